// Base of every Xbyak kernel generator: a growing RW buffer that is never
// executed (the bytes are copied into W^X memory by the caller), a constant
// pool addressed RIP-relative (so the code is position independent and can be
// moved or stored on disk), and the SysV prologue/epilogue.
#pragma once

#include <xbyak/xbyak.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

namespace tilejit::codegen::xbyak {

class JitGenerator : public Xbyak::CodeGenerator {
 public:
  JitGenerator() : Xbyak::CodeGenerator(4096, Xbyak::AutoGrow) {}

  // Returns a broadcast memory operand for a 32-bit constant in the pool.
  Xbyak::Address bcst(float v) { return ptr_b[rip + const_label(bits_of(v))]; }
  Xbyak::Address bcst_u32(uint32_t v) { return ptr_b[rip + const_label(v)]; }
  Xbyak::Address f32_const(float v) { return dword[rip + const_label(bits_of(v))]; }

  // Each dword lane of v holding an MXFP4 e8m0 exponent e (0..254, packing
  // refuses the NaN 255) becomes the f32 scale 2^(e − 127): e << 23, and for
  // e = 0 the subnormal 2^-127 (0x00400000). Clobbers k.
  void e8m0_to_f32(const Xbyak::Zmm& v, const Xbyak::Opmask& k) {
    vptestnmd(k, v, v);
    vpslld(v, v, 23);
    vpord(v | k, v, bcst_u32(0x00400000u));
  }

  // Appends a 64-byte aligned blob to the pool (e.g. an AMX tile config).
  const Xbyak::Label& blob_label(const uint8_t* data, size_t size) {
    blobs_.push_back({std::vector<uint8_t>(data, data + size), {}});
    return blobs_.back().label;
  }

  // Finishes the code: emits the pool, resolves labels and returns the bytes.
  std::vector<uint8_t> finish() {
    align(64);
    for (auto& c : consts_) {
      L(c.label);
      dd(c.bits);
    }
    for (auto& b : blobs_) {
      align(64);
      L(b.label);
      for (uint8_t v : b.bytes) db(v);
    }
    // Resolves the AutoGrow buffer's forward references. The buffer stays RW
    // and is never executed: the caller copies the bytes into W^X memory.
    ready(PROTECT_RW);
    const uint8_t* p = getCode();
    return std::vector<uint8_t>(p, p + getSize());
  }

  // The 64-bit field at byte `offset` of the argument struct the kernel gets
  // by pointer in rdi: called with offsetof(Args, field), so the emitted
  // displacement follows the struct and no literal offset can drift from it.
  static Xbyak::Address arg(size_t offset) {
    return Xbyak::util::qword[Xbyak::util::rdi + static_cast<uint32_t>(offset)];
  }

 protected:
  void push_callee_saved() {
    for (const auto& r : kCalleeSaved) push(r);
  }
  void pop_callee_saved() {
    for (auto it = std::rbegin(kCalleeSaved); it != std::rend(kCalleeSaved); ++it) pop(*it);
  }

 private:
  static uint32_t bits_of(float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return u;
  }
  const Xbyak::Label& const_label(uint32_t bits) {
    for (auto& c : consts_)
      if (c.bits == bits) return c.label;
    consts_.push_back({bits, {}});
    return consts_.back().label;
  }

  struct Const {
    uint32_t bits;
    Xbyak::Label label;
  };
  struct Blob {
    std::vector<uint8_t> bytes;
    Xbyak::Label label;
  };
  // Labels are referenced by address while more constants are added: a deque
  // never moves its elements.
  std::deque<Const> consts_;
  std::deque<Blob> blobs_;
  inline static const Xbyak::Reg64 kCalleeSaved[] = {Xbyak::util::rbx, Xbyak::util::rbp,
                                                     Xbyak::util::r12, Xbyak::util::r13,
                                                     Xbyak::util::r14, Xbyak::util::r15};
};

}  // namespace tilejit::codegen::xbyak
