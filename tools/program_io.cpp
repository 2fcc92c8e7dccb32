#include "tools/program_io.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "ir/parser.h"
#include "runtime/bf16.h"
#include "tilejit/error.h"
#include "tools/commands.h"
#include "tools/file_limits.h"

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
  double unit() {  // [0, 1)
    return static_cast<double>(next() >> 11) / static_cast<double>(1ull << 53);
  }
};

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

}  // namespace

std::string one_line(const std::string& s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      out += c;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    }
  }
  return out;
}

std::string display_name(const std::string& path) {
  return path == "-" ? "<stdin>" : path;
}

std::string read_text(const std::string& path) {
  return CappedFile(path, /*dash_is_stdin=*/true).read_all(kMaxProgramBytes, ".tir program");
}

ir::Function load_program(const std::string& path) {
  return ir::parse(read_text(path), display_name(path));
}

ProgramRunner make_runner(const ir::Function& f, const std::string& path) {
  try {
    return ProgramRunner(f);
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
    throw UsageError(fmt::format("{} '{}': expected NAME={}", option, arg, value_hint));
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

DimBindings parse_dims(const std::vector<std::string>& args, const ir::Function& f) {
  const std::vector<std::string> syms = program_symbols(f);
  DimBindings dims;
  for (const std::string& arg : args) {
    auto [name, text] = split_assignment(arg, "--dim", "SIZE (e.g. M=512)");
    if (!name.empty() && name[0] == '?') name.erase(0, 1);
    int64_t v = -1;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || v < 0 || v > kMaxDimValue)
      throw UsageError(
          fmt::format("--dim '{}': the size must be an integer in [0, {}]", arg, kMaxDimValue));
    if (std::find(syms.begin(), syms.end(), name) == syms.end())
      throw UsageError(fmt::format(
          "--dim '{}': @{} has no dim ?{}; its symbolic dims are {}", arg, f.name, name,
          syms.empty() ? std::string("(none)") : "?" + fmt::format("{}", fmt::join(syms, ", ?"))));
    // Given twice: refused, as --input given twice is (the last one won, silently).
    if (const auto it = dims.find(name); it != dims.end())
      throw UsageError(fmt::format("--dim '{}': ?{} is already given ({}); allowed: each dim once",
                                   arg, name, it->second));
    dims[name] = v;
  }
  return dims;
}

HostTensor tensor_from_npy(const NpyArray& a, const ir::Value& param, const std::string& file) {
  const DType want = param.type.dtype;
  HostTensor t;
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
    case DType::f8e4m3:
      if (a.dtype != NpyDtype::u1) throw mismatch("'|u1' (e4m3 codes)");
      break;
    case DType::f8e5m2:
      if (a.dtype != NpyDtype::u1) throw mismatch("'|u1' (e5m2 codes)");
      break;
    case DType::f16:
      if (a.dtype != NpyDtype::u2) throw mismatch("'<u2' (f16 bit patterns)");
      break;
    case DType::u4:
      // A u4 weight or zero point: the checkpoint's int32-packed tensor
      // (qweight / qzeros), whose shape the runner checks.
      if (a.dtype != NpyDtype::i4) throw mismatch("'<i4' (the int32-packed qweight / qzeros)");
      t.dtype = DType::i32;
      break;
    case DType::f4e2m1:
      // MXFP4 weights: the checkpoint's code bytes (two codes a byte, low
      // nibble first; GPT-OSS's *_blocks), whose shape the runner checks.
      if (a.dtype != NpyDtype::u1) throw mismatch("'|u1' (the MXFP4 code bytes)");
      t.dtype = DType::u8;
      break;
    case DType::i64: {
      // Index tensors (rope positions) may be int64 in the IR, as PyTorch
      // engines pass them; the .npy reader has no '<i8', so '<i4' is widened.
      if (a.dtype != NpyDtype::i4) throw mismatch("'<i4' (widened to i64)");
      t.bytes.resize(a.data.size() * 2);
      for (int64_t i = 0; i < a.numel(); ++i) {
        int32_t v;
        std::memcpy(&v, a.data.data() + i * 4, 4);
        const int64_t w = v;
        std::memcpy(t.bytes.data() + i * 8, &w, 8);
      }
      return t;
    }
    default:
      throw Error(fmt::format("input '{}' is {}: the .npy convention has no dtype for it",
                              param.name, param.type.str()));
  }
  t.bytes = a.data;
  return t;
}

