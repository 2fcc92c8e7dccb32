// The fused GEMM epilogue on zmm registers, shared by the AVX-512 and AMX
// micro-kernels: bias add, activation, conversion to bf16 (round to nearest
// even) or f32, and the (masked) store. The int8 kernels (u8 × i8 → i32) go
// through apply_int8_and_store: zero-point compensation and the two scales
// first (BrgemmArgs' a_scale, a_zero, b_scale, b_comp), then the same bias,
// activation and store, or the raw int32 sums with out = i32. Transcendentals are evaluated with
// constants from the generator's RIP-relative pool, so no register holds them.
#pragma once

#include <array>

#include "codegen/brgemm_desc.h"
#include "codegen/xbyak/jit_generator.h"

namespace tilejit::codegen::xbyak {

class Avx512Epilogue {
 public:
  // temps: four zmm registers the epilogue may clobber.
  Avx512Epilogue(JitGenerator& g, const BrgemmDesc& d, std::array<Xbyak::Zmm, 4> temps)
      : g_(g), d_(d), t_(temps) {}

  // Applies bias + activation to acc (16 f32 lanes = output columns
  // [16*col_vec, 16*col_vec + 16)) and stores it at c_row + 16*col_vec elements.
  // `tail` masks both the bias load and the store of the last, partial vector.
  // With desc.accumulate, acc_in_row points at the fp32 partial sums of the row.
  void apply_and_store(const Xbyak::Zmm& acc, int col_vec, const Xbyak::Reg64& c_row,
                       const Xbyak::Reg64& bias, const Xbyak::Opmask* tail,
                       const Xbyak::Reg64& acc_in_row);

  // The int8 operands of BrgemmArgs, each in a register: a_scale and a_zero
  // (per row of the call, addressed at row·4), b_scale and b_comp (64 entries
  // of the column block, read unmasked: the block's arrays are padded).
  struct Int8Regs {
    Xbyak::Reg64 a_scale, a_zero, b_scale, b_comp;
  };

  // Int8 kernels: acc holds the int32 sums of row `row`, columns
  // [16*col_vec, +16). With desc.accumulate the int32 partial sums at
  // acc_in_row are added first (vpaddd). out = i32 stores that; otherwise, in
  // this order, t = acc − a_zero[row]·b_comp[c] (vpmulld, vpsubd), v =
  // float(t) (vcvtdq2ps), v = v·a_scale[row], v = v·b_scale[c], then bias,
  // activation and the store as apply_and_store. Clobbers temps[0] and those
  // the activation uses.
  void apply_int8_and_store(const Xbyak::Zmm& acc, int col_vec, int row, const Int8Regs& q,
                            const Xbyak::Reg64& c_row, const Xbyak::Reg64& bias,
                            const Xbyak::Opmask* tail, const Xbyak::Reg64& acc_in_row);

  // Int8 GLU (desc.glu with a = u8; the statement: BrgemmArgs in
  // codegen/brgemm_desc.h): gate holds the int32 sums of row `row`, columns
  // [16·out_vec, +16) of the 64-column block, up those 32 further on (block
  // vector out_vec + 2). Each is scaled as apply_int8_and_store scales its
  // vector (acc_in, zero point, a_scale, b_scale, bias), unmasked: the
  // block's arrays cover all 64 columns. Then out = glu(gate, up) by
  // apply_glu_and_store's code, stored at c_row + 16·out_vec elements,
  // `tail` masking the last vector. out = f32 or bf16. Clobbers up and the
  // four temps.
  void apply_int8_glu_and_store(const Xbyak::Zmm& gate, const Xbyak::Zmm& up, int out_vec, int row,
                                const Int8Regs& q, const Xbyak::Reg64& c_row,
                                const Xbyak::Reg64& bias, const Xbyak::Opmask* tail,
                                const Xbyak::Reg64& acc_in_row);

  // GLU (desc.glu): gate holds columns [16·out_vec, +16) of the 64-column
  // block and up the matching columns 32 further on; both get acc_in and bias
  // (64 columns, unmasked: the block is padded), then out = f(gate, up) is
  // stored at c_row + 16·out_vec elements, `tail` masking the last vector.
  // Clobbers up and the four temps.
  void apply_glu_and_store(const Xbyak::Zmm& gate, const Xbyak::Zmm& up, int out_vec,
                           const Xbyak::Reg64& c_row, const Xbyak::Reg64& bias,
                           const Xbyak::Opmask* tail, const Xbyak::Reg64& acc_in_row);

  // exp(v) in place; clobbers n and r. Max relative error ~2e-7 on [-87, 88].
  static void exp_inplace(JitGenerator& g, const Xbyak::Zmm& v, const Xbyak::Zmm& n,
                          const Xbyak::Zmm& r);

 private:
  void activation(const Xbyak::Zmm& v);
  // gate = f(gate, up) for desc.glu, from the f32 gate and up; clobbers up
  // and the temps.
  void glu(const Xbyak::Zmm& gate, const Xbyak::Zmm& up);
  // Int8: acc (+ int32 acc_in) − a_zero·b_comp, to f32, · a_scale · b_scale,
  // for block vector col_vec of row `row` (acc_in masked by `tail`).
  void int8_scale(const Xbyak::Zmm& acc, int col_vec, int row, const Int8Regs& q,
                  const Xbyak::Opmask* tail, const Xbyak::Reg64& acc_in_row);
  // acc += acc_in (if accumulating) and bias for 64-column block vector col_vec.
  void add_inputs(const Xbyak::Zmm& acc, int col_vec, const Xbyak::Reg64& bias,
                  const Xbyak::Opmask* tail, const Xbyak::Reg64& acc_in_row);
  void add_bias(const Xbyak::Zmm& acc, int col_vec, const Xbyak::Reg64& bias,
                const Xbyak::Opmask* tail);
  void store(const Xbyak::Zmm& v, int col_vec, const Xbyak::Reg64& c_row,
             const Xbyak::Opmask* tail);

  JitGenerator& g_;
  const BrgemmDesc d_;  // a copy: callers pass descriptors adjusted for the epilogue
  std::array<Xbyak::Zmm, 4> t_;
};

}  // namespace tilejit::codegen::xbyak
