// pack_experts: [E, rows, cols] bf16 expert weights -> E packed matrices (see
// ops/packed_experts_impl.h). Padding is zero, so padded products vanish and a
// GLU's padded outputs are act(0)·0 = 0, never stored anyway.
#include <fmt/format.h>

#include "ops/packed_experts_impl.h"
#include "ops/tensor_checks.h"
#include "runtime/thread_pool.h"

#include "runtime/api_guard.h"

namespace tilejit {

PackedExperts::PackedExperts() = default;
PackedExperts::~PackedExperts() = default;
PackedExperts::PackedExperts(const PackedExperts&) = default;
PackedExperts::PackedExperts(PackedExperts&&) noexcept = default;
PackedExperts& PackedExperts::operator=(const PackedExperts&) = default;
PackedExperts& PackedExperts::operator=(PackedExperts&&) noexcept = default;
PackedExperts::PackedExperts(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

namespace {
const PackedExperts::Impl& need(const PackedExperts::Impl* impl, const char* what) {
  if (impl == nullptr)
    throw Error(
        fmt::format("{}: the PackedExperts is empty; allowed: experts from pack_experts()", what));
  return *impl;
}
}  // namespace

int64_t PackedExperts::num_experts() const {
  return need(impl_.get(), "PackedExperts::num_experts").experts;
}
ExpertProj PackedExperts::proj() const {
  return need(impl_.get(), "PackedExperts::proj").proj;
}
int64_t PackedExperts::n() const {
  return need(impl_.get(), "PackedExperts::n").n;
}
int64_t PackedExperts::k() const {
  return need(impl_.get(), "PackedExperts::k").k;
}
std::string PackedExperts::layout() const {
  return need(impl_.get(), "PackedExperts::layout").layout_name;
}
size_t PackedExperts::packed_bytes() const {
  const Impl& p = need(impl_.get(), "PackedExperts::packed_bytes");
  if (!p.quant.empty()) {
    size_t bytes = 0;
    for (const PackedWeight& w : p.quant) bytes += w.packed_bytes();
    return bytes;
  }
  return static_cast<size_t>(p.experts * p.expert_bytes);
}

void PackedExperts::Impl::check_proj_and_rows(const char* op, ExpertProj proj, GluRows order) {
  if (proj != ExpertProj::gate_up && proj != ExpertProj::down && proj != ExpertProj::up)
    throw Error(fmt::format("{}: proj={} is not an ExpertProj; allowed: gate_up, down, up", op,
                            static_cast<int>(proj)));
  if (order != GluRows::halves && order != GluRows::interleaved)
    throw Error(fmt::format("{}: glu_rows={} is not a GluRows; allowed: halves, interleaved", op,
                            static_cast<int>(order)));
  // Only a gate_up matrix has gate / up rows to order: a non-gated up
  // projection and a down one have none (the IR refuses glu_rows with gated
  // = false alike; a down matrix's interleaved flag was ignored, which hid
  // a caller's belief that it changed something).
  if (proj != ExpertProj::gate_up && order == GluRows::interleaved)
    throw Error(fmt::format(
        "{}: glu_rows=interleaved with proj={}: only a gate_up matrix has gate / up rows to "
        "interleave; allowed: halves (the default)",
        op, proj == ExpertProj::up ? "up" : "down"));
}

PackedExperts pack_experts(const TensorView& w, ExpertProj proj, GluRows order) {
  return runtime::api_guard("pack_experts", [&]() -> PackedExperts {
    const char* op = "pack_experts";
    PackedExperts::Impl::check_proj_and_rows(op, proj, order);
    ops::check_view(op, "w", w, 3);
    ops::check_dtype(op, "w", w, {DType::bf16});
    // An expert's elements may not share an address (a row stride below H,
    // e.g. 0, would pack one row many times: a weight no checkpoint holds);
    // any strides otherwise: HF's GPT-OSS / Llama-4 experts are [E, H, 2I]
    // for x @ W, the logical [E, 2I, H] with strides {2I·H, 1, 2I}. Experts
    // may share (stride 0: E copies).
    ops::check_distinct_matrix(op, "w", w);
    const int64_t E = w.shape[0], rows = w.shape[1], cols = w.shape[2];
    if (E < 1 || rows < 1 || cols < 1)
      throw Error(fmt::format("pack_experts: w has shape {}; allowed: every dim >= 1",
                              ops::shape_str(w.shape)));
    ops::check_count(op, "E (w.shape[0])", E, 1, Limits::max_experts);
    if (proj == ExpertProj::gate_up && rows % 2 != 0)
      throw Error(fmt::format(
          "pack_experts: w has shape {} for gate_up; allowed: [E, 2I, H] (an even row count)",
          ops::shape_str(w.shape)));

    auto impl = std::make_shared<PackedExperts::Impl>();
    impl->layout_name = PackedExperts::Impl::layout_for(proj);
    impl->proj = proj;
    impl->glu_interleaved = order == GluRows::interleaved && proj == ExpertProj::gate_up;
    impl->experts = E;
    impl->n = proj == ExpertProj::gate_up ? rows / 2 : rows;
    impl->k = cols;
    impl->layout.n = proj == ExpertProj::gate_up ? (impl->n + 31) / 32 * 64 : rows;
    impl->layout.k = cols;
    impl->expert_bytes = impl->layout.total_elems() * 2;
    impl->data = runtime::aligned_alloc_bytes(static_cast<size_t>(
        ops::checked_mul(op, "packed bytes E·bytes per expert", E, impl->expert_bytes)));
    const auto* src = static_cast<const uint16_t*>(w.data);
    const PackedExperts::Impl& p = *impl;
    runtime::parallel_for(E, [&](int64_t e) {
      auto* dst = reinterpret_cast<uint16_t*>(const_cast<uint8_t*>(p.expert(e)));
      // Packed row r holds source row s (gate_up: the blocks' gate / up
      // order; -1: zero padding, the buffer starts zeroed). In 64 × 64
      // tiles: a transposed source is read a cache line at a time.
      std::vector<int64_t> source(static_cast<size_t>(p.layout.n));
      for (int64_t r = 0; r < p.layout.n; ++r)
        source[r] = proj == ExpertProj::gate_up ? p.gate_up_source_row(r) : r;
      const uint16_t* expert = src + e * w.strides[0];
      ops::for_each_in_tiles(p.layout.n, cols, [&](int64_t r, int64_t c) {
        if (source[r] >= 0)
          dst[p.layout.index(r, c)] = expert[source[r] * w.strides[1] + c * w.strides[2]];
      });
    });
    return PackedExperts(std::move(impl));
  });
}

PackedExperts pack_experts(const PackedExperts& w, ExpertProj proj) {
  const PackedExperts::Impl& p = need(w.impl(), "pack_experts");
  if (p.proj != proj)
    throw Error(fmt::format(
        "pack_experts: w is already packed as {} (layout {}); allowed: proj = that same value",
        PackedExperts::Impl::proj_name(p.proj), p.layout_name));
  return w;  // already packed: the same immutable bytes, never a second transform
}

void PackedExperts::unpack(const TensorView& out) const {
  const Impl& p = need(impl_.get(), "PackedExperts::unpack");
  const char* op = "PackedExperts::unpack";
  if (!p.quant.empty())
    throw Error(
        fmt::format("{}: the experts are {}; allowed: unpack into that format's checkpoint tensors",
                    op, weight_format_name(p.format)));
  ops::check_view(op, "out", out, 3);
  ops::check_dtype(op, "out", out, {DType::bf16});
  if (out.strides[2] != 1)
    throw Error(fmt::format("{}: out has innermost stride {}; allowed: 1", op, out.strides[2]));
  ops::check_writable(op, "out", out);
  const int64_t rows = p.proj == ExpertProj::gate_up ? 2 * p.n : p.n;
  if (out.shape[0] != p.experts || out.shape[1] != rows || out.shape[2] != p.k)
    throw Error(fmt::format("{}: out has shape {}; allowed: [{}, {}, {}]", op,
                            ops::shape_str(out.shape), p.experts, rows, p.k));
  auto* dst = static_cast<uint16_t*>(out.data);
  runtime::parallel_for(p.experts, [&](int64_t e) {
    const auto* src = reinterpret_cast<const uint16_t*>(p.expert(e));
    for (int64_t r = 0; r < p.layout.n; ++r) {
      const int64_t s = p.proj == ExpertProj::gate_up ? p.gate_up_source_row(r) : r;
      if (s < 0) continue;
      uint16_t* row = dst + e * out.strides[0] + s * out.strides[1];
      for (int64_t c = 0; c < p.k; ++c) row[c] = src[p.layout.index(r, c)];
    }
  });
}

}  // namespace tilejit
