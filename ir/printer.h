// The text form of the IR (grammar in docs/ir.md). It is the form `tilejit
// dump` shows and ir::parse reads back: print(parse(print(f))) == print(f).
//
//   func @linear(%x: tensor<?Mx4096xbf16>, %w: tensor<4096x4096xbf16, packed<vnni2, n_block=64,
//   k_pair=2>>) -> (tensor<?Mx4096xf32>) {
//     %0 = gemm %x, %w : tensor<?Mx4096xf32>
//     return %0
//   }
#pragma once

#include <string>

#include "ir/program.h"

namespace tilejit::ir {

// The whole function, ending in "}\n". Never throws on a malformed function:
// a bad value id prints as %<id N> so that a broken program can still be shown.
std::string print(const Function& f);
// One op line without indent or newline: "%0 = gemm %x, %w : tensor<?Mx4096xf32>".
std::string print(const Function& f, const Op& op);

}  // namespace tilejit::ir
