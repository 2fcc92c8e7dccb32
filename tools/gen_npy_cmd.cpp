// `tilejit gen-npy` (hidden): writes a random .npy file of any supported dtype
// and shape. It lets tests/tool_test.sh build inputs — of wrong shapes and
// dtypes too — on machines without numpy.
//
// Operator inputs must hold valid values, so a file named after the operand
// role it feeds gets values of that role (tools/program_io.h, fill_role):
// pos.npy / positions.npy positions in [0, 16) (valid for a cache of ≥ 16
// rows), cos_sin.npy a real cos/sin cache, topk_ids.npy distinct expert ids in
// [0, 16) per row (valid for E ≥ 16), topk_weights.npy positive rows summing
// to 1. The name is the switch because the options are fixed by the command
// line parser (tools/tilejit_main.cpp).
#include <fmt/format.h>

#include <cstring>
#include <filesystem>

#include "runtime/bf16.h"
#include "tilejit/error.h"
#include "tools/commands.h"
#include "tools/npy.h"
#include "tools/program_io.h"

namespace tilejit::tools {
namespace {

// The range of generated positions and expert ids: that of the plain ints.
constexpr int64_t kIndexRange = 16;

DType dtype_of(NpyDtype t) {
  switch (t) {
    case NpyDtype::f4:
      return DType::f32;
    case NpyDtype::i4:
      return DType::i32;
    case NpyDtype::u1:
      return DType::u8;
    case NpyDtype::i1:
      return DType::i8;
    case NpyDtype::u2:
      break;
  }
  return DType::bf16;
}

}  // namespace

int run_gen_npy(const GenNpyOptions& opt) {
  NpyArray a;
  const NpyDtype all[] = {NpyDtype::f4, NpyDtype::i4, NpyDtype::u1, NpyDtype::i1, NpyDtype::u2};
  bool found = false;
  for (NpyDtype t : all)
    if (opt.dtype == npy_descr(t)) {
      a.dtype = t;
      found = true;
    }
  if (!found)
    throw UsageError(
        fmt::format("--dtype '{}': allowed: <f4, <i4, |u1, |i1, <u2 (bf16 bits)", opt.dtype));
  for (int64_t d : opt.shape)
    if (d < 0 || d > kMaxDimValue)
      throw UsageError(fmt::format("--shape: dim {}; allowed: 0 to {}", d, kMaxDimValue));
  a.shape = opt.shape;
  const int64_t bytes = dense_bytes(a.shape, npy_item_bytes(a.dtype), "gen-npy " + opt.file);
  const InputRole role = role_from_name(std::filesystem::path(opt.file).stem().string());
  if (role != InputRole::plain) {
    HostTensor t = HostTensor::zeros(dtype_of(a.dtype), a.shape, "gen-npy " + opt.file);
    fill_role(t, role, kIndexRange, opt.seed, "gen-npy " + opt.file);
    write_npy(opt.file, npy_from_tensor(t, "gen-npy " + opt.file));
    return 0;
  }
  const int64_t n = a.numel();
  const int item = npy_item_bytes(a.dtype);
  a.data.resize(static_cast<size_t>(bytes));
  uint64_t s = opt.seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const float u = static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) / float(1 << 23);
    uint8_t* p = a.data.data() + i * item;
    switch (a.dtype) {
      case NpyDtype::f4:
        std::memcpy(p, &u, 4);
        break;
      case NpyDtype::u2: {
        const uint16_t h = runtime::f32_to_bf16(u);
        std::memcpy(p, &h, 2);
        break;
      }
      case NpyDtype::i4: {
        const int32_t v = static_cast<int32_t>(s % 16);
        std::memcpy(p, &v, 4);
        break;
      }
      case NpyDtype::u1:
      case NpyDtype::i1:
        *p = static_cast<uint8_t>(s);
        break;
    }
  }
  write_npy(opt.file, a);
  return 0;
}

}  // namespace tilejit::tools
