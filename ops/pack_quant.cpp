// pack_weight for the quantized formats (int8, fp8 e4m3, int4 AWQ / GPTQ /
// AutoRound), their unpack (the checkpoint tensors back, bit for bit) and
// dequantize (the logical weight), with every check on the checkpoint's
// tensors. Layouts: ops/packed_weight_impl.h and docs/quantized.md.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "codegen/quant_desc.h"
#include "ops/pack_quant_util.h"
#include "ops/packed_weight_impl.h"
#include "ops/quant_weight.h"
#include "ops/tensor_checks.h"
#include "runtime/bf16.h"
#include "runtime/int_math.h"
#include "runtime/quant_formats.h"

#include "runtime/api_guard.h"

namespace tilejit {

namespace ops {

// (No anonymous namespace: ops/pack_quant_util.h declares the helpers the
// MXFP4 packer shares.)

constexpr int64_t kBlockN = codegen::PackedLayout::kBlockN;

Buffer zeroed(size_t bytes) {
  Buffer b = runtime::aligned_alloc_bytes(std::max<size_t>(bytes, 64));
  std::memset(b.get(), 0, std::max<size_t>(bytes, 64));
  return b;
}

int64_t elem_bytes(DType t) {
  return std::max(1, dtype_bits(t) / 8);
}

// Element (i, j) of a checked 2-D view, or element i of a 1-D one.
template <class T>
T at2(const TensorView& t, int64_t i, int64_t j) {
  const auto* p = static_cast<const T*>(t.data);
  return p[i * t.strides[0] + j * t.strides[1]];
}
template <class T>
T at1(const TensorView& t, int64_t i) {
  return static_cast<const T*>(t.data)[i * t.strides[0]];
}

SavedTensor save(const TensorView& t) {
  SavedTensor s;
  s.present = true;
  s.dtype = t.dtype;
  s.shape = t.shape;
  const int64_t eb = elem_bytes(t.dtype);
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  s.bytes.resize(static_cast<size_t>(n * eb));
  const auto* src = static_cast<const uint8_t*>(t.data);
  if (t.shape.size() == 1) {
    for (int64_t i = 0; i < t.shape[0]; ++i)
      std::memcpy(&s.bytes[i * eb], src + i * t.strides[0] * eb, eb);
  } else {
    for (int64_t i = 0; i < t.shape[0]; ++i)
      for (int64_t j = 0; j < t.shape[1]; ++j)
        std::memcpy(&s.bytes[(i * t.shape[1] + j) * eb],
                    src + (i * t.strides[0] + j * t.strides[1]) * eb, eb);
  }
  return s;
}

// ±Inf scales are refused at packing: a zero code times an infinite scale is
// NaN on the kernels that scale each weight before the sum and ±Inf on those
// that scale a group's sum, so the outputs depended on the path, M and the
// int4 route (an outside tester's corrupt checkpoint). A NaN scale is kept:
// its column is NaN on every kernel.
void check_no_infinite_scale(const char* op, const TensorView& s) {
  const bool two = s.shape.size() == 2;
  const int64_t rows = s.shape[0], cols = two ? s.shape[1] : 1;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      float v = 0;
      if (s.dtype == DType::f32) {
        v = two ? at2<float>(s, i, j) : at1<float>(s, i);
      } else {
        const uint16_t b = two ? at2<uint16_t>(s, i, j) : at1<uint16_t>(s, i);
        v = s.dtype == DType::f16 ? runtime::f16_to_f32(b) : runtime::bf16_to_f32(b);
      }
      if (std::isinf(v))
        throw Error(
            fmt::format("{}: scales[{}] = {}; allowed: finite scales (a NaN one makes its "
                        "outputs NaN)",
                        op, two ? fmt::format("{}, {}", i, j) : std::to_string(i), v));
    }
}

// vLLM and compressed-tensors checkpoints keep per-channel (per-tensor)
// scales as [N, 1] ([1, 1]): the same values as [N] ([1]). The packers read
// them as those, and a rank-1 saved tensor is restored into either form.
static TensorView column_scales(const TensorView& s) {
  if (s.shape.size() == 2 && s.shape[1] == 1 && s.strides.size() == 2)
    return TensorView(s.data, s.dtype, {s.shape[0]}, {s.strides[0]});
  return s;
}

// Per-channel or per-tensor scales, as column_scales gives them: [N] or [1].
static void check_column_scales(const char* op, const TensorView& s, int64_t N) {
  check_view(op, "scales", s, 1);
  if (s.shape[0] != N && s.shape[0] != 1)
    throw Error(
        fmt::format("{}: scales has shape {}; allowed: [N] = [{}] or [1] (or [N, 1], "
                    "[1, 1])",
                    op, shape_str(s.shape), N));
}

void check_restore(const char* op, const char* arg, const SavedTensor& s,
                   const TensorView& out_in) {
  const TensorView out = s.shape.size() == 1 ? column_scales(out_in) : out_in;
  check_view(op, arg, out, s.shape.size());
  check_dtype(op, arg, out, {s.dtype});
  check_writable(op, arg, out);
  if (out.shape != s.shape)
    throw Error(fmt::format("{}: {} has shape {}; allowed: {} (as packed)", op, arg,
                            shape_str(out.shape), shape_str(s.shape)));
}

void restore(const char* op, const char* arg, const SavedTensor& s, const TensorView& out_in) {
  check_restore(op, arg, s, out_in);
  const TensorView out = s.shape.size() == 1 ? column_scales(out_in) : out_in;
  const int64_t eb = elem_bytes(s.dtype);
  auto* dst = static_cast<uint8_t*>(out.data);
  if (s.shape.size() == 1) {
    for (int64_t i = 0; i < s.shape[0]; ++i)
      std::memcpy(dst + i * out.strides[0] * eb, &s.bytes[i * eb], eb);
  } else {
    for (int64_t i = 0; i < s.shape[0]; ++i)
      for (int64_t j = 0; j < s.shape[1]; ++j)
        std::memcpy(dst + (i * out.strides[0] + j * out.strides[1]) * eb,
                    &s.bytes[(i * s.shape[1] + j) * eb], eb);
  }
}

template <class T>
T saved_at(const SavedTensor& s, int64_t i, int64_t j = 0) {
  T v;
  const int64_t cols = s.shape.size() == 2 ? s.shape[1] : 1;
  std::memcpy(&v, &s.bytes[(i * cols + j) * sizeof(T)], sizeof(T));
  return v;
}

double scale_value(const SavedTensor& s, int64_t i, int64_t j) {
  switch (s.dtype) {
    case DType::f16:
      return runtime::f16_to_f32(saved_at<uint16_t>(s, i, j));
    case DType::bf16:
      return runtime::bf16_to_f32(saved_at<uint16_t>(s, i, j));
    default:
      return saved_at<float>(s, i, j);
  }
}

// ---- the packed K order (fp8 blocks and int4 groups) ----------------------------

// From the group of each input channel: the packed order (sorted by group,
// stable), a padding position after each odd-length run so that no k-pair
// holds two groups, and the scale row of every k-pair row.
void build_order(QuantTables& q, const std::vector<int32_t>& group_of, int64_t n_groups) {
  const int64_t K = static_cast<int64_t>(group_of.size());
  std::vector<int32_t> order(static_cast<size_t>(K));
  std::iota(order.begin(), order.end(), 0);
  // Stable by construction (the channel breaks ties): std::stable_sort's
  // libstdc++ buffer trips clang's deprecation warning.
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return group_of[a] != group_of[b] ? group_of[a] < group_of[b] : a < b;
  });
  std::vector<int32_t> perm, pos_group;
  perm.reserve(static_cast<size_t>(K + K / 2 + 2));
  for (int64_t i = 0; i < K; ++i) {
    const int32_t g = group_of[order[i]];
    if (i > 0 && g != group_of[order[i - 1]] && perm.size() % 2 != 0) {
      perm.push_back(-1);  // pads the previous group's run to even length
      pos_group.push_back(group_of[order[i - 1]]);
    }
    perm.push_back(order[i]);
    pos_group.push_back(g);
  }
  q.k_packed = static_cast<int64_t>(perm.size());
  q.n_groups = n_groups;
  q.pos_of.assign(static_cast<size_t>(K), 0);
  bool identity = q.k_packed == K;
  for (int64_t p = 0; p < q.k_packed; ++p) {
    if (perm[p] >= 0) q.pos_of[perm[p]] = p;
    identity = identity && perm[p] == p;
  }
  const codegen::PackedLayout geo{1, q.k_packed};
  q.groups.assign(static_cast<size_t>(geo.k_pairs()), pos_group.empty() ? 0 : pos_group.back());
  for (int64_t p = 0; p < q.k_packed; p += 2) q.groups[p / 2] = pos_group[p];
  if (!identity) q.perm = std::move(perm);
}

