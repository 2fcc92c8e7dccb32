// The C API's mixture of experts and routing (include/tilejit/tilejit_c.h).
#include "ops/c_api_support.h"

using namespace tilejit;
using namespace tilejit::c_api;

namespace {

const PackedExperts& experts(const tilejit_packed_experts* w, const char* arg) {
  return deref(w, arg).w;
}

// The quantized pack_experts / unpack: one C description per expert,
// converted by conv.
template <class C, class Conv>
tilejit_status pack_quantized(const char* fn, const C* w, int64_t num_experts,
                              tilejit_expert_proj proj, tilejit_glu_rows rows,
                              tilejit_packed_experts** out, Conv conv) {
  return make_handle(fn, out, [&] {
    return pack_experts(weight_array(w, num_experts, "w", conv), to_enum<ExpertProj>(proj),
                        to_enum<GluRows>(rows));
  });
}
template <class C, class Conv>
tilejit_status unpack_quantized(const char* fn, const tilejit_packed_experts* w, const C* out,
                                int64_t num_experts, Conv conv) {
  return call(fn, [&] { experts(w, "w").unpack(weight_array(out, num_experts, "out", conv)); });
}

}  // namespace

extern "C" {

tilejit_status tilejit_pack_experts_bf16(const tilejit_tensor* w, tilejit_expert_proj proj,
                                         tilejit_glu_rows rows, tilejit_packed_experts** out) {
  return make_handle(__func__, out, [&] {
    return pack_experts(view(w, "w"), to_enum<ExpertProj>(proj), to_enum<GluRows>(rows));
  });
}
tilejit_status tilejit_pack_experts_int8(const tilejit_int8_weight* w, int64_t num_experts,
                                         tilejit_expert_proj proj, tilejit_glu_rows rows,
                                         tilejit_packed_experts** out) {
  return pack_quantized(__func__, w, num_experts, proj, rows, out, int8_weight);
}
tilejit_status tilejit_pack_experts_fp8(const tilejit_fp8_weight* w, int64_t num_experts,
                                        tilejit_expert_proj proj, tilejit_glu_rows rows,
                                        tilejit_packed_experts** out) {
  return pack_quantized(__func__, w, num_experts, proj, rows, out, fp8_weight);
}
tilejit_status tilejit_pack_experts_int4(const tilejit_int4_weight* w, int64_t num_experts,
                                         tilejit_expert_proj proj, tilejit_glu_rows rows,
                                         tilejit_packed_experts** out) {
  return pack_quantized(__func__, w, num_experts, proj, rows, out, int4_weight);
}
tilejit_status tilejit_pack_experts_mxfp4(const tilejit_mxfp4_weight* w, int64_t num_experts,
                                          tilejit_expert_proj proj, tilejit_glu_rows rows,
                                          tilejit_packed_experts** out) {
  return pack_quantized(__func__, w, num_experts, proj, rows, out, mxfp4_weight);
}

void tilejit_packed_experts_destroy(tilejit_packed_experts* w) {
  delete w;
}

tilejit_status tilejit_packed_experts_get_info(const tilejit_packed_experts* w,
                                               tilejit_packed_experts_info* out) {
  return call(__func__, [&] {
    const PackedExperts& p = experts(w, "w");
    tilejit_packed_experts_info& info = deref(out, "out");
    info.num_experts = p.num_experts();
    info.n = p.n();
    info.k = p.k();
    info.proj = static_cast<tilejit_expert_proj>(p.proj());
    info.format = static_cast<tilejit_weight_format>(p.format());
    info.packed_bytes = p.packed_bytes();
    info.layout = w->layout.c_str();
  });
}

tilejit_status tilejit_packed_experts_dequantize(const tilejit_packed_experts* w,
                                                 const tilejit_tensor* out) {
  return call(__func__, [&] { experts(w, "w").dequantize(view(out, "out")); });
}
tilejit_status tilejit_packed_experts_unpack_bf16(const tilejit_packed_experts* w,
                                                  const tilejit_tensor* out) {
  return call(__func__, [&] { experts(w, "w").unpack(view(out, "out")); });
}
tilejit_status tilejit_packed_experts_unpack_int8(const tilejit_packed_experts* w,
                                                  const tilejit_int8_weight* out,
                                                  int64_t num_experts) {
  return unpack_quantized(__func__, w, out, num_experts, int8_weight);
}
tilejit_status tilejit_packed_experts_unpack_fp8(const tilejit_packed_experts* w,
                                                 const tilejit_fp8_weight* out,
                                                 int64_t num_experts) {
  return unpack_quantized(__func__, w, out, num_experts, fp8_weight);
}
tilejit_status tilejit_packed_experts_unpack_int4(const tilejit_packed_experts* w,
                                                  const tilejit_int4_weight* out,
                                                  int64_t num_experts) {
  return unpack_quantized(__func__, w, out, num_experts, int4_weight);
}
tilejit_status tilejit_packed_experts_unpack_mxfp4(const tilejit_packed_experts* w,
                                                   const tilejit_mxfp4_weight* out,
                                                   int64_t num_experts) {
  return unpack_quantized(__func__, w, out, num_experts, mxfp4_weight);
}

void tilejit_moe_options_init(tilejit_moe_options* opt) {
  if (opt == nullptr) return;
  const MoeOptions d;
  *opt = tilejit_moe_options{};
  opt->struct_size = sizeof *opt;
  opt->act = static_cast<tilejit_activation>(d.act);
  opt->clamped_swiglu = d.clamped_swiglu;
  opt->swiglu_alpha = d.swiglu_alpha;
  opt->swiglu_limit = d.swiglu_limit;
  opt->routed_scaling_factor = d.routed_scaling_factor;
  opt->int4_route = static_cast<tilejit_int4_route>(d.int4_route);
  opt->act_quant = static_cast<tilejit_act_quant>(d.act_quant);
  opt->act_scale13 = d.act_scale13;
  opt->act_scale2 = d.act_scale2;
  opt->act_zero_point13 = d.act_zero_point13;
  opt->act_zero_point2 = d.act_zero_point2;
}

tilejit_status tilejit_fused_experts(const tilejit_tensor* hidden,
                                     const tilejit_packed_experts* w13,
                                     const tilejit_packed_experts* w2,
                                     const tilejit_tensor* topk_weights,
                                     const tilejit_tensor* topk_ids, const tilejit_tensor* out,
                                     const tilejit_moe_options* opt) {
  return call(__func__, [&] {
    MoeOptions o;
    if (const auto c = options(opt, "opt", "tilejit_moe_options_init", tilejit_moe_options_init)) {
      o.act = to_enum<Activation>(c->act);
      o.clamped_swiglu = c->clamped_swiglu;
      o.swiglu_alpha = c->swiglu_alpha;
      o.swiglu_limit = c->swiglu_limit;
      o.b13 = optional_view(c->b13, "opt.b13");
      o.b2 = optional_view(c->b2, "opt.b2");
      o.routed_scaling_factor = c->routed_scaling_factor;
      o.shared_w13 = c->shared_w13 != nullptr ? &c->shared_w13->w : nullptr;
      o.shared_w2 = c->shared_w2 != nullptr ? &c->shared_w2->w : nullptr;
      o.int4_route = to_enum<Int4Route>(c->int4_route);
      o.act_quant = to_enum<ActQuant>(c->act_quant);
      o.act_scale13 = c->act_scale13;
      o.act_scale2 = c->act_scale2;
      o.act_zero_point13 = c->act_zero_point13;
      o.act_zero_point2 = c->act_zero_point2;
      o.shared_weights = optional_view(c->shared_weights, "opt.shared_weights");
    }
    fused_experts(view(hidden, "hidden"), experts(w13, "w13"), experts(w2, "w2"),
                  view(topk_weights, "topk_weights"), view(topk_ids, "topk_ids"), view(out, "out"),
                  o);
  });
}

tilejit_status tilejit_topk_softmax(const tilejit_tensor* logits,
                                    const tilejit_tensor* topk_weights,
                                    const tilejit_tensor* topk_ids, bool renormalize) {
  return call(__func__, [&] {
    topk_softmax(view(logits, "logits"), view(topk_weights, "topk_weights"),
                 view(topk_ids, "topk_ids"), renormalize);
  });
}
tilejit_status tilejit_topk_sigmoid(const tilejit_tensor* logits,
                                    const tilejit_tensor* topk_weights,
                                    const tilejit_tensor* topk_ids, bool renormalize) {
  return call(__func__, [&] {
    topk_sigmoid(view(logits, "logits"), view(topk_weights, "topk_weights"),
                 view(topk_ids, "topk_ids"), renormalize);
  });
}

void tilejit_grouped_topk_options_init(tilejit_grouped_topk_options* opt) {
  if (opt == nullptr) return;
  const GroupedTopkOptions d;
  *opt = tilejit_grouped_topk_options{};
  opt->struct_size = sizeof *opt;
  opt->score = static_cast<tilejit_router_score>(d.score);
  opt->num_expert_group = d.num_expert_group;
  opt->topk_group = d.topk_group;
  opt->renormalize = d.renormalize;
  opt->routed_scaling_factor = d.routed_scaling_factor;
}

tilejit_status tilejit_grouped_topk(const tilejit_tensor* logits,
                                    const tilejit_tensor* topk_weights,
                                    const tilejit_tensor* topk_ids,
                                    const tilejit_grouped_topk_options* opt) {
  return call(__func__, [&] {
    GroupedTopkOptions o;
    if (const auto c = options(opt, "opt", "tilejit_grouped_topk_options_init",
                               tilejit_grouped_topk_options_init)) {
      o.score = to_enum<RouterScore>(c->score);
      o.num_expert_group = c->num_expert_group;
      o.topk_group = c->topk_group;
      o.renormalize = c->renormalize;
      o.routed_scaling_factor = c->routed_scaling_factor;
      o.correction_bias = optional_view(c->correction_bias, "opt.correction_bias");
    }
    grouped_topk(view(logits, "logits"), view(topk_weights, "topk_weights"),
                 view(topk_ids, "topk_ids"), o);
  });
}

}  // extern "C"
