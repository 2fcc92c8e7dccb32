// The C API's shared part: status and last-error, the tensor and weight
// conversions (ops/c_api_support.h).
#include "ops/c_api_support.h"

#include <cxxabi.h>

#include <new>

#include "runtime/no_cancel.h"

namespace tilejit::c_api {

namespace {
// The thread's last error. A plain array: a thread_local with a destructor
// is what glibc aborts on when a thread exits out of memory
// (runtime/per_thread.h), and this one must be writable without allocating.
constexpr size_t kMessageBytes = 4096;
thread_local char t_last_error[kMessageBytes];

// Appends src to dst[pos..], keeping the NUL; returns the new end, or
// kMessageBytes when src did not fit (the caller then ends it with "...").
size_t append(size_t pos, const char* src) noexcept {
  for (; *src != '\0'; ++src, ++pos) {
    if (pos + 1 >= kMessageBytes) return kMessageBytes;
    t_last_error[pos] = *src;
  }
  t_last_error[pos] = '\0';
  return pos;
}
}  // namespace

void set_last_error(const char* prefix, const char* msg, const char* more) noexcept {
  t_last_error[0] = '\0';
  size_t pos = append(0, prefix);
  if (pos < kMessageBytes) pos = append(pos, msg);
  if (pos < kMessageBytes) pos = append(pos, more);
  if (pos == kMessageBytes) std::memcpy(t_last_error + kMessageBytes - 4, "...", 4);
}

tilejit_status call(const char* fn, void (*body)(void*), void* ctx) {
  const runtime::NoCancelScope no_cancel;  // as every C++ call (runtime/no_cancel.h)
  try {
    body(ctx);
    return TILEJIT_OK;
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (const CArgError& e) {
    set_last_error(fn, ": ", e.what());
    return TILEJIT_ERROR;
  } catch (const InternalError& e) {
    set_last_error("", e.what());
    return TILEJIT_INTERNAL_ERROR;
  } catch (const Error& e) {
    set_last_error("", e.what());
    return TILEJIT_ERROR;
  } catch (const std::bad_alloc&) {
    // The operators turn theirs into an Error naming the call; this is one
    // the C layer's own conversions met.
    set_last_error("", "out of memory: an allocation failed");
    return TILEJIT_ERROR;
  } catch (const std::exception& e) {
    set_last_error("tilejit internal error (please report): ", e.what());
    return TILEJIT_INTERNAL_ERROR;
  } catch (...) {
    set_last_error("tilejit internal error (please report): ", "an unknown exception");
    return TILEJIT_INTERNAL_ERROR;
  }
}

TensorView view(const tilejit_tensor* t, const char* arg) {
  const tilejit_tensor& c = deref(t, arg);
  if (c.ndim < 0 || c.ndim > TILEJIT_MAX_NDIM)
    throw CArgError(std::string(arg) + ".ndim = " + std::to_string(c.ndim) + "; allowed: 0.." +
                    std::to_string(TILEJIT_MAX_NDIM));
  if (c.ndim > 0 && c.shape == nullptr)
    throw CArgError(std::string(arg) + ".shape is NULL with ndim " + std::to_string(c.ndim) +
                    "; allowed: ndim values");
  const auto n = static_cast<size_t>(c.ndim);
  std::vector<int64_t> shape(c.shape, c.shape + n);
  const auto dtype = to_enum<DType>(c.dtype);
  if (c.strides == nullptr) return TensorView(c.data, dtype, std::move(shape));
  return TensorView(c.data, dtype, std::move(shape),
                    std::vector<int64_t>(c.strides, c.strides + n));
}

std::optional<TensorView> optional_view(const tilejit_tensor* t, const char* arg) {
  if (t == nullptr) return std::nullopt;
  return view(t, arg);
}

Int8Weight int8_weight(const tilejit_int8_weight& w, const std::string& arg) {
  return {view(&w.weight, (arg + ".weight").c_str()), view(&w.scales, (arg + ".scales").c_str())};
}

Fp8Weight fp8_weight(const tilejit_fp8_weight& w, const std::string& arg) {
  Fp8Weight out;
  out.weight = view(&w.weight, (arg + ".weight").c_str());
  out.scales = view(&w.scales, (arg + ".scales").c_str());
  out.block_n = w.block_n;
  out.block_k = w.block_k;
  return out;
}

Int4Weight int4_weight(const tilejit_int4_weight& w, const std::string& arg) {
  Int4Weight out;
  out.format = to_enum<Int4Format>(w.format);
  out.qweight = view(&w.qweight, (arg + ".qweight").c_str());
  out.scales = view(&w.scales, (arg + ".scales").c_str());
  out.qzeros = optional_view(w.qzeros, (arg + ".qzeros").c_str());
  out.g_idx = optional_view(w.g_idx, (arg + ".g_idx").c_str());
  out.bits = w.bits;
  out.group_size = w.group_size;
  out.gptq_v2 = w.gptq_v2;
  out.n = w.n;
  out.k = w.k;
  return out;
}

Mxfp4Weight mxfp4_weight(const tilejit_mxfp4_weight& w, const std::string& arg) {
  Mxfp4Weight out;
  out.blocks = view(&w.blocks, (arg + ".blocks").c_str());
  out.scales = view(&w.scales, (arg + ".scales").c_str());
  out.k = w.k;
  return out;
}

KvCacheScales kv_scales(const tilejit_kv_cache_scales& s) {
  KvCacheScales out;
  out.k_scale = s.k_scale;
  out.v_scale = s.v_scale;
  out.k_head_scales = optional_view(s.k_head_scales, "k_head_scales");
  out.v_head_scales = optional_view(s.v_head_scales, "v_head_scales");
  return out;
}

// The C enums hold the C++ enums' values (tilejit_c.h says so per enum).
#define TILEJIT_SAME_VALUE(c, cpp) static_assert(static_cast<int>(c) == static_cast<int>(cpp))
TILEJIT_SAME_VALUE(TILEJIT_F32, DType::f32);
TILEJIT_SAME_VALUE(TILEJIT_BF16, DType::bf16);
TILEJIT_SAME_VALUE(TILEJIT_F16, DType::f16);
TILEJIT_SAME_VALUE(TILEJIT_I8, DType::i8);
TILEJIT_SAME_VALUE(TILEJIT_U8, DType::u8);
TILEJIT_SAME_VALUE(TILEJIT_I32, DType::i32);
TILEJIT_SAME_VALUE(TILEJIT_F8E4M3, DType::f8e4m3);
TILEJIT_SAME_VALUE(TILEJIT_U4, DType::u4);
TILEJIT_SAME_VALUE(TILEJIT_I64, DType::i64);
TILEJIT_SAME_VALUE(TILEJIT_F4E2M1, DType::f4e2m1);
TILEJIT_SAME_VALUE(TILEJIT_F8E5M2, DType::f8e5m2);
TILEJIT_SAME_VALUE(TILEJIT_ACT_NONE, Activation::none);
TILEJIT_SAME_VALUE(TILEJIT_ACT_RELU, Activation::relu);
TILEJIT_SAME_VALUE(TILEJIT_ACT_SILU, Activation::silu);
TILEJIT_SAME_VALUE(TILEJIT_ACT_GELU_TANH, Activation::gelu_tanh);
TILEJIT_SAME_VALUE(TILEJIT_ACT_GELU_ERF, Activation::gelu_erf);
TILEJIT_SAME_VALUE(TILEJIT_ACT_RELU2, Activation::relu2);
TILEJIT_SAME_VALUE(TILEJIT_WEIGHT_BF16, WeightFormat::bf16);
TILEJIT_SAME_VALUE(TILEJIT_WEIGHT_INT8, WeightFormat::int8);
TILEJIT_SAME_VALUE(TILEJIT_WEIGHT_FP8_E4M3, WeightFormat::fp8_e4m3);
TILEJIT_SAME_VALUE(TILEJIT_WEIGHT_INT4_AWQ, WeightFormat::int4_awq);
TILEJIT_SAME_VALUE(TILEJIT_WEIGHT_INT4_GPTQ, WeightFormat::int4_gptq);
TILEJIT_SAME_VALUE(TILEJIT_WEIGHT_MXFP4, WeightFormat::mxfp4);
TILEJIT_SAME_VALUE(TILEJIT_INT4_AWQ, Int4Format::awq);
TILEJIT_SAME_VALUE(TILEJIT_INT4_GPTQ, Int4Format::gptq);
TILEJIT_SAME_VALUE(TILEJIT_ACT_QUANT_DYNAMIC_SYM, ActQuant::dynamic_sym);
TILEJIT_SAME_VALUE(TILEJIT_ACT_QUANT_DYNAMIC_ASYM, ActQuant::dynamic_asym);
TILEJIT_SAME_VALUE(TILEJIT_ACT_QUANT_FIXED, ActQuant::fixed);
TILEJIT_SAME_VALUE(TILEJIT_INT4_ROUTE_AUTOMATIC, Int4Route::automatic);
TILEJIT_SAME_VALUE(TILEJIT_INT4_ROUTE_W4A16, Int4Route::w4a16);
TILEJIT_SAME_VALUE(TILEJIT_INT4_ROUTE_W4A8, Int4Route::w4a8);
TILEJIT_SAME_VALUE(TILEJIT_ROPE_NEOX, RopeStyle::neox);
TILEJIT_SAME_VALUE(TILEJIT_ROPE_GPTJ, RopeStyle::gptj);
TILEJIT_SAME_VALUE(TILEJIT_EXPERTS_GATE_UP, ExpertProj::gate_up);
TILEJIT_SAME_VALUE(TILEJIT_EXPERTS_DOWN, ExpertProj::down);
TILEJIT_SAME_VALUE(TILEJIT_EXPERTS_UP, ExpertProj::up);
TILEJIT_SAME_VALUE(TILEJIT_GLU_HALVES, GluRows::halves);
TILEJIT_SAME_VALUE(TILEJIT_GLU_INTERLEAVED, GluRows::interleaved);
TILEJIT_SAME_VALUE(TILEJIT_ROUTER_SOFTMAX, RouterScore::softmax);
TILEJIT_SAME_VALUE(TILEJIT_ROUTER_SIGMOID, RouterScore::sigmoid);
TILEJIT_SAME_VALUE(TILEJIT_ISA_SCALAR, Isa::scalar);
TILEJIT_SAME_VALUE(TILEJIT_ISA_LLVM, Isa::llvm);
TILEJIT_SAME_VALUE(TILEJIT_ISA_AVX512, Isa::avx512);
TILEJIT_SAME_VALUE(TILEJIT_ISA_AMX, Isa::amx);
#undef TILEJIT_SAME_VALUE

}  // namespace tilejit::c_api

extern "C" {

int tilejit_c_api_version(void) {
  return TILEJIT_C_API_VERSION;
}

const char* tilejit_last_error(void) {
  return tilejit::c_api::t_last_error;
}

const char* tilejit_status_name(tilejit_status s) {
  switch (tilejit::c_api::enum_value(s)) {
    case TILEJIT_OK:
      return "ok";
    case TILEJIT_ERROR:
      return "error";
    case TILEJIT_INTERNAL_ERROR:
      return "internal error";
    default:
      return "unknown status";
  }
}

}  // extern "C"
