#include "codegen/llvm/mc_disassembler.h"

#include <fmt/format.h>
#include <llvm/MC/MCAsmInfo.h>
#include <llvm/MC/MCContext.h>
#include <llvm/MC/MCDisassembler/MCDisassembler.h>
#include <llvm/MC/MCInst.h>
#include <llvm/MC/MCInstPrinter.h>
#include <llvm/MC/MCInstrAnalysis.h>
#include <llvm/MC/MCInstrInfo.h>
#include <llvm/MC/MCRegisterInfo.h>
#include <llvm/MC/MCSubtargetInfo.h>
#include <llvm/MC/MCTargetOptions.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/TargetParser/Triple.h>

#include <algorithm>
#include <memory>
#include <mutex>

#include "tilejit/error.h"

namespace tilejit::codegen::llvm_backend {
namespace {

constexpr const char* kTriple = "x86_64-unknown-linux-gnu";
// Decoding does not depend on the CPU here, but a CPU that has every extension
// the emitters use keeps the printer from ever refusing an operand form.
constexpr const char* kCpu = "sapphirerapids";
constexpr const char* kAllFeatures =
    "+avx512f,+avx512bw,+avx512vl,+avx512dq,+avx512bf16,+avx512fp16,+amx-tile,+amx-bf16,+amx-int8";

// Only the X86 pieces the disassembler needs, once per process. The LLVM ORC
// backend may initialise the native target too: these calls are idempotent.
const llvm::Target& x86_target() {
  static std::once_flag once;
  std::call_once(once, [] {
    LLVMInitializeX86TargetInfo();
    LLVMInitializeX86TargetMC();
    LLVMInitializeX86Disassembler();
  });
  std::string err;
  const llvm::Target* t = llvm::TargetRegistry::lookupTarget(kTriple, err);
  if (t == nullptr) throw Error("disassembler: no X86 target in this LLVM build: " + err);
  return *t;
}

}  // namespace

std::string disassemble(const uint8_t* code, size_t size, uint64_t address,
                        const std::string& cpu_features_hint, AsmSyntax syntax) {
  const llvm::Target& target = x86_target();
  const llvm::Triple triple(kTriple);
  const std::string features = cpu_features_hint.empty() ? kAllFeatures : cpu_features_hint;

  // One set of MC objects per call: nothing shared, so concurrent callers are safe.
  std::unique_ptr<llvm::MCRegisterInfo> mri(target.createMCRegInfo(kTriple));
  llvm::MCTargetOptions options;
  std::unique_ptr<llvm::MCAsmInfo> mai(target.createMCAsmInfo(*mri, kTriple, options));
  std::unique_ptr<llvm::MCSubtargetInfo> sti(target.createMCSubtargetInfo(kTriple, kCpu, features));
  std::unique_ptr<llvm::MCInstrInfo> mii(target.createMCInstrInfo());
  if (!mri || !mai || !sti || !mii) throw Error("disassembler: cannot create the X86 MC objects");
  llvm::MCContext ctx(triple, mai.get(), mri.get(), sti.get());
  std::unique_ptr<llvm::MCDisassembler> dis(target.createMCDisassembler(*sti, ctx));
  // Intel is variant 1 of the X86 printers, AT&T variant 0.
  std::unique_ptr<llvm::MCInstPrinter> printer(
      target.createMCInstPrinter(triple, syntax == AsmSyntax::intel ? 1 : 0, *mai, *mii, *mri));
  std::unique_ptr<llvm::MCInstrAnalysis> mia(target.createMCInstrAnalysis(mii.get()));
  if (!dis || !printer) throw Error("disassembler: cannot create the X86 disassembler");
  printer->setPrintImmHex(true);
  printer->setPrintBranchImmAsAddress(true);

  const llvm::ArrayRef<uint8_t> bytes(code, size);
  std::string out;
  uint64_t offset = 0;
  while (offset < size) {
    const uint64_t pc = address + offset;
    llvm::MCInst inst;
    uint64_t len = 0;
    std::string text;
    llvm::raw_string_ostream os(text);
    const auto status = dis->getInstruction(inst, len, bytes.slice(offset), pc, llvm::nulls());
    if (status == llvm::MCDisassembler::Success && len > 0) {
      // X86 prints PC-relative operands against the next instruction's address.
      printer->printInst(&inst, pc + len, "", *sti, os);
      // RIP-relative memory operands (the epilogue's constant pool): show where
      // they point, as objdump does.
      if (mia) {
        if (auto target_addr = mia->evaluateMemoryOperandAddress(inst, sti.get(), pc, len))
          os << fmt::format("  # 0x{:x}", *target_addr);
      }
    } else {
      len = 1;
      os << "(bad)";
    }
    os.flush();
    // The printer indents with a tab; one space is enough after the bytes column.
    text.erase(0, text.find_first_not_of(" \t"));
    std::replace(text.begin(), text.end(), '\t', ' ');
    std::string hex;
    for (uint64_t i = 0; i < len; ++i) hex += fmt::format("{:02x} ", code[offset + i]);
    out += fmt::format("  {:6x}:  {:<36} {}\n", pc, hex, text);
    offset += len;
  }
  return out;
}

}  // namespace tilejit::codegen::llvm_backend
