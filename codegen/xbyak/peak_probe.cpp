// Register-only throughput probes: the machine's measured bf16 (and int8) peak, against
// which the benchmarks report "% of peak" (no datasheet numbers).
#include "codegen/xbyak/amx_tile_config.h"
#include "codegen/xbyak/emitters.h"
#include "codegen/xbyak/jit_generator.h"
#include "runtime/cpu_features.h"

namespace tilejit::codegen::xbyak {
namespace {

using namespace Xbyak::util;
using runtime::Feature;

// The vector instruction a non-AMX probe runs: the best dot product of the
// host (the llvm path runs on any AVX2 host, so the probe must too).
enum class VecOp { dpbf16, vpdpbusd, fma, vpmaddwd };
struct VecProbe {
  VecOp op;
  bool zmm;
  int accs;  // independent accumulators (instructions per iteration)
};

VecProbe vec_probe(bool int8) {
  const runtime::FeatureSet f = runtime::detected_features();
  const bool zmm = f.has(Feature::avx512f) && f.has(Feature::avx512bw);
  // ymm: 12 accumulators + 2 sources of the 16 registers (enough to cover a
  // 4-cycle latency on 2 ports); zmm: 16 of 32.
  const int accs = zmm ? 16 : 12;
  if (int8) {
    if (zmm && f.has(Feature::avx512_vnni)) return {VecOp::vpdpbusd, true, accs};
    return {VecOp::vpmaddwd, zmm, accs};
  }
  if (zmm && f.has(Feature::avx512_bf16)) return {VecOp::dpbf16, true, accs};
  return {VecOp::fma, zmm, accs};
}

class PeakProbe : public JitGenerator {
 public:
  PeakProbe(Isa isa, bool int8) {
    push_callee_saved();
    Xbyak::Label loop, done;
    if (isa == Isa::amx) {
      AmxTileConfig cfg;
      for (int t = 0; t < 8; ++t) cfg.set(t, 16, 64);
      ldtilecfg(ptr[rip + blob_label(cfg.bytes.data(), cfg.bytes.size())]);
      for (int t = 0; t < 8; ++t) tilezero(Xbyak::Tmm(t));
      test(rdi, rdi);
      jle(done, T_NEAR);
      L(loop);
      for (int rep = 0; rep < 2; ++rep)
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < 2; ++j)
            if (int8)
              tdpbusd(Xbyak::Tmm(i * 2 + j), Xbyak::Tmm(4 + i), Xbyak::Tmm(6 + j));
            else
              tdpbf16ps(Xbyak::Tmm(i * 2 + j), Xbyak::Tmm(4 + i), Xbyak::Tmm(6 + j));
      dec(rdi);
      jnz(loop);
      L(done);
      tilerelease();
    } else {
      const VecProbe v = vec_probe(int8);
      auto reg = [&](int i) -> Xbyak::Xmm {
        if (v.zmm) return Xbyak::Zmm(i);
        return Xbyak::Ymm(i);
      };
      const int src0 = v.accs, src1 = v.accs + 1;
      for (int i = 0; i < v.accs + 2; ++i) {
        if (v.zmm)
          vpxord(Xbyak::Zmm(i), Xbyak::Zmm(i), Xbyak::Zmm(i));
        else
          vpxor(Xbyak::Ymm(i), Xbyak::Ymm(i), Xbyak::Ymm(i));
      }
      test(rdi, rdi);
      jle(done, T_NEAR);
      L(loop);
      for (int i = 0; i < v.accs; ++i) {
        switch (v.op) {
          case VecOp::dpbf16:
            vdpbf16ps(reg(i), reg(src0), reg(src1));
            break;
          case VecOp::vpdpbusd:
            vpdpbusd(reg(i), reg(src0), reg(src1), Xbyak::EvexEncoding);
            break;
          case VecOp::fma:
            vfmadd231ps(reg(i), reg(src0), reg(src1));
            break;
          case VecOp::vpmaddwd:
            vpmaddwd(reg(i), reg(src0), reg(src1));
            break;
        }
      }
      dec(rdi);
      jnz(loop);
      L(done);
      vzeroupper();
    }
    pop_callee_saved();
    ret();
  }
};

// The ceiling of a 2×2 AMX kernel that reloads its operands: per K step two A
// tiles and two B tiles (1 KiB each, rows of 64 bytes, contiguous) are loaded
// and feed four tdpbf16ps. The operands walk `steps` K steps of 4 KiB each
// and start over, so the footprint picks the cache level they come from
// (1 step: L1; 64 steps, 256 KiB: L2).
class AmxReloadProbe : public JitGenerator {
 public:
  AmxReloadProbe() {
    // void f(int64_t iters, const void* operands, int64_t steps)
    push_callee_saved();
    AmxTileConfig cfg;
    for (int t = 0; t < 8; ++t) cfg.set(t, 16, 64);
    ldtilecfg(ptr[rip + blob_label(cfg.bytes.data(), cfg.bytes.size())]);
    for (int t = 0; t < 4; ++t) tilezero(Xbyak::Tmm(t));
    mov(r8, 64);
    Xbyak::Label outer, inner, done;
    test(rdi, rdi);
    jle(done, T_NEAR);
    L(outer);
    mov(rax, rsi);
    mov(rcx, rdx);
    L(inner);
    tileloadd(Xbyak::Tmm(4), ptr[rax + r8]);
    tileloadd(Xbyak::Tmm(6), ptr[rax + r8 + 2048]);
    tdpbf16ps(Xbyak::Tmm(0), Xbyak::Tmm(4), Xbyak::Tmm(6));
    tileloadd(Xbyak::Tmm(5), ptr[rax + r8 + 1024]);
    tdpbf16ps(Xbyak::Tmm(2), Xbyak::Tmm(5), Xbyak::Tmm(6));
    tileloadd(Xbyak::Tmm(7), ptr[rax + r8 + 3072]);
    tdpbf16ps(Xbyak::Tmm(1), Xbyak::Tmm(4), Xbyak::Tmm(7));
    tdpbf16ps(Xbyak::Tmm(3), Xbyak::Tmm(5), Xbyak::Tmm(7));
    add(rax, 4096);
    dec(rcx);
    jnz(inner);
    dec(rdi);
    jnz(outer);
    L(done);
    tilerelease();
    pop_callee_saved();
    ret();
  }
};

}  // namespace

std::vector<uint8_t> emit_amx_reload_probe() {
  AmxReloadProbe g;
  return g.finish();
}

std::vector<uint8_t> emit_peak_probe(Isa isa, DType op) {
  PeakProbe g(isa, op == DType::u8);
  return g.finish();
}

double peak_flops_per_iter(Isa isa, DType op) {
  // tdpbf16ps: 16×16 outputs × 32 products × 2 FLOPs; 8 per iteration.
  // The int8 tdpbusd takes 4 bytes per VNNI group: twice the products.
  if (isa == Isa::amx) return (op == DType::u8 ? 2 : 1) * 8.0 * 16 * 16 * 32 * 2;
  // Vector probes: accs instructions of lanes 32-bit lanes, each lane
  // vdpbf16ps / vpmaddwd 2 products, vpdpbusd 4, vfmadd231ps 1; 2 ops each.
  const VecProbe v = vec_probe(op == DType::u8);
  const double lanes = v.zmm ? 16 : 8;
  const double products = v.op == VecOp::vpdpbusd ? 4 : v.op == VecOp::fma ? 1 : 2;
  return v.accs * lanes * products * 2;
}

}  // namespace tilejit::codegen::xbyak