// The fp8 / int4 packing's common part: the packed K order into the tables,
// the tables into the weight, and the zeroed code buffer (returned).
uint8_t* place_tables(PackedWeight::Impl& impl, std::unique_ptr<QuantTables> q,
                      const std::vector<int32_t>& group_of, int64_t n_groups) {
  build_order(*q, group_of, n_groups);
  impl.quant = std::move(q);
  impl.data_bytes = static_cast<size_t>(impl.run_layout().n_blocks() * impl.code_block_bytes());
  impl.data = zeroed(impl.data_bytes);
  return reinterpret_cast<uint8_t*>(impl.data.get());
}

std::string shape_of(int64_t a, int64_t b) {
  return fmt::format("[{}, {}]", a, b);
}

// Whether every scale of the table is 0, non-finite or large enough that
// no dequantized product is an f32 subnormal.
bool normal_products(const float* s, size_t count, DType code) {
  const float min = codegen::DequantDesc::normal_scale_min(code);
  for (size_t i = 0; i < count; ++i)
    if (s[i] != 0 && std::isfinite(s[i]) && (std::fabs(s[i]) < min || std::fabs(s[i]) > 0x1p100f))
      return false;
  return true;
}

void QuantTables::set_row_map(std::vector<int64_t> map, int64_t n) {
  if (!map.empty()) {
    const int64_t cols = (n + kBlockN - 1) / kBlockN * kBlockN;
    std::vector<bool> used(static_cast<size_t>(cols), false);
    bool ok = static_cast<int64_t>(map.size()) == n;
    for (size_t i = 0; ok && i < map.size(); ++i) {
      ok = map[i] >= 0 && map[i] < cols && !used[map[i]];
      if (ok) used[map[i]] = true;
    }
    if (!ok)
      throw Error(fmt::format(
          "pack_weight: the row map of {} entries is not a permutation of {} rows into [0, {})",
          map.size(), n, cols));
  }
  row_of = std::move(map);
}

