#include "tools/program/llvm_kernel_names.h"

namespace tilejit::tools {

#ifdef TILEJIT_HAVE_LLVM
std::string rope_kernel_name(const codegen::llvm_backend::RopeDesc& d) {
  return d.name();
}

std::string decode_attention_kernel_name(const codegen::llvm_backend::DecodeAttentionDesc& d) {
  return d.name();
}
#else
std::string rope_kernel_name(const codegen::llvm_backend::RopeDesc&) {
  return "";
}

std::string decode_attention_kernel_name(const codegen::llvm_backend::DecodeAttentionDesc&) {
  return "";
}
#endif

}  // namespace tilejit::tools
