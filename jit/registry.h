// The kernel registry: one place that knows which kernel families exist, on
// which paths, needing which CPU features, made by which backend and emitter,
// and that hands out compiled kernels for descriptors.
//
//   const jit::Kernel& k = jit::get(desc);   // any family's descriptor
//
// get() answers repeats from a per-thread front cache (no lock, no key text:
// the descriptor's generated hash and equality); a miss picks the family's
// row for the descriptor's path, checks that the row can run here, and asks
// the process-wide compile-once cache (jit/kernel_cache.h), which tries the
// disk cache before compiling. Rows are a table (kernel_rows()), as XNNPACK's
// configs or libxsmm's dispatcher keep them: adding an ISA or a backend for a
// family is a row plus its emitter, not a new lookup path.
#pragma once

#include <span>
#include <string>

#include "codegen/brgemm_desc.h"
#include "codegen/kv_quant_desc.h"
#include "codegen/llvm/llvm_decode_attention.h"
#include "codegen/llvm/llvm_rope.h"
#include "codegen/llvm/llvm_rowwise.h"
#include "codegen/llvm/llvm_softmax.h"
#include "codegen/quant_desc.h"
#include "jit/kernel.h"
#include "runtime/isa.h"

namespace tilejit::ir {
struct Function;
}

namespace tilejit::jit {

enum class Family {
  brgemm,
  softmax_step,
  softmax_glue,
  decode_attention,
  rope,
  rowwise,
  elementwise,
  dequant,
  act_quant,
  kv_quant
};
const char* family_name(Family f);

// One row: a kernel family on one path.
struct KernelRow {
  Family family;
  Isa path;                   // the public path it serves
  runtime::FeatureSet needs;  // CPU features its code uses (runtime::isa_features(path))
  runtime::Backend backend;
  const char* emitter;  // the function that makes its code
  const char* limits;   // the descriptors it takes (each emitter checks them: Error)
};

// Every row of this build, best path first within a family.
std::span<const KernelRow> kernel_rows();
// The row serving `family` on `path`, or null when this build has none.
const KernelRow* find_row(Family family, Isa path);
// Whether a row's code can run on this CPU (its features are usable).
bool row_runs_here(const KernelRow& row);
// Whether this build has any row of the family (the LLVM families need LLVM).
bool family_built(Family family);

// The kernel for a descriptor. Throws Error when the descriptor is outside
// its row's limits or no row serves its path in this build; InternalError
// when an emitter fails on a descriptor it accepted. It does not ask whether
// this CPU can run the row (row_runs_here): compiling is harmless, and the
// tool shows the code of paths the machine lacks.
const Kernel& get(const codegen::BrgemmDesc& d);
const Kernel& get(const codegen::llvm_backend::SoftmaxStepDesc& d);
const Kernel& get(const codegen::llvm_backend::SoftmaxGlueDesc& d);
const Kernel& get(const codegen::llvm_backend::DecodeAttentionDesc& d);
const Kernel& get(const codegen::llvm_backend::RopeDesc& d);
const Kernel& get(const codegen::llvm_backend::RowwiseDesc& d);
const Kernel& get(const codegen::DequantDesc& d);
const Kernel& get(const codegen::ActQuantDesc& d);
const Kernel& get(const codegen::KvQuantDesc& d);
// An elementwise IR function (the tool's fused epilogues), keyed on its
// printed IR; without a front cache (the tool compiles a few per run).
const Kernel& get_elementwise(const ir::Function& f);

// The key get() caches a descriptor's kernel under (in memory and on disk):
// the descriptor's key text, plus the host target for the LLVM rows.
std::string cache_key(const codegen::BrgemmDesc& d);
std::string cache_key(const codegen::llvm_backend::RopeDesc& d);
std::string cache_key(const codegen::llvm_backend::RowwiseDesc& d);
std::string cache_key(const codegen::llvm_backend::DecodeAttentionDesc& d);
std::string cache_key(const ir::Function& elementwise);

// The kernel's machine code as assembly text (Xbyak and LLVM kernels alike;
// raw bytes in a build without LLVM, which holds the disassembler).
std::string disassemble(const Kernel& k, bool att_syntax = false);

}  // namespace tilejit::jit
