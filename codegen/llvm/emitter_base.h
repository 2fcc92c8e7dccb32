// The base of the LLVM kernel emitters: what every emitter used to write again
// before its own IR (the kernel function, its entry block, a builder, the
// loads of the argument struct) and after it (the return, the compile).
//
//   class RopeEmitter : public KernelEmitter {
//     void generate() override {         // the builder is in the entry block
//       llvm::Value* tokens = arg(TILEJIT_ARG(RopeArgs, tokens));
//       ...
//     }
//   };
//   return compile_emitter<RopeEmitter>(desc.name(), opt, desc);
//
// A field of the C argument struct is named by offsetof at the place that uses
// it; its LLVM type and alignment come from the member's C type. Each field is
// loaded once, in the entry block, with the loads ordered by offset ahead of
// the rest of the code whenever they are asked for, so the emitted function
// starts as a hand-written prologue would.
//
// Includes LLVM headers: for .cpp files of codegen/llvm/ only.
#pragma once

#include <llvm/IR/IRBuilder.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>

#include "codegen/llvm/llvm_jit.h"
#include "codegen/llvm/module_context.h"
#include "tilejit/tilejit.h"

namespace tilejit::codegen::llvm_backend {

// One field of a kernel's C argument struct: its offset and name; T is the
// member's C type. Made by TILEJIT_ARG.
template <class T>
struct ArgField {
  int64_t offset;
  const char* name;
};

// The field `member` of the C struct `Args` (standard layout), by offsetof.
#define TILEJIT_ARG(Args, member)                                      \
  ::tilejit::codegen::llvm_backend::ArgField<decltype(Args::member)> { \
    static_cast<int64_t>(offsetof(Args, member)), #member              \
  }

class KernelEmitter {
 public:
  explicit KernelEmitter(ModuleContext& mc) : mc_(mc), b_(mc.ctx) {}
  virtual ~KernelEmitter() = default;
  KernelEmitter(const KernelEmitter&) = delete;
  KernelEmitter& operator=(const KernelEmitter&) = delete;

  // Defines the kernel `void name(const Args* args)` (ModuleContext::define_kernel),
  // emits its body with generate() from the entry block, and returns void
  // where generate() leaves the builder.
  void emit(const std::string& name);

 protected:
  // The kernel's IR, from the entry block on.
  virtual void generate() = 0;

  // The value of an argument field (an invariant load: the struct is never
  // written while the kernel runs, so LLVM may hoist it out of any loop).
  template <class T>
  llvm::Value* arg(ArgField<T> f) {
    return load_field(f.offset, c_type<T>(), alignof(T), f.name);
  }

  // *p as `t`, marked invariant (for arrays the argument struct points to).
  llvm::Value* invariant_load(llvm::Type* t, llvm::Value* p, unsigned align,
                              const llvm::Twine& name = "");

  llvm::Value* i64(int64_t v) { return b_.getInt64(static_cast<uint64_t>(v)); }

  // f32 / bf16 tensors as the row kernels (RoPE, the row-wise ops) address
  // them: elements of float or i16 (bf16 bits), with their alignment.
  llvm::Type* storage(DType t) { return t == DType::f32 ? b_.getFloatTy() : b_.getInt16Ty(); }
  llvm::Align align(DType t) { return llvm::Align(t == DType::f32 ? 4 : 2); }
  // The constant <lanes x i1> mask of the first `active` lanes.
  llvm::Value* const_mask(int lanes, int active);
  // `lanes` elements of dtype t (f32 or bf16) from p[at], the first `active`
  // of them (a masked load when fewer: nothing past them is read; the other
  // lanes are 0), widened to <lanes x float>.
  llvm::Value* load_f32(llvm::Value* p, DType t, llvm::Value* at, int lanes, int active);

  ModuleContext& mc_;
  llvm::IRBuilder<> b_;

 private:
  template <class T>
  llvm::Type* c_type() {
    if constexpr (std::is_pointer_v<T>) {
      return b_.getPtrTy();
    } else if constexpr (std::is_same_v<T, float>) {
      return b_.getFloatTy();
    } else {
      static_assert(std::is_integral_v<T>, "argument fields are pointers, floats or integers");
      return b_.getIntNTy(8 * sizeof(T));
    }
  }

  llvm::Value* load_field(int64_t offset, llvm::Type* t, unsigned align, const char* name);

  struct Loaded {
    llvm::Instruction* first;  // the address computation (or the load)
    llvm::LoadInst* load;
  };
  llvm::Function* fn_ = nullptr;
  llvm::BasicBlock* entry_ = nullptr;
  std::map<int64_t, Loaded> fields_;  // by offset
};

// compile_module(name, ...) of Emitter(mc, extra...).emit(name).
template <class Emitter, class... Extra>
LlvmKernel compile_emitter(const std::string& name, OptLevel opt, const Extra&... extra) {
  return compile_module(
      name, [&](ModuleContext& mc) { Emitter(mc, extra...).emit(name); }, opt);
}

}  // namespace tilejit::codegen::llvm_backend