NpyArray npy_from_tensor(const HostTensor& t, const std::string& what) {
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
    case DType::f8e4m3:
    case DType::f8e5m2:
      a.dtype = NpyDtype::u1;
      break;
    case DType::f16:
      a.dtype = NpyDtype::u2;
      break;
    case DType::i64: {
      // Written as '<i4' (what tensor_from_npy widens back) when it fits.
      a.dtype = NpyDtype::i4;
      a.shape = t.shape;
      a.data.resize(t.bytes.size() / 2);
      for (int64_t i = 0; i < t.numel(); ++i) {
        const int64_t v = t.data<int64_t>()[i];
        if (v < INT32_MIN || v > INT32_MAX)
          throw Error(
              fmt::format("{} is i64 with element {} = {}: the .npy convention writes i64 "
                          "as '<i4', which cannot hold it",
                          what, i, v));
        const int32_t n = static_cast<int32_t>(v);
        std::memcpy(a.data.data() + i * 4, &n, 4);
      }
      return a;
    }
    default:
      throw Error(fmt::format("{} is {}: the .npy convention has no dtype for it", what,
                              dtype_name(t.dtype)));
  }
  a.shape = t.shape;
  a.data = t.bytes;
  return a;
}

InputRole input_role(const ir::Function& f, int id, const DimBindings& dims, int64_t* range,
                     int* range_of) {
  *range = -1;
  int unused = -1;
  if (range_of == nullptr) range_of = &unused;
  for (const ir::Op& op : f.ops)
    for (size_t i = 0; i < op.operands.size(); ++i) {
      if (op.operands[i] != id) continue;
      if (op.kind == ir::OpKind::rope && i == 1) {
        *range_of = op.operands[2];
        *range = bind_shape(f.value(*range_of).type, dims).at(0);
        return InputRole::positions;
      }
      if (op.kind == ir::OpKind::rope && i == 2) return InputRole::cos_sin;
      if (op.kind == ir::OpKind::moe && i == 3) return InputRole::topk_weights;
      if (op.kind == ir::OpKind::decode_attention && i == 3) {
        *range_of = op.operands[1];
        *range = bind_shape(f.value(*range_of).type, dims).at(0);
        return InputRole::block_table;
      }
      if (op.kind == ir::OpKind::decode_attention && i == 4) {
        const int64_t mb = bind_shape(f.value(op.operands[3]).type, dims).at(1);
        const int64_t bs = bind_shape(f.value(op.operands[1]).type, dims).at(1);
        *range = mb < 0 || bs < 0 ? -1 : mb * bs;
        return InputRole::seq_lens;
      }
      if (op.kind == ir::OpKind::gemm && ir::operand_role(op, i) == "g_idx") {
        // The groups are the scale's rows.
        *range_of = op.operands[2];
        *range = bind_shape(f.value(*range_of).type, dims).at(0);
        return InputRole::g_idx;
      }
      if (op.kind == ir::OpKind::gemm && ir::operand_role(op, i) == "scale")
        return InputRole::quant_scale;
      if (op.kind == ir::OpKind::moe) {
        // Quantized experts: the gemm's roles per projection, with a leading [E].
        const std::string role = ir::operand_role(op, i);
        if (role == "scale13" || role == "scale2") return InputRole::quant_scale;
        if (role == "g_idx13" || role == "g_idx2") {
          const std::string scale = role == "g_idx13" ? "scale13" : "scale2";
          for (size_t j = 5; j < op.operands.size(); ++j)
            if (ir::operand_role(op, j) == scale) *range_of = op.operands[j];
          if (*range_of >= 0) *range = bind_shape(f.value(*range_of).type, dims).at(1);
          return InputRole::g_idx;
        }
      }
      if (op.kind == ir::OpKind::moe && i == 4) {
        *range_of = op.operands[1];
        *range = bind_shape(f.value(*range_of).type, dims).at(0);
        return InputRole::topk_ids;
      }
      return InputRole::plain;
    }
  return InputRole::plain;
}