Int4Term int4_term(const PackedWeight::Impl& p, int64_t n, int64_t k) {
  const QuantTables& q = *p.quant;
  const int64_t pos = q.pos_of[k], pr = q.packed_row(n);
  const uint8_t byte =
      p.bytes()[pr / kBlockN * p.code_block_bytes() + pos / 2 * q.code_row_bytes + pr % kBlockN];
  Int4Term t;
  t.code = (byte >> (4 * (pos % 2))) & 0xF;
  t.group = q.g_idx_in.present ? saved_at<int32_t>(q.g_idx_in, k)
            : q.group_size < 0 ? 0
                               : k / q.group_size;
  if (q.qzeros_in.present) {
    const auto* zw = reinterpret_cast<const int32_t*>(q.qzeros_in.bytes.data());
    const int64_t words = q.qzeros_in.shape[1];
    t.zero = p.format == WeightFormat::int4_awq
                 ? runtime::awq_at(zw, words, t.group, n)
                 : runtime::gptq_zero_at(zw, words, t.group, n, !q.gptq_v2);
  }
  t.scale = scale_value(q.scales_in, t.group, n);
  return t;
}

double weight_value(const PackedWeight::Impl& p, int64_t n, int64_t k) {
  if (p.quant == nullptr) return runtime::bf16_to_f32(p.bf16()[p.layout.index(n, k)]);
  const QuantTables& q = *p.quant;
  switch (p.format) {
    case WeightFormat::bf16:
      break;
    case WeightFormat::int8: {
      const auto code = static_cast<int8_t>(p.bytes()[p.int8.index(q.packed_row(n), k)]);
      const int64_t si = q.scales_in.shape[0] == 1 ? 0 : n;
      return double(code) * double(saved_at<float>(q.scales_in, si));
    }
    case WeightFormat::fp8_e4m3: {
      const int64_t pos = q.pos_of[k], pr = q.packed_row(n);
      const uint8_t code = p.bytes()[pr / kBlockN * p.code_block_bytes() +
                                     pos / 2 * q.code_row_bytes + pr % kBlockN * 2 + pos % 2];
      double s;
      if (q.block_n > 0)
        s = saved_at<float>(q.scales_in, n / q.block_n, k / q.block_k);
      else
        s = saved_at<float>(q.scales_in, q.scales_in.shape[0] == 1 ? 0 : n);
      return double(runtime::e4m3_to_f32(code)) * s;
    }
    case WeightFormat::int4_awq:
    case WeightFormat::int4_gptq: {
      const Int4Term t = int4_term(p, n, k);
      return runtime::dequant_int4(t.code, t.zero, t.scale);
    }
    case WeightFormat::mxfp4: {  // int4's code layout; scales_in: the e8m0 bytes [N, G]
      const int64_t pos = q.pos_of[k], pr = q.packed_row(n);
      const uint8_t byte = p.bytes()[pr / kBlockN * p.code_block_bytes() +
                                     pos / 2 * q.code_row_bytes + pr % kBlockN];
      const uint8_t e = saved_at<uint8_t>(q.scales_in, n, k / q.group_size);
      return double(runtime::e2m1_to_f32(static_cast<uint8_t>((byte >> (4 * (pos % 2))) & 0xF))) *
             std::ldexp(1.0, int(e) - 127);
    }
  }
  return 0;
}

std::string quant_layout_name(const PackedWeight::Impl& p) {
  if (p.quant == nullptr) return PackedWeight::Impl::kLayoutName;
  const QuantTables& q = *p.quant;
  switch (p.format) {
    case WeightFormat::bf16:
      break;
    case WeightFormat::int8:
      return fmt::format("i8_vnni4_n64k64_{}",
                         q.scales_in.shape[0] == 1 && p.layout.n > 1 ? "tensor" : "channel");
    case WeightFormat::fp8_e4m3:
      if (q.block_n > 0) return fmt::format("f8e4m3_vnni2_n64k32_block{}x{}", q.block_n, q.block_k);
      return fmt::format("f8e4m3_vnni2_n64k32_{}",
                         q.scales_in.shape[0] == 1 && p.layout.n > 1 ? "tensor" : "channel");
    case WeightFormat::int4_awq:
    case WeightFormat::int4_gptq:
      return fmt::format("u4_{}_vnni2_n64k32_g{}{}{}{}",
                         p.format == WeightFormat::int4_awq ? "awq" : "gptq",
                         q.group_size < 0 ? std::string("ch") : std::to_string(q.group_size),
                         q.qzeros_in.present ? "_zp" : "", q.g_idx_in.present ? "_gidx" : "",
                         q.perm.empty() ? "" : "_perm");
    case WeightFormat::mxfp4:
      return "f4e2m1_mx_vnni2_n64k32_g32";
  }
  return "?";
}

}  // namespace ops

using ops::kBlockN;
using ops::QuantTables;

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::bf16:
      return "bf16";
    case WeightFormat::int8:
      return "int8";
    case WeightFormat::fp8_e4m3:
      return "fp8_e4m3";
    case WeightFormat::int4_awq:
      return "int4_awq";
    case WeightFormat::int4_gptq:
      return "int4_gptq";
    case WeightFormat::mxfp4:
      return "mxfp4";
  }
  throw Error(
      fmt::format("weight_format_name: {} is not a WeightFormat; allowed: bf16, int8, "
                  "fp8_e4m3, int4_awq, int4_gptq, mxfp4",
                  static_cast<int>(f)));
}

// ---- int8 ------------------------------------------------------------------------

