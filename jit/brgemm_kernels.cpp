#include "jit/brgemm_kernels.h"

#include <cstdio>

#include "codegen/xbyak/emitters.h"
#include "jit/kernel_cache.h"

#ifdef TILEJIT_HAVE_LLVM
#include "codegen/llvm/llvm_brgemm.h"
#endif

namespace tilejit::jit {
namespace {

#ifdef TILEJIT_HAVE_LLVM
namespace lb = codegen::llvm_backend;

std::unique_ptr<Kernel> adopt(lb::LlvmKernel&& lk) {
  auto k = std::make_unique<Kernel>();
  k->backend = "llvm";
  k->entry_ptr = lk.entry;
  k->size = lk.object_file.size();
  k->keepalive = std::move(lk.keepalive);
  return k;
}

// LLVM code is compiled for exactly this host's CPU and features (and the
// dot-product variant follows them), so they are part of the key.
std::string llvm_key(const codegen::BrgemmDesc& d) {
  const lb::HostTarget& h = lb::host_target();
  uint64_t hash = 1469598103934665603ull;  // FNV-1a of the feature string
  for (char c : h.features) hash = (hash ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return d.key() + ";llvm_cpu=" + h.cpu + ";llvm_features=" + hex;
}

const Kernel& llvm_brgemm_kernel(const codegen::BrgemmDesc& d) {
  const std::string name = lb::llvm_brgemm_name(d);
  KernelRecipe r;
  r.compile = [&] {
    lb::LlvmKernel lk = lb::compile_llvm_brgemm(d);
    BuiltKernel b;
    b.payload = lk.object_file;
    b.kernel = adopt(std::move(lk));
    return b;
  };
  r.load = [name](std::vector<uint8_t> object) {
    return adopt(lb::load_object_file(name, std::move(object)));
  };
  return KernelCache::global().get(llvm_key(d), name, r);
}
#endif

}  // namespace

const Kernel& brgemm_kernel(const codegen::BrgemmDesc& d) {
  if (d.mr < 1 || d.nr < 1 || d.nr > 64 || d.kb < 1)
    throw Error("brgemm: descriptor " + d.key() + " is outside 1 <= mr, 1 <= nr <= 64, kb >= 1");
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
        const int nz = (d.nr + 15) / 16;
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
