// `tilejit dump`: every stage of the pipeline for one .tir program — the IR,
// the verified types, the kernel plan, the specialization keys, and the
// disassembly of the machine code the emitters produce for it.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "codegen/gemm_lowering.h"
#include "codegen/gemm_plan.h"
#include "codegen/quant_desc.h"
#include "ir/infer.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "jit/registry.h"
#include "ops/gemm_executable.h"
#include "ops/quant_weight.h"
#include "runtime/batch_invariant.h"
#include "runtime/isa.h"
#include "runtime/thread_pool.h"
#include "tilejit/tilejit.h"
#include "tools/commands.h"
#include "tools/program/describe_operators.h"
#include "tools/program/program_runner.h"
#include "tools/program/quant_route.h"
#include "tools/program_io.h"

namespace tilejit::tools {
namespace {

const char* const kStages[] = {"ir", "verified", "plan", "key", "asm"};

std::string pad(const std::string& s, size_t w) {
  return s.size() >= w ? s + " " : s + std::string(w - s.size(), ' ');
}

void print_verified(const ir::Function& f) {
  fmt::print("// @{} verified: {} params, {} ops, no diagnostics\n", f.name, f.params.size(),
             f.ops.size());
  for (const std::string& s : program_symbols(f)) {
    for (int p : f.params) {
      const auto& dims = f.value(p).type.dims;
      auto it =
          std::find_if(dims.begin(), dims.end(), [&](const ir::Dim& d) { return d.symbol == s; });
      if (it != dims.end()) {
        fmt::print("// ?{} is bound at run time by %{} dim {}\n", s, f.value(p).name,
                   it - dims.begin());
        break;
      }
    }
  }
  size_t w = 0;
  for (const ir::Value& v : f.values) w = std::max(w, v.name.size() + 1);
  for (int p : f.params)
    fmt::print("{}param     {}\n", pad("%" + f.value(p).name, w + 1), f.value(p).type.str());
  for (const ir::Op& op : f.ops) {
    // The type the op rules infer from the operands (verify() checked that
    // it is the one the text states).
    std::vector<const ir::Value*> operands;
    for (int id : op.operands) operands.push_back(&f.value(id));
    const ir::TensorType t = ir::infer_type(op.kind, operands, op.attrs, op.operand_names);
    fmt::print("{}{}{}\n", pad("%" + f.value(op.result).name, w + 1), pad(ir::name(op.kind), 10),
               t.str());
  }
  for (int r : f.results)
    fmt::print("{}result    {}\n", pad("%" + f.value(r).name, w + 1), f.value(r).type.str());
}

// M of the gemm: x's first dim, static or bound by --dim.
std::optional<int64_t> gemm_m(const ir::Function& f, const GemmProgram& p,
                              const DimBindings& dims) {
  const int64_t m = bind_shape(f.value(p.x).type, dims).at(0);
  return m < 0 ? std::nullopt : std::optional<int64_t>(m);
}

void print_plan(const ir::Function& f, const GemmProgram& p, const codegen::GemmPlan& plan,
                std::optional<int64_t> m) {
  fmt::print("{}\n", plan.str());
  if (p.w_packed_by_runner && !p.quantized())
    fmt::print(
        "  note         %{} is row-major in the IR: `tilejit run` packs it (pack_weight) "
        "into the layout above\n",
        f.value(p.w).name);
  if (plan.isa == Isa::scalar) {
    fmt::print(
        "  note         the scalar path runs the reference (runtime/reference_gemm.h) on "
        "the packed weight: no JIT code\n");
  } else if (m) {
    const int64_t full = *m / plan.mr, tail = *m % plan.mr;
    fmt::print("  for M={:<6}  {} block{} of {} rows{}; {} column block{} of {}{}\n", *m, full,
               full == 1 ? "" : "s", plan.mr,
               tail ? fmt::format(" + 1 tail block of {} row{}", tail, tail == 1 ? "" : "s") : "",
               plan.spec.n / plan.nb, plan.spec.n / plan.nb == 1 ? "" : "s", plan.nb,
               plan.n_tail ? fmt::format(" + 1 tail of {}", plan.n_tail) : "");
    // The task split tilejit::gemm runs (the plan's own schedule).
    fmt::print("  tasks        {}\n", plan.schedule(*m, runtime::num_threads()).str());
  }
}

void print_keys(const codegen::GemmPlan& plan, std::optional<int64_t> m) {
  fmt::print("plan   {}\n", plan.name());
  fmt::print("key    {}\n", plan.key());
  if (plan.isa == Isa::scalar) {
    fmt::print("micro-kernels: none (the scalar path runs the reference: no JIT code)\n");
    return;
  }
  const auto uses = codegen::plan_kernels(plan, m);
  fmt::print("micro-kernels {}: {}\n",
             m ? fmt::format("for M={}", *m) : "for any M (main block, N tail)", uses.size());
  size_t w = 0;
  for (const auto& u : uses) w = std::max(w, u.role.size());
  for (const auto& u : uses) {
    fmt::print("  {}{}\n", pad(u.role, w + 2), u.desc.name());
    fmt::print("  {}{}\n", std::string(w + 2, ' '), u.desc.key());
  }
}

std::string quant_kernel_key(const QuantKernel& q) {
  return q.dequant ? q.dequant->key() : q.act_quant->key();
}
const jit::Kernel& quant_kernel_code(const QuantKernel& q) {
  return q.dequant ? jit::get(*q.dequant) : jit::get(*q.act_quant);
}

// How the weight of a quantized program is packed and run.
void print_quant_plan(const ir::Function& f, const GemmProgram& p, Isa isa,
                      std::optional<int64_t> m, const codegen::PlanOverrides& tuned) {
  const ir::Value& w = f.value(p.w);
  const char* api = checkpoint_struct_name(p.format);
  fmt::print("  weight       %{} {} {}: tilejit::pack_weight({}), format {}\n", w.name,
             dtype_name(w.type.dtype), dims_str(w.type), api, weight_format_name(p.format));
  if (p.format == WeightFormat::int8)
    fmt::print(
        "  w8a8         x quantized to u8 per call, u8 x s8 brgemm with i32 sums, then "
        "y = act(Σ·s_x·s_w + bias) in f32 (b_type=i8, K rounded up to {})\n",
        p.spec.k);
  else
    fmt::print(
        "  dequant      per task and K chunk, the chunk's codes become bf16 packed rows, which "
        "the bf16 plan above runs on (K = k_packed = {}: the packed K order; act-order "
        "gathers x's columns into it)\n",
        p.spec.k);
  const bool w4a8 = program_w4a8(p, isa, m, tuned);
  if (const auto q = quant_kernel(f, p, isa, w4a8))
    fmt::print("  kernel       {} ({})\n", quant_kernel_name(*q), q->role);
  else
    fmt::print(
        "  kernel       none (the scalar path computes from the logical weights in double)\n");
  if (!tuned.empty())
    fmt::print("  tuned        {} (the tuning database's entry at M = {})\n", tuned.entry, *m);
  const Isa rows_isa = m ? ops::quant_rows_isa(isa, *m) : isa;
  if (w4a8) {
    fmt::print(
        "  w4a8         M = {}: int4_route {} takes W4A8 instead of the plan above: x gathered "
        "into the quad K order and quantized per row, the codes as s8 (q − z) chunks "
        "(dequant out = i8), one W4A8 brgemm call per K chunk folding each scale group's "
        "int32 sums into f32 where it ends "
        "(docs/quantized.md, W4A8); its kernels: {}\n",
        *m, p.int4_route == Int4Route::w4a8 ? "w4a8" : "automatic",
        !ops::w4a8_kernels_usable(rows_isa) ? "none here (the scalar oracle computes it)"
        : rows_isa == Isa::llvm             ? "LLVM"
        : rows_isa == Isa::amx              ? "Xbyak AMX (tdpbusd tiles)"
                                            : "Xbyak AVX-512 (vpdpbusd)");
    return;
  }
  if (const auto fd = fused_kernel(p, isa, m, tuned))
    fmt::print(
        "  fused        {} (M = {}: this decode kernel reads the codes and group tables "
        "itself, one call per 64-column block over the whole K and group of <= 4 rows, "
        "instead of the dequant route above)\n",
        fd->name(), *m);
}

// Every kernel is compiled through the registry and disassembled from
// memory, whichever backend made it (compiling is harmless on a CPU that
// cannot run the code: nothing is called).
void print_kernel_asm(const jit::Kernel& k, const std::string& what, const std::string& syntax) {
  fmt::print("; kernel {}  ({} bytes)\n; {} ({} code)\n", k.name, k.size, what, k.backend);
  fmt::print("{}\n", jit::disassemble(k, syntax == "att"));
}

void print_asm(const codegen::GemmPlan& plan, std::optional<int64_t> m, const GemmProgram& prog,
               const std::string& syntax) {
  if (plan.isa == Isa::scalar) {
    fmt::print(
        "; scalar path: tilejit::gemm runs the scalar reference (runtime/reference_gemm.h); "
        "there is no JIT code to show\n");
  } else {
    for (const auto& u : codegen::plan_kernels(plan, m))
      print_kernel_asm(jit::get(u.desc), fmt::format("{}: {}", u.role, jit::cache_key(u.desc)),
                       syntax);
  }
  if (!prog.epilogue.ops.empty())
    print_kernel_asm(jit::get_elementwise(prog.epilogue),
                     "the elementwise epilogue after the gemm (LLVM loop)", syntax);
}

// A program without a gemm: one elementwise loop compiled by LLVM.
int dump_elementwise(const GemmProgram& prog, const DumpOptions& opt, bool all) {
  auto header = [&](const char* stage) {
    if (all) fmt::print("// ---- {} ----\n", stage);
  };
  if (all || opt.stage == "plan") {
    header("plan");
    fmt::print("plan   elementwise: @{} as one fused loop compiled by LLVM (no gemm)\n",
               prog.epilogue.name);
  }
  if (all || opt.stage == "key") {
    header("key");
    // The key holds the printed IR: shown on one line.
    std::string key = jit::cache_key(prog.epilogue);
    std::replace(key.begin(), key.end(), '\n', ' ');
    fmt::print("key    {}\n", key);
  }
  if (all || opt.stage == "asm") {
    header("asm");
    print_kernel_asm(jit::get_elementwise(prog.epilogue), "the elementwise program", opt.syntax);
  }
  return 0;
}

// A program of rope / attention / moe ops: each op is one call of the public
// API, which plans and compiles its own kernels. plan and key say which call
// and which kernels (named where the shapes fix them); asm has no listing.
int dump_operators(const ir::Function& f, const std::string& file, const DumpOptions& opt, bool all,
                   Isa isa, const DimBindings& dims) {
  OperatorProgram prog;
  try {
    prog = match_operator_program(f);
  } catch (const Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "{}\n",
               one_line(fmt::format("{}: error: cannot produce --stage {}: {}", file,
                                    all ? "plan" : opt.stage, e.what())));
    return 1;
  }
  auto header = [&](const char* stage) {
    if (all) fmt::print("// ---- {} ----\n", stage);
  };
  if (all || opt.stage == "plan") {
    header("plan");
    fmt::print("{}", describe_operator_plan(f, prog, isa, dims));
  }
  if (all || opt.stage == "key") {
    header("key");
    fmt::print("{}", describe_operator_keys(f, prog, isa, dims));
  }
  if (all || opt.stage == "asm") {
    header("asm");
    std::vector<std::string> apis;
    for (const OperatorCall& c : prog.calls) {
      // RoPE's one kernel follows from the shapes: its code is shown.
      if (const auto rope = call_rope_kernel(f, c, isa, dims)) {
        print_kernel_asm(jit::get(*rope), fmt::format("{}: {}", c.api(), jit::cache_key(*rope)),
                         opt.syntax);
        continue;
      }
      // decode_attention's one LLVM kernel follows from the shapes too.
      if (const auto dec = call_decode_kernel(f, c, isa, dims)) {
        print_kernel_asm(jit::get(*dec), fmt::format("{}: {}", c.api(), jit::cache_key(*dec)),
                         opt.syntax);
        continue;
      }
      // Quantized experts: their helper kernels (act_quant / dequant) are
      // fixed by the format; the brgemm kernels are chosen at run time.
      std::string shown;  // w13 and w2 often share one: listed once
      for (const MoeHelperKernel& k : call_moe_quant_kernels(f, c, isa)) {
        if (k.key() == shown) continue;
        shown = k.key();
        print_kernel_asm(k.code(), fmt::format("{} ({}): {}", c.api(), k.proj, k.key()),
                         opt.syntax);
      }
      apis.push_back(c.api());
    }
    if (!apis.empty())
      fmt::print(
          "; @{} runs {}: the kernels are chosen and compiled inside the operator at run time, "
          "so there is no listing here (`dump --stage asm` disassembles gemm micro-kernels, "
          "RoPE, decode attention and elementwise kernels); TILEJIT_VERBOSE=1 logs each kernel "
          "compiled, "
          "TILEJIT_PERF_MAP=1 names them for perf\n",
          f.name, fmt::join(apis, ", then "));
  }
  return 0;
}

}  // namespace

