// The C API's weights and GEMM (include/tilejit/tilejit_c.h): packing each
// format into a handle, its queries, unpack and dequantize, and gemm.
#include "ops/c_api_support.h"

#include <fmt/format.h>

#include <string>
#include <vector>

using namespace tilejit;
using namespace tilejit::c_api;

namespace {

const PackedWeight& weight(const tilejit_packed_weight* w) {
  return deref(w, "w").w;
}

// The C options (NULL: the defaults) as GemmOptions.
GemmOptions gemm_options(const tilejit_gemm_options* opt) {
  GemmOptions o;
  if (const auto c = options(opt, "opt", "tilejit_gemm_options_init", tilejit_gemm_options_init)) {
    o.bias = optional_view(c->bias, "opt.bias");
    o.act = to_enum<Activation>(c->act);
    o.int4_route = to_enum<Int4Route>(c->int4_route);
    o.act_quant = to_enum<ActQuant>(c->act_quant);
    o.act_scale = c->act_scale;
    o.act_zero_point = c->act_zero_point;
  }
  return o;
}

}  // namespace

extern "C" {

void tilejit_int4_weight_init(tilejit_int4_weight* w) {
  if (w == nullptr) return;
  *w = tilejit_int4_weight{};
  const Int4Weight d;
  w->format = static_cast<tilejit_int4_format>(d.format);
  w->bits = d.bits;
  w->group_size = d.group_size;
  w->gptq_v2 = d.gptq_v2;
  w->n = d.n;
  w->k = d.k;
}

tilejit_status tilejit_int4_weight_from_autoround(const tilejit_autoround_config* config,
                                                  const tilejit_tensor* qweight,
                                                  const tilejit_tensor* scales,
                                                  const tilejit_tensor* qzeros,
                                                  const tilejit_tensor* g_idx,
                                                  tilejit_int4_weight* out) {
  return call(__func__, [&] {
    const tilejit_autoround_config& c = deref(config, "config");
    deref(out, "out");
    AutoRoundConfig cfg;
    cfg.bits = c.bits;
    cfg.group_size = c.group_size;
    cfg.sym = c.sym;
    cfg.desc_act = c.desc_act;
    deref(c.checkpoint_format, "config.checkpoint_format");
    cfg.checkpoint_format = c.checkpoint_format;
    const Int4Weight w =
        int4_weight_from_config(cfg, view(qweight, "qweight"), view(scales, "scales"),
                                optional_view(qzeros, "qzeros"), optional_view(g_idx, "g_idx"));
    tilejit_int4_weight r{};
    r.format = static_cast<tilejit_int4_format>(w.format);
    r.qweight = *qweight;
    r.scales = *scales;
    r.qzeros = w.qzeros ? qzeros : nullptr;
    r.g_idx = w.g_idx ? g_idx : nullptr;
    r.bits = w.bits;
    r.group_size = w.group_size;
    r.gptq_v2 = w.gptq_v2;
    r.n = w.n;
    r.k = w.k;
    *out = r;
  });
}

tilejit_status tilejit_pack_weight_bf16(const tilejit_tensor* w, tilejit_packed_weight** out) {
  return make_handle(__func__, out, [&] { return pack_weight(view(w, "w")); });
}
tilejit_status tilejit_pack_weight_int8(const tilejit_int8_weight* w, tilejit_packed_weight** out) {
  return make_handle(__func__, out, [&] { return pack_weight(int8_weight(deref(w, "w"), "w")); });
}
tilejit_status tilejit_pack_weight_fp8(const tilejit_fp8_weight* w, tilejit_packed_weight** out) {
  return make_handle(__func__, out, [&] { return pack_weight(fp8_weight(deref(w, "w"), "w")); });
}
tilejit_status tilejit_pack_weight_int4(const tilejit_int4_weight* w, tilejit_packed_weight** out) {
  return make_handle(__func__, out, [&] { return pack_weight(int4_weight(deref(w, "w"), "w")); });
}
tilejit_status tilejit_pack_weight_mxfp4(const tilejit_mxfp4_weight* w,
                                         tilejit_packed_weight** out) {
  return make_handle(__func__, out, [&] { return pack_weight(mxfp4_weight(deref(w, "w"), "w")); });
}

void tilejit_packed_weight_destroy(tilejit_packed_weight* w) {
  delete w;
}

tilejit_status tilejit_packed_weight_get_info(const tilejit_packed_weight* w,
                                              tilejit_packed_weight_info* out) {
  return call(__func__, [&] {
    const PackedWeight& p = weight(w);
    tilejit_packed_weight_info& info = deref(out, "out");
    info.n = p.n();
    info.k = p.k();
    info.dtype = static_cast<tilejit_dtype>(p.dtype());
    info.format = static_cast<tilejit_weight_format>(p.format());
    info.packed_bytes = p.packed_bytes();
    info.layout = w->layout.c_str();
  });
}

tilejit_status tilejit_packed_weight_dequantize(const tilejit_packed_weight* w,
                                                const tilejit_tensor* out) {
  return call(__func__, [&] { weight(w).dequantize(view(out, "out")); });
}
tilejit_status tilejit_packed_weight_unpack_bf16(const tilejit_packed_weight* w,
                                                 const tilejit_tensor* out) {
  return call(__func__, [&] { weight(w).unpack(view(out, "out")); });
}
tilejit_status tilejit_packed_weight_unpack_int8(const tilejit_packed_weight* w,
                                                 const tilejit_int8_weight* out) {
  return call(__func__, [&] { weight(w).unpack(int8_weight(deref(out, "out"), "out")); });
}
tilejit_status tilejit_packed_weight_unpack_fp8(const tilejit_packed_weight* w,
                                                const tilejit_fp8_weight* out) {
  return call(__func__, [&] { weight(w).unpack(fp8_weight(deref(out, "out"), "out")); });
}
tilejit_status tilejit_packed_weight_unpack_int4(const tilejit_packed_weight* w,
                                                 const tilejit_int4_weight* out) {
  return call(__func__, [&] { weight(w).unpack(int4_weight(deref(out, "out"), "out")); });
}
tilejit_status tilejit_packed_weight_unpack_mxfp4(const tilejit_packed_weight* w,
                                                  const tilejit_mxfp4_weight* out) {
  return call(__func__, [&] { weight(w).unpack(mxfp4_weight(deref(out, "out"), "out")); });
}

void tilejit_gemm_options_init(tilejit_gemm_options* opt) {
  if (opt == nullptr) return;
  const GemmOptions d;
  *opt = tilejit_gemm_options{};
  opt->struct_size = sizeof *opt;
  opt->act = static_cast<tilejit_activation>(d.act);
  opt->int4_route = static_cast<tilejit_int4_route>(d.int4_route);
  opt->act_quant = static_cast<tilejit_act_quant>(d.act_quant);
  opt->act_scale = d.act_scale;
  opt->act_zero_point = d.act_zero_point;
}

tilejit_status tilejit_gemm(const tilejit_tensor* x, const tilejit_packed_weight* w,
                            const tilejit_tensor* y, const tilejit_gemm_options* opt) {
  return call(__func__, [&] { gemm(view(x, "x"), weight(w), view(y, "y"), gemm_options(opt)); });
}

tilejit_status tilejit_gemm_batched(const tilejit_tensor* x, const tilejit_packed_weight* const* w,
                                    size_t w_count, const tilejit_tensor* y,
                                    const tilejit_gemm_options* opt) {
  return call(__func__, [&] {
    if (w == nullptr && w_count > 0)
      throw CArgError(
          fmt::format("w is NULL with w_count {}; allowed: an array of w_count weights", w_count));
    std::vector<PackedWeight> ws;
    ws.reserve(w_count);
    for (size_t i = 0; i < w_count; ++i)
      ws.push_back(deref(w[i], fmt::format("w[{}]", i).c_str()).w);
    gemm_batched(view(x, "x"), ws, view(y, "y"), gemm_options(opt));
  });
}

}  // extern "C"
