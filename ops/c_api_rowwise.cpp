// The C API of the row-wise layer ops (include/tilejit/tilejit_c.h): thin
// wrappers over tilejit's norms and act_and_mul.
#include "ops/c_api_support.h"
#include "ops/tensor_checks.h"

using namespace tilejit;
using namespace tilejit::c_api;

namespace {

NormOptions norm_options(const tilejit_norm_options* opt, const char* arg = "opt") {
  NormOptions o;
  if (const auto c = options(opt, arg, "tilejit_norm_options_init", tilejit_norm_options_init)) {
    o.eps = c->eps;
    o.weight_plus_one = c->weight_plus_one;
  }
  return o;
}

}  // namespace

extern "C" {

void tilejit_norm_options_init(tilejit_norm_options* opt) {
  if (opt == nullptr) return;
  const NormOptions d;
  *opt = tilejit_norm_options{};
  opt->struct_size = sizeof *opt;
  opt->eps = d.eps;
  opt->weight_plus_one = d.weight_plus_one;
}

tilejit_status tilejit_rms_norm(const tilejit_tensor* x, const tilejit_tensor* weight,
                                const tilejit_tensor* out, const tilejit_norm_options* opt) {
  return call(__func__, [&] {
    const NormOptions o = norm_options(opt);
    const auto w = optional_view(weight, "weight");
    rms_norm(view(x, "x"), ops::opt_view(w), view(out, "out"), o);
  });
}

tilejit_status tilejit_fused_add_rms_norm(const tilejit_tensor* x, const tilejit_tensor* residual,
                                          const tilejit_tensor* weight, const tilejit_tensor* out,
                                          const tilejit_norm_options* opt) {
  return call(__func__, [&] {
    const NormOptions o = norm_options(opt);
    const auto w = optional_view(weight, "weight");
    fused_add_rms_norm(view(x, "x"), view(residual, "residual"), ops::opt_view(w), view(out, "out"),
                       o);
  });
}

tilejit_status tilejit_layer_norm(const tilejit_tensor* x, const tilejit_tensor* weight,
                                  const tilejit_tensor* bias, const tilejit_tensor* out,
                                  const tilejit_norm_options* opt) {
  return call(__func__, [&] {
    const NormOptions o = norm_options(opt);
    const auto w = optional_view(weight, "weight"), b = optional_view(bias, "bias");
    layer_norm(view(x, "x"), ops::opt_view(w), ops::opt_view(b), view(out, "out"), o);
  });
}

tilejit_status tilejit_fused_add_layer_norm(const tilejit_tensor* x, const tilejit_tensor* residual,
                                            const tilejit_tensor* weight,
                                            const tilejit_tensor* bias, const tilejit_tensor* out,
                                            const tilejit_norm_options* opt) {
  return call(__func__, [&] {
    const NormOptions o = norm_options(opt);
    const auto w = optional_view(weight, "weight"), b = optional_view(bias, "bias");
    fused_add_layer_norm(view(x, "x"), view(residual, "residual"), ops::opt_view(w),
                         ops::opt_view(b), view(out, "out"), o);
  });
}

void tilejit_gated_norm_options_init(tilejit_gated_norm_options* opt) {
  if (opt == nullptr) return;
  const GatedNormOptions d;
  *opt = tilejit_gated_norm_options{};
  opt->struct_size = sizeof *opt;
  tilejit_norm_options_init(&opt->norm);
  opt->act = static_cast<tilejit_activation>(d.act);
  opt->norm_before_gate = d.norm_before_gate;
}

tilejit_status tilejit_rms_norm_gated(const tilejit_tensor* x, const tilejit_tensor* gate,
                                      const tilejit_tensor* weight, const tilejit_tensor* out,
                                      const tilejit_gated_norm_options* opt) {
  return call(__func__, [&] {
    GatedNormOptions o;
    if (const auto c = options(opt, "opt", "tilejit_gated_norm_options_init",
                               tilejit_gated_norm_options_init)) {
      o.norm = norm_options(&c->norm, "opt.norm");
      o.act = to_enum<Activation>(c->act);
      o.norm_before_gate = c->norm_before_gate;
    }
    const auto w = optional_view(weight, "weight");
    rms_norm_gated(view(x, "x"), view(gate, "gate"), ops::opt_view(w), view(out, "out"), o);
  });
}

void tilejit_glu_options_init(tilejit_glu_options* opt) {
  if (opt == nullptr) return;
  const GluOptions d;
  *opt = tilejit_glu_options{};
  opt->struct_size = sizeof *opt;
  opt->act = static_cast<tilejit_activation>(d.act);
  opt->clamped_swiglu = d.clamped_swiglu;
  opt->swiglu_alpha = d.swiglu_alpha;
  opt->swiglu_limit = d.swiglu_limit;
  opt->rows = static_cast<tilejit_glu_rows>(d.rows);
}

tilejit_status tilejit_act_and_mul(const tilejit_tensor* x, const tilejit_tensor* out,
                                   const tilejit_glu_options* opt) {
  return call(__func__, [&] {
    GluOptions o;
    if (const auto c = options(opt, "opt", "tilejit_glu_options_init", tilejit_glu_options_init)) {
      o.act = to_enum<Activation>(c->act);
      o.clamped_swiglu = c->clamped_swiglu;
      o.swiglu_alpha = c->swiglu_alpha;
      o.swiglu_limit = c->swiglu_limit;
      o.rows = to_enum<GluRows>(c->rows);
    }
    act_and_mul(view(x, "x"), view(out, "out"), o);
  });
}

}  // extern "C"
