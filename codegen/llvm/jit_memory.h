// The memory the LLVM JIT links kernels into (codegen/llvm/jit_memory.cpp).
#pragma once

#include <llvm/ExecutionEngine/Orc/Core.h>
#include <llvm/ExecutionEngine/Orc/ObjectLinkingLayer.h>

#include <cstddef>
#include <memory>

namespace tilejit::codegen::llvm_backend {

// The address space a reservation of linked kernels takes (mapped RW until
// kernels fill it): a link may need a new one, so the link's headroom check
// (llvm_jit.cpp) counts it.
inline constexpr size_t kKernelReservationBytes = size_t{16} << 20;

// An ObjectLinkingLayer whose kernels share a few large mappings instead of
// taking two each (see jit_memory.cpp: Linux caps a process at ~65 530
// mappings, host and JIT together), with LLJIT's EH-frame registration.
std::unique_ptr<llvm::orc::ObjectLinkingLayer> make_kernel_linking_layer(
    llvm::orc::ExecutionSession& es);

}  // namespace tilejit::codegen::llvm_backend
