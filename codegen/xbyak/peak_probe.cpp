// Register-only throughput probes: the machine's measured bf16 peak, against
// which the benchmarks report "% of peak" (no datasheet numbers).
#include "codegen/xbyak/amx_tile_config.h"
#include "codegen/xbyak/emitters.h"
#include "codegen/xbyak/jit_generator.h"

namespace tilejit::codegen::xbyak {
namespace {

using namespace Xbyak::util;

class PeakProbe : public JitGenerator {
 public:
  explicit PeakProbe(Isa isa) {
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
            tdpbf16ps(Xbyak::Tmm(i * 2 + j), Xbyak::Tmm(4 + i), Xbyak::Tmm(6 + j));
      dec(rdi);
      jnz(loop);
      L(done);
      tilerelease();
    } else {
      for (int i = 0; i < 18; ++i) vpxord(Xbyak::Zmm(i), Xbyak::Zmm(i), Xbyak::Zmm(i));
      test(rdi, rdi);
      jle(done, T_NEAR);
      L(loop);
      for (int i = 0; i < 16; ++i) vdpbf16ps(Xbyak::Zmm(i), zmm16, zmm17);
      dec(rdi);
      jnz(loop);
      L(done);
      vzeroupper();
    }
    pop_callee_saved();
    ret();
  }
};

}  // namespace

std::vector<uint8_t> emit_peak_probe(Isa isa) {
  PeakProbe g(isa);
  return g.finish();
}

double peak_flops_per_iter(Isa isa) {
  // tdpbf16ps: 16×16 outputs × 32 products × 2 FLOPs; 8 per iteration.
  // vdpbf16ps zmm: 16 lanes × 2 products × 2 FLOPs; 16 per iteration.
  return isa == Isa::amx ? 8.0 * 16 * 16 * 32 * 2 : 16.0 * 16 * 2 * 2;
}

}  // namespace tilejit::codegen::xbyak