namespace ops {

PackedWeight pack_int8(const Int8Weight& w_in, std::vector<int64_t> row_of) {
  const char* op = "pack_weight(int8)";
  Int8Weight w = w_in;
  w.scales = column_scales(w.scales);
  ops::check_view(op, "weight", w.weight, 2);
  ops::check_dtype(op, "weight", w.weight, {DType::i8});
  ops::check_row_major_rows(op, "weight", w.weight);
  const int64_t N = w.weight.shape[0], K = w.weight.shape[1];
  if (N < 1 || K < 1)
    throw Error(fmt::format("{}: weight has shape {}; allowed: N >= 1 and K >= 1", op,
                            ops::shape_str(w.weight.shape)));
  if (K > ops::kInt8MaxK)
    throw Error(
        fmt::format("{}: K={}; allowed: K <= {} (the int32 dot products of u8 x s8 "
                    "codes stay exact up to there)",
                    op, K, ops::kInt8MaxK));
  check_column_scales(op, w.scales, N);
  ops::check_dtype(op, "scales", w.scales, {DType::f32});
  ops::check_no_infinite_scale(op, w.scales);
  auto impl = std::make_shared<PackedWeight::Impl>();
  impl->format = WeightFormat::int8;
  impl->dtype = DType::i8;
  impl->layout = {N, K};
  impl->int8 = {N, K};
  const auto& L = impl->int8;
  impl->data_bytes = static_cast<size_t>(L.total_bytes());
  impl->data = ops::zeroed(impl->data_bytes);
  auto q = std::make_unique<QuantTables>();
  q->set_row_map(std::move(row_of), N);
  q->scales_in = ops::save(w.scales);
  const int64_t cols = L.n_blocks() * kBlockN;
  q->col_scale = ops::zeroed(static_cast<size_t>(cols) * 4);
  q->col_comp = ops::zeroed(static_cast<size_t>(cols) * 4);
  auto* dst = reinterpret_cast<int8_t*>(impl->data.get());
  auto* cs = reinterpret_cast<float*>(q->col_scale.get());
  auto* cc = reinterpret_cast<int32_t*>(q->col_comp.get());
  for (int64_t n = 0; n < N; ++n) {
    const auto* row = static_cast<const int8_t*>(w.weight.data) + n * w.weight.strides[0];
    const int64_t pr = q->packed_row(n);
    int32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) {
      dst[L.index(pr, k)] = row[k];
      sum += row[k];
    }
    cc[pr] = sum;
    cs[pr] = ops::at1<float>(w.scales, w.scales.shape[0] == 1 ? 0 : n);
  }
  impl->quant = std::move(q);
  impl->layout_name = ops::quant_layout_name(*impl);
  return PackedWeight(std::move(impl));
}

// ---- fp8 e4m3 --------------------------------------------------------------------

PackedWeight pack_fp8(const Fp8Weight& w_in, std::vector<int64_t> row_of) {
  const char* op = "pack_weight(fp8)";
  Fp8Weight w = w_in;
  if (w.block_n == 0 && w.block_k == 0) w.scales = column_scales(w.scales);
  ops::check_view(op, "weight", w.weight, 2);
  ops::check_dtype(op, "weight", w.weight, {DType::f8e4m3});
  const int64_t N = w.weight.shape[0], K = w.weight.shape[1];
  if (N < 1 || K < 1)
    throw Error(fmt::format("{}: weight has shape {}; allowed: N >= 1 and K >= 1", op,
                            ops::shape_str(w.weight.shape)));
  const bool block = w.block_n != 0 || w.block_k != 0;
  if (block) {
    if (w.block_n < 1 || w.block_k < 2 || w.block_k % 2 != 0)
      throw Error(
          fmt::format("{}: block_n={} block_k={}; allowed: block_n >= 1 and block_k an "
                      "even number >= 2 (or both 0 for per-tensor / per-channel scales)",
                      op, w.block_n, w.block_k));
    ops::check_view(op, "scales", w.scales, 2);
    const int64_t gn = runtime::ceil_div(N, w.block_n), gk = runtime::ceil_div(K, w.block_k);
    if (w.scales.shape[0] != gn || w.scales.shape[1] != gk)
      throw Error(fmt::format(
          "{}: scales has shape {}; allowed: [ceil(N/block_n), "
          "ceil(K/block_k)] = {} for N={} K={} block {}x{}",
          op, ops::shape_str(w.scales.shape), ops::shape_of(gn, gk), N, K, w.block_n, w.block_k));
  } else {
    if (w.scales.shape.size() != 1)
      throw Error(
          fmt::format("{}: scales has rank {}; allowed: [1] or [N], or [N, 1] (block scales "
                      "need block_n and block_k)",
                      op, w.scales.shape.size()));
    check_column_scales(op, w.scales, N);
  }
  ops::check_dtype(op, "scales", w.scales, {DType::f32});
  ops::check_no_infinite_scale(op, w.scales);
  // NaN codes first: nothing is allocated for a bad checkpoint.
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t c = ops::at2<uint8_t>(w.weight, n, k);
      if ((c & 0x7F) == 0x7F)
        throw Error(
            fmt::format("{}: weight[{}, {}] = 0x{:02x} is an e4m3 NaN code; allowed: "
                        "finite e4m3 values",
                        op, n, k, c));
    }

  auto impl = std::make_shared<PackedWeight::Impl>();
  impl->format = WeightFormat::fp8_e4m3;
  impl->dtype = DType::f8e4m3;
  impl->layout = {N, K};
  auto q = std::make_unique<QuantTables>();
  q->set_row_map(std::move(row_of), N);
  q->code_row_bytes = 128;
  q->block_n = block ? w.block_n : 0;
  q->block_k = block ? w.block_k : 0;
  q->scales_in = ops::save(w.scales);
  std::vector<int32_t> group_of(static_cast<size_t>(K), 0);
  const int64_t G = block ? runtime::ceil_div(K, w.block_k) : 1;
  if (block)
    for (int64_t k = 0; k < K; ++k) group_of[k] = static_cast<int32_t>(k / w.block_k);
  uint8_t* codes = ops::place_tables(*impl, std::move(q), group_of, G);
  QuantTables& t = *impl->quant;
  const codegen::PackedLayout geo = impl->run_layout();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t pos = t.pos_of[k], pr = t.packed_row(n);
      codes[pr / kBlockN * impl->code_block_bytes() + pos / 2 * 128 + pr % kBlockN * 2 + pos % 2] =
          ops::at2<uint8_t>(w.weight, n, k);
    }
  t.scales = ops::zeroed(static_cast<size_t>(geo.n_blocks() * G * kBlockN) * 4);
  auto* s = reinterpret_cast<float*>(t.scales.get());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      float v;
      if (block)
        v = ops::at2<float>(w.scales, n / w.block_n, g);
      else
        v = ops::at1<float>(w.scales, w.scales.shape[0] == 1 ? 0 : n);
      const int64_t pr = t.packed_row(n);
      s[(pr / kBlockN * G + g) * kBlockN + pr % kBlockN] = v;
    }
  t.normal_products =
      ops::normal_products(s, static_cast<size_t>(geo.n_blocks() * G * kBlockN), DType::f8e4m3);
  impl->layout_name = ops::quant_layout_name(*impl);
  return PackedWeight(std::move(impl));
}

