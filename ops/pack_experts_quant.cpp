// pack_experts for the quantized formats: one quantized PackedWeight per
// expert (ops/pack_quant.cpp does the packing and every checkpoint check),
// gate_up ones with the GLU row map so that each 64-column block pairs 32
// gate with the matching 32 up columns, as the bf16 experts' layout does.
// unpack / dequantize go back through those weights.
#include <fmt/format.h>

#include <cstring>

#include "ops/pack_quant_util.h"
#include "ops/packed_experts_impl.h"
#include "ops/quant_weight.h"
#include "ops/tensor_checks.h"
#include "runtime/aligned_buffer.h"
#include "runtime/bf16.h"
#include "runtime/thread_pool.h"

#include "runtime/api_guard.h"

namespace tilejit {
namespace {

constexpr const char* kOp = "pack_experts";

// Rows of the logical matrix a checkpoint description holds (before any
// check: pack_weight checks it right after).
int64_t logical_rows(const Int8Weight& w) {
  return w.weight.shape.empty() ? 0 : w.weight.shape[0];
}
int64_t logical_rows(const Fp8Weight& w) {
  return w.weight.shape.empty() ? 0 : w.weight.shape[0];
}
int64_t logical_rows(const Int4Weight& w) {
  if (w.n != 0) return w.n;
  if (w.qweight.shape.size() != 2) return 0;
  return w.format == Int4Format::awq ? w.qweight.shape[1] * 8 : w.qweight.shape[1];
}

int64_t logical_rows(const Mxfp4Weight& w) {
  return w.blocks.shape.empty() ? 0 : w.blocks.shape[0];
}

PackedWeight pack_one(const Int8Weight& w, std::vector<int64_t> map) {
  return ops::pack_int8(w, std::move(map));
}
PackedWeight pack_one(const Fp8Weight& w, std::vector<int64_t> map) {
  return ops::pack_fp8(w, std::move(map));
}
PackedWeight pack_one(const Int4Weight& w, std::vector<int64_t> map) {
  return ops::pack_int4(w, std::move(map));
}
PackedWeight pack_one(const Mxfp4Weight& w, std::vector<int64_t> map) {
  return ops::pack_mxfp4(w, std::move(map));
}

// What must agree between experts: the layout tag without the act-order
// marker (each expert's g_idx is its own).
std::string tag_class(const PackedWeight::Impl& p) {
  std::string t = p.layout_name;
  const std::string perm = "_perm";
  if (t.size() >= perm.size() && t.compare(t.size() - perm.size(), perm.size(), perm) == 0)
    t.resize(t.size() - perm.size());
  return t;
}

// All experts' codes into one buffer (huge pages once it reaches 2 MiB, as
// one bf16 PackedExperts gets): decode streams a few experts of ~1-3 MiB
// each, which on their own 4 KiB pages lose 20-30 % of the DRAM rate to TLB
// misses (moe_bench).
void move_to_arena(std::vector<PackedWeight>& experts) {
  constexpr size_t kAlign = 4096;
  std::vector<size_t> off(experts.size() + 1, 0);
  for (size_t e = 0; e < experts.size(); ++e)
    off[e + 1] = off[e] + (experts[e].impl()->data_bytes + kAlign - 1) / kAlign * kAlign;
  std::shared_ptr<std::byte> arena(runtime::aligned_alloc_bytes(off.back()).release(),
                                   runtime::FreeDeleter{});
  runtime::parallel_for(static_cast<int64_t>(experts.size()), [&](int64_t e) {
    // The weight was made by this pack_experts call and is not shared yet.
    auto& p = const_cast<PackedWeight::Impl&>(*experts[e].impl());
    std::memcpy(arena.get() + off[e], p.data.get(), p.data_bytes);
    p.shared = arena;
    p.shared_at = arena.get() + off[e];
    p.data.reset();
  });
}

template <class W>
PackedExperts pack_quantized(const std::vector<W>& w, ExpertProj proj, GluRows order) {
  PackedExperts::Impl::check_proj_and_rows(kOp, proj, order);
  const int64_t E = static_cast<int64_t>(w.size());
  ops::check_count(kOp, "E (w.size())", E, 1, Limits::max_experts);
  const int64_t rows = logical_rows(w[0]);
  if (proj == ExpertProj::gate_up && (rows < 2 || rows % 2 != 0))
    throw Error(fmt::format(
        "{}: expert 0 has {} output rows for gate_up; allowed: 2I (gate rows, then up rows)", kOp,
        rows));
  std::vector<int64_t> map;
  const bool interleaved = order == GluRows::interleaved;
  if (proj == ExpertProj::gate_up) map = PackedExperts::Impl::glu_row_map(rows / 2, interleaved);
  auto impl = std::make_shared<PackedExperts::Impl>();
  impl->quant.resize(static_cast<size_t>(E));
  runtime::parallel_for(E, [&](int64_t e) {
    if (logical_rows(w[e]) != rows)
      throw Error(fmt::format("{}: expert {} has {} output rows; allowed: expert 0's {}", kOp, e,
                              logical_rows(w[e]), rows));
    try {
      impl->quant[e] = pack_one(w[e], map);
    } catch (const Error& err) {
      throw Error(fmt::format("{}: expert {}: {}", kOp, e, err.what()));
    }
  });
  move_to_arena(impl->quant);
  const PackedWeight::Impl& first = impl->q(0);
  for (int64_t e = 1; e < E; ++e) {
    const PackedWeight::Impl& p = impl->q(e);
    if (p.layout.k != first.layout.k || tag_class(p) != tag_class(first))
      throw Error(fmt::format(
          "{}: expert {} is {} with K = {}; allowed: expert 0's format {} and K = {} (every "
          "expert the same shape and parameters)",
          kOp, e, p.layout_name, p.layout.k, first.layout_name, first.layout.k));
  }
  impl->format = first.format;
  impl->glu_interleaved = interleaved && proj == ExpertProj::gate_up;
  impl->proj = proj;
  impl->experts = E;
  impl->n = proj == ExpertProj::gate_up ? first.layout.n / 2 : first.layout.n;
  impl->k = first.layout.k;
  impl->layout_name =
      tag_class(first) + (proj == ExpertProj::gate_up ? PackedExperts::Impl::kGluSuffix : "");
  return PackedExperts(std::move(impl));
}

const PackedExperts::Impl& need_quant(const PackedExperts::Impl* p, const char* op, size_t size) {
  if (p == nullptr)
    throw Error(
        fmt::format("{}: the PackedExperts is empty; allowed: experts from pack_experts()", op));
  if (p->quant.empty())
    throw Error(fmt::format(
        "{}: the experts are bf16; allowed: unpack(const TensorView&) for bf16 experts", op));
  if (size != p->quant.size())
    throw Error(fmt::format("{}: out has {} entries; allowed: one per expert ({})", op, size,
                            p->quant.size()));
  return *p;
}

template <class W>
void unpack_quantized(const PackedExperts::Impl* impl, const std::vector<W>& out) {
  const char* op = "PackedExperts::unpack";
  const PackedExperts::Impl& p = need_quant(impl, op, out.size());
  // Every expert's outputs checked before any is written.
  for (size_t e = 0; e < out.size(); ++e) {
    try {
      ops::check_unpack(p.quant[e].impl(), out[e]);
    } catch (const Error& err) {
      throw Error(fmt::format("{}: expert {}: {}", op, e, err.what()));
    }
  }
  for (size_t e = 0; e < out.size(); ++e) p.quant[e].unpack(out[e]);
}

}  // namespace

PackedExperts pack_experts(const std::vector<Int8Weight>& w, ExpertProj proj, GluRows rows) {
  return runtime::api_guard("pack_experts", [&]() -> PackedExperts {
    if (w.empty()) throw Error(fmt::format("{}: w is empty; allowed: one weight per expert", kOp));
    return pack_quantized(w, proj, rows);
  });
}
PackedExperts pack_experts(const std::vector<Fp8Weight>& w, ExpertProj proj, GluRows rows) {
  return runtime::api_guard("pack_experts", [&]() -> PackedExperts {
    if (w.empty()) throw Error(fmt::format("{}: w is empty; allowed: one weight per expert", kOp));
    return pack_quantized(w, proj, rows);
  });
}
PackedExperts pack_experts(const std::vector<Int4Weight>& w, ExpertProj proj, GluRows rows) {
  return runtime::api_guard("pack_experts", [&]() -> PackedExperts {
    if (w.empty()) throw Error(fmt::format("{}: w is empty; allowed: one weight per expert", kOp));
    return pack_quantized(w, proj, rows);
  });
}
PackedExperts pack_experts(const std::vector<Mxfp4Weight>& w, ExpertProj proj, GluRows rows) {
  return runtime::api_guard("pack_experts", [&]() -> PackedExperts {
    if (w.empty()) throw Error(fmt::format("{}: w is empty; allowed: one weight per expert", kOp));
    return pack_quantized(w, proj, rows);
  });
}

void PackedExperts::unpack(const std::vector<Int8Weight>& out) const {
  unpack_quantized(impl_.get(), out);
}
void PackedExperts::unpack(const std::vector<Fp8Weight>& out) const {
  unpack_quantized(impl_.get(), out);
}
void PackedExperts::unpack(const std::vector<Int4Weight>& out) const {
  unpack_quantized(impl_.get(), out);
}
void PackedExperts::unpack(const std::vector<Mxfp4Weight>& out) const {
  unpack_quantized(impl_.get(), out);
}

WeightFormat PackedExperts::format() const {
  if (impl_ == nullptr)
    throw Error(
        "PackedExperts::format: the PackedExperts is empty; allowed: experts from "
        "pack_experts()");
  return impl_->format;
}

void PackedExperts::dequantize(const TensorView& out) const {
  const char* op = "PackedExperts::dequantize";
  if (impl_ == nullptr)
    throw Error(
        fmt::format("{}: the PackedExperts is empty; allowed: experts from pack_experts()", op));
  const Impl& p = *impl_;
  ops::check_view(op, "out", out, 3);
  ops::check_dtype(op, "out", out, {DType::f32, DType::bf16});
  if (out.strides[2] != 1)
    throw Error(fmt::format("{}: out has innermost stride {}; allowed: 1", op, out.strides[2]));
  ops::check_writable(op, "out", out);
  const int64_t rows = p.proj == ExpertProj::gate_up ? 2 * p.n : p.n;
  if (out.shape != std::vector<int64_t>{p.experts, rows, p.k})
    throw Error(fmt::format("{}: out has shape {}; allowed: [{}, {}, {}]", op,
                            ops::shape_str(out.shape), p.experts, rows, p.k));
  // bf16 experts: the packed row of each logical row.
  const std::vector<int64_t> map = p.quant.empty() && p.proj == ExpertProj::gate_up
                                       ? PackedExperts::Impl::glu_row_map(p.n, p.glu_interleaved)
                                       : std::vector<int64_t>{};
  runtime::parallel_for(p.experts * rows, [&](int64_t er) {
    const int64_t e = er / rows, r = er % rows;
    for (int64_t c = 0; c < p.k; ++c) {
      double v;  // rounded once to out's dtype
      if (p.quant.empty()) {
        const int64_t s = map.empty() ? r : map[static_cast<size_t>(r)];
        v = runtime::bf16_to_f32(
            reinterpret_cast<const uint16_t*>(p.expert(e))[p.layout.index(s, c)]);
      } else {
        v = ops::weight_value(p.q(e), r, c);
      }
      const int64_t off = e * out.strides[0] + r * out.strides[1] + c;
      if (out.dtype == DType::f32)
        static_cast<float*>(out.data)[off] = static_cast<float>(v);
      else
        static_cast<uint16_t*>(out.data)[off] = runtime::f64_to_bf16(v);
    }
  });
}

}  // namespace tilejit
