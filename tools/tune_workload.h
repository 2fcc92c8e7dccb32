// The workload `tilejit tune` searches plans for (docs/tuning.md): operator
// specs with their shapes, read from a JSON file or built from a Hugging
// Face-style config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tilejit/tilejit.h"

namespace tilejit::tools {

// One operator of the workload. `op` picks which fields apply:
//   gemm:             n, k, bias (none | f32 | bf16), act, out (bf16 | f32), m (list)
//   decode_attention: d, dv, hq, hkv, block_size, kv (bf16), batch (list), seq_len (list)
//   prefill_attention (warm-up only, no knob is tuned): d, dv, hq, hkv, causal, seq_len (list)
//   moe:              e, topk, h, i, t (list)
// Every format is bf16 (the tuner searches bf16 plans only).
struct WorkloadOp {
  std::string op;
  std::string name;  // e.g. "qkv_proj" (for the report)
  int64_t n = 0, k = 0;
  std::string bias = "none", act = "none", out = "bf16";
  int64_t d = 0, dv = 0, hq = 0, hkv = 0, block_size = 16;
  std::string kv = "bf16";
  bool causal = true;
  int64_t e = 0, topk = 0, h = 0, i = 0;
  // The counts tuned: gemm M, decode batch, moe T (in `m`), and sequence lengths.
  std::vector<int64_t> m;
  std::vector<int64_t> seq_len;
  bool operator==(const WorkloadOp&) const = default;
};

struct Workload {
  std::string name;
  std::vector<WorkloadOp> ops;
  bool operator==(const Workload&) const = default;
};

// The op kinds a workload may hold (the one list, for messages).
const std::vector<std::string>& workload_op_kinds();

// Parses workload JSON; `source` names it in errors, which name the field:
// "llama.json: ops[2].n: -1; allowed: an integer >= 1". A count list is a
// JSON array of integers or {"from": a, "to": b} (a, the powers of two
// between, b).
Workload parse_workload(const std::string& json_text, const std::string& source);
Workload load_workload(const std::string& path);
// The JSON text parse_workload reads back to the same Workload.
std::string workload_json(const Workload& w);

// A workload from a Hugging Face config.json: the attention projections,
// the dense MLP or the MoE experts (+ router), decode and prefill attention,
// for the given counts. An unquantized config only (a quantization_config
// is an Error naming it: the tuner searches bf16 plans).
Workload workload_from_model_config(const std::string& json_text, const std::string& source,
                                    const std::vector<int64_t>& m = {1, 16, 512},
                                    int64_t context = 4096);

}  // namespace tilejit::tools
