// The kernel descriptors the attention operators build, exported so that a
// caller that reports which kernel a call runs (the `tilejit` tool) takes the
// operator's own descriptor instead of re-deriving its fields.
#pragma once

#include <cstdint>
#include <string>

#include "codegen/llvm/llvm_decode_attention.h"

namespace tilejit::ops {

// The LLVM kernel tilejit::decode_attention runs for head sizes d and dv, g
// query heads per kv head, cache blocks of block_size rows, with a softcap
// and ALiBi slopes or without, over a bf16 or f8e4m3 cache (kv); its partial
// O rows are dv rounded up to 64 floats.
codegen::llvm_backend::DecodeAttentionDesc decode_attention_desc(int64_t d, int64_t dv, int64_t g,
                                                                 int64_t block_size, bool softcap,
                                                                 bool alibi,
                                                                 DType kv = DType::bf16);

// Whether tilejit::decode_attention runs that LLVM kernel on path `isa` for g
// query heads per kv head: a JIT path of an LLVM build and g within the
// kernel's kMaxG; otherwise the attention engine's decode (an fp8 cache
// through an exact bf16 copy of the blocks it reads).
bool decode_attention_llvm_kernel(Isa isa, int64_t g);

// What the attention engine runs for one call on path `isa` (prefill,
// extend, and decode without its LLVM kernel), as the TILEJIT_VERBOSE line
// names it: "plan=attention_engine kernels=brgemm_<isa> glue=<llvm|c++>
// rows=R key_block=KB tasks=N splits=S": its brgemm micro-kernels, its
// softmax glue (LLVM kernels, or C++ in a build without LLVM), query rows per
// task, keys per online-softmax step, tasks and key-range splits per task.
std::string attention_engine_plan(Isa isa, int64_t rows, int64_t key_block, int64_t tasks,
                                  int64_t splits);

}  // namespace tilejit::ops