InputRole role_from_name(const std::string& stem) {
  if (stem == "pos" || stem == "positions") return InputRole::positions;
  if (stem == "cos_sin") return InputRole::cos_sin;
  if (stem == "topk_ids") return InputRole::topk_ids;
  if (stem == "topk_weights") return InputRole::topk_weights;
  return InputRole::plain;
}

void fill_role(HostTensor& t, InputRole role, int64_t range, uint64_t seed,
               const std::string& what) {
  Rng r{seed};
  const int64_t n = t.numel();
  const int rank = static_cast<int>(t.shape.size());
  auto need = [&](bool ok, const std::string& rule) {
    if (!ok)
      throw Error(
          fmt::format("{} ({} {}): {}", what, dtype_name(t.dtype), shape_str(t.shape), rule));
  };
  switch (role) {
    case InputRole::positions:
      need(t.dtype == DType::i32 || t.dtype == DType::i64, "positions are i32 or i64");
      need(range >= 1 || n == 0, range < 0 ? "the cache's row count is unbound: give --dim for it"
                                           : "positions need a cos/sin cache of at least one row");
      for (int64_t i = 0; i < n; ++i) {
        const int64_t p = static_cast<int64_t>(r.next() % static_cast<uint64_t>(range));
        if (t.dtype == DType::i64)
          t.data<int64_t>()[i] = p;
        else
          t.data<int32_t>()[i] = static_cast<int32_t>(p);
      }
      return;
    case InputRole::cos_sin: {
      // A real cache (θ base 10000): values an engine holds, not noise.
      need(t.dtype == DType::f32 && rank == 2 && t.shape[1] % 2 == 0,
           "a cos/sin cache is f32 [P, R] with R even");
      const int64_t rows = t.shape[0], w = t.shape[1], half = w / 2;
      for (int64_t p = 0; p < rows; ++p)
        for (int64_t j = 0; j < half; ++j) {
          const double theta = std::pow(10000.0, -2.0 * double(j) / double(w));
          t.data<float>()[p * w + j] = static_cast<float>(std::cos(double(p) * theta));
          t.data<float>()[p * w + half + j] = static_cast<float>(std::sin(double(p) * theta));
        }
      return;
    }
    case InputRole::topk_ids: {
      need(t.dtype == DType::i32 && rank == 2, "expert ids are i32 [T, top_k]");
      const int64_t k = t.shape[1];
      need(range >= 0, "the expert count is unbound: give --dim for it");
      need(k <= range,
           fmt::format("top_k = {} distinct experts need E >= top_k; E = {}", k, range));
      // k distinct experts per token, as a router picks them.
      for (int64_t row = 0; row < t.shape[0]; ++row) {
        int32_t* ids = t.data<int32_t>() + row * k;
        for (int64_t j = 0; j < k;) {
          const int32_t e = static_cast<int32_t>(r.next() % static_cast<uint64_t>(range));
          if (std::find(ids, ids + j, e) == ids + j) ids[j++] = e;
        }
      }
      return;
    }
    case InputRole::topk_weights: {
      need(t.dtype == DType::f32 && rank == 2, "routing weights are f32 [T, top_k]");
      const int64_t k = t.shape[1];
      // Positive and renormalized, as topk_softmax(renormalize) leaves them.
      for (int64_t row = 0; row < t.shape[0]; ++row) {
        float* w = t.data<float>() + row * k;
        double sum = 0;
        for (int64_t j = 0; j < k; ++j) sum += w[j] = static_cast<float>(0.1 + r.unit());
        for (int64_t j = 0; j < k; ++j) w[j] = static_cast<float>(w[j] / sum);
      }
      return;
    }
    case InputRole::block_table: {
      need(t.dtype == DType::i32 && rank == 2, "a block table is i32 [B, max_blocks_per_seq]");
      need(range >= 1, "the cache's block count is unbound or 0: give --dim for it");
      // A shuffled pool, handed out in order: every row's blocks scattered
      // over the cache, as an engine's allocator leaves them after a while.
      std::vector<int32_t> pool(static_cast<size_t>(range));
      for (int64_t i = 0; i < range; ++i) pool[i] = static_cast<int32_t>(i);
      for (int64_t i = range - 1; i > 0; --i)
        std::swap(pool[i], pool[static_cast<int64_t>(r.next() % static_cast<uint64_t>(i + 1))]);
      for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = pool[i % range];
      return;
    }
    case InputRole::seq_lens:
      need(t.dtype == DType::i32 && rank == 1, "sequence lengths are i32 [B]");
      need(range >= 1, "max_blocks_per_seq or block_size is unbound: give --dim for them");
      need(range <= INT32_MAX, fmt::format("max_blocks_per_seq·block_size = {} keys: lengths are "
                                           "int32, at most {}",
                                           range, INT32_MAX));
      for (int64_t i = 0; i < n; ++i)
        t.data<int32_t>()[i] =
            static_cast<int32_t>(i == 0 ? range : 1 + int64_t(r.next() % uint64_t(range)));
      return;
    case InputRole::g_idx: {
      // Act-order: every group holds ceil(K/G) channels (k / ceil(K/G)), shuffled;
      // [E, K] (a moe op's experts): each expert's row so.
      need(t.dtype == DType::i32 && (rank == 1 || rank == 2) && range >= 1,
           "g_idx is i32 [K] (or [E, K] for experts) over G >= 1 groups");
      const int64_t k = rank == 0 ? 0 : t.shape.back();
      const int64_t per = (k + range - 1) / range;
      for (int64_t row = 0; k > 0 && row < n / k; ++row) {
        int32_t* g = t.data<int32_t>() + row * k;
        for (int64_t i = 0; i < k; ++i) g[i] = static_cast<int32_t>(i / per);
        for (int64_t i = k - 1; i > 0; --i)
          std::swap(g[i], g[static_cast<int64_t>(r.next() % static_cast<uint64_t>(i + 1))]);
      }
      return;
    }
    case InputRole::quant_scale:
      if (t.dtype == DType::u8) {
        // MXFP4's e8m0 exponents: scales 2^-9 .. 2^-6 (|w| <= 6·2^-6).
        for (int64_t i = 0; i < n; ++i)
          t.data<uint8_t>()[i] = static_cast<uint8_t>(127 - 9 + static_cast<int>(r.next() % 4));
        return;
      }
      // Positive scales in [2^-8, 2^-6) with 3 mantissa bits, exact in f16, bf16 and f32.
      for (int64_t i = 0; i < n; ++i) {
        const int m = static_cast<int>(r.next() % 8), e = -8 + static_cast<int>(r.next() % 2);
        const float v = std::ldexp(1.0f + float(m) / 8.0f, e);
        if (t.dtype == DType::f32)
          t.data<float>()[i] = v;
        else if (t.dtype == DType::bf16)
          t.data<uint16_t>()[i] = runtime::f32_to_bf16(v);
        else if (t.dtype == DType::f16)
          t.data<uint16_t>()[i] = static_cast<uint16_t>(((e + 15) << 10) | (m << 7));
        else
          need(false, "a scale is f32, bf16 or f16");
      }
      return;
    case InputRole::plain:
      break;
  }
  switch (t.dtype) {
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) t.data<uint16_t>()[i] = runtime::f32_to_bf16(r.uniform());
      break;
    case DType::f32:
      for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = r.uniform();
      break;
    case DType::f16:
      // The bf16-rounded uniform values, exact in f16 (8 significant bits);
      // those below f16's normal range (2^-14) as 0.
      for (int64_t i = 0; i < n; ++i) {
        const float v = runtime::bf16_to_f32(runtime::f32_to_bf16(r.uniform()));
        uint16_t h = 0;
        if (std::fabs(v) >= 0x1p-14f) {
          int e;
          const float m = std::frexp(std::fabs(v), &e);  // v = m·2^e, m in [0.5, 1)
          h = static_cast<uint16_t>(((e - 1 + 15) << 10) |
                                    static_cast<int>(std::ldexp(m, 11) - 1024));
        }
        t.data<uint16_t>()[i] = static_cast<uint16_t>(h | (v < 0 ? 0x8000 : 0));
      }
      break;
    case DType::i32:
      for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(r.next() % 16);
      break;
    case DType::i64:
      for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = static_cast<int64_t>(r.next() % 16);
      break;
    case DType::u8:
    case DType::i8:
      for (int64_t i = 0; i < n; ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(r.next());
      break;
    case DType::f8e4m3:  // any code but the NaNs (0x7F, 0xFF)
      for (int64_t i = 0; i < n; ++i) {
        uint8_t c;
        do c = static_cast<uint8_t>(r.next());
        while ((c & 0x7F) == 0x7F);
        t.data<uint8_t>()[i] = c;
      }
      break;
    case DType::f8e5m2:
      // Codes of e4m3's range (exponent field <= 23: |x| <= 448), not Inf /
      // NaN: random scores of an e5m2 cache stay what an e4m3 cache's are
      // (the full range, to 57344, makes every softmax one-hot).
      for (int64_t i = 0; i < n; ++i) {
        uint8_t c;
        do c = static_cast<uint8_t>(r.next());
        while (((c >> 2) & 31) > 23);
        t.data<uint8_t>()[i] = c;
      }
      break;
    default:
      throw Error(fmt::format("{} is {}: no generator for it", what, dtype_name(t.dtype)));
  }
}

