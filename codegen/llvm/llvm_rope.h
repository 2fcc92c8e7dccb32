// Rotary position embedding kernels compiled by LLVM: q and k rotated in
// place in one pass over the tokens, specialised on everything but the token
// count and the strides (semantics: docs/rope.md). LLVM-free: the rest of the
// project includes this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "codegen/kernel_desc.h"
#include "codegen/llvm/llvm_jit.h"
#include "tilejit/tilejit.h"

namespace tilejit::codegen::llvm_backend {

// What the emitted bytes depend on.
struct RopeDesc {
  static constexpr const char* kFamily = "rope_llvm";
  bool neox = true;                    // else gptj
  DType dtype = DType::bf16;           // q and k: f32 or bf16
  DType cache_dtype = DType::f32;      // f32 or bf16
  int64_t d = 0;                       // head size (even)
  int64_t rotary_dim = 0;              // even, <= d, a multiple of 2·ndim
  int64_t hq = 0, hk = 0;              // heads; hk = 0: no k
  int64_t ndim = 1;                    // chunks of the rotary part, one position stream each
  std::vector<int64_t> mrope_section;  // frequency sections (ndim == 1), sum rotary_dim / 2
  bool mrope_interleaved = false;      // 3 sections, frequencies dealt t,h,w,t,h,w,... (tilejit.h)
  DType pos_dtype = DType::i32;        // positions: i32 or i64 (the load width)

  // Position streams: ndim chunks, or one per M-RoPE section, else one. Inline:
  // the ops layer reads it in builds without LLVM too.
  int64_t streams() const {
    if (ndim > 1) return ndim;
    return mrope_section.empty() ? 1 : static_cast<int64_t>(mrope_section.size());
  }
  static constexpr auto field_list() {
    using D = RopeDesc;
    using enum NameRule;
    return std::make_tuple(field("neox", &D::neox, "_neox", "_gptj", choice),
                           field("dtype", &D::dtype, "_"),
                           field("cache", &D::cache_dtype, "_cache"), field("d", &D::d, "_d"),
                           field("rd", &D::rotary_dim, "_rd"), field("hq", &D::hq, "_hq"),
                           field("hk", &D::hk, "_hk"), field("nd", &D::ndim, "_nd", unless_default),
                           field("mrope", &D::mrope_section, "_mrope", unless_default),
                           field("il", &D::mrope_interleaved, "_interleaved", flag),
                           field("pos", &D::pos_dtype, "_pos", unless_default));
  }
  bool operator==(const RopeDesc& o) const { return same_fields(*this, o); }
  // rope_llvm_neox_bf16_cachef32_d128_rd64_hq32_hk8[_nd2 | _mrope16x24x24[_interleaved]][_posi64]
  // (i32 positions add nothing, so the names of the int32 kernels stay as they were).
  std::string name() const { return desc_name(*this); }
};
static_assert(fields_cover<RopeDesc>(), "a RopeDesc member is missing from field_list()");

// The call: `tokens` tokens starting at the given pointers. Strides in
// elements; positions[s·pos_stream_stride + t·pos_token_stride] (int32 or
// int64 per pos_dtype) is stream s of token t, already checked to lie in
// [0, max_position).
struct RopeArgs {
  void* q;
  void* k;  // unused when hk = 0
  const void* positions;
  const void* cache;
  int64_t tokens;
  int64_t q_token_stride, q_head_stride;
  int64_t k_token_stride, k_head_stride;
  int64_t pos_stream_stride, pos_token_stride;
  int64_t cache_row_stride;
};
static_assert(offsetof(RopeArgs, tokens) == 32 && offsetof(RopeArgs, cache_row_stride) == 88);

using RopeFn = void (*)(const RopeArgs*);

// Checks the descriptor (Error naming the field) and compiles it.
LlvmKernel compile_llvm_rope(const RopeDesc& desc, OptLevel opt = OptLevel::kernel);

}  // namespace tilejit::codegen::llvm_backend
