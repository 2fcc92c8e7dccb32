// Where linked LLVM kernels live. LLJIT's default memory manager maps each
// linked object on its own and gives its code (RX) and constants (R) their
// protections: two mappings a kernel that never merge with the neighbours'
// (RX R RX R ...). Linux caps a process at vm.max_map_count (~65 530)
// mappings, shared with the host: an outside tester's long-running process
// stopped compiling at ~32 700 LLVM kernels, and the host's own
// std::thread creation failed with it.
//
// Instead, kernels are carved from 16 MiB reservations
// (orc::MapperJITLinkMemoryManager over the in-process mapper, which reuses
// freed ranges), and a kernel's read-only segments (constant pools, the GOT)
// are mapped read + execute like its code: every kernel of a reservation then
// has one protection, and the kernel merges their pages into one mapping (two
// a reservation with its unused RW tail). Nothing becomes writable and
// executable at once: a segment is written while RW, then made RX; writable
// data segments (none in tilejit's kernels) keep RW.
#include "codegen/llvm/jit_memory.h"

#include <llvm/ADT/BitmaskEnum.h>
#include <llvm/ExecutionEngine/JITLink/EHFrameSupport.h>
#include <llvm/ExecutionEngine/Orc/MapperJITLinkMemoryManager.h>
#include <llvm/ExecutionEngine/Orc/MemoryMapper.h>
#include <llvm/Support/Process.h>

namespace tilejit::codegen::llvm_backend {

namespace {

namespace orc = llvm::orc;
LLVM_ENABLE_BITMASK_ENUMS_IN_NAMESPACE();  // MemProt's & and |

class MergingMapper final : public orc::InProcessMemoryMapper {
 public:
  using orc::InProcessMemoryMapper::InProcessMemoryMapper;

  void initialize(AllocInfo& ai, OnInitializedFunction on_initialized) override {
    for (AllocInfo::SegInfo& seg : ai.Segments) {
      const orc::MemProt p = seg.AG.getMemProt();
      if ((p & orc::MemProt::Read) == orc::MemProt::Read &&
          (p & orc::MemProt::Write) == orc::MemProt::None)
        seg.AG = orc::AllocGroup(orc::MemProt::Read | orc::MemProt::Exec, seg.AG.getMemLifetime());
    }
    orc::InProcessMemoryMapper::initialize(ai, std::move(on_initialized));
  }
};

}  // namespace

std::unique_ptr<orc::ObjectLinkingLayer> make_kernel_linking_layer(orc::ExecutionSession& es) {
  auto mapper = std::make_unique<MergingMapper>(
      static_cast<size_t>(llvm::sys::Process::getPageSizeEstimate()));
  auto layer = std::make_unique<orc::ObjectLinkingLayer>(
      es, std::make_unique<orc::MapperJITLinkMemoryManager>(kKernelReservationBytes,
                                                            std::move(mapper)));
  // As LLJIT's default layer: the kernels' unwind tables registered (a
  // debugger's or profiler's backtrace through a kernel).
  layer->addPlugin(std::make_unique<orc::EHFrameRegistrationPlugin>(
      es, std::make_unique<llvm::jitlink::InProcessEHFrameRegistrar>()));
  return layer;
}

}  // namespace tilejit::codegen::llvm_backend
