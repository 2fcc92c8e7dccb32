// The LLVM decode kernel (codegen/llvm/llvm_decode_attention.h) as the
// attention operators call it: one query token's Hq rows (every kv head at
// once) over a key range of one sequence's paged cache, into an fp32
// online-softmax state. decode_attention runs every sequence through it;
// extend_attention its sequences with one new token (sglang's decode tokens
// inside a mixed extend batch), which the block engine, tiled for 64-row
// query blocks, ran at 2-3x the decode time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "codegen/llvm/llvm_decode_attention.h"
#include "ops/attention_checks.h"
#include "ops/attention_engine.h"
#include "tilejit/tilejit.h"

namespace tilejit::ops::attn {

class DecodeKernel {
 public:
  // q [rows, Hq, D] (the query tokens), the caches and block table as the
  // operator checked them; p the call's parameters, ph its per-kv-head copy
  // with an fp8 cache's scales folded in (head_params). Compiles or loads the
  // kernel (desc) once, here.
  DecodeKernel(const codegen::llvm_backend::DecodeAttentionDesc& desc, const Params& p,
               const std::vector<Params>& ph, bool fp8, const TensorView& q,
               const TensorView& k_cache, const TensorView& v_cache, const TensorView& block_table);

  // Query token `token` (row of q) at position i_pos of sequence b (row b of
  // the block table), whose sequence has tk keys: keys [j0, j1) that it can
  // see (windows, causality of p) folded into st, which is reset here to Hq
  // rows of padded_dv(Dv) floats (attention_engine.h). O comes out in V's units (an fp8 cache's V
  // scale applied), so states of other key ranges merge with it as they are.
  void run(int64_t b, int64_t token, int64_t i_pos, int64_t tk, int64_t j0, int64_t j1,
           Partial& st) const;

 private:
  codegen::llvm_backend::DecodeAttentionFn fn_;
  size_t scratch_bytes_;
  const Params& p_;
  const std::vector<Params>& ph_;
  bool fp8_;
  const TensorView &q_, &k_cache_, &v_cache_, &block_table_;
  int64_t hq_, hkv_, g_, dv_;
};

}  // namespace tilejit::ops::attn
