// The small public functions: names, TensorView constructors, cpu_info,
// cache_stats, thread count.
#include <fmt/format.h>

#include <limits>

#include "ir/activation.h"
#include "jit/kernel_cache.h"
#include "runtime/batch_invariant.h"
#include "runtime/cpu_features.h"
#include "runtime/dtype_list.h"
#include "runtime/isa.h"
#include "runtime/thread_pool.h"
#include "tilejit/tilejit.h"

namespace tilejit {

namespace {
// An enum value outside its declaration (a cast from an int, a corrupted
// field) is a caller's error like any other.
Error bad_enum(const char* fn, const char* type, int value, const char* allowed) {
  return Error(fmt::format("{}: {}({}) is not a {}; allowed: {}", fn, type, value, type, allowed));
}
// "f32, bf16, ..., f8e5m2": every DType's name (runtime::kAllDTypes).
std::string all_dtype_names() {
  std::string r;
  for (DType d : runtime::kAllDTypes) r += (r.empty() ? "" : ", ") + std::string(dtype_name(d));
  return r;
}
}  // namespace

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i8:
      return "i8";
    case DType::u8:
      return "u8";
    case DType::i32:
      return "i32";
    case DType::f8e4m3:
      return "f8e4m3";
    case DType::u4:
      return "u4";
    case DType::i64:
      return "i64";
    case DType::f4e2m1:
      return "f4e2m1";
    case DType::f8e5m2:
      return "f8e5m2";
  }
  throw bad_enum("dtype_name", "DType", static_cast<int>(t), all_dtype_names().c_str());
}

int dtype_bits(DType t) {
  switch (t) {
    case DType::f32:
    case DType::i32:
      return 32;
    case DType::bf16:
    case DType::f16:
      return 16;
    case DType::i8:
    case DType::u8:
    case DType::f8e4m3:
    case DType::f8e5m2:
      return 8;
    case DType::u4:
    case DType::f4e2m1:
      return 4;
    case DType::i64:
      return 64;
  }
  throw bad_enum("dtype_bits", "DType", static_cast<int>(t), all_dtype_names().c_str());
}

const char* activation_name(Activation a) {
  if (const ir::ActivationInfo* r = ir::find_activation(a)) return r->name;
  throw bad_enum("activation_name", "Activation", static_cast<int>(a),
                 ir::activation_list(false).c_str());
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar:
      return "scalar";
    case Isa::llvm:
      return "llvm";
    case Isa::avx512:
      return "avx512";
    case Isa::amx:
      return "amx";
  }
  throw bad_enum("isa_name", "Isa", static_cast<int>(isa), "scalar, llvm, avx512, amx");
}

TensorView::TensorView(void* d, DType t, std::vector<int64_t> s)
    : data(d), dtype(t), shape(std::move(s)), strides(shape.size()) {
  // Saturating: a shape whose size overflows int64 gets strides every
  // operator's view check refuses (a constructor has no argument name to report).
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    if (__builtin_mul_overflow(stride, shape[i] > 0 ? shape[i] : 0, &stride))
      stride = std::numeric_limits<int64_t>::max();
  }
}

TensorView::TensorView(void* d, DType t, std::vector<int64_t> s, std::vector<int64_t> st)
    : data(d), dtype(t), shape(std::move(s)), strides(std::move(st)) {}

CpuInfo cpu_info() {
  const auto& f = runtime::cpu_features();
  CpuInfo c;
  c.vendor = f.vendor;
  c.avx512f = f.avx512f;
  c.avx512bw = f.avx512bw;
  c.avx512vl = f.avx512vl;
  c.avx512_bf16 = f.avx512_bf16;
  c.avx512_fp16 = f.avx512_fp16;
  c.amx_tile = f.amx_tile;
  c.amx_bf16 = f.amx_bf16;
  c.amx_int8 = f.amx_int8;
  c.amx_permitted = f.amx_permitted;
  c.amx_emulated = f.amx_emulated;
  c.avx2 = f.avx2;
  c.fma = f.fma;
#ifdef TILEJIT_HAVE_LLVM
  c.llvm_backend = true;
#endif
  c.max_isa = runtime::max_supported_isa();
  c.isa = runtime::active_isa();
  c.num_threads = runtime::num_threads();
  return c;
}

CacheStats cache_stats() {
  return jit::KernelCache::global().stats();
}

void set_num_threads(int n) {
  runtime::set_num_threads(n);
}
int num_threads() {
  return runtime::num_threads();
}

void set_batch_invariant(bool on) {
  runtime::set_batch_invariant(on);
}
bool batch_invariant() {
  return runtime::batch_invariant();
}

}  // namespace tilejit
