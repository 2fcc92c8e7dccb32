// IR helpers shared by the attention glue kernels (llvm_softmax*.cpp).
// Includes LLVM headers: for .cpp files of codegen/llvm/ only.
#pragma once

#include <llvm/IR/IRBuilder.h>

#include <string>
#include <vector>

#include "codegen/llvm/emitter_base.h"
#include "codegen/llvm/ir_loop.h"
#include "codegen/llvm/vector_math.h"

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

// The glue kernels that walk a 2-D grid of 16 × 16 tiles (finish, pack Q,
// transpose V), `void f(const Args*)`: tile(i0, j0) emits the tile at element
// i0 = 16·i of the outer dimension and j0 = 16·j of the inner one, for every
// (i, j) of grid().
template <class A>
class TileWalkEmitter : public KernelEmitter {
 public:
  using Args = A;
  static constexpr int kTile = 16;

  explicit TileWalkEmitter(ModuleContext& mc) : KernelEmitter(mc), vm_(b_, kTile) {}

 protected:
  using Vals = std::vector<llvm::Value*>;
  struct Grid {
    llvm::Value* outer;  // tiles (i64)
    llvm::Value* inner;
  };

  virtual void tile(llvm::Value* i0, llvm::Value* j0) = 0;
  virtual Grid grid() = 0;

  // Tiles covering n elements: ⌈n / 16⌉, or n / 16 when n is a multiple of 16.
  llvm::Value* tiles_up(llvm::Value* n) {
    return b_.CreateUDiv(b_.CreateAdd(n, i64(kTile - 1)), i64(kTile));
  }
  llvm::Value* tiles(llvm::Value* n) { return b_.CreateUDiv(n, i64(kTile)); }
  // The grid of an outer (rounded up) × inner element count of the arguments.
  Grid tiles_of(ArgField<int64_t> outer, ArgField<int64_t> inner) {
    return {tiles_up(arg(outer)), tiles(arg(inner))};
  }

  // The 16 vectors row(0), ..., row(15) of a tile, emitted in that order.
  template <class Row>
  Vals rows16(Row row) {
    Vals v;
    for (int i = 0; i < kTile; ++i) v.push_back(row(i));
    return v;
  }

  VectorMath vm_;

 private:
  void generate() final {
    const Grid g = grid();
    emit_tile_loops(
        b_, g.outer, g.inner,
        [&](llvm::Value* i, llvm::Value* j) {
          llvm::Value* i0 = b_.CreateMul(i, i64(kTile));
          tile(i0, b_.CreateMul(j, i64(kTile)));
        },
        "tile.i", "tile.j");
  }
};

}  // namespace tilejit::codegen::llvm_backend