// ---- int4 ------------------------------------------------------------------------

// The one rule for an int4 group size, for pack_weight and for the
// AutoRound config that fills it.
void check_int4_group_size(const char* op, int64_t group_size) {
  if (group_size == 0 || group_size < -1)
    throw Error(
        fmt::format("{}: group_size={}; allowed: a group size >= 1 (32, 64, 128, ...) or "
                    "-1 (per channel)",
                    op, group_size));
}

PackedWeight pack_int4(const Int4Weight& w, std::vector<int64_t> row_of) {
  const char* op = "pack_weight(int4)";
  if (w.format != Int4Format::awq && w.format != Int4Format::gptq)
    throw Error(fmt::format("{}: format={} is not an Int4Format; allowed: awq, gptq", op,
                            static_cast<int>(w.format)));
  const bool awq = w.format == Int4Format::awq;
  if (w.bits != 4) throw Error(fmt::format("{}: bits={}; allowed: 4", op, w.bits));
  check_int4_group_size(op, w.group_size);
  if (awq && w.gptq_v2)
    throw Error(
        fmt::format("{}: gptq_v2=true with format=awq; allowed: gptq_v2 only with gptq "
                    "(AWQ stores the zero points themselves)",
                    op));
  ops::check_view(op, "qweight", w.qweight, 2);
  ops::check_dtype(op, "qweight", w.qweight, {DType::i32});
  ops::check_row_major_rows(op, "qweight", w.qweight);
  const int64_t rows = w.qweight.shape[0], cols = w.qweight.shape[1];
  const int64_t full_n = awq ? cols * 8 : cols, full_k = awq ? rows : rows * 8;
  const int64_t N = w.n != 0 ? w.n : full_n, K = w.k != 0 ? w.k : full_k;
  auto packed_dim_ok = [](int64_t v, int64_t full, bool by8) {
    return v >= 1 && v <= full && (!by8 || (v + 7) / 8 == full / 8);
  };
  if (!packed_dim_ok(N, full_n, awq) || !packed_dim_ok(K, full_k, !awq) || full_n < 1 || full_k < 1)
    throw Error(
        fmt::format("{}: n={} k={} with qweight {} ({}); allowed: N in [{}, {}] and K in "
                    "[{}, {}] (the packed dimension may only drop its last word's padding)",
                    op, w.n, w.k, ops::shape_str(w.qweight.shape), awq ? "awq" : "gptq",
                    awq ? full_n - 7 : full_n, full_n, awq ? full_k : full_k - 7, full_k));
  const int64_t G = w.g_idx            ? (w.scales.shape.empty() ? 0 : w.scales.shape[0])
                    : w.group_size < 0 ? 1
                                       : runtime::ceil_div(K, w.group_size);
  ops::check_view(op, "scales", w.scales, 2);
  ops::check_dtype(op, "scales", w.scales, {DType::f16, DType::bf16, DType::f32});
  if (w.scales.shape[0] != G || w.scales.shape[1] != N || G < 1)
    throw Error(fmt::format("{}: scales has shape {}; allowed: [G, N] = {} (G = {})", op,
                            ops::shape_str(w.scales.shape),
                            ops::shape_of(std::max<int64_t>(G, 1), N),
                            w.g_idx ? "g_idx's groups: scales.shape[0] >= 1"
                                    : fmt::format("ceil(K / group_size) = {}", G)));
  ops::check_no_infinite_scale(op, w.scales);
  if (w.qzeros) {
    ops::check_view(op, "qzeros", *w.qzeros, 2);
    ops::check_dtype(op, "qzeros", *w.qzeros, {DType::i32});
    ops::check_row_major_rows(op, "qzeros", *w.qzeros);
    if (w.qzeros->shape[0] != G || w.qzeros->shape[1] != (N + 7) / 8)
      throw Error(fmt::format("{}: qzeros has shape {}; allowed: [G, ceil(N/8)] = {}", op,
                              ops::shape_str(w.qzeros->shape), ops::shape_of(G, (N + 7) / 8)));
  }
  std::vector<int32_t> group_of(static_cast<size_t>(K));
  if (w.g_idx) {
    ops::check_view(op, "g_idx", *w.g_idx, 1);
    ops::check_dtype(op, "g_idx", *w.g_idx, {DType::i32});
    if (w.g_idx->shape[0] != K)
      throw Error(fmt::format("{}: g_idx has shape {}; allowed: [K] = [{}]", op,
                              ops::shape_str(w.g_idx->shape), K));
    std::vector<int64_t> count(static_cast<size_t>(G), 0);
    for (int64_t k = 0; k < K; ++k) {
      const int32_t g = ops::at1<int32_t>(*w.g_idx, k);
      if (g < 0 || g >= G)
        throw Error(fmt::format("{}: g_idx[{}] = {}; allowed: a group in [0, {}) (scales' rows)",
                                op, k, g, G));
      if (w.group_size > 0 && ++count[g] > w.group_size)
        throw Error(
            fmt::format("{}: g_idx puts more than group_size={} input channels in group "
                        "{} (at g_idx[{}]); allowed: at most group_size per group",
                        op, w.group_size, g, k));
      group_of[k] = g;
    }
  } else {
    for (int64_t k = 0; k < K; ++k)
      group_of[k] = static_cast<int32_t>(w.group_size < 0 ? 0 : k / w.group_size);
  }

  auto impl = std::make_shared<PackedWeight::Impl>();
  impl->format = awq ? WeightFormat::int4_awq : WeightFormat::int4_gptq;
  impl->dtype = DType::u4;
  impl->layout = {N, K};
  auto q = std::make_unique<QuantTables>();
  q->set_row_map(std::move(row_of), N);
  q->code_row_bytes = 64;
  q->int4_format = w.format;
  q->gptq_v2 = w.gptq_v2;
  q->group_size = w.group_size;
  q->qweight_shape = w.qweight.shape;
  q->scales_in = ops::save(w.scales);
  if (w.qzeros) q->qzeros_in = ops::save(*w.qzeros);
  if (w.g_idx) q->g_idx_in = ops::save(*w.g_idx);
  uint8_t* codes = ops::place_tables(*impl, std::move(q), group_of, G);
  QuantTables& t = *impl->quant;
  const codegen::PackedLayout geo = impl->run_layout();
  const auto* qw = static_cast<const int32_t*>(w.qweight.data);
  const int64_t qstride = w.qweight.strides[0];
  for (int64_t k = 0; k < K; ++k) {
    const int64_t pos = t.pos_of[k];
    for (int64_t n = 0; n < N; ++n) {
      const int v =
          awq ? runtime::awq_at(qw, qstride, k, n) : runtime::gptq_q_at(qw, qstride, k, n);
      const int64_t pr = t.packed_row(n);
      codes[pr / kBlockN * impl->code_block_bytes() + pos / 2 * 64 + pr % kBlockN] |=
          static_cast<uint8_t>(v << (4 * (pos % 2)));
    }
  }
  t.scales = ops::zeroed(static_cast<size_t>(geo.n_blocks() * G * kBlockN) * 4);
  auto* s = reinterpret_cast<float*>(t.scales.get());
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t pr = t.packed_row(n);
      s[(pr / kBlockN * G + g) * kBlockN + pr % kBlockN] =
          static_cast<float>(ops::scale_value(t.scales_in, g, n));
    }
  t.normal_products =
      ops::normal_products(s, static_cast<size_t>(geo.n_blocks() * G * kBlockN), DType::u4);
  if (w.qzeros) {
    t.zeros = ops::zeroed(static_cast<size_t>(geo.n_blocks() * G * kBlockN));
    auto* z = reinterpret_cast<uint8_t*>(t.zeros.get());
    const auto* zw = static_cast<const int32_t*>(w.qzeros->data);
    const int64_t zstride = w.qzeros->strides[0];
    for (int64_t g = 0; g < G; ++g)
      for (int64_t n = 0; n < N; ++n) {
        const int64_t pr = t.packed_row(n);
        z[(pr / kBlockN * G + g) * kBlockN + pr % kBlockN] =
            static_cast<uint8_t>(awq ? runtime::awq_at(zw, zstride, g, n)
                                     : runtime::gptq_zero_at(zw, zstride, g, n, !w.gptq_v2));
      }
  }
  // The padding positions (past K, and after an odd-length act-order group)
  // hold their group's zero point, not 0: the dequant kernels compute
  // (q − z)·s there too, and (0 − z)·s is ±Inf in bf16 for a finite scale
  // past ~2^124, which the zero activations there turn into NaN outputs of
  // a row whose weights are all 0 (fuzz/crashes/experts-int4-pad-huge-scale).
  std::vector<bool> real(2 * t.groups.size(), false);
  for (int64_t k = 0; k < K; ++k) real[static_cast<size_t>(t.pos_of[k])] = true;
  const auto* zp = t.zeros ? reinterpret_cast<const uint8_t*>(t.zeros.get()) : nullptr;
  for (size_t pos = 0; pos < real.size(); ++pos) {
    if (real[pos]) continue;
    const int64_t g = t.groups[pos / 2];
    for (int64_t n = 0; n < N; ++n) {
      const int64_t pr = t.packed_row(n);
      const int z = zp != nullptr ? zp[(pr / kBlockN * G + g) * kBlockN + pr % kBlockN] : 8;
      codes[pr / kBlockN * impl->code_block_bytes() + int64_t(pos) / 2 * 64 + pr % kBlockN] |=
          static_cast<uint8_t>(z << (4 * (pos % 2)));
    }
  }
  impl->layout_name = ops::quant_layout_name(*impl);
  return PackedWeight(std::move(impl));
}

}  // namespace ops

