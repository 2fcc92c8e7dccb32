// `tilejit gen-npy` (hidden): writes a random .npy file of any supported dtype
// and shape. It lets tests/tool_test.sh build inputs — of wrong shapes and
// dtypes too — on machines without numpy.
#include <fmt/format.h>

#include <cstring>

#include "runtime/bf16.h"
#include "tilejit/error.h"
#include "tools/commands.h"
#include "tools/npy.h"

namespace tilejit::tools {

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
    throw Error(
        fmt::format("--dtype '{}': allowed: <f4, <i4, |u1, |i1, <u2 (bf16 bits)", opt.dtype));
  for (int64_t d : opt.shape)
    if (d < 0) throw Error(fmt::format("--shape: dim {} must be >= 0", d));
  a.shape = opt.shape;
  const int64_t n = a.numel();
  const int item = npy_item_bytes(a.dtype);
  a.data.resize(static_cast<size_t>(n * item));
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
