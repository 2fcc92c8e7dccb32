#include "ops/rope_kernels.h"

#include "jit/llvm_kernels.h"

namespace tilejit::ops {

#ifdef TILEJIT_HAVE_LLVM
namespace lb = codegen::llvm_backend;

const jit::Kernel& rope_kernel(const lb::RopeDesc& d) {
  const std::string name = d.name();
  return jit::llvm_kernel(name, name, [&] { return lb::compile_llvm_rope(d); });
}
#else
const jit::Kernel& rope_kernel(const codegen::llvm_backend::RopeDesc&) {
  throw Error("rope: the JIT path needs a tilejit built with LLVM");
}
#endif

}  // namespace tilejit::ops
