// `tilejit run`: executes a .tir program on .npy inputs (or generated ones),
// writes its outputs as .npy, and with --check compares them with the scalar
// reference.
#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "runtime/bf16.h"
#include "runtime/make_directories.h"
#include "tilejit/tilejit.h"
#include "tools/commands.h"
#include "tools/program/program_runner.h"
#include "tools/program_io.h"

namespace tilejit::tools {
namespace {

std::vector<std::string> names_of(const ir::Function& f, const std::vector<int>& ids) {
  std::vector<std::string> n;
  for (int id : ids) n.push_back(f.value(id).name);
  return n;
}

// NAME=FILE options → {NAME: FILE}, each NAME one of `allowed`.
std::map<std::string, std::string> file_options(const std::vector<std::string>& args,
                                                const char* option, const char* what,
                                                const ir::Function& f,
                                                const std::vector<int>& allowed) {
  const std::vector<std::string> names = names_of(f, allowed);
  std::map<std::string, std::string> out;
  for (const std::string& arg : args) {
    auto [name, path] = split_assignment(arg, option, "FILE.npy");
    if (std::find(names.begin(), names.end(), name) == names.end())
      throw UsageError(fmt::format("{} '{}': @{} has no {} '{}'; its {}s are {}", option, arg,
                                   f.name, what, name, what, fmt::join(names, ", ")));
    if (!out.emplace(name, path).second)
      throw UsageError(fmt::format("{} '{}': {} '{}' is given twice", option, arg, what, name));
  }
  return out;
}

// Whether two option paths name one file: the same file when both exist
// (hard links and symlinks included), else the same lexical path.
bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (std::filesystem::equivalent(a, b, ec) && !ec) return true;
  return std::filesystem::path(a).lexically_normal() == std::filesystem::path(b).lexically_normal();
}

// An --output onto one of the run's --input files (the run would replace the
// data it read, silently) or onto another --output's file (the second write
// would replace the first) is a usage error.
void check_output_files(const std::map<std::string, std::string>& in_files,
                        const std::map<std::string, std::string>& out_files) {
  for (auto o = out_files.begin(); o != out_files.end(); ++o) {
    for (const auto& [name, path] : in_files)
      if (same_file(o->second, path))
        throw UsageError(fmt::format(
            "--output '{}={}': the file of --input '{}={}'; allowed: a file that is not one of "
            "the run's inputs",
            o->first, o->second, name, path));
    for (auto p = out_files.begin(); p != o; ++p)
      if (same_file(o->second, p->second))
        throw UsageError(fmt::format(
            "--output '{}={}': the file of --output '{}={}'; allowed: one file per result",
            o->first, o->second, p->first, p->second));
  }
}

// --save-inputs DIR: created when missing (runtime::make_directories: 0755,
// whatever the umask); a path that exists and is not a directory (a regular
// file, say) is a usage error, not a failed write.
void make_save_dir(const std::string& dir) {
  std::error_code stat_ec;
  const std::error_code ec = runtime::make_directories(dir);
  if (!ec && std::filesystem::is_directory(dir, stat_ec)) return;
  throw UsageError(
      fmt::format("--save-inputs '{}': {}; allowed: a directory (created if missing)", dir,
                  std::filesystem::exists(dir, stat_ec) ? "exists and is not a directory"
                                                        : "cannot be created: " + ec.message()));
}

void print_summary(const std::string& name, const HostTensor& t) {
  double lo = INFINITY, hi = -INFINITY, sum = 0;
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double v = t.at(i);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
  }
  if (n == 0) {
    fmt::print("  %{} {} {}: empty\n", name, shape_str(t.shape), dtype_name(t.dtype));
    return;
  }
  fmt::print("  %{} {} {}: min {:.6g} max {:.6g} mean {:.6g}\n", name, shape_str(t.shape),
             dtype_name(t.dtype), lo, hi, sum / n);
}

void print_check(const CheckReport& c) {
  fmt::print("check  against the scalar reference ({})\n", c.reference);
  fmt::print("  max abs err  {:.3g}\n", c.max_abs);
  fmt::print("  max rel err  {:.3g}  (|got - ref| / max(|ref|, 1e-6))\n", c.max_rel);
  fmt::print("  tolerance    {}\n", c.tolerance);
  if (!c.worst_index.empty())
    fmt::print("  worst        {}[{}]: got {:.7g}, ref {:.7g}, |err| {:.3g} vs tol {:.3g}\n",
               c.worst_value, fmt::join(c.worst_index, ", "), c.worst_got, c.worst_ref, c.worst_err,
               c.worst_tol);
  if (c.pass())
    fmt::print("PASS ({} elements within tolerance)\n", c.checked);
  else
    fmt::print("FAIL ({} of {} elements exceed the tolerance)\n", c.failures, c.checked);
}

}  // namespace