PackedWeight pack_weight(const Int8Weight& w) {
  return runtime::api_guard("pack_weight", [&]() -> PackedWeight { return ops::pack_int8(w, {}); });
}
PackedWeight pack_weight(const Fp8Weight& w) {
  return runtime::api_guard("pack_weight", [&]() -> PackedWeight { return ops::pack_fp8(w, {}); });
}
PackedWeight pack_weight(const Int4Weight& w) {
  return runtime::api_guard("pack_weight", [&]() -> PackedWeight { return ops::pack_int4(w, {}); });
}

Int4Weight int4_weight_from_config(const AutoRoundConfig& c, const TensorView& qweight,
                                   const TensorView& scales, std::optional<TensorView> qzeros,
                                   std::optional<TensorView> g_idx) {
  const char* op = "int4_weight_from_config";
  if (c.bits != 4) throw Error(fmt::format("{}: bits={}; allowed: 4", op, c.bits));
  ops::check_int4_group_size(op, c.group_size);
  std::string fmt_name = c.checkpoint_format;
  if (fmt_name.rfind("auto_round:", 0) == 0) fmt_name = fmt_name.substr(11);
  Int4Weight w;
  if (fmt_name == "auto_gptq" || fmt_name == "gptq") {
    w.format = Int4Format::gptq;
  } else if (fmt_name == "gptq_v2" || fmt_name == "gptqmodel") {
    // AutoRound's "auto_round:gptqmodel" packs GPTQ's layout with the zero
    // points stored as they are (its torch QuantLinear, unlike the
    // auto_gptq one, does not subtract 1): GPTQ v2.
    w.format = Int4Format::gptq;
    w.gptq_v2 = true;
  } else if (fmt_name == "auto_awq" || fmt_name == "awq") {
    w.format = Int4Format::awq;
  } else {
    throw Error(
        fmt::format("{}: checkpoint_format=\"{}\"; allowed: auto_gptq, gptq, gptq_v2, "
                    "gptqmodel, auto_awq, awq (optionally prefixed auto_round:)",
                    op, c.checkpoint_format));
  }
  if (c.desc_act && !g_idx)
    throw Error(
        fmt::format("{}: desc_act=true but no g_idx; allowed: desc_act with the "
                    "checkpoint's g_idx tensor",
                    op));
  if (c.desc_act && w.format == Int4Format::awq)
    throw Error(
        fmt::format("{}: desc_act=true with checkpoint_format=\"{}\"; allowed: desc_act "
                    "with a GPTQ export (AWQ has no g_idx)",
                    op, c.checkpoint_format));
  if (!c.sym && !qzeros)
    throw Error(
        fmt::format("{}: sym=false but no qzeros; allowed: asymmetric checkpoints with "
                    "their qzeros tensor",
                    op));
  w.qweight = qweight;
  w.scales = scales;
  w.qzeros = qzeros;
  w.g_idx = g_idx;
  w.bits = c.bits;
  w.group_size = c.group_size;
  return w;
}

