// The allowed values of the attention operators' scalar options, one home for
// the two places that check them: the operators (ops/attention_checks.cpp
// throws an Error naming the call) and the IR verifier (ir/ops.cpp reports a
// problem of the op). Each returns what is allowed when `v` is not, else null.
// (The IR once required sm_scale > 0 while the operators take any finite
// scale: a program could not say what the API runs.)
#pragma once

#include <cmath>
#include <cstdint>

#include "tilejit/tilejit.h"

namespace tilejit::ir {

// The dtypes a paged KV cache may have: bf16, or f8e4m3 / f8e5m2 (an fp8
// cache read as code · scale, KvCacheScales; vLLM's "fp8_e4m3" / "fp8_e5m2"). The one list every
// cache check uses (ops::attn::kKvCacheDtypes is this; the tuning database's `kv` field too).
inline constexpr DType kKvCacheDtypes[] = {DType::bf16, DType::f8e4m3, DType::f8e5m2};

// sm_scale: any finite value (0 and negative scales included: the scores'
// order is taken after scaling, docs/attention.md).
inline const char* sm_scale_refusal(double v) {
  return std::isfinite(v) ? nullptr : "a finite value";
}
inline const char* softcap_refusal(double v) {
  return v >= 0 && std::isfinite(v) ? nullptr : "0 (off) or a finite value > 0";
}
// window_left / window_right.
inline const char* window_refusal(int64_t v) {
  return v >= -1 ? nullptr : "-1 (unbounded) or >= 0";
}
// fp8 cache k_scale / v_scale and each head scale.
inline const char* kv_scale_refusal(double v) {
  return v > 0 && std::isfinite(v) ? nullptr : "a finite value > 0";
}

}  // namespace tilejit::ir
