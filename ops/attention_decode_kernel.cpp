#include "ops/attention_decode_kernel.h"

#include <algorithm>
#include <cstdint>

#include "jit/registry.h"
#include "runtime/per_thread.h"

namespace tilejit::ops::attn {

namespace lb = codegen::llvm_backend;

DecodeKernel::DecodeKernel(const lb::DecodeAttentionDesc& desc, const Params& p,
                           const std::vector<Params>& ph, bool fp8, const TensorView& q,
                           const TensorView& k_cache, const TensorView& v_cache,
                           const TensorView& block_table)
    : fn_(jit::get(desc).entry<lb::DecodeAttentionFn>()),
      scratch_bytes_(
          static_cast<size_t>(lb::decode_attention_scratch_bytes(desc, k_cache.shape[2]))),
      p_(p),
      ph_(ph),
      fp8_(fp8),
      q_(q),
      k_cache_(k_cache),
      v_cache_(v_cache),
      block_table_(block_table),
      hq_(q.shape[1]),
      hkv_(k_cache.shape[2]),
      g_(q.shape[1] / k_cache.shape[2]),
      dv_(v_cache.shape[3]) {}

void DecodeKernel::run(int64_t b, int64_t token, int64_t i_pos, int64_t tk, int64_t j0, int64_t j1,
                       Partial& st) const {
  st.reset(hq_, padded_dv(dv_));
  int64_t lo = 0, hi = 0;
  visible_keys(p_, i_pos, tk, lo, hi);
  j0 = std::max(j0, lo), j1 = std::min(j1, hi + 1);
  if (j0 >= j1) return;
  // Slopes gathered once per call into the kernel's [Hq] order (the rows are
  // the heads in order).
  auto& slopes = runtime::per_thread<std::vector<float>>([] {});
  slopes.resize(static_cast<size_t>(hq_));
  if (p_.slopes)
    for (int64_t r = 0; r < hq_; ++r) slopes[r] = p_.slopes[r * p_.slopes_stride];
  // fp8: the score scale per kv head (sm_scale · k scale).
  auto& k_scale = runtime::per_thread<std::vector<float>>([] {});
  k_scale.resize(static_cast<size_t>(hkv_));
  for (int64_t h = 0; h < hkv_; ++h) k_scale[h] = ph_[h].scale;
  lb::DecodeAttentionArgs a{};
  a.k_scale = k_scale.data();
  a.q = static_cast<const uint16_t*>(q_.data) + token * q_.strides[0];
  a.q_row_stride = q_.strides[1];
  a.k = static_cast<const uint16_t*>(k_cache_.data);
  a.v = static_cast<const uint16_t*>(v_cache_.data);
  a.heads = hkv_;
  a.k_head_stride = k_cache_.strides[2];
  a.v_head_stride = v_cache_.strides[2];
  a.table = static_cast<const int32_t*>(block_table_.data) + b * block_table_.strides[0];
  a.table_stride = block_table_.strides[1];
  a.k_block_stride = k_cache_.strides[0];
  a.k_row_stride = k_cache_.strides[1];
  a.v_block_stride = v_cache_.strides[0];
  a.v_row_stride = v_cache_.strides[1];
  a.j0 = j0;
  a.j1 = j1;
  a.i_pos = i_pos;
  a.slopes = slopes.data();
  a.softcap = p_.softcap;
  a.scale = p_.scale;
  a.m = st.mx.data();
  a.l = st.l.data();
  a.o = st.o.data();
  // The kernel's working memory, kept per thread (64-byte aligned).
  auto& scratch = runtime::per_thread<std::vector<uint8_t>>([] {});
  if (scratch.size() < scratch_bytes_ + 63) scratch.resize(scratch_bytes_ + 63);
  a.scratch =
      reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t{63});
  fn_(&a);
  // fp8: the kernel's O is in the V codes' units (DecodeAttentionArgs).
  if (fp8_)
    for (int64_t r = 0; r < hq_; ++r) {
      const float vsc = ph_[r / g_].v_scale;
      float* orow = st.o.data() + r * st.ldo;
      for (int64_t c = 0; c < dv_; ++c) orow[c] *= vsc;
    }
}

}  // namespace tilejit::ops::attn
