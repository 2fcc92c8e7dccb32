#include "tools/tune_measure.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "tools/commands.h"

namespace tilejit::tools {

using Clock = std::chrono::steady_clock;

Stats stats_of(std::vector<double> v) {
  Stats s;
  s.samples = static_cast<int>(v.size());
  if (v.empty()) return s;
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    const size_t n = x.size();
    return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
  };
  s.median = median(v);
  for (double& x : v) x = std::fabs(x - s.median);
  s.mad = median(v);
  return s;
}

double noise_of(const Stats& dflt, const Stats& cand) {
  return std::max(2 * std::max(dflt.mad, cand.mad), 0.01 * dflt.median);
}

bool beats(const Stats& dflt, const Stats& cand) {
  return dflt.median - cand.median > noise_of(dflt, cand);
}

namespace {
std::atomic<bool> g_interrupted{false};
// The first ^C asks for a clean stop; a second one kills as ^C always does.
extern "C" void on_sigint(int) {
  if (g_interrupted.exchange(true)) {
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
  }
}
}  // namespace

void install_sigint_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
}

Stop stop_requested(Clock::time_point deadline) {
  if (g_interrupted.load()) return Stop::interrupted;
  if (Clock::now() >= deadline) return Stop::budget;
  return Stop::none;
}

Stop measure_interleaved(std::vector<Contender>& cs, const std::function<void()>& call,
                         int min_rounds, int max_rounds, double seconds, Clock::time_point deadline,
                         const std::function<void()>& tick) {
  const auto t_start = Clock::now();
  double per_call = 0;
  for (Contender& c : cs) {
    if (Stop s = stop_requested(deadline); s != Stop::none) return s;
    c.select();
    call();  // compiles (or loads) this plan's kernels
    const auto t0 = Clock::now();
    call();
    per_call = std::max(per_call, std::chrono::duration<double>(Clock::now() - t0).count());
    tick();
  }
  // Enough calls per sample that the clock and the switch are negligible.
  const int64_t calls =
      std::clamp<int64_t>(static_cast<int64_t>(2e-3 / std::max(per_call, 1e-7)), 1, 1000);
  const size_t n = cs.size();
  for (int r = 0; r < max_rounds; ++r) {
    if (r >= min_rounds && std::chrono::duration<double>(Clock::now() - t_start).count() > seconds)
      break;
    for (size_t i = 0; i < n; ++i) {
      if (Stop s = stop_requested(deadline); s != Stop::none) return s;
      Contender& c = cs[(i + static_cast<size_t>(r)) % n];
      c.select();
      const auto t0 = Clock::now();
      for (int64_t j = 0; j < calls; ++j) call();
      c.samples.push_back(std::chrono::duration<double>(Clock::now() - t0).count() /
                          static_cast<double>(calls));
      tick();
    }
  }
  return Stop::none;
}

int64_t llc_bytes() {
  int64_t best = 0;
  int best_level = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/", i);
    std::ifstream lv(dir + "level"), sz(dir + "size");
    int level = 0;
    std::string size;
    if (!(lv >> level) || !(sz >> size) || size.empty()) continue;
    int64_t bytes = std::atoll(size.c_str());
    if (size.back() == 'K') bytes <<= 10;
    if (size.back() == 'M') bytes <<= 20;
    if (bytes > 0 && (level > best_level || (level == best_level && bytes > best)))
      best_level = level, best = bytes;
  }
  return best > 0 ? best : int64_t{32} << 20;
}

int64_t cold_copies(int64_t bytes) {
  static const int64_t llc = llc_bytes();
  return std::clamp<int64_t>((4 * llc + bytes - 1) / std::max<int64_t>(bytes, 1), 1, 16);
}

std::string us_str(double s) {
  if (s < 1e-3) return fmt::format("{:.1f} us", s * 1e6);
  if (s < 1) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.3f} s", s);
}

std::string duration_str(double s) {
  const int64_t t = static_cast<int64_t>(std::lround(std::max(0.0, s)));
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, t / 60 % 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

double parse_budget(const std::string& text) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  // A decimal number and its unit, as the docs say: "5" (no unit) and
  // "0x10s" (stod reads hex) were taken as seconds.
  if (text.find_first_not_of("0123456789.eE+-") < used) used = 0;
  const std::string unit = text.substr(used);
  const double scale = unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : -1;
  // The cap keeps now + budget inside the clock's range (1e10 s as int64
  // microseconds overflowed to a deadline in the past: nothing was tuned).
  if (used == 0 || scale < 0 || !(v > 0) || !(v * scale <= kMaxBudgetSeconds))
    throw UsageError(fmt::format(
        "--budget '{}' is not a duration; allowed: a positive number with s, m or h (e.g. 90s, "
        "10m), at most {}h",
        text, kMaxBudgetSeconds / 3600));
  return v * scale;
}

Progress::Progress(int64_t total, double budget)
    : total_(total), budget_(budget), tty_(isatty(STDERR_FILENO) == 1), t0_(Clock::now()) {}

std::string Progress::bar() const {
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0_).count();
  std::string eta = "?";
  if (finished_ > 0) {
    double left =
        elapsed / static_cast<double>(finished_) * static_cast<double>(total_ - finished_);
    left = std::min(left, budget_ - elapsed);
    eta = duration_str(left);
  }
  constexpr int kWidth = 24;
  const int fill = total_ ? static_cast<int>(kWidth * finished_ / total_) : kWidth;
  return fmt::format("[{}{}] {}/{} ETA {} {}", std::string(fill, '#'),
                     std::string(kWidth - fill, '-'), index_ + 1, total_, eta, label_);
}

void Progress::start(int64_t index, const std::string& label) {
  index_ = index;
  label_ = label;
  if (tty_) {
    tick();
  } else {
    fmt::print("tune [{}/{}] {}\n", index + 1, total_, label);
    std::fflush(stdout);
  }
}

void Progress::tick() {
  if (!tty_) return;
  std::string b = bar();
  if (b.size() > 110) b.resize(110);
  fmt::print(stderr, "\r{:<110}", b);
  std::fflush(stderr);
}

void Progress::done(const std::string& line) {
  ++finished_;
  clear();
  fmt::print("  {}\n", line);
  std::fflush(stdout);
}

void Progress::clear() {
  if (!tty_) return;
  fmt::print(stderr, "\r{:<110}\r", "");
  std::fflush(stderr);
}

}  // namespace tilejit::tools