int run_program(const RunOptions& opt) {
  const ir::Function f = load_program(opt.file);
  const DimBindings preset = parse_dims(opt.dims, f);
  // verify + match: their errors come before any .npy file is read.
  ProgramRunner runner = make_runner(f, opt.file);
  const auto in_files = file_options(opt.inputs, "--input", "input", f, f.params);
  const auto out_files = file_options(opt.outputs, "--output", "result", f, f.results);
  check_output_files(in_files, out_files);
  note_isa_request(opt.isa);

  TensorMap inputs;
  for (const auto& [name, path] : in_files) {
    const int id = *std::find_if(f.params.begin(), f.params.end(),
                                 [&](int p) { return f.value(p).name == name; });
    inputs[name] = tensor_from_npy(read_npy(path), f.value(id), path);
  }
  // Generated inputs take their symbolic dims from --dim, then from the inputs
  // read from files (conflicts are reported by set_inputs below).
  DimBindings dims = preset;
  for (const auto& [name, t] : inputs) {
    const int id = *std::find_if(f.params.begin(), f.params.end(),
                                 [&](int p) { return f.value(p).name == name; });
    const ir::TensorType& type = f.value(id).type;
    if (static_cast<int>(t.shape.size()) != type.rank()) continue;
    for (int i = 0; i < type.rank(); ++i)
      if (!type.dims[i].is_static()) dims.emplace(type.dims[i].symbol, t.shape[i]);
  }
  for (int p : f.params) {
    const ir::Value& v = f.value(p);
    if (inputs.count(v.name)) continue;
    if (!opt.random_inputs)
      throw UsageError(
          fmt::format("missing input '{}' ({}): give --input {}=FILE.npy, or "
                      "--random-inputs SEED",
                      v.name, v.type.str(), v.name));
    inputs[v.name] = random_tensor(f, p, dims, opt.seed);
  }
  if (!opt.save_inputs.empty()) {
    make_save_dir(opt.save_inputs);
    for (const auto& [name, t] : inputs)
      write_npy(opt.save_inputs + "/" + name + ".npy", npy_from_tensor(t, "input '" + name + "'"));
  }

  try {
    runner.set_inputs(inputs, preset);
  } catch (const Error& e) {
    // The runner names the input; say which file it came from.
    std::string msg = e.what();
    for (const auto& [name, path] : in_files) {
      const std::string head = "input '" + name + "'";
      if (msg.rfind(head, 0) == 0) msg.insert(head.size(), " (" + path + ")");
    }
    throw Error(msg);
  }
  TensorMap outputs = runner.make_outputs();
  const auto t0 = std::chrono::steady_clock::now();
  runner.run(outputs);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  if (const OperatorRunner* o = runner.operators()) {
    std::vector<std::string> apis;
    for (const OperatorCall& c : o->program().calls) apis.push_back(c.api());
    fmt::print("ran @{} on the {} path: {} ({}) in {:.3f} ms (first call, compiles included)\n",
               f.name, isa_name(cpu_info().isa), o->work().shape, fmt::join(apis, ", then "), ms);
  } else {
    const auto& spec = runner.program().spec;
    // x: the gemm's input, or an elementwise program's param of largest rank
    // (rank 0 for a program of scalars: one row).
    const std::vector<int64_t>& xs = inputs.at(f.value(runner.program().x).name).shape;
    const int64_t m = xs.empty() ? 1 : xs[0];
    fmt::print(
        "ran @{} on the {} path: M={} N={} K={} in {:.3f} ms (first call, compiles included)\n",
        f.name, isa_name(cpu_info().isa), m, spec.n, spec.k, ms);
  }
  for (const auto& [name, t] : outputs) {
    print_summary(name, t);
    if (auto it = out_files.find(name); it != out_files.end()) {
      write_npy(it->second, npy_from_tensor(t, "result '" + name + "'"));
      fmt::print("  wrote %{} to {}\n", name, it->second);
    }
  }
  if (!opt.check) return 0;
  const CheckReport c = runner.check(outputs);
  print_check(c);
  return c.pass() ? 0 : 1;
}

}  // namespace tilejit::tools
