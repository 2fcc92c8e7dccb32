#include "jit/brgemm_kernels.h"

#include "codegen/xbyak/emitters.h"
#include "jit/kernel_cache.h"

#ifdef TILEJIT_HAVE_LLVM
#include "codegen/llvm/llvm_brgemm.h"
#include "jit/llvm_kernels.h"
#endif

namespace tilejit::jit {
namespace {

#ifdef TILEJIT_HAVE_LLVM
const Kernel& llvm_brgemm_kernel(const codegen::BrgemmDesc& d) {
  // The dot-product variant (vdpbf16ps or fp32 FMA) follows the host target,
  // which llvm_kernel adds to the key.
  return llvm_kernel(d.key(), codegen::llvm_backend::llvm_brgemm_name(d),
                     [&] { return codegen::llvm_backend::compile_llvm_brgemm(d); });
}
#endif

}  // namespace

const Kernel& brgemm_kernel(const codegen::BrgemmDesc& d) {
  if (d.mr < 1 || d.nr < 1 || d.nr > 64 || d.kb < 1)
    throw Error("brgemm: descriptor " + d.key() + " is outside 1 <= mr, 1 <= nr <= 64, kb >= 1");
  if (d.glu != codegen::Glu::none && d.nr > 32)
    throw Error("brgemm: GLU descriptor " + d.key() + " has nr > 32 (a 64-column block pairs 32)");
  if (d.isa == Isa::llvm) {
#ifdef TILEJIT_HAVE_LLVM
    return llvm_brgemm_kernel(d);
#else
    throw Error("brgemm: the llvm path needs a tilejit built with LLVM");
#endif
  }
  return KernelCache::global().get(d.key(), d.name(), [&] {
    switch (d.isa) {
      case Isa::amx:
        if (d.mr > 32) throw Error("brgemm: AMX kernel mr=" + std::to_string(d.mr) + " > 32");
        return codegen::xbyak::emit_amx_brgemm(d);
      case Isa::avx512: {
        const int nz = (d.computed_cols() + 15) / 16;
        if (d.mr > codegen::xbyak::avx512_brgemm_max_mr(nz))
          throw Error("brgemm: AVX-512 kernel mr=" + std::to_string(d.mr) + " exceeds " +
                      std::to_string(codegen::xbyak::avx512_brgemm_max_mr(nz)) +
                      " for nr=" + std::to_string(d.nr));
        return codegen::xbyak::emit_avx512_brgemm(d);
      }
      case Isa::llvm:
      case Isa::scalar:
        break;
    }
    throw Error("brgemm: no Xbyak kernel for the " + std::string(isa_name(d.isa)) + " path");
  });
}

}  // namespace tilejit::jit