HostTensor random_tensor(const ir::Function& f, int id, const DimBindings& dims, uint64_t seed) {
  const ir::Value& param = f.value(id);
  const std::vector<int64_t> shape = bind_shape(param.type, dims);
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] < 0)
      throw UsageError(fmt::format("random input '{}' ({}): {} has no size; give --dim {}=SIZE",
                                   param.name, param.type.str(), param.type.dims[i].str(),
                                   param.type.dims[i].symbol));
  if (const auto stored = checkpoint_storage(f, id)) {
    // The int32-packed checkpoint tensor (eight random nibbles a word), or
    // MXFP4's code bytes (two random e2m1 codes a byte: every code is finite).
    HostTensor t = HostTensor::zeros(stored->dtype, stored->shape,
                                     fmt::format("random input '{}'", param.name));
    Rng r{seed * 0x2545F4914F6CDD1Dull ^ name_hash(param.name)};
    for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = static_cast<uint8_t>(r.next());
    return t;
  }
  HostTensor t =
      HostTensor::zeros(param.type.dtype, shape, fmt::format("random input '{}'", param.name));
  int64_t range = -1;
  int range_of = -1;
  const InputRole role = input_role(f, id, dims, &range, &range_of);
  if (range < 0 && range_of >= 0) {
    const ir::Dim& d = f.value(range_of).type.dims.at(0);
    throw UsageError(fmt::format(
        "random input '{}' ({}): its values must lie in [0, {}) (%{} dim 0), which has no size; "
        "give --dim {}=SIZE",
        param.name, param.type.str(), d.str(), f.value(range_of).name, d.symbol));
  }
  fill_role(t, role, range, seed * 0x2545F4914F6CDD1Dull ^ name_hash(param.name),
            fmt::format("random input '{}'", param.name));
  return t;
}

void set_threads_option(int threads) {
  if (threads == 0) return;  // the option was not given
  try {
    set_num_threads(threads);
  } catch (const Error& e) {
    // The runtime states the allowed range; the message names the option too.
    throw UsageError(fmt::format("--threads {}: {}", threads, e.what()));
  }
}

void check_seconds_option(double seconds) {
  if (!(seconds > 0 && seconds <= kMaxSeconds))
    throw UsageError(fmt::format(
        "--seconds {}: allowed: a number of seconds > 0 and at most {} (the timing budget)",
        seconds, kMaxSeconds));
}

int64_t calls_for_budget(double budget, double measured) {
  // 1 ns: below any call's cost, so the count stays below 2^42 for kMaxSeconds.
  const double calls = budget / std::max(measured, 1e-9);
  return calls < 1 ? 1 : static_cast<int64_t>(std::min(calls, 4e12));
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
