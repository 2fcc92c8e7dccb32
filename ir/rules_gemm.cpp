// gemm %x, %w: y[M, N] = x[M, K] · w[N, K]ᵀ, bf16 in, f32 accumulator out.
// The f32 result is what epilogue ops (add, activations, cast) then consume,
// so the whole chain fuses into the micro-kernel's store.
//
// A quantized weight comes with named operands (docs/ir.md, "Quantized
// weights"): gemm %x, %w, scale = %s [, zero = %z] [, g_idx = %g] {...}:
//   i8 [N, K]      W8A8: scale f32 [N] or [1]; act_quant / act_scale / act_zero_point
//   f8e4m3 [N, K]  scale f32 [1], [N], or [ceil(N/block_n), ceil(K/block_k)] with block_n, block_k
//   u4 [N, K]      AWQ / GPTQ: scale [G, N] f16/bf16/f32, zero u4 [G, N], g_idx i32 [K];
//                  format ("awq" | "gptq"), group_size, bits, gptq_v2, int4_route
//   f4e2m1 [N, K]  MXFP4 (GPT-OSS): scale u8 [N, ceil(K/32)], the e8m0 exponents
#include <array>

#include "ir/op_rules.h"
#include "runtime/int_math.h"

namespace tilejit::ir {

namespace {

constexpr size_t kX = 0, kW = 1;

// Which weight dtype each quantization attribute belongs to.
struct AttrOwner {
  const char* attr;
  DType dtype;
};
constexpr std::array<AttrOwner, 10> kAttrOwners = {{
    {"act_quant", DType::i8},
    {"act_scale", DType::i8},
    {"act_zero_point", DType::i8},
    {"block_k", DType::f8e4m3},
    {"block_n", DType::f8e4m3},
    {"bits", DType::u4},
    {"format", DType::u4},
    {"gptq_v2", DType::u4},
    {"group_size", DType::u4},
    {"int4_route", DType::u4},
}};

using runtime::ceil_div;

// A contiguous row-major operand (scales, zero points, g_idx are dense tensors).
bool dense(RuleContext& c, size_t i) {
  const Layout& l = c.type(i).layout;
  if (l.kind == LayoutKind::row_major &&
      (l.strides.empty() || l.strides.back() == std::optional<int64_t>(1)))
    return true;
  return c.fail(cat("operand ", c.who(i), " has layout ", l.str(), ": ", name(c.kind()),
                    " takes it row_major with unit stride on the last dim"));
}

std::string shape_text(const std::vector<int64_t>& s) {
  return cat("[", join(s, ", ", [](int64_t v) { return std::to_string(v); }), "]");
}

// The shapes one matrix's tensors have, spelled for messages: "[N]", or
// "[E, N]" for experts (a leading expert dim).
std::string spell(const QuantWeight& q, const std::string& inner) {
  return q.experts ? cat("[E, ", inner, "]") : cat("[", inner, "]");
}

// The dims of operand i past the expert dim (all of them for a gemm).
// Experts: dim 0 must be E; std::nullopt (a problem recorded) otherwise.
std::optional<std::vector<Dim>> per_matrix(RuleContext& c, size_t i, const QuantWeight& q) {
  const auto& dims = c.type(i).dims;
  if (!q.experts) return dims;
  if (dims.empty() || !dims[0].is_static() || dims[0].value != q.e) {
    c.fail(cat("operand ", c.who(i), " has shape ", shape_str(dims),
               "; its dim 0 is the expert count E=", q.e, " (one tensor per expert)"));
    return std::nullopt;
  }
  return std::vector<Dim>(dims.begin() + 1, dims.end());
}

// shape == [E,] want (static dims), else "operand 'scale' (%s) has shape [..]; <rule>".
bool shape_is(RuleContext& c, size_t i, const QuantWeight& q, std::vector<int64_t> want,
              const std::string& rule) {
  if (q.experts) want.insert(want.begin(), q.e);
  const auto& dims = c.type(i).dims;
  bool ok = dims.size() == want.size();
  for (size_t d = 0; ok && d < dims.size(); ++d)
    ok = dims[d].is_static() && dims[d].value == want[d];
  if (ok) return true;
  return c.fail(cat("operand ", c.who(i), " has shape ", shape_str(dims), "; ", rule));
}

void check_int8(RuleContext& c, const QuantWeight& q) {
  const Attrs& a = c.attrs();
  const size_t scale = *q.scale;
  if (q.k > 65536)
    c.fail(cat("operand ", c.who(q.w), " has K=", q.k,
               "; allowed: K <= 65536 for an i8 weight (the int32 sums of u8 x s8 codes stay "
               "exact)"));
  if (c.dtype(scale, {DType::f32}) && dense(c, scale)) {
    if (auto dims = per_matrix(c, scale, q)) {
      const bool ok = dims->size() == 1 && (*dims)[0].is_static() &&
                      ((*dims)[0].value == q.n || (*dims)[0].value == 1);
      if (!ok)
        c.fail(cat("operand ", c.who(scale), " has shape ", shape_str(c.type(scale).dims),
                   "; an i8 weight takes ", c.role(scale), " as f32 ", spell(q, "N"),
                   " (per channel, N=", q.n, ") or ", spell(q, "1"), " (per tensor)"));
    }
  }
  const std::string mode = a.get_string("act_quant").value_or("dynamic_sym");
  if (mode == "fixed") {
    auto s = a.get_double("act_scale");
    if (!s)
      c.fail("attribute 'act_quant' = \"fixed\" needs attribute 'act_scale' (x's scale, > 0)");
    else if (!(*s > 0))
      c.fail(cat("attribute 'act_scale' = ", *s, " must be > 0"));
    if (auto z = a.get_int("act_zero_point"); z && (*z < 0 || *z > 255))
      c.fail(cat("attribute 'act_zero_point' = ", *z, " must be in [0, 255] (a u8 zero point)"));
  } else {
    for (const char* n2 : {"act_scale", "act_zero_point"})
      if (a.has(n2))
        c.fail(cat("attribute '", n2, "' applies to act_quant = \"fixed\" only (act_quant is \"",
                   mode, "\")"));
  }
}

void check_fp8(RuleContext& c, const QuantWeight& q) {
  const Attrs& a = c.attrs();
  const size_t scale = *q.scale;
  const int64_t n = q.n, k = q.k;
  const auto bn = a.get_int("block_n"), bk = a.get_int("block_k");
  if (!c.dtype(scale, {DType::f32}) || !dense(c, scale)) return;
  const auto inner = per_matrix(c, scale, q);
  if (!inner) return;
  const auto& all = c.type(scale).dims;
  if (inner->size() == 2) {
    if (!bn || !bk) {
      c.fail(cat("operand ", c.who(scale), " has shape ", shape_str(all),
                 ": block scales need attributes 'block_n' and 'block_k' (e.g. {block_k = 128, "
                 "block_n = 128})"));
      return;
    }
    if (*bn < 1) c.fail(cat("attribute 'block_n' = ", *bn, " must be >= 1"));
    if (*bk < 2 || *bk % 2 != 0)
      c.fail(cat("attribute 'block_k' = ", *bk,
                 " must be even and >= 2 (a k-pair never straddles two blocks)"));
    if (!c.ok()) return;
    const std::vector<int64_t> want = {ceil_div(n, *bn), ceil_div(k, *bk)};
    shape_is(c, scale, q, want,
             cat("block scales of ", *bn, "x", *bk, " over N=", n, ", K=", k, " are f32 ",
                 shape_text(q.experts ? std::vector<int64_t>{q.e, want[0], want[1]} : want), " ",
                 spell(q, "ceil(N/block_n), ceil(K/block_k)")));
    return;
  }
  for (const char* b : {"block_n", "block_k"})
    if (a.has(b))
      c.fail(cat("attribute '", b, "' needs block scales: ", c.who(scale), " is ", shape_str(all),
                 ", not ", spell(q, "ceil(N/block_n), ceil(K/block_k)")));
  const bool ok = inner->size() == 1 && (*inner)[0].is_static() &&
                  ((*inner)[0].value == n || (*inner)[0].value == 1);
  if (!ok)
    c.fail(cat("operand ", c.who(scale), " has shape ", shape_str(all), "; an f8e4m3 weight takes ",
               c.role(scale), " as f32 ", spell(q, "1"), " (per tensor), ", spell(q, "N"),
               " (per channel, N=", n, ") or ", spell(q, "ceil(N/block_n), ceil(K/block_k)"),
               " (block scales)"));
}

void check_int4(RuleContext& c, const QuantWeight& q) {
  const Attrs& a = c.attrs();
  const size_t scale = *q.scale;
  const int64_t n = q.n, k = q.k;
  const auto format = a.get_string("format");
  if (!format)
    c.fail("a u4 weight needs attribute 'format': \"awq\" (AutoAWQ) or \"gptq\" (AutoGPTQ)");
  if (auto bits = a.get_int("bits"); bits && *bits != 4)
    c.fail(cat("attribute 'bits' = ", *bits, "; allowed: 4 (u4 weights)"));
  const int64_t gs = a.get_int("group_size").value_or(128);
  // pack_weight's rule (ops/pack_quant.cpp): any group size, or -1.
  if (gs == 0 || gs < -1)
    c.fail(cat("attribute 'group_size' = ", gs,
               "; allowed: a group size >= 1 (32, 64, 128, ...) or -1 (one group over all of K)"));
  if (format == "awq" && a.get_bool("gptq_v2").value_or(false))
    c.fail("attribute 'gptq_v2' = true applies to format = \"gptq\" only (AWQ stores z itself)");
  if (!c.ok()) return;
  if (!c.dtype(scale, {DType::f16, DType::bf16, DType::f32}) || !dense(c, scale)) return;
  const auto sd = per_matrix(c, scale, q);
  if (!sd) return;
  const int64_t groups = gs < 0 ? 1 : ceil_div(k, gs);
  if (!q.g_idx) {
    shape_is(c, scale, q, {groups, n},
             cat("a u4 weight of K=", k, " in groups of ", gs < 0 ? k : gs, " takes ",
                 c.role(scale), " as ", spell(q, "G, N"), " = ",
                 shape_text(q.experts ? std::vector<int64_t>{q.e, groups, n}
                                      : std::vector<int64_t>{groups, n})));
  } else if (sd->size() != 2 || !(*sd)[0].is_static() || (*sd)[0].value < 1 ||
             !(*sd)[1].is_static() || (*sd)[1].value != n) {
    c.fail(cat("operand ", c.who(scale), " has shape ", shape_str(c.type(scale).dims),
               "; a u4 weight takes ", c.role(scale), " as ", spell(q, "G, N"),
               " with G >= 1 static and N=", n));
  }
  if (!c.ok()) return;
  const int64_t g = (*sd)[0].value;
  if (q.zero && c.dtype(*q.zero, {DType::u4}) && dense(c, *q.zero))
    shape_is(
        c, *q.zero, q, {g, n},
        cat("zero points are u4 ", spell(q, "G, N"), " like '", c.role(scale), "' (",
            shape_text(q.experts ? std::vector<int64_t>{q.e, g, n} : std::vector<int64_t>{g, n}),
            ")"));
  if (q.g_idx && c.dtype(*q.g_idx, {DType::i32}) && dense(c, *q.g_idx))
    shape_is(c, *q.g_idx, q, {k},
             cat("g_idx is i32 ", spell(q, "K"), " (the group of each input channel, K=", k, ")"));
}

// MXFP4: e2m1 codes two per byte (the checkpoint's blocks, [N, ceil(K/2)]
// bytes), one e8m0 exponent byte per 32 codes of a row.
void check_mxfp4(RuleContext& c, const QuantWeight& q) {
  const size_t scale = *q.scale;
  if (!c.dtype(scale, {DType::u8}) || !dense(c, scale)) return;
  const int64_t blocks = ceil_div(q.k, 32);
  shape_is(c, scale, q, {q.n, blocks},
           cat("an f4e2m1 weight of N=", q.n, ", K=", q.k, " takes ", c.role(scale),
               " as its e8m0 exponents, u8 ", spell(q, "N, ceil(K/32)"), " = ",
               shape_text(q.experts ? std::vector<int64_t>{q.e, q.n, blocks}
                                    : std::vector<int64_t>{q.n, blocks})));
}

}  // namespace

void check_weight_layout(RuleContext& c, size_t w, DType wt) {
  const Layout& wl = c.type(w).layout;
  const std::string op = name(c.kind());
  if (wt == DType::bf16) {
    c.weight_layout(w);
  } else if (wt == DType::i8) {
    c.unit_stride_rows(w);
  } else if (wt == DType::f8e4m3) {
    // Any strides: a [K, N] checkpoint is the logical [N, K] with strided<[1, N]>.
    if (wl.kind != LayoutKind::row_major)
      c.fail(cat("operand ", c.who(w), " has layout ", wl.str(), ": ", op,
                 " takes an f8e4m3 weight row_major (any strides)"));
  } else if (!wl.is_contiguous()) {
    c.fail(cat("operand ", c.who(w), " has layout ", wl.str(), ": ", op, " takes ",
               wt == DType::u4 ? "a u4 weight as the checkpoint's int32-packed qweight"
                               : "an f4e2m1 weight as the checkpoint's blocks, two codes a byte",
               ", contiguous"));
  }
}

void check_quant_attr_owners(RuleContext& c, DType wt, const std::string& w_is) {
  for (const AttrOwner& o : kAttrOwners)
    if (c.attrs().has(o.attr) && o.dtype != wt)
      c.fail(cat("attribute '", o.attr, "' applies to ", dtype_name(o.dtype), " weights only; ",
                 w_is));
}

void check_quant_weight(RuleContext& c, DType wt, const QuantWeight& q) {
  const std::string w_is = cat(c.who(q.w), " is ", dtype_name(wt));
  if (q.zero && wt != DType::u4)
    c.fail(cat("operand ", c.who(*q.zero), ": an ", dtype_name(wt), " weight has no zero point (",
               c.role(*q.zero), " is for u4 weights",
               wt == DType::i8 ? "; x's zero point comes from act_quant)" : ")"));
  if (q.g_idx && wt != DType::u4)
    c.fail(cat("operand ", c.who(*q.g_idx), ": an ", dtype_name(wt), " weight has no ",
               c.role(*q.g_idx), " (", c.role(*q.g_idx), " is for act-order u4 weights)"));
  if (!q.scale)
    c.fail(cat("operand ", w_is, ": a quantized weight needs a '", q.scale_role, "' operand (",
               q.example, ")"));
  if (!c.ok()) return;
  if (wt == DType::i8) check_int8(c, q);
  if (wt == DType::f8e4m3) check_fp8(c, q);
  if (wt == DType::u4) check_int4(c, q);
  if (wt == DType::f4e2m1) check_mxfp4(c, q);
}

namespace {

// The quantized weight's operands and attributes, for w of dtype wt.
void check_quant(RuleContext& c, DType wt) {
  check_quant_attr_owners(c, wt, cat(c.who(kW), " is ", dtype_name(wt)));
  if (wt == DType::bf16) {
    for (size_t i = 2; i < c.size(); ++i)
      c.fail(cat("operand ", c.who(i), ": a bf16 weight takes no '", c.role(i),
                 "' (scale, zero and g_idx describe i8, f8e4m3, u4 and f4e2m1 weights)"));
    return;
  }
  c.static_dim(kW, 0, "N", "a quantized weight has static dims");
  c.static_dim(kW, 1, "K", "a quantized weight has static dims");
  if (!c.ok()) return;
  QuantWeight q;
  q.w = kW;
  q.scale = c.named("scale");
  q.zero = c.named("zero");
  q.g_idx = c.named("g_idx");
  q.n = c.dim(kW, 0).value;
  q.k = c.dim(kW, 1).value;
  q.scale_role = "scale";
  q.example = "gemm %x, %w, scale = %s";
  check_quant_weight(c, wt, q);
}

}  // namespace

std::optional<TensorType> check_gemm(RuleContext& c) {
  c.rank(kX, 2, "[M, K]");
  c.rank(kW, 2, "[N, K]");
  if (!c.ok()) return std::nullopt;
  c.dtype(kX, {DType::bf16});
  c.dtype(kW, kWeightDtypes);
  c.unit_stride_rows(kX);
  if (!c.ok()) return std::nullopt;
  const DType wt = c.type(kW).dtype;
  check_weight_layout(c, kW, wt);
  if (!c.ok()) return std::nullopt;
  if (!c.same_dim(kW, 1, kX, 1, "K", "the reduction dims must match")) return std::nullopt;
  c.nonzero_dim(kW, 0, "N", "tilejit::pack_weight takes no empty weight");
  c.nonzero_dim(kW, 1, "K", "tilejit::pack_weight takes no empty weight");
  if (!c.ok()) return std::nullopt;
  check_quant(c, wt);
  if (!c.ok()) return std::nullopt;
  return result(DType::f32, {c.dim(kX, 0), c.dim(kW, 0)});
}

}  // namespace tilejit::ir