// ---- unpack and dequantize -------------------------------------------------------

namespace ops {

const PackedWeight::Impl& need_format(const PackedWeight::Impl* impl, const char* op,
                                      std::initializer_list<WeightFormat> allowed) {
  if (impl == nullptr)
    throw Error(
        fmt::format("{}: the PackedWeight is empty; allowed: a weight from pack_weight()", op));
  for (WeightFormat f : allowed)
    if (impl->format == f) return *impl;
  throw Error(fmt::format("{}: the weight was packed as {}; allowed: the unpack of its own format",
                          op, weight_format_name(impl->format)));
}

}  // namespace ops

using ops::need_format;

namespace ops {

namespace {
// The [N, K] code tensor an int8 / fp8 unpack writes.
void check_codes_out(const char* op, const PackedWeight::Impl& p, const TensorView& weight,
                     DType codes) {
  check_view(op, "weight", weight, 2);
  check_dtype(op, "weight", weight, {codes});
  check_writable(op, "weight", weight);
  if (weight.shape != std::vector<int64_t>{p.layout.n, p.layout.k})
    throw Error(fmt::format("{}: weight has shape {}; allowed: {}", op, shape_str(weight.shape),
                            shape_of(p.layout.n, p.layout.k)));
}
}  // namespace

void check_unpack(const PackedWeight::Impl* impl, const Int8Weight& out) {
  const char* op = "PackedWeight::unpack(int8)";
  const PackedWeight::Impl& p = need_format(impl, op, {WeightFormat::int8});
  check_codes_out(op, p, out.weight, DType::i8);
  check_restore(op, "scales", p.quant->scales_in, out.scales);
}

void check_unpack(const PackedWeight::Impl* impl, const Fp8Weight& out) {
  const char* op = "PackedWeight::unpack(fp8)";
  const PackedWeight::Impl& p = need_format(impl, op, {WeightFormat::fp8_e4m3});
  const QuantTables& q = *p.quant;
  check_codes_out(op, p, out.weight, DType::f8e4m3);
  if (out.block_n != q.block_n || out.block_k != q.block_k)
    throw Error(fmt::format("{}: block_n={} block_k={}; allowed: {} and {} (as packed)", op,
                            out.block_n, out.block_k, q.block_n, q.block_k));
  check_restore(op, "scales", q.scales_in, out.scales);
}

void check_unpack(const PackedWeight::Impl* impl, const Int4Weight& out) {
  const char* op = "PackedWeight::unpack(int4)";
  const PackedWeight::Impl& p =
      need_format(impl, op, {WeightFormat::int4_awq, WeightFormat::int4_gptq});
  const QuantTables& q = *p.quant;
  const bool awq = p.format == WeightFormat::int4_awq;
  if (out.format != q.int4_format)
    throw Error(fmt::format("{}: format={}; allowed: {} (as packed)", op,
                            out.format == Int4Format::awq ? "awq" : "gptq", awq ? "awq" : "gptq"));
  check_view(op, "qweight", out.qweight, 2);
  check_dtype(op, "qweight", out.qweight, {DType::i32});
  check_row_major_rows(op, "qweight", out.qweight);
  check_writable(op, "qweight", out.qweight);
  if (out.qweight.shape != q.qweight_shape)
    throw Error(fmt::format("{}: qweight has shape {}; allowed: {} (as packed)", op,
                            shape_str(out.qweight.shape), shape_str(q.qweight_shape)));
  if (out.qzeros.has_value() != q.qzeros_in.present || out.g_idx.has_value() != q.g_idx_in.present)
    throw Error(fmt::format(
        "{}: qzeros {} and g_idx {}; allowed: qzeros {} and g_idx {} (as "
        "packed)",
        op, out.qzeros ? "given" : "absent", out.g_idx ? "given" : "absent",
        q.qzeros_in.present ? "given" : "absent", q.g_idx_in.present ? "given" : "absent"));
  check_restore(op, "scales", q.scales_in, out.scales);
  if (out.qzeros) check_restore(op, "qzeros", q.qzeros_in, *out.qzeros);
  if (out.g_idx) check_restore(op, "g_idx", q.g_idx_in, *out.g_idx);
}

}  // namespace ops

