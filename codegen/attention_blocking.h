// The blocking of the attention block engine (ops/attention_engine.h) that
// prefill and extend attention run: how many query rows one task packs, and
// how many keys one online-softmax step takes. Both are plan knobs a tuning
// database may set (docs/tuning.md); the limits below are the one statement
// of what the engine accepts, read by the engine, the ops and the database.
#pragma once

#include <cstdint>

namespace tilejit::codegen {

struct AttentionBlocking {
  // Query rows per task: whole 16-row vector groups, at most the engine's
  // 64-row transposed state. Fewer rows make more (cheaper) tasks, which
  // balances short or causal sequences over the threads, at the price of
  // reading each key block once more per task.
  static constexpr int64_t kRowsStep = 16, kRowsMax = 64;
  // Keys per online-softmax step: the P·V micro-kernel reduces over them (in
  // pairs rounded up to 32), the score scratch holds key_block × 64 floats.
  // Longer steps amortise the rescale and the accumulator traffic of P·V;
  // shorter ones waste less on the causal diagonal and stay in L1.
  static constexpr int64_t kKeyBlockStep = 32, kKeyBlockMax = 256;

  int64_t rows = kRowsMax;
  int64_t key_block = 128;

  static bool key_block_allowed(int64_t v) {
    return v >= kKeyBlockStep && v <= kKeyBlockMax && v % kKeyBlockStep == 0;
  }
};

}  // namespace tilejit::codegen
