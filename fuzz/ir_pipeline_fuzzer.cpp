// libFuzzer harness: IR text -> parse -> print round trip -> verify -> match
// -> plan (every path) -> keys -> emit -> disassemble, the pipeline of
// `tilejit dump --stage all` (tools/dump_cmd.cpp) through the library's entry
// points and the tool's program matching (tools/program/).
//
// The contract under test: for any bytes, each stage either succeeds or
// raises tilejit::Error. Any other exception (std::out_of_range from an
// .at(), std::bad_alloc from a size nobody checked), a signal, a sanitizer
// report or a hang is a finding. Also checked: the printer's output parses
// back to the same text (print(parse(print(f))) == print(f)).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/gemm_lowering.h"
#include "codegen/xbyak/emitters.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "tilejit/tilejit.h"
#include "tools/program/describe_operators.h"
#include "tools/program/gemm_program.h"
#include "tools/program/host_tensor.h"

#if TILEJIT_FUZZ_HAVE_MC
#include "codegen/llvm/mc_disassembler.h"
#endif

namespace {

using namespace tilejit;

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "ir_pipeline_fuzzer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

// Emitting and disassembling every kernel of a plan is the slow stage: a
// program whose plan needs more kernels than this is planned and keyed only.
constexpr size_t kMaxEmittedKernels = 8;

void plan_emit(const ir::Function& f, const tools::GemmProgram& prog, Isa isa) {
  const codegen::GemmPlan plan = codegen::lower_gemm(prog.lowered, isa);
  (void)plan.str();
  (void)plan.name();
  (void)plan.key();
  if (plan.isa == Isa::scalar) return;  // the reference: no JIT code
  // M as `dump` takes it: x's first dim when static (a symbol stays unbound).
  std::optional<int64_t> m;
  const int64_t m0 = tools::bind_shape(f.value(prog.x).type, {}).at(0);
  if (m0 >= 0) m = m0;
  const std::vector<codegen::KernelUse> uses = codegen::plan_kernels(plan, m);
  if (plan.isa != Isa::avx512 && plan.isa != Isa::amx) return;  // no Xbyak emitter
  for (size_t i = 0; i < uses.size() && i < kMaxEmittedKernels; ++i) {
    const codegen::BrgemmDesc& d = uses[i].desc;
    (void)d.name();
    (void)d.key();
    const std::vector<uint8_t> code = d.isa == Isa::amx ? codegen::xbyak::emit_amx_brgemm(d)
                                                        : codegen::xbyak::emit_avx512_brgemm(d);
#if TILEJIT_FUZZ_HAVE_MC
    // Kernels keep their constants after the code, which print as "(bad)"
    // bytes: only that the listing is produced is checked.
    (void)codegen::llvm_backend::disassemble(code.data(), code.size(), 0, "");
#endif
  }
}

void run_pipeline(std::string_view text) {
  ir::Function f;
  try {
    f = ir::parse(text, "fuzz.tir");
  } catch (const Error&) {
    return;  // the ordinary outcome for most inputs
  }
  // What the printer writes must read back as the same program.
  const std::string printed = ir::print(f);
  try {
    const ir::Function again = ir::parse(printed, "printed.tir");
    if (ir::print(again) != printed) fail("print(parse(print(f))) != print(f)", printed);
  } catch (const Error& e) {
    fail("the printer's output does not parse", printed + "\n" + e.what());
  }

  if (!ir::check(f).empty()) return;
  // check() empty means verify() must accept it too.
  try {
    ir::verify(f);
  } catch (const Error& e) {
    fail("check() found nothing but verify() threw", e.what());
  }

  for (Isa isa : {Isa::amx, Isa::avx512, Isa::llvm, Isa::scalar}) {
    try {
      if (tools::has_operator_ops(f)) {
        const tools::OperatorProgram prog = tools::match_operator_program(f);
        (void)tools::describe_operator_plan(f, prog, isa, {});
        (void)tools::describe_operator_keys(f, prog, isa, {});
      } else {
        plan_emit(f, tools::match_program(f), isa);
      }
    } catch (const Error&) {
      // A program the library refuses, with a message: fine.
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  run_pipeline(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
