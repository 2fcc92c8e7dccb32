// Measurement for `tilejit tune` (docs/tuning.md): interleaved repetitions of
// whole operator calls, medians with their spread, the keep rule; the
// progress display; the stop conditions (^C, the budget).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tilejit::tools {

struct Stats {
  double median = 0;  // seconds per call
  double mad = 0;     // median absolute deviation of the samples
  int samples = 0;
};
Stats stats_of(std::vector<double> v);

// The keep rule: a candidate wins when its median is below the default's by
// more than the noise, noise = max(2 · the larger MAD, 1 % of the default's
// median) (the 1 % floor: a MAD of 0 from a coarse clock or few samples is
// no proof of a difference).
double noise_of(const Stats& dflt, const Stats& cand);
bool beats(const Stats& dflt, const Stats& cand);

// The last-level cache's bytes: the largest cache of the highest level sysfs
// lists for cpu0 (32 MiB where it lists none).
int64_t llc_bytes();
// How many copies of a call's streamed data (a gemm's weight, the experts a
// call touches, a decode call's KV rows) a rotation of calls runs over so
// that each call reads its data from DRAM, as an engine's does: a layer's
// weights and KV cache are read once per step, and the other layers' pass
// through the caches in between. Copies past 4x the last-level cache (2x
// left part of a rotation of 8 int4 weights of 9 MB in Zen 5's 32 MiB L3:
// 171 us a call against 235-255 us truly cold), at most 16, 1 where one copy is that big.
int64_t cold_copies(int64_t bytes);

// Why a measurement stopped early.
enum class Stop { none, interrupted, budget };
// Installs the SIGINT handler (the first ^C sets the flag; the measurement
// in progress is abandoned and the database written; a second ^C kills).
void install_sigint_handler();
Stop stop_requested(std::chrono::steady_clock::time_point deadline);

// One plan timed against the others: select() makes the operator call use
// it (e.g. installs a one-entry tuning database).
struct Contender {
  std::function<void()> select;
  std::vector<double> samples;  // seconds per call
};
// Warm-up (two calls each: compile, then caches), then rounds of one sample
// per contender, in an order rotated every round so none always runs first.
// A sample times enough back-to-back calls for ~2 ms. At least min_rounds
// rounds, more up to max_rounds while within `seconds`. `tick` is called
// between samples (progress). Returns the stop reason (samples are then
// incomplete and must be discarded).
Stop measure_interleaved(std::vector<Contender>& cs, const std::function<void()>& call,
                         int min_rounds, int max_rounds, double seconds,
                         std::chrono::steady_clock::time_point deadline,
                         const std::function<void()>& tick);

// A bar with an ETA on a terminal (stderr, redrawn with \r), plain lines on
// stdout otherwise.
class Progress {
 public:
  Progress(int64_t total, double budget_seconds);
  bool tty() const { return tty_; }
  void start(int64_t index, const std::string& label);  // entry index of total
  void tick();                                          // redraw (tty only)
  void done(const std::string& result_line);            // entry finished
  void clear();                                         // erase the bar (tty)

 private:
  std::string bar() const;
  int64_t total_, index_ = 0, finished_ = 0;
  double budget_;
  bool tty_;
  std::string label_;
  std::chrono::steady_clock::time_point t0_;
};

std::string us_str(double seconds);
std::string duration_str(double seconds);
// "90", "90s", "10m", "1h" -> seconds, at most kMaxBudgetSeconds (a week);
// UsageError naming --budget otherwise.
inline constexpr double kMaxBudgetSeconds = 7 * 24 * 3600;
double parse_budget(const std::string& text);

}  // namespace tilejit::tools
