#include "tools/program_io.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>

#include "ir/parser.h"
#include "runtime/bf16.h"
#include "tilejit/error.h"

namespace tilejit::tools {
namespace {

// splitmix64: a cheap, well-mixed stream per input.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() {  // [-1, 1)
    return static_cast<float>(static_cast<int64_t>(next() >> 40) - (1 << 23)) / float(1 << 23);
  }
};

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

}  // namespace

std::string display_name(const std::string& path) {
  return path == "-" ? "<stdin>" : path;
}

std::string read_text(const std::string& path) {
  if (path == "-")
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw Error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::string text;
  char buf[1 << 14];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw Error(fmt::format("{}: read error", path));
  return text;
}

ir::Function load_program(const std::string& path) {
  return ir::parse(read_text(path), display_name(path));
}

ops::ProgramRunner make_runner(const ir::Function& f, const std::string& path) {
  try {
    return ops::ProgramRunner(f);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: error: {}", display_name(path), e.what()));
  }
}

std::pair<std::string, std::string> split_assignment(const std::string& arg, const char* option,
                                                     const char* value_hint) {
  const size_t eq = arg.find('=');
  std::string name = arg.substr(0, eq);
  if (!name.empty() && name[0] == '%') name.erase(0, 1);
  if (eq == std::string::npos || name.empty() || eq + 1 == arg.size())
    throw Error(fmt::format("{} '{}': expected NAME={}", option, arg, value_hint));
  return {name, arg.substr(eq + 1)};
}

std::vector<std::string> program_symbols(const ir::Function& f) {
  std::vector<std::string> syms;
  for (int p : f.params)
    for (const ir::Dim& d : f.value(p).type.dims)
      if (!d.is_static() && std::find(syms.begin(), syms.end(), d.symbol) == syms.end())
        syms.push_back(d.symbol);
  return syms;
}

ops::DimBindings parse_dims(const std::vector<std::string>& args, const ir::Function& f) {
  const std::vector<std::string> syms = program_symbols(f);
  ops::DimBindings dims;
  for (const std::string& arg : args) {
    auto [name, text] = split_assignment(arg, "--dim", "SIZE (e.g. M=512)");
    if (!name.empty() && name[0] == '?') name.erase(0, 1);
    int64_t v = -1;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || v < 0)
      throw Error(fmt::format("--dim '{}': the size must be an integer >= 0", arg));
    if (std::find(syms.begin(), syms.end(), name) == syms.end())
      throw Error(fmt::format(
          "--dim '{}': @{} has no dim ?{}; its symbolic dims are {}", arg, f.name, name,
          syms.empty() ? std::string("(none)") : "?" + fmt::format("{}", fmt::join(syms, ", ?"))));
    dims[name] = v;
  }
  return dims;
}

ops::HostTensor tensor_from_npy(const NpyArray& a, const ir::Value& param,
                                const std::string& file) {
  const DType want = param.type.dtype;
  ops::HostTensor t;
  t.dtype = want;
  t.shape = a.shape;
  auto mismatch = [&](const char* allowed) {
    return Error(fmt::format("input '{}' ({}) is a '{}' array; {} needs {}", param.name, file,
                             npy_descr(a.dtype), param.type.str(), allowed));
  };
  switch (want) {
    case DType::bf16:
      if (a.dtype == NpyDtype::u2) {
        t.bytes = a.data;
      } else if (a.dtype == NpyDtype::f4) {
        // Convenience for float32 arrays: rounded to nearest even, as the
        // engines that feed tilejit convert their activations.
        t.bytes.resize(a.data.size() / 2);
        for (int64_t i = 0; i < a.numel(); ++i) {
          float f;
          std::memcpy(&f, a.data.data() + i * 4, 4);
          const uint16_t h = runtime::f32_to_bf16(f);
          std::memcpy(t.bytes.data() + i * 2, &h, 2);
        }
      } else {
        throw mismatch("'<u2' (bf16 bit patterns) or '<f4' (rounded to bf16)");
      }
      return t;
    case DType::f32:
      if (a.dtype != NpyDtype::f4) throw mismatch("'<f4'");
      break;
    case DType::i32:
      if (a.dtype != NpyDtype::i4) throw mismatch("'<i4'");
      break;
    case DType::u8:
      if (a.dtype != NpyDtype::u1) throw mismatch("'|u1'");
      break;
    case DType::i8:
      if (a.dtype != NpyDtype::i1) throw mismatch("'|i1'");
      break;
    default:
      throw Error(fmt::format("input '{}' is {}: the .npy convention has no dtype for it",
                              param.name, param.type.str()));
  }
  t.bytes = a.data;
  return t;
}

NpyArray npy_from_tensor(const ops::HostTensor& t, const std::string& what) {
  NpyArray a;
  switch (t.dtype) {
    case DType::bf16:
      a.dtype = NpyDtype::u2;
      break;
    case DType::f32:
      a.dtype = NpyDtype::f4;
      break;
    case DType::i32:
      a.dtype = NpyDtype::i4;
      break;
    case DType::u8:
      a.dtype = NpyDtype::u1;
      break;
    case DType::i8:
      a.dtype = NpyDtype::i1;
      break;
    default:
      throw Error(fmt::format("{} is {}: the .npy convention has no dtype for it", what,
                              dtype_name(t.dtype)));
  }
  a.shape = t.shape;
  a.data = t.bytes;
  return a;
}

ops::HostTensor random_tensor(const ir::Value& param, const ops::DimBindings& dims, uint64_t seed) {
  const std::vector<int64_t> shape = ops::bind_shape(param.type, dims);
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] < 0)
      throw Error(fmt::format("random input '{}' ({}): {} has no size; give --dim {}=SIZE",
                              param.name, param.type.str(), param.type.dims[i].str(),
                              param.type.dims[i].symbol));
  ops::HostTensor t = ops::HostTensor::zeros(param.type.dtype, shape);
  Rng r{seed * 0x2545F4914F6CDD1Dull ^ name_hash(param.name)};
  const int64_t n = t.numel();
  switch (t.dtype) {
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) t.data<uint16_t>()[i] = runtime::f32_to_bf16(r.uniform());
      break;
    case DType::f32:
      for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = r.uniform();
      break;
    case DType::i32:
      for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(r.next() % 16);
      break;
    case DType::u8:
    case DType::i8:
      for (int64_t i = 0; i < n; ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(r.next());
      break;
    default:
      throw Error(fmt::format("random input '{}' is {}: no generator for it", param.name,
                              param.type.str()));
  }
  return t;
}

void note_isa_request(const std::string& requested) {
  if (requested.empty()) return;
  const CpuInfo cpu = cpu_info();
  if (requested != isa_name(cpu.isa))
    fmt::print(stderr,
               "tilejit: note: --isa {} asked, but this machine's best path is {}: "
               "running {}\n",
               requested, isa_name(cpu.max_isa), isa_name(cpu.isa));
}

}  // namespace tilejit::tools
