// pack_weight / unpack: [N, K] bf16 <-> the vnni2 n64 k32-padded layout
// (codegen/packed_layout.h). Padding is zero, so padded products vanish.
#include <fmt/format.h>

#include <cstring>

#include "ops/packed_weight_impl.h"
#include "ops/tensor_checks.h"

#include "runtime/api_guard.h"

namespace tilejit {

PackedWeight::PackedWeight() = default;
PackedWeight::~PackedWeight() = default;
PackedWeight::PackedWeight(const PackedWeight&) = default;
PackedWeight::PackedWeight(PackedWeight&&) noexcept = default;
PackedWeight& PackedWeight::operator=(const PackedWeight&) = default;
PackedWeight& PackedWeight::operator=(PackedWeight&&) noexcept = default;
PackedWeight::PackedWeight(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

namespace {
const PackedWeight::Impl& need(const PackedWeight::Impl* impl, const char* what) {
  if (impl == nullptr)
    throw Error(
        fmt::format("{}: the PackedWeight is empty; allowed: a weight from pack_weight()", what));
  return *impl;
}
}  // namespace

int64_t PackedWeight::n() const {
  return need(impl_.get(), "PackedWeight::n").layout.n;
}
int64_t PackedWeight::k() const {
  return need(impl_.get(), "PackedWeight::k").layout.k;
}
DType PackedWeight::dtype() const {
  return need(impl_.get(), "PackedWeight::dtype").dtype;
}
WeightFormat PackedWeight::format() const {
  return need(impl_.get(), "PackedWeight::format").format;
}
std::string PackedWeight::layout() const {
  return need(impl_.get(), "PackedWeight::layout").layout_name;
}
size_t PackedWeight::packed_bytes() const {
  const Impl& p = need(impl_.get(), "PackedWeight::packed_bytes");
  if (p.quant == nullptr) return static_cast<size_t>(p.layout.total_elems()) * 2;
  // Codes, plus the tables the kernels read per call.
  const ops::QuantTables& q = *p.quant;
  const int64_t cols = p.run_layout().n_blocks() * codegen::PackedLayout::kBlockN;
  size_t bytes = p.data_bytes + q.groups.size() * 4 + q.perm.size() * 4;
  if (q.scales) bytes += static_cast<size_t>(cols * q.n_groups * q.scale_entry_bytes);
  if (q.zeros) bytes += static_cast<size_t>(cols * q.n_groups);
  if (q.col_scale) bytes += static_cast<size_t>(cols) * 8;
  return bytes;
}

PackedWeight pack_weight(const TensorView& w) {
  return runtime::api_guard("pack_weight", [&]() -> PackedWeight {
    ops::check_view("pack_weight", "w", w, 2);
    ops::check_dtype("pack_weight", "w", w, {DType::bf16});
    ops::check_distinct_matrix("pack_weight", "w", w);
    if (w.shape[0] < 1 || w.shape[1] < 1)
      throw Error(fmt::format("pack_weight: w has shape {}; allowed: N >= 1 and K >= 1",
                              ops::shape_str(w.shape)));
    auto impl = std::make_shared<PackedWeight::Impl>();
    impl->layout.n = w.shape[0];
    impl->layout.k = w.shape[1];
    const auto& L = impl->layout;
    impl->data = runtime::aligned_alloc_bytes(static_cast<size_t>(L.total_elems()) * 2);
    auto* dst = reinterpret_cast<uint16_t*>(impl->data.get());
    const auto* src = static_cast<const uint16_t*>(w.data);
    ops::for_each_in_tiles(L.n, L.k, [&](int64_t n, int64_t k) {
      dst[L.index(n, k)] = src[n * w.strides[0] + k * w.strides[1]];
    });
    return PackedWeight(std::move(impl));
  });
}

PackedWeight pack_weight(const PackedWeight& w) {
  need(w.impl(), "pack_weight");
  return w;  // already packed: the same immutable bytes, never a second transform
}

void PackedWeight::unpack(const TensorView& out) const {
  const Impl& p = need(impl_.get(), "PackedWeight::unpack");
  if (p.quant != nullptr)
    throw Error(
        fmt::format("PackedWeight::unpack: the weight was packed as {}; allowed: a bf16 "
                    "weight (a quantized one unpacks into its own format's tensors, or "
                    "dequantize() gives its logical values)",
                    weight_format_name(p.format)));
  ops::check_view("PackedWeight::unpack", "out", out, 2);
  ops::check_dtype("PackedWeight::unpack", "out", out, {DType::bf16});
  ops::check_row_major_rows("PackedWeight::unpack", "out", out);
  ops::check_writable("PackedWeight::unpack", "out", out);
  if (out.shape[0] != p.layout.n || out.shape[1] != p.layout.k)
    throw Error(fmt::format("PackedWeight::unpack: out has shape {}; allowed: [{}, {}]",
                            ops::shape_str(out.shape), p.layout.n, p.layout.k));
  auto* dst = static_cast<uint16_t*>(out.data);
  const uint16_t* src = p.bf16();
  for (int64_t n = 0; n < p.layout.n; ++n)
    for (int64_t k = 0; k < p.layout.k; ++k)
      dst[n * out.strides[0] + k] = src[p.layout.index(n, k)];
}

}  // namespace tilejit