int run_dump(const DumpOptions& opt) {
  const bool all = opt.stage == "all";
  if (!all && std::find(std::begin(kStages), std::end(kStages), opt.stage) == std::end(kStages))
    throw UsageError(fmt::format(
        "--stage '{}' is not a stage; allowed: ir, verified, plan, key, asm, all", opt.stage));
  const std::string file = display_name(opt.file);
  const ir::Function f = load_program(opt.file);
  // Bad options fail before anything is printed.
  const DimBindings dims = parse_dims(opt.dims, f);
  const Isa isa = opt.isa.empty() ? cpu_info().isa : runtime::parse_isa(opt.isa.c_str(), "--isa");

  auto header = [&](const char* stage) {
    if (all) fmt::print("// ---- {} ----\n", stage);
  };
  if (all || opt.stage == "ir") {
    header("ir");
    fmt::print("{}", ir::print(f));
  }
  if (opt.stage == "ir") return 0;

  const std::vector<ir::Diagnostic> diags = ir::check(f);
  if (!diags.empty()) {
    for (const ir::Diagnostic& d : diags)
      fmt::print(stderr, "{}\n", one_line(fmt::format("{}: error: {}", file, d.message)));
    return 1;
  }
  if (all || opt.stage == "verified") {
    header("verified");
    print_verified(f);
  }
  if (opt.stage == "verified") return 0;

  if (has_operator_ops(f)) return dump_operators(f, file, opt, all, isa, dims);

  GemmProgram prog;
  try {
    prog = match_program(f, /*allow_elementwise=*/true);
  } catch (const Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "{}\n",
               one_line(fmt::format("{}: error: cannot produce --stage {}: {}", file,
                                    all ? "plan" : opt.stage, e.what())));
    return 1;
  }
  if (!prog.has_gemm) return dump_elementwise(prog, opt, all);
  const std::optional<int64_t> m = gemm_m(f, prog, dims);
  codegen::GemmPlan plan;
  // A quantized program's tuning database entry at M (as for bf16 below:
  // only on the path the library picks).
  const codegen::PlanOverrides qtuned =
      opt.isa.empty() ? quant_program_tuned(f, prog, isa, m) : codegen::PlanOverrides{};
  if (prog.quantized()) {
    // ops/gemm_quant.cpp's spec: shallow K chunks (L1-resident dequantized
    // chunks) for fp8 / int4 at M <= 16 (not in batch-invariant mode); a
    // tuned entry's knobs on top.
    codegen::GemmSpec spec = prog.spec;
    spec.invariant = runtime::batch_invariant();
    if (m) spec.max_kc = ops::quant_gemm_max_kc(spec.int8(), *m, spec.invariant);
    plan = qtuned.empty()
               ? codegen::plan_gemm(spec, isa)
               : codegen::plan_gemm(spec, codegen::gemm_isa_for_rows(isa, *m, qtuned), qtuned);
  } else {
    plan = codegen::lower_gemm(prog.lowered, isa);
    // In batch-invariant mode tilejit::gemm plans the spec with the mode
    // (ops::bf16_gemm_spec; one chain, K chunked for every M): that plan.
    if (runtime::batch_invariant()) {
      codegen::GemmSpec spec = codegen::match_gemm(prog.lowered);
      spec.invariant = true;
      plan = codegen::plan_gemm(spec, isa);
    }
    // With a tuning database (TILEJIT_TUNING_DB) entry for this shape at the
    // bound M, the plan tilejit::gemm runs is the entry's: shown, and named
    // (never in batch-invariant mode: ops::tuned_gemm).
    if (m && opt.isa.empty()) {
      codegen::GemmSpec spec = codegen::match_gemm(prog.lowered);
      spec.invariant = runtime::batch_invariant();
      const codegen::PlanOverrides tuned = ops::tuned_gemm(isa, spec, *m);
      if (!tuned.empty())
        plan = codegen::plan_gemm(spec, codegen::gemm_isa_for_rows(isa, *m, tuned), tuned);
    }
  }
  const std::optional<QuantKernel> qk =
      quant_kernel(f, prog, isa, program_w4a8(prog, isa, m, qtuned));
  if (all || opt.stage == "plan") {
    header("plan");
    print_plan(f, prog, plan, m);
    if (prog.quantized()) print_quant_plan(f, prog, isa, m, qtuned);
  }
  if (all || opt.stage == "key") {
    header("key");
    print_keys(plan, m);
    if (qk)
      fmt::print("{}  {}\n{}  {}\n", qk->dequant ? "dequant  " : "act_quant",
                 quant_kernel_name(*qk), std::string(9, ' '), quant_kernel_key(*qk));
    if (fused_kernel(prog, isa, m, qtuned)) {
      // The set FusedKernels compiles for this M (ops::quant_fused_descs).
      const ops::FusedDescs fds =
          ops::quant_fused_descs(weight_code_dtype(prog.format), prog.zero >= 0, prog.spec.k,
                                 prog.spec, *m, ops::quant_rows_isa(isa, *m), qtuned);
      int count = 0;
      for (const auto& g : fds)
        for (const auto& d : g) count += d.has_value();
      fmt::print(
          "fused kernels for M={}: {} (called instead of the micro-kernels and the dequant "
          "kernel above)\n",
          *m, count);
      for (int g = 0; g < 2; ++g)
        for (int t = 0; t < 2; ++t)
          if (const auto& d = fds[g][t])
            fmt::print("  {:<26}{}\n  {:<26}{}\n",
                       fmt::format("{} rows{}", d->mr, t == 1 ? ", N tail" : ""), d->name(), "",
                       jit::cache_key(*d));
    }
  }
  if (all || opt.stage == "asm") {
    header("asm");
    print_asm(plan, m, prog, opt.syntax);
    if (qk)
      print_kernel_asm(quant_kernel_code(*qk),
                       fmt::format("{}: {}", qk->role, quant_kernel_key(*qk)), opt.syntax);
    if (const auto fd = fused_kernel(prog, isa, m, qtuned))
      print_kernel_asm(jit::get(*fd),
                       fmt::format("the fused decode kernel (M <= {}): {}",
                                   ops::fused_max_rows(isa), jit::cache_key(*fd)),
                       opt.syntax);
  }
  return 0;
}

}  // namespace tilejit::tools
