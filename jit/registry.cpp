#include "jit/registry.h"

#include <fmt/format.h>

#include <new>
#include <string_view>

#include "codegen/xbyak/emitters.h"
#include "jit/front_cache.h"
#include "jit/kernel_cache.h"
#include "tilejit/error.h"

#ifdef TILEJIT_HAVE_LLVM
#include "codegen/llvm/llvm_act_quant.h"
#include "codegen/llvm/llvm_brgemm.h"
#include "codegen/llvm/llvm_dequant.h"
#include "codegen/llvm/llvm_elementwise.h"
#include "codegen/llvm/llvm_kv_quant.h"
#include "codegen/llvm/llvm_rowwise.h"
#include "codegen/llvm/mc_disassembler.h"
#include "jit/llvm_kernels.h"
// The LLVM maker of a two-backend family (nothing in a build without LLVM).
#define TILEJIT_LLVM_MAKER(D, expr) []([[maybe_unused]] const D& y) { return expr; }
#else
#define TILEJIT_LLVM_MAKER(D, expr) nullptr
#endif
#include "ir/printer.h"

namespace tilejit::jit {

namespace lb = codegen::llvm_backend;
using runtime::Backend;
using runtime::isa_features;

namespace {

// What each brgemm row takes (checked in brgemm_slow and by the emitter):
// AMX and LLVM cap mr at 32, AVX-512 at its zmm budget; every row also takes
// int8 (W8A8: u8 activations × i8 weights, int32 sums).
constexpr const char* kAmxLimits =
    "a=bf16 b=bf16 acc=f32, 1 <= mr <= 32, 1 <= nr <= 64 (GLU: <= 32), kb >= 1, out f32|bf16; "
    "or a=u8 b=i8 acc=i32 (W8A8) with kb % 4 == 0, a_packed, out i32|f32|bf16 "
    "(i32: the raw sums, no bias, act or GLU; GLU: nr <= 32); "
    "w4a8 (a=u8 b=i8 acc=i32, B in [-16, 15]) with kb % 64 == 0, row-major A, out f32|bf16";
constexpr const char* kAvx512Limits =
    "a=bf16 b=bf16 acc=f32, 1 <= mr <= avx512_brgemm_max_mr(nr) (the zmm budget), "
    "1 <= nr <= 64 (GLU: <= 32), kb >= 1, out f32|bf16; "
    "or a=u8 b=i8 acc=i32 (W8A8) with kb % 4 == 0, out i32|f32|bf16 "
    "(i32: the raw sums, no bias, act or GLU; GLU: nr <= 32); "
    "or a=bf16 b=u4|f8e4m3|f4e2m1 acc=f32 (the fused decode kernel) with mr <= 4; "
    "w4a8 (a=u8 b=i8 acc=i32, B in [-16, 15]) with kb % 16 == 0, out f32|bf16 (GLU: nr <= 32)";
constexpr const char* kLlvmLimits =
    "a=bf16 b=bf16 acc=f32, 1 <= mr <= 32, 1 <= nr <= 64 (GLU: <= 32), kb >= 1, out f32|bf16; "
    "or a=u8 b=i8 acc=i32 (W8A8) with kb % 4 == 0, out i32|f32|bf16 "
    "(i32: the raw sums, no bias, act or GLU; GLU: nr <= 32); or the fused decode kernel "
    "(a=bf16 b=u4|f8e4m3|f4e2m1 acc=f32, 1 <= mr <= 4, the whole K, batch 1); "
    "w4a8 (a=u8 b=i8 acc=i32, B in [-16, 15]) with kb % 16 == 0, out f32|bf16 "
    "(GLU: nr <= 32), row-major A";
// The table: one row per (family, path) this build can make, best path first.
const KernelRow kRows[] = {
    {Family::brgemm, Isa::amx, isa_features(Isa::amx), Backend::xbyak, "xbyak::emit_amx_brgemm",
     kAmxLimits},
    {Family::brgemm, Isa::avx512, isa_features(Isa::avx512), Backend::xbyak,
     "xbyak::emit_avx512_brgemm", kAvx512Limits},
#ifdef TILEJIT_HAVE_LLVM
    {Family::brgemm, Isa::llvm, isa_features(Isa::llvm), Backend::llvm,
     "llvm_backend::compile_llvm_brgemm", kLlvmLimits},
    // The attention glue, decode and RoPE kernels are LLVM code on every JIT
    // path: one row each, serving the llvm, avx512 and amx paths alike.
    {Family::softmax_step, Isa::llvm, isa_features(Isa::llvm), Backend::llvm,
     "llvm_backend::compile_llvm_softmax_step", "nz 1..4 (16-row groups)"},
    {Family::softmax_glue, Isa::llvm, isa_features(Isa::llvm), Backend::llvm,
     "llvm_backend::compile_llvm_softmax_{finish,pack_q,transpose_v}", "shape-free"},
    {Family::decode_attention, Isa::llvm, isa_features(Isa::llvm), Backend::llvm,
     "llvm_backend::compile_llvm_decode_attention",
     "d, dv even (Limits::attention_head_dim_ok), block_size >= 1"},
    {Family::rope, Isa::llvm, isa_features(Isa::llvm), Backend::llvm,
     "llvm_backend::compile_llvm_rope", "d even, rotary_dim even <= d, f32|bf16 q/k and cache"},
    {Family::rowwise, Isa::llvm, isa_features(Isa::llvm), Backend::llvm,
     "llvm_backend::compile_llvm_rowwise",
     "rms_norm | add_rms_norm | glu, any h >= 1, f32|bf16 rows, weight and out"},
    {Family::elementwise, Isa::llvm, isa_features(Isa::llvm), Backend::llvm,
     "llvm_backend::compile_llvm_elementwise", "add mul relu silu gelu_tanh gelu_erf relu2 cast"},
#endif
    // The quantized GEMMs' helpers: the Xbyak AVX-512 kernels serve the
    // avx512 and amx paths (a descriptor of either names isa=avx512).
    {Family::dequant, Isa::avx512, isa_features(Isa::avx512), Backend::xbyak, "xbyak::emit_dequant",
     "code f8e4m3 | u4 | f4e2m1 (zeros: u4 only); out bf16, or i8 with u4 (W4A8)"},
    {Family::act_quant, Isa::avx512, isa_features(Isa::avx512), Backend::xbyak,
     "xbyak::emit_act_quant", "mode sym | asym | fixed"},
    // store_kv's conversion into an f8e4m3 cache (the scalar path converts in C++).
    {Family::kv_quant, Isa::avx512, isa_features(Isa::avx512), Backend::xbyak,
     "xbyak::emit_kv_quant", "shape-free"},
#ifdef TILEJIT_HAVE_LLVM
    {Family::dequant, Isa::llvm, isa_features(Isa::llvm), Backend::llvm,
     "llvm_backend::compile_llvm_dequant",
     "code f8e4m3 | u4 | f4e2m1 (zeros: u4 only); out bf16, or i8 with u4 (W4A8)"},
    {Family::act_quant, Isa::llvm, isa_features(Isa::llvm), Backend::llvm,
     "llvm_backend::compile_llvm_act_quant", "mode sym | asym | fixed"},
    {Family::kv_quant, Isa::llvm, isa_features(Isa::llvm), Backend::llvm,
     "llvm_backend::compile_llvm_kv_quant", "shape-free"},
#endif
};

// The row of a descriptor: brgemm descriptors name their path; the other
// families have one row.
const KernelRow& row_for(Family family, Isa path) {
  if (const KernelRow* r = find_row(family, path)) return *r;
  throw Error(fmt::format("jit: no {} kernel for the {} path in this build{}", family_name(family),
                          isa_name(path),
                          family == Family::brgemm ? "" : " (it is LLVM code: build with LLVM)"));
}

// Compile through the cache; an exception an emitter raises that is not a
// tilejit::Error (Xbyak's, a std:: one) is a bug in tilejit, not in the call.
const Kernel& compile(const std::string& key, const std::string& name, const KernelRecipe& recipe) {
  // Not a bug: the process is short of memory (docs/reliability.md).
  auto out_of_memory = [&] {
    return Error(fmt::format("jit: out of memory: making the kernel {} failed to allocate", name));
  };
  try {
    return KernelCache::global().get(key, name, recipe);
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw out_of_memory();
  } catch (const std::exception& e) {
    // Xbyak reports its own allocation failure (ERR_CANT_ALLOC) by this text;
    // its header stays in codegen/xbyak, so the text is what we can match.
    if (std::string_view(e.what()) == "can't alloc") throw out_of_memory();
    throw InternalError(fmt::format("jit: emitting {} failed: {}", name, e.what()));
  }
}

// The LLVM rows' keys add the host target (LLVM compiles for the host).
std::string llvm_cache_key(const std::string& key) {
#ifdef TILEJIT_HAVE_LLVM
  return llvm_host_key(key);
#else
  return key;
#endif
}

// The per-thread front of the registry (jit/front_cache.h); a front hit
// counts as a cache hit in cache_stats().
template <class D, class Slow>
const Kernel& front(const D& d, Slow slow) {
  struct Eq {
    bool operator()(const D& a, const D& b) const { return codegen::same_fields(a, b); }
  };
  bool hit = false;
  const Kernel& k = FrontCache<D, const Kernel, codegen::DescHash, Eq>::get(
      d, [&](const D& x) -> const Kernel& { return slow(x); }, &hit);
  if (hit) KernelCache::global().count_hit();
  return k;
}

// The fused W4A16 / W8A16 decode kernel (b = u4 | f8e4m3 | f4e2m1): Xbyak on
// the avx512 row (the amx path's small-M quantized GEMMs use the avx512 plan
// too), LLVM on the llvm row; both take the same descriptors.
constexpr const char* kQuantLimits =
    "a=bf16 b=u4|f8e4m3|f4e2m1 acc=f32 on the avx512 and llvm rows: 1 <= mr <= 4, "
    "1 <= nr <= 64 (GLU: nr <= 32 outputs of the 64 computed columns), kb >= 1 (the whole K, "
    "batch 1), b_row_bytes 64 (u4, f4e2m1) | 128 (f8e4m3), zeros with u4 only, no acc_in, "
    "row-major A, out f32|bf16";

const Kernel& quant_brgemm(const codegen::BrgemmDesc& d, const KernelRow& row) {
  auto refuse = [&](const std::string& what) -> Error {
    return Error(fmt::format("brgemm: quantized descriptor {} has {}; allowed: {}", d.key(), what,
                             kQuantLimits));
  };
  if (d.isa != Isa::avx512 && d.isa != Isa::llvm)
    throw refuse(fmt::format("isa={}", isa_name(d.isa)));
  if (d.a_type != DType::bf16 || d.acc_type != DType::f32)
    throw refuse(fmt::format("a={} acc={}", dtype_name(d.a_type), dtype_name(d.acc_type)));
  if (d.b_zeros && d.b_type != DType::u4)
    throw refuse(fmt::format("zeros=1 with b={}", dtype_name(d.b_type)));
  if (d.mr < 1 || d.mr > codegen::BrgemmDesc::kQuantMaxMr) throw refuse(fmt::format("mr={}", d.mr));
  if (d.nr < 1 || d.nr > (d.glu != codegen::Glu::none ? 32 : 64))
    throw refuse(fmt::format("nr={} with glu={}", d.nr, codegen::glu_name(d.glu)));
  if (d.kb < 1) throw refuse(fmt::format("kb={}", d.kb));
  const int64_t code_row = d.b_type == DType::f8e4m3 ? 128 : 64;
  if (d.b_row_bytes != code_row)
    throw refuse(
        fmt::format("b_row_bytes={} (batch-shaped B: one code block of {}-byte k-pair "
                    "rows)",
                    d.b_row_bytes, code_row));
  if (d.accumulate) throw refuse("acc_in=1 (the kernel takes the whole K in one call)");
  if (d.a_packed) throw refuse("apack=1");
  if (d.w4a8) throw refuse("w4a8=1");
  if (d.out != DType::f32 && d.out != DType::bf16)
    throw refuse(fmt::format("out={}", dtype_name(d.out)));
  if (row.backend == Backend::xbyak)
    return compile(cache_key(d), d.name(),
                   xbyak_recipe([d] { return codegen::xbyak::emit_quant_brgemm(d); }));
#ifdef TILEJIT_HAVE_LLVM
  const std::string symbol = lb::llvm_brgemm_name(d);
  return compile(cache_key(d), symbol,
                 llvm_kernel_recipe(symbol, [d] { return lb::compile_llvm_brgemm(d); }));
#else
  throw InternalError("jit: the llvm brgemm row without LLVM");
#endif
}

const Kernel& brgemm_slow(const codegen::BrgemmDesc& d) {
  const KernelRow& row = row_for(Family::brgemm, d.isa);
  // The prefetch distance is an operand of the Xbyak AVX-512 kernels only
  // (AMX prefetches through args.b_prefetch, LLVM's kernels have their own).
  if (!codegen::BrgemmDesc::prefetch_allowed(d.prefetch_kib, row.path))
    throw Error(fmt::format("brgemm: descriptor {} has pf={} on the {} row; allowed: {}", d.key(),
                            d.prefetch_kib, isa_name(row.path),
                            codegen::BrgemmDesc::prefetch_allowed_text()));
  // The arithmetic choice of the Xbyak fused u4 kernel, and of nothing else.
  if (d.u4_bf16_dot &&
      !(d.b_type == DType::u4 && row.path == Isa::avx512 && row.backend == Backend::xbyak))
    throw Error(fmt::format(
        "brgemm: descriptor {} has dot=1 on the {} row; allowed: dot=1 with b=u4 on the avx512 "
        "(Xbyak) row",
        d.key(), isa_name(row.path)));
  if (d.b_type == DType::u4 || d.b_type == DType::f8e4m3 || d.b_type == DType::f4e2m1) {
    if ((row.path == Isa::avx512 && row.backend == Backend::xbyak) ||
        (row.path == Isa::llvm && row.backend == Backend::llvm))
      return quant_brgemm(d, row);
    throw Error(fmt::format("brgemm: descriptor {} has b={}; allowed on the {} row: {}", d.key(),
                            dtype_name(d.b_type), isa_name(row.path), row.limits));
  }
  if (d.b_zeros)
    throw Error(fmt::format("brgemm: descriptor {} has zeros=1 with b={}; allowed: zeros with b=u4",
                            d.key(), dtype_name(d.b_type)));
  if (d.w4a8 && !(d.a_type == DType::u8 && d.b_type == DType::i8 && d.acc_type == DType::i32))
    throw Error(
        fmt::format("brgemm: descriptor {} has w4a8=1 with a={} b={} acc={}; allowed: "
                    "w4a8 with a=u8 b=i8 acc=i32",
                    d.key(), dtype_name(d.a_type), dtype_name(d.b_type), dtype_name(d.acc_type)));
  const bool bf16 = d.a_type == DType::bf16 && d.b_type == DType::bf16 && d.acc_type == DType::f32;
  // Int8 (u8 × i8 → i32): every row (Xbyak amx / avx512, LLVM).
  const bool int8 = d.a_type == DType::u8 && d.b_type == DType::i8 && d.acc_type == DType::i32;
  if (!bf16 && !int8)
    throw Error(fmt::format("brgemm: descriptor {} has a={} b={} acc={}; allowed on the {} row: {}",
                            d.key(), dtype_name(d.a_type), dtype_name(d.b_type),
                            dtype_name(d.acc_type), isa_name(row.path), row.limits));
  if (bf16 && d.out != DType::f32 && d.out != DType::bf16)
    throw Error(fmt::format("brgemm: descriptor {} has out={}; allowed with a=bf16: f32, bf16",
                            d.key(), dtype_name(d.out)));
  if (int8) {
    if (d.out != DType::i32 && d.out != DType::f32 && d.out != DType::bf16)
      throw Error(fmt::format("brgemm: descriptor {} has out={}; allowed with a=u8: i32, f32, bf16",
                              d.key(), dtype_name(d.out)));
    if (d.kb % codegen::k_group_of(d.b_type) != 0)
      throw Error(fmt::format(
          "brgemm: int8 descriptor {} has kb={}; allowed: a multiple of 4 (the VNNI group)",
          d.key(), d.kb));
    if (d.out == DType::i32 && (d.bias != codegen::BiasKind::none || d.act != Activation::none ||
                                d.glu != codegen::Glu::none))
      throw Error(
          fmt::format("brgemm: int8 descriptor {} has out=i32 with bias={} act={} glu={}; "
                      "allowed: bias=none act=none glu=none (i32 is the raw partial sums)",
                      d.key(), codegen::bias_kind_name(d.bias), activation_name(d.act),
                      codegen::glu_name(d.glu)));
    if (d.w4a8) {
      // The W4A8 group kernel (BrgemmDesc::w4a8): every row, over row-major
      // A; AMX's items are whole tile K steps (64 bytes).
      const int64_t kb_unit = row.path == Isa::amx ? 64 : 16;
      if (d.kb % kb_unit != 0 || d.out == DType::i32 || d.a_packed)
        throw Error(fmt::format(
            "brgemm: w4a8 descriptor {} on the {} row; allowed: kb % {} == 0, out f32|bf16, "
            "apack=0",
            d.key(), isa_name(row.path), kb_unit));
    }
    if (d.isa == Isa::amx && !d.a_packed && !d.w4a8)
      throw Error(
          fmt::format("brgemm: AMX int8 descriptor {} has a_packed=0; allowed: a_packed "
                      "(A in the PackedA tile layout)",
                      d.key()));
  }
  if (d.mr < 1 || d.nr < 1 || d.nr > 64 || d.kb < 1)
    throw Error("brgemm: descriptor " + d.key() + " is outside 1 <= mr, 1 <= nr <= 64, kb >= 1");
  if (d.glu != codegen::Glu::none && d.nr > 32)
    throw Error("brgemm: GLU descriptor " + d.key() + " has nr > 32 (a 64-column block pairs 32)");
  switch (row.backend) {
    case Backend::xbyak:
      if (d.isa == Isa::amx) {
        if (d.mr > 32) throw Error("brgemm: AMX kernel mr=" + std::to_string(d.mr) + " > 32");
        return compile(cache_key(d), d.name(),
                       xbyak_recipe([d] { return codegen::xbyak::emit_amx_brgemm(d); }));
      } else {
        const int nz = (d.computed_cols() + 15) / 16;
        if (d.mr > codegen::xbyak::avx512_brgemm_max_mr(nz))
          throw Error("brgemm: AVX-512 kernel mr=" + std::to_string(d.mr) + " exceeds " +
                      std::to_string(codegen::xbyak::avx512_brgemm_max_mr(nz)) +
                      " for nr=" + std::to_string(d.nr));
        return compile(cache_key(d), d.name(),
                       xbyak_recipe([d] { return codegen::xbyak::emit_avx512_brgemm(d); }));
      }
    case Backend::llvm:
#ifdef TILEJIT_HAVE_LLVM
    {
      // The dot-product variant (vdpbf16ps or fp32 FMA) follows the host
      // target, which the key adds.
      const std::string symbol = lb::llvm_brgemm_name(d);
      return compile(cache_key(d), symbol,
                     llvm_kernel_recipe(symbol, [d] { return lb::compile_llvm_brgemm(d); }));
    }
#endif
    case Backend::reference:
      break;
  }
  throw InternalError("jit: brgemm row " + std::string(isa_name(row.path)) + " has no emitter");
}

// An LLVM-only family: its one row, keyed on the descriptor and the host.
template <class D, class Make>
const Kernel& llvm_family(Family family, const D& d, Make make) {
  row_for(family, Isa::llvm);  // Error when this build has no such row
#ifdef TILEJIT_HAVE_LLVM
  const std::string symbol = codegen::desc_name(d);
  return compile(llvm_cache_key(codegen::desc_key(d)), symbol,
                 llvm_kernel_recipe(symbol, [&d, &make] { return make(d); }));
#else
  (void)d;
  (void)make;
  throw InternalError("jit: an LLVM row in a build without LLVM");
#endif
}

}  // namespace

const char* family_name(Family f) {
  switch (f) {
    case Family::brgemm:
      return "brgemm";
    case Family::softmax_step:
      return "softmax_step";
    case Family::softmax_glue:
      return "softmax_glue";
    case Family::decode_attention:
      return "decode_attention";
    case Family::rope:
      return "rope";
    case Family::rowwise:
      return "rowwise";
    case Family::elementwise:
      return "elementwise";
    case Family::dequant:
      return "dequant";
    case Family::act_quant:
      return "act_quant";
    case Family::kv_quant:
      return "kv_quant";
  }
  return "?";
}

std::span<const KernelRow> kernel_rows() {
  return kRows;
}

const KernelRow* find_row(Family family, Isa path) {
  for (const KernelRow& r : kRows)
    if (r.family == family && r.path == path) return &r;
  return nullptr;
}

bool row_runs_here(const KernelRow& row) {
  return runtime::detected_features().contains(row.needs);
}

bool family_built(Family family) {
  for (const KernelRow& r : kRows)
    if (r.family == family) return true;
  return false;
}

const Kernel& get(const codegen::BrgemmDesc& d) {
  return front(d, brgemm_slow);
}

const Kernel& get(const lb::SoftmaxStepDesc& d) {
  return front(d, [](const lb::SoftmaxStepDesc& x) -> const Kernel& {
    return llvm_family(Family::softmax_step, x, [](const lb::SoftmaxStepDesc& y) {
      return lb::compile_llvm_softmax_step(y);
    });
  });
}

const Kernel& get(const lb::SoftmaxGlueDesc& d) {
  return front(d, [](const lb::SoftmaxGlueDesc& x) -> const Kernel& {
    return llvm_family(Family::softmax_glue, x, [](const lb::SoftmaxGlueDesc& y) {
      switch (y.kind) {
        case lb::SoftmaxGlue::finish:
          return lb::compile_llvm_softmax_finish();
        case lb::SoftmaxGlue::pack_q:
          return lb::compile_llvm_softmax_pack_q();
        case lb::SoftmaxGlue::transpose_v:
          break;
      }
      return lb::compile_llvm_softmax_transpose_v();
    });
  });
}

const Kernel& get(const lb::DecodeAttentionDesc& d) {
  return front(d, [](const lb::DecodeAttentionDesc& x) -> const Kernel& {
    return llvm_family(Family::decode_attention, x, [](const lb::DecodeAttentionDesc& y) {
      return lb::compile_llvm_decode_attention(y);
    });
  });
}

const Kernel& get(const lb::RopeDesc& d) {
  return front(d, [](const lb::RopeDesc& x) -> const Kernel& {
    return llvm_family(Family::rope, x,
                       [](const lb::RopeDesc& y) { return lb::compile_llvm_rope(y); });
  });
}

const Kernel& get(const lb::RowwiseDesc& d) {
  return front(d, [](const lb::RowwiseDesc& x) -> const Kernel& {
    return llvm_family(Family::rowwise, x,
                       [](const lb::RowwiseDesc& y) { return lb::compile_llvm_rowwise(y); });
  });
}

namespace {

// A family with an Xbyak row (avx512) and an LLVM row, chosen by desc.isa.
template <class D, class EmitXbyak, class CompileLlvm>
const Kernel& two_backend_family(Family family, const D& d, EmitXbyak emit,
                                 CompileLlvm compile_llvm) {
  const KernelRow& row = row_for(family, d.isa);
  if (row.backend == Backend::xbyak)
    return compile(d.key(), d.name(), xbyak_recipe([d, emit] { return emit(d); }));
#ifdef TILEJIT_HAVE_LLVM
  const std::string symbol = d.name();
  return compile(llvm_cache_key(d.key()), symbol,
                 llvm_kernel_recipe(symbol, [d, compile_llvm] { return compile_llvm(d); }));
#else
  (void)compile_llvm;
  throw InternalError("jit: an LLVM row in a build without LLVM");
#endif
}

}  // namespace

const Kernel& get(const codegen::DequantDesc& d) {
  return front(d, [](const codegen::DequantDesc& x) -> const Kernel& {
    if (x.code != DType::f8e4m3 && x.code != DType::u4 && x.code != DType::f4e2m1)
      throw Error(fmt::format("dequant: code={}; allowed: f8e4m3, u4, f4e2m1", dtype_name(x.code)));
    if (x.zeros && x.code != DType::u4)
      throw Error(fmt::format("dequant: zero points with code={}; allowed: zeros with u4 only",
                              dtype_name(x.code)));
    if (x.out != DType::bf16 && !(x.out == DType::i8 && x.code == DType::u4))
      throw Error(fmt::format(
          "dequant: out={} with code={}; allowed: out bf16, or out i8 with code u4 (the W4A8 "
          "chunk)",
          dtype_name(x.out), dtype_name(x.code)));
    return two_backend_family(
        Family::dequant, x,
        [](const codegen::DequantDesc& y) { return codegen::xbyak::emit_dequant(y); },
        TILEJIT_LLVM_MAKER(codegen::DequantDesc, lb::compile_llvm_dequant(y)));
  });
}

const Kernel& get(const codegen::ActQuantDesc& d) {
  return front(d, [](const codegen::ActQuantDesc& x) -> const Kernel& {
    return two_backend_family(
        Family::act_quant, x,
        [](const codegen::ActQuantDesc& y) { return codegen::xbyak::emit_act_quant(y); },
        TILEJIT_LLVM_MAKER(codegen::ActQuantDesc, lb::compile_llvm_act_quant(y)));
  });
}

const Kernel& get(const codegen::KvQuantDesc& d) {
  return front(d, [](const codegen::KvQuantDesc& x) -> const Kernel& {
    return two_backend_family(
        Family::kv_quant, x,
        [](const codegen::KvQuantDesc& y) { return codegen::xbyak::emit_kv_quant(y); },
        TILEJIT_LLVM_MAKER(codegen::KvQuantDesc, lb::compile_llvm_kv_quant(y)));
  });
}

const Kernel& get_elementwise(const ir::Function& f) {
  row_for(Family::elementwise, Isa::llvm);
#ifdef TILEJIT_HAVE_LLVM
  // The symbol is the compiler's (it adds the row width): the payload keeps it.
  return compile(cache_key(f), "elementwise_" + f.name,
                 llvm_kernel_recipe("", [&f] { return lb::compile_llvm_elementwise(f); }));
#else
  (void)f;
  throw InternalError("jit: an LLVM row in a build without LLVM");
#endif
}

std::string cache_key(const codegen::BrgemmDesc& d) {
  const KernelRow* row = find_row(Family::brgemm, d.isa);
  return row != nullptr && row->backend == Backend::llvm ? llvm_cache_key(d.key()) : d.key();
}

std::string cache_key(const lb::RopeDesc& d) {
  return llvm_cache_key(codegen::desc_key(d));
}

std::string cache_key(const lb::RowwiseDesc& d) {
  return llvm_cache_key(codegen::desc_key(d));
}

std::string cache_key(const lb::DecodeAttentionDesc& d) {
  return llvm_cache_key(codegen::desc_key(d));
}

std::string cache_key(const ir::Function& elementwise) {
  return llvm_cache_key("elementwise;" + ir::print(elementwise));
}

std::string disassemble(const Kernel& k, bool att_syntax) {
  const auto* code = static_cast<const uint8_t*>(k.entry_ptr);
#ifdef TILEJIT_HAVE_LLVM
  // Offsets from the entry (address 0), so listings compare across runs.
  return lb::disassemble(code, k.size, 0, "",
                         att_syntax ? lb::AsmSyntax::att : lb::AsmSyntax::intel);
#else
  // For an external disassembler (objdump -D -b binary -m i386:x86-64 -M intel).
  (void)att_syntax;
  std::string s = "  ; no disassembler in this build (TILEJIT_WITH_LLVM=OFF): raw bytes\n";
  for (size_t i = 0; i < k.size; i += 16) {
    s += fmt::format("  {:6x}: ", i);
    for (size_t j = i; j < std::min(k.size, i + 16); ++j) s += fmt::format(" {:02x}", code[j]);
    s += '\n';
  }
  return s;
#endif
}

}  // namespace tilejit::jit
