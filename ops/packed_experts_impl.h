// The inside of a PackedExperts: E expert matrices, each in the packed bf16
// layout of codegen/packed_layout.h, back to back in one buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "codegen/packed_layout.h"
#include "runtime/aligned_buffer.h"
#include "tilejit/tilejit.h"

namespace tilejit {

struct PackedExperts::Impl {
  // The tags fused_experts checks before reading the bytes; quantized
  // experts: their expert weights' tag (ops/quant_weight.h) + kGluSuffix
  // for gate_up.
  static constexpr const char* kGateUpLayout = "bf16_vnni2_n64k32_glu32";
  static constexpr const char* kDownLayout = "bf16_vnni2_n64k32";
  static constexpr const char* kGluSuffix = "_glu32";
  static const char* layout_for(ExpertProj p) {
    return p == ExpertProj::gate_up ? kGateUpLayout : kDownLayout;
  }
  // The spelling of an ExpertProj in messages ("gate_up", "down", "up").
  static const char* proj_name(ExpertProj p) {
    return p == ExpertProj::gate_up ? "gate_up" : p == ExpertProj::down ? "down" : "up";
  }
  // gate_up: the act-and-mul pairs 32 gate and 32 up columns in each packed
  // 64-column block; down and up (non-gated) are plain: 64 outputs a block.
  bool gated() const { return proj == ExpertProj::gate_up; }
  int64_t outputs_per_block() const { return gated() ? 32 : 64; }
  // The packed 64-column blocks of one expert's n outputs.
  int64_t output_blocks() const { return (n + outputs_per_block() - 1) / outputs_per_block(); }
  WeightFormat format = WeightFormat::bf16;
  // Quantized formats: one packed weight per expert, the logical [2I, H] or
  // [H, I] matrix; gate_up ones with the GLU row map (glu_row_map), so their
  // 64-column blocks hold 32 gate and the matching 32 up columns like the
  // bf16 layout. `layout` and `data` are unused then.
  std::vector<PackedWeight> quant;
  const PackedWeight::Impl& q(int64_t e) const { return *quant[static_cast<size_t>(e)].impl(); }
  // gate_up checkpoints: rows [0, I) gate and [I, 2I) up (halves, the
  // default), or GPT-OSS's interleaving: row 2i gate i, row 2i + 1 up i.
  bool glu_interleaved = false;
  int64_t gate_row(int64_t i) const { return glu_interleaved ? 2 * i : i; }
  int64_t up_row(int64_t i) const { return glu_interleaved ? 2 * i + 1 : n + i; }
  // Packed column of logical row r of a [2I, H] gate_up matrix (the
  // inverse of gate_up_source_row for halves).
  static int64_t glu_packed_row(int64_t I, int64_t r, bool interleaved = false) {
    const bool up = interleaved ? r % 2 != 0 : r >= I;
    const int64_t i = interleaved ? r / 2 : up ? r - I : r;
    return i / 32 * 64 + (up ? 32 : 0) + i % 32;
  }
  int64_t glu_packed_row(int64_t r) const { return glu_packed_row(n, r, glu_interleaved); }
  // The one rule for the enums every pack_experts overload takes: Error of
  // `op` naming a value outside ExpertProj / GluRows.
  static void check_proj_and_rows(const char* op, ExpertProj proj, GluRows order);
  static std::vector<int64_t> glu_row_map(int64_t I, bool interleaved = false) {
    std::vector<int64_t> m(static_cast<size_t>(2 * I));
    for (int64_t r = 0; r < 2 * I; ++r) m[r] = glu_packed_row(I, r, interleaved);
    return m;
  }
  std::string layout_name;
  ExpertProj proj = ExpertProj::down;
  int64_t experts = 0;
  int64_t n = 0;  // outputs per expert: I (gate_up, up) or H (down)
  int64_t k = 0;  // inputs per expert: H (gate_up, up) or I (down)
  // One expert's packed matrix. gate_up: rows = ceil(I/32)·64, block b holding
  // gate rows 32b.. in columns 0..31 and up rows I + 32b.. in 32..63 (zero
  // past I); down: rows = H.
  codegen::PackedLayout layout;
  int64_t expert_bytes = 0;
  std::unique_ptr<std::byte[], runtime::FreeDeleter> data;

  const uint8_t* expert(int64_t e) const {
    return reinterpret_cast<const uint8_t*>(data.get()) + e * expert_bytes;
  }
  int64_t block_bytes() const { return layout.block_elems() * 2; }
  // Row of the unpacked weight held by packed row p of a gate_up expert, or -1 (padding).
  int64_t gate_up_source_row(int64_t p) const {
    const int64_t b = p / 64, c = p % 64;
    const int64_t i = 32 * b + (c % 32);
    if (i >= n) return -1;
    return c < 32 ? gate_row(i) : up_row(i);
  }
};

}  // namespace tilejit
