// The W4A8 group fold of the Xbyak int8 brgemm kernels (BrgemmDesc::w4a8;
// the contract in codegen/brgemm_desc.h), shared by the AVX-512 kernel
// (int32 sums in zmm) and the AMX one (int32 tiles stored to the stack):
// the f32 block's start, the test for a group's end after each batch item,
// and the fold of one vector of 16 int32 sums into its f32 sums.
#pragma once

#include <cstddef>
#include <functional>

#include "codegen/brgemm_desc.h"
#include "codegen/xbyak/jit_generator.h"

namespace tilejit::codegen::xbyak {

class W4A8Fold {
 public:
  // slot(r, j): the f32 block's vector j of row r.
  using Slot = std::function<Xbyak::Address(int r, int j)>;

  W4A8Fold(JitGenerator& g, const BrgemmDesc& d, Slot slot)
      : g_(g), d_(d), slot_(std::move(slot)) {}

  // f = acc_in (d.accumulate; the last vector masked past the computed
  // columns, which the caller need not hold) or −0, for `vecs` vectors of
  // each row. Clobbers rax, rbx, edx, k2 and t.
  void init(int vecs, const Xbyak::Zmm& t) {
    using namespace Xbyak::util;
    if (d_.accumulate) {
      const int tail = d_.computed_cols() % 16;
      if (tail != 0) {
        g_.mov(edx, (1u << tail) - 1);
        g_.kmovw(k2, edx);
      }
      g_.mov(rax, JitGenerator::arg(offsetof(BrgemmArgs, acc_in)));
      g_.mov(rbx, JitGenerator::arg(offsetof(BrgemmArgs, ld_acc_in)));
      for (int r = 0; r < d_.mr; ++r) {
        for (int j = 0; j < vecs; ++j) {
          if (tail != 0 && j == vecs - 1)
            g_.vmovups(t | k2 | T_z, ptr[rax + 64 * j]);
          else
            g_.vmovups(t, ptr[rax + 64 * j]);
          g_.vmovups(slot_(r, j), t);
        }
        if (r + 1 < d_.mr) g_.add(rax, rbx);
      }
      return;
    }
    g_.mov(eax, 0x80000000u);
    g_.vpbroadcastd(t, eax);
    for (int r = 0; r < d_.mr; ++r)
      for (int j = 0; j < vecs; ++j) g_.vmovups(slot_(r, j), t);
  }

  // After a batch item: rdx = the scale row and rcx = the column-sum row of
  // the group it ends, rax = a_scale, rbx = a_zero; or a jump to `skip`
  // when it ends none. scales / comps walk args.w4a8_scales / w4a8_comps
  // (loaded by the caller; null lists: one group, b_scale / b_comp, ending
  // with the last item, when items_left, the batch count down, is 1).
  void group_end(const Xbyak::Reg64& scales, const Xbyak::Reg64& comps,
                 const Xbyak::Reg64& items_left, const Xbyak::Label& skip) {
    using namespace Xbyak::util;
    Xbyak::Label no_list, check;
    g_.test(scales, scales);
    g_.jz(no_list, JitGenerator::T_NEAR);
    g_.mov(rdx, ptr[scales]);
    g_.mov(rcx, ptr[comps]);
    g_.add(scales, 8);
    g_.add(comps, 8);
    g_.jmp(check, JitGenerator::T_NEAR);
    g_.L(no_list);
    g_.cmp(items_left, 1);
    g_.jne(skip, JitGenerator::T_NEAR);
    g_.mov(rdx, JitGenerator::arg(offsetof(BrgemmArgs, b_scale)));
    g_.mov(rcx, JitGenerator::arg(offsetof(BrgemmArgs, b_comp)));
    g_.L(check);
    g_.test(rdx, rdx);
    g_.jz(skip, JitGenerator::T_NEAR);
    g_.mov(rax, JitGenerator::arg(offsetof(BrgemmArgs, a_scale)));
    g_.mov(rbx, JitGenerator::arg(offsetof(BrgemmArgs, a_zero)));
  }

  // The contract's order, for row r and column vector j of the block, with
  // the registers group_end left: slot(r, j) += float(acc − a_zero[r]·comp) ·
  // a_scale[r] · scale. acc (int32) is clobbered (f32 result), t too.
  void fold(const Xbyak::Zmm& acc, const Xbyak::Zmm& t, int r, int j) {
    using namespace Xbyak::util;
    g_.vmovdqu32(t, ptr[rcx + 64 * j]);
    g_.vpmulld(t, t, ptr_b[rbx + 4 * r]);
    g_.vpsubd(acc, acc, t);
    g_.vcvtdq2ps(acc, acc);
    g_.vmulps(acc, acc, ptr_b[rax + 4 * r]);
    g_.vmulps(acc, acc, ptr[rdx + 64 * j]);
    g_.vaddps(acc, acc, slot_(r, j));
    g_.vmovups(slot_(r, j), acc);
  }

 private:
  JitGenerator& g_;
  const BrgemmDesc& d_;
  Slot slot_;
};

}  // namespace tilejit::codegen::xbyak
