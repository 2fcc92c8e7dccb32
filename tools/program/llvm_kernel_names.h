// The names of the LLVM kernels the operators build, for the tool's reports
// (`tilejit dump`, the llama-layer job): "" in a tilejit built without LLVM,
// where those operators run no JIT code.
#pragma once

#include <string>

#include "codegen/llvm/llvm_decode_attention.h"
#include "codegen/llvm/llvm_rope.h"

namespace tilejit::tools {

std::string rope_kernel_name(const codegen::llvm_backend::RopeDesc& d);
std::string decode_attention_kernel_name(const codegen::llvm_backend::DecodeAttentionDesc& d);

}  // namespace tilejit::tools
