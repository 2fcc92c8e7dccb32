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
//   gemm:             n, k, bias (none | f32 | bf16), act, out (bf16 | f32), format, m (list)
//   decode_attention: d, dv, hq, hkv, block_size, kv (bf16 | f8e4m3 | f8e5m2: the cache's dtype),
//                     batch (list), seq_len (list)
//   prefill_attention: d, dv, hq, hkv, causal, seq_len (list)
//   extend_attention: d, dv, hq, hkv, block_size, kv, prefix_len, seq_len (list: new tokens
//                     of one sequence over a cached prefix of prefix_len)
//   rope (warm-up only): d, hq, hkv, rotary_dim (0: d), style (neox | gptj),
//                     dtype (bf16 | f32: q and k), cache (f32 | bf16: cos_sin_cache), t (list)
//   moe:              e, topk, h, i, format, t (list)
// format: a weight format name (weight_format_name: bf16, int8, fp8_e4m3,
// int4_awq, int4_gptq, mxfp4); the format's parameters: group_size, sym,
// desc_act (int4), block_n, block_k (fp8_e4m3 block scales; 0: per channel).
// The tuner times synthetic checkpoints of that format (synthetic_weight).
struct WorkloadOp {
  std::string op;
  std::string name;  // e.g. "qkv_proj" (for the report)
  int64_t n = 0, k = 0;
  std::string bias = "none", act = "none", out = "bf16";
  int64_t d = 0, dv = 0, hq = 0, hkv = 0, block_size = 16;
  int64_t prefix_len = 0;                                     // extend_attention
  int64_t rotary_dim = 0;                                     // rope (0: d)
  std::string style = "neox", dtype = "bf16", cache = "f32";  // rope
  std::string kv = "bf16";
  bool causal = true;
  int64_t e = 0, topk = 0, h = 0, i = 0;
  std::string format = "bf16";
  int64_t group_size = 128;           // int4
  bool sym = true, desc_act = false;  // int4: no zero points; act-order g_idx
  int64_t block_n = 0, block_k = 0;   // fp8_e4m3 block scales (0: per output channel)
  // The counts tuned: gemm M, decode batch, moe and rope T (in `m`), and sequence lengths.
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
// for the given counts. A quantization_config sets the format of the
// linear layers and experts (quant_method awq, gptq, fp8 (weight_block_size:
// block scales), mxfp4, compressed-tensors / w8a8 int8; bits, group_size,
// sym, desc_act); another method is an Error naming it and the allowed ones.
// The router stays bf16 (checkpoints leave it unquantized). kv_cache: the
// dtype of the engine's paged KV cache (a serving flag, not in the config:
// sglang / vLLM --kv-cache-dtype), for the decode and extend ops; an Error
// naming the allowed ones otherwise.
Workload workload_from_model_config(const std::string& json_text, const std::string& source,
                                    const std::string& kv_cache = WorkloadOp{}.kv,
                                    const std::vector<int64_t>& m = {1, 16, 512},
                                    int64_t context = 4096);

// The KV cache dtypes a decode / extend op takes (`kv`, --kv-cache-dtype):
// the names of ops::attn::kKvCacheDtypes.
const std::vector<std::string>& kv_cache_dtype_names();

// The quant_method values workload_from_model_config reads (for messages).
const std::vector<std::string>& quant_methods();

// A synthetic checkpoint of op's format for a [n, k] weight (random codes,
// scales that keep |w| near 1/16, zero points / g_idx as op says), packed
// with the public pack_weight overload: what the tuner times and a test
// checks. bf16: random values. Errors are pack_weight's.
PackedWeight synthetic_weight(const WorkloadOp& op, int64_t n, int64_t k, uint64_t seed);
// The same for e experts of [n, k] each, packed with pack_experts.
PackedExperts synthetic_experts(const WorkloadOp& op, int64_t e, int64_t n, int64_t k,
                                ExpertProj proj, uint64_t seed);

}  // namespace tilejit::tools