void PackedWeight::unpack(const Int8Weight& out) const {
  const char* op = "PackedWeight::unpack(int8)";
  ops::check_unpack(impl_.get(), out);
  const Impl& p = *impl_;
  auto* dst = static_cast<uint8_t*>(out.weight.data);
  for (int64_t n = 0; n < p.layout.n; ++n)
    for (int64_t k = 0; k < p.layout.k; ++k)
      dst[n * out.weight.strides[0] + k * out.weight.strides[1]] =
          p.bytes()[p.int8.index(p.quant->packed_row(n), k)];
  ops::restore(op, "scales", p.quant->scales_in, out.scales);
}

void PackedWeight::unpack(const Fp8Weight& out) const {
  const char* op = "PackedWeight::unpack(fp8)";
  ops::check_unpack(impl_.get(), out);
  const Impl& p = *impl_;
  const QuantTables& q = *p.quant;
  auto* dst = static_cast<uint8_t*>(out.weight.data);
  for (int64_t n = 0; n < p.layout.n; ++n)
    for (int64_t k = 0; k < p.layout.k; ++k) {
      const int64_t pos = q.pos_of[k], pr = q.packed_row(n);
      dst[n * out.weight.strides[0] + k * out.weight.strides[1]] =
          p.bytes()[pr / 64 * p.code_block_bytes() + pos / 2 * 128 + pr % 64 * 2 + pos % 2];
    }
  ops::restore(op, "scales", q.scales_in, out.scales);
}

void PackedWeight::unpack(const Int4Weight& out) const {
  const char* op = "PackedWeight::unpack(int4)";
  ops::check_unpack(impl_.get(), out);
  const Impl& p = *impl_;
  const QuantTables& q = *p.quant;
  const bool awq = p.format == WeightFormat::int4_awq;
  auto* qw = static_cast<int32_t*>(out.qweight.data);
  const int64_t stride = out.qweight.strides[0];
  for (int64_t r = 0; r < q.qweight_shape[0]; ++r)
    for (int64_t c = 0; c < q.qweight_shape[1]; ++c) qw[r * stride + c] = 0;
  for (int64_t k = 0; k < p.layout.k; ++k) {
    const int64_t pos = q.pos_of[k];
    for (int64_t n = 0; n < p.layout.n; ++n) {
      const int64_t pr = q.packed_row(n);
      const uint32_t v =
          (p.bytes()[pr / 64 * p.code_block_bytes() + pos / 2 * 64 + pr % 64] >> (4 * (pos % 2))) &
          0xF;
      if (awq)
        qw[k * stride + n / 8] |= static_cast<int32_t>(v << (4 * runtime::kAwqNibble[n % 8]));
      else
        qw[k / 8 * stride + n] |= static_cast<int32_t>(v << (4 * (k % 8)));
    }
  }
  ops::restore(op, "scales", q.scales_in, out.scales);
  if (out.qzeros) ops::restore(op, "qzeros", q.qzeros_in, *out.qzeros);
  if (out.g_idx) ops::restore(op, "g_idx", q.g_idx_in, *out.g_idx);
}

void PackedWeight::dequantize(const TensorView& out) const {
  const char* op = "PackedWeight::dequantize";
  if (impl_ == nullptr)
    throw Error(
        fmt::format("{}: the PackedWeight is empty; allowed: a weight from pack_weight()", op));
  const Impl& p = *impl_;
  ops::check_view(op, "out", out, 2);
  ops::check_dtype(op, "out", out, {DType::f32, DType::bf16});
  ops::check_row_major_rows(op, "out", out);
  ops::check_writable(op, "out", out);
  if (out.shape != std::vector<int64_t>{p.layout.n, p.layout.k})
    throw Error(fmt::format("{}: out has shape {}; allowed: {}", op, ops::shape_str(out.shape),
                            ops::shape_of(p.layout.n, p.layout.k)));
  for (int64_t n = 0; n < p.layout.n; ++n)
    for (int64_t k = 0; k < p.layout.k; ++k) {
      const double v = ops::weight_value(p, n, k);  // rounded once to out's dtype
      if (out.dtype == DType::f32)
        static_cast<float*>(out.data)[n * out.strides[0] + k] = static_cast<float>(v);
      else
        static_cast<uint16_t*>(out.data)[n * out.strides[0] + k] = runtime::f64_to_bf16(v);
    }
}

}  // namespace tilejit
