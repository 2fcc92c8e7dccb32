// IR helpers shared by the attention glue kernels (llvm_softmax*.cpp).
// Includes LLVM headers: for .cpp files of codegen/llvm/ only.
#pragma once

#include <llvm/IR/IRBuilder.h>

#include <vector>

namespace tilejit::codegen::llvm_backend {

// Transposes 16 vectors of 16 lanes in place (element (i, k) ends at (k, i)):
// four stages swapping the off-diagonal d × d blocks of every 2d × 2d block,
// d = 8, 4, 2, 1, each 16 two-source shuffles (vpermt2ps/d on AVX-512).
inline void transpose16(llvm::IRBuilder<>& b, std::vector<llvm::Value*>& v) {
  constexpr int kN = 16;
  for (int d = kN / 2; d >= 1; d /= 2) {
    std::vector<int> lo, hi;  // indices into concat(x, y), y at +16
    for (int k = 0; k < kN; ++k) {
      lo.push_back((k & d) ? kN + k - d : k);
      hi.push_back((k & d) ? kN + k : k + d);
    }
    for (int i = 0; i < kN; ++i) {
      if (i & d) continue;
      llvm::Value* x = b.CreateShuffleVector(v[i], v[i + d], lo);
      llvm::Value* y = b.CreateShuffleVector(v[i], v[i + d], hi);
      v[i] = x;
      v[i + d] = y;
    }
  }
}

}  // namespace tilejit::codegen::llvm_backend
