// Every file the `tilejit` tool reads goes through CappedFile
// (runtime/capped_file.h), against a cap stated here once.
#pragma once

#include <cstdint>

#include "runtime/capped_file.h"
#include "tools/program/host_tensor.h"

namespace tilejit::tools {

using runtime::byte_size_str;
using runtime::CappedFile;

// A .tir program is text a person writes: the examples are under 2 KiB.
inline constexpr int64_t kMaxProgramBytes = int64_t(16) << 20;
// numpy writes headers of a few hundred bytes (and its own reader refuses
// more than 10000 by default); 1 MiB leaves room for any writer.
inline constexpr int64_t kMaxNpyHeaderBytes = int64_t(1) << 20;
// A .npy array becomes a HostTensor: the runner's cap on the tensors it holds.
inline constexpr int64_t kMaxNpyDataBytes = kMaxHostTensorBytes;
// A tune workload and a Hugging Face config.json are text of a few KiB.
inline constexpr int64_t kMaxWorkloadBytes = int64_t(16) << 20;
inline constexpr int64_t kMaxModelConfigBytes = int64_t(16) << 20;
// (The tuning database's cap is the library's: jit::kMaxTuningDbBytes.)

}  // namespace tilejit::tools
