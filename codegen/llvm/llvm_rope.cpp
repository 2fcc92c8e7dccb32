// LLVM IR for RoPE. Shape of the emitted function:
//
//   for t < tokens:                                 runtime count
//     row[s] = cache + positions[s][t]·row_stride   one cos/sin row per stream
//     cos/sin of every block, widened to f32       loaded once per token, kept
//                                                   in registers for all heads
//     for h < Hq: rotate every block of q[t][h]     static count
//     for h < Hk: rotate every block of k[t][h]
//
// A block is up to 16 rotation pairs of consecutive frequencies: for neox
// two <16 x float> halves x1 = x[a..], x2 = x[a + W/2..]; for gptj one
// <16 x float> of 8 interleaved pairs, with cos/sin duplicated across each
// pair and the partner swapped in by a shuffle. Blocks end at chunk
// boundaries; a short block uses masked loads and stores, so nothing past
// the rotary part (or the cache row) is read or written. M-RoPE blocks are
// plain runs of 16 / 8 frequencies too, whose cos/sin lanes are blended once
// per token from the streams' rows where a block spans several streams
// (interleaved M-RoPE changes stream at every frequency).
#include "codegen/llvm/llvm_rope.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/IntrinsicsX86.h>

#include <algorithm>
#include <numeric>

#include "codegen/llvm/emitter_base.h"
#include "codegen/llvm/ir_loop.h"
#include "codegen/llvm/vector_math.h"

namespace tilejit::codegen::llvm_backend {

namespace {

constexpr int kLanes = 16;

[[noreturn]] void fail(const RopeDesc& d, const std::string& what) {
  throw Error("compile_llvm_rope: " + d.name() + ": " + what);
}

void check(const RopeDesc& d) {
  const auto float_type = [](DType t) { return t == DType::f32 || t == DType::bf16; };
  if (!float_type(d.dtype))
    fail(d, std::string("dtype ") + dtype_name(d.dtype) + "; allowed: f32, bf16");
  if (!float_type(d.cache_dtype))
    fail(d, std::string("cache_dtype ") + dtype_name(d.cache_dtype) + "; allowed: f32, bf16");
  if (d.pos_dtype != DType::i32 && d.pos_dtype != DType::i64)
    fail(d, std::string("pos_dtype ") + dtype_name(d.pos_dtype) + "; allowed: i32, i64");
  if (d.d < 2 || d.d % 2) fail(d, "d=" + std::to_string(d.d) + "; allowed: even, >= 2");
  if (d.ndim < 1) fail(d, "ndim=" + std::to_string(d.ndim) + "; allowed: >= 1");
  if (d.rotary_dim < 2 || d.rotary_dim > d.d || d.rotary_dim % (2 * d.ndim))
    fail(d, "rotary_dim=" + std::to_string(d.rotary_dim) +
                "; allowed: a multiple of 2·ndim in [2, d]");
  if (d.hq < 1 || d.hk < 0) fail(d, "heads; allowed: hq >= 1, hk >= 0");
  if (!d.mrope_section.empty()) {
    if (d.ndim > 1) fail(d, "mrope_section with ndim > 1; allowed: one of the two");
    const int64_t sum = std::accumulate(d.mrope_section.begin(), d.mrope_section.end(), int64_t{0});
    const bool positive = std::all_of(d.mrope_section.begin(), d.mrope_section.end(),
                                      [](int64_t v) { return v > 0; });
    if (!positive || sum != d.rotary_dim / 2)
      fail(d, "mrope_section sums to " + std::to_string(sum) +
                  "; allowed: positive sizes summing to rotary_dim/2 = " +
                  std::to_string(d.rotary_dim / 2));
  }
  if (d.mrope_interleaved && d.mrope_section.size() != 3)
    fail(d, "mrope_interleaved with " + std::to_string(d.mrope_section.size()) +
                " sections; allowed: 3 (t, h, w)");
}

// Up to 16 (neox) or 8 (gptj) rotation pairs of consecutive frequencies.
struct Block {
  int64_t stream = 0;  // the position stream of every pair, unless lane_stream is set
  // Interleaved M-RoPE: the stream of pair l (size n), when the pairs of the
  // block take more than one; cos/sin are then blended per lane from the rows.
  std::vector<int64_t> lane_stream;
  int64_t a = 0;    // first element: x1 (neox) or the first pair (gptj)
  int64_t b = 0;    // neox: first element of x2
  int64_t col = 0;  // cos column of the first pair; sin at col + W/2
  int n = 0;        // pairs
};

// Interleaved M-RoPE's stream of frequency j (the rule in tilejit.h's
// RopeOptions::mrope_interleaved): h and w take every third frequency from
// 1 and 2 while their sections last, t everything else.
int64_t interleaved_stream(const RopeDesc& d, int64_t j) {
  if (j % 3 == 1 && j < 3 * d.mrope_section[1]) return 1;
  if (j % 3 == 2 && j < 3 * d.mrope_section[2]) return 2;
  return 0;
}

// M-RoPE's stream of frequency j: interleaved, or the section holding j.
int64_t mrope_stream(const RopeDesc& d, int64_t j) {
  if (d.mrope_interleaved) return interleaved_stream(d, j);
  int64_t end = 0;
  for (size_t s = 0; s < d.mrope_section.size(); ++s)
    if (j < (end += d.mrope_section[s])) return static_cast<int64_t>(s);
  return 0;  // unreachable: the sections sum to rotary_dim / 2
}

// M-RoPE: blocks do not end at stream changes (interleaved, they would hold
// one pair each; sectioned, [16, 24, 24] would give blocks of 16, 16, 8, 16,
// 8 with half-empty vectors and unpaired bf16 stores); a block holds
// per_block consecutive frequencies and records each lane's stream.
std::vector<Block> make_mrope_blocks(const RopeDesc& d, int64_t per_block) {
  const int64_t half = d.rotary_dim / 2;
  std::vector<Block> blocks;
  for (int64_t j = 0; j < half; j += per_block) {
    Block bl;
    bl.n = static_cast<int>(std::min(per_block, half - j));
    bl.col = j;
    bl.a = d.neox ? j : 2 * j;
    bl.b = half + j;
    for (int64_t l = 0; l < bl.n; ++l) bl.lane_stream.push_back(mrope_stream(d, j + l));
    const auto& ls = bl.lane_stream;
    if (std::all_of(ls.begin(), ls.end(), [&](int64_t s) { return s == ls.front(); })) {
      bl.stream = ls.front();  // one stream after all (e.g. the t-only tail): plain loads
      bl.lane_stream.clear();
    }
    blocks.push_back(bl);
  }
  return blocks;
}

std::vector<Block> make_blocks(const RopeDesc& d) {
  const int64_t width = d.rotary_dim / d.ndim, half = width / 2;
  const int64_t per_block = d.neox ? kLanes : kLanes / 2;
  if (!d.mrope_section.empty()) return make_mrope_blocks(d, per_block);
  std::vector<Block> blocks;
  for (int64_t c = 0; c < d.ndim; ++c) {
    const int64_t base = c * width;
    for (int64_t j = 0; j < half; j += per_block) {
      Block bl;
      bl.stream = c;  // chunk c reads stream c (0 for plain RoPE)
      bl.n = static_cast<int>(std::min(per_block, half - j));
      bl.col = j;
      bl.a = base + (d.neox ? j : 2 * j);
      bl.b = base + half + j;
      blocks.push_back(bl);
    }
  }
  return blocks;
}

class RopeEmitter : public KernelEmitter {
 public:
  RopeEmitter(ModuleContext& mc, const RopeDesc& d)
      : KernelEmitter(mc),
        d_(d),
        blocks_(make_blocks(d)),
        vm16_(b_, kLanes),
        vm8_(b_, kLanes / 2),
        cvt_bf16_(d.dtype == DType::bf16 && mc.host.bf16_convert()) {}

 private:
  using Args = RopeArgs;

  void generate() override {
    emit_loop(
        b_, arg(TILEJIT_ARG(Args, tokens)), {},
        [&](llvm::Value* t, const std::vector<llvm::Value*>&) {
          token(t);
          return std::vector<llvm::Value*>{};
        },
        "token");
  }

  // `active` of `lanes` elements from base[offset], widened to f32 (inactive lanes 0).
  llvm::Value* load(llvm::Value* base, DType t, int64_t offset, int lanes, int active) {
    return load_f32(base, t, i64(offset), lanes, active);
  }

  void store(llvm::Value* base, int64_t offset, llvm::Value* v, int active) {
    const DType t = d_.dtype;
    if (t == DType::bf16) v = vm16_.f32_to_bf16(v);
    llvm::Value* p = b_.CreateGEP(storage(t), base, i64(offset));
    if (active == kLanes)
      b_.CreateAlignedStore(v, p, align(t));
    else
      b_.CreateMaskedStore(v, p, align(t), const_mask(kLanes, active));
  }

  llvm::Value* shuffle(llvm::Value* v, const std::vector<int>& idx) {
    return b_.CreateShuffleVector(v, idx);
  }

  void token(llvm::Value* t) {
    std::vector<llvm::Value*> rows;
    for (int64_t s = 0; s < d_.streams(); ++s) {
      llvm::Value* at =
          b_.CreateAdd(b_.CreateMul(i64(s), arg(TILEJIT_ARG(Args, pos_stream_stride))),
                       b_.CreateMul(t, arg(TILEJIT_ARG(Args, pos_token_stride))));
      // The index width is part of the specialisation: an int64 position is
      // loaded whole (the ops layer checked it against max_position).
      const bool wide = d_.pos_dtype == DType::i64;
      llvm::Type* pt = wide ? b_.getInt64Ty() : b_.getInt32Ty();
      llvm::Value* pos = b_.CreateAlignedLoad(
          pt, b_.CreateGEP(pt, arg(TILEJIT_ARG(Args, positions)), at), llvm::Align(wide ? 8 : 4));
      if (!wide) pos = b_.CreateSExt(pos, b_.getInt64Ty());
      rows.push_back(b_.CreateGEP(storage(d_.cache_dtype), arg(TILEJIT_ARG(Args, cache)),
                                  b_.CreateMul(pos, arg(TILEJIT_ARG(Args, cache_row_stride)))));
    }
    const int64_t half = d_.rotary_dim / d_.ndim / 2;
    cos_.clear();
    sin_.clear();
    for (const Block& bl : blocks_) {
      const int lanes = d_.neox ? kLanes : kLanes / 2;
      // cos (half = 0) or sin (half = W/2) of the block's pairs, one lane per pair.
      const auto pairs = [&](int64_t at) { return cache_pairs(rows, bl, at, lanes); };
      if (d_.neox) {
        cos_.push_back(pairs(bl.col));
        sin_.push_back(pairs(half + bl.col));
        continue;
      }
      // gptj: lane 2i and 2i+1 use pair i; the even lane subtracts x_odd·sin.
      std::vector<int> dup;
      for (int l = 0; l < kLanes; ++l) dup.push_back(l / 2);
      std::vector<llvm::Constant*> sign;
      for (int l = 0; l < kLanes; ++l)
        sign.push_back(llvm::ConstantFP::get(b_.getFloatTy(), l % 2 ? 1.0 : -1.0));
      cos_.push_back(shuffle(pairs(bl.col), dup));
      sin_.push_back(
          b_.CreateFMul(shuffle(pairs(half + bl.col), dup), llvm::ConstantVector::get(sign)));
    }
    heads(arg(TILEJIT_ARG(Args, q)), arg(TILEJIT_ARG(Args, q_token_stride)),
          arg(TILEJIT_ARG(Args, q_head_stride)), d_.hq, t, "qhead");
    if (d_.hk > 0)
      heads(arg(TILEJIT_ARG(Args, k)), arg(TILEJIT_ARG(Args, k_token_stride)),
            arg(TILEJIT_ARG(Args, k_head_stride)), d_.hk, t, "khead");
  }

  // Columns at .. at + n - 1 of the block's cache row(s), widened to f32 in
  // `lanes` lanes. A block of interleaved M-RoPE reads the same columns of
  // each stream's row and keeps, per lane, the one of that pair's stream:
  // 3 loads and 2 blends per token, shared by every head.
  llvm::Value* cache_pairs(const std::vector<llvm::Value*>& rows, const Block& bl, int64_t at,
                           int lanes) {
    if (bl.lane_stream.empty()) return load(rows[bl.stream], d_.cache_dtype, at, lanes, bl.n);
    llvm::Value* v = nullptr;
    for (int64_t s = 0; s < d_.streams(); ++s) {
      std::vector<llvm::Constant*> take;
      bool any = false;
      for (int l = 0; l < lanes; ++l) {
        const bool mine = l < bl.n && bl.lane_stream[l] == s;
        any |= mine;
        take.push_back(b_.getInt1(mine));
      }
      if (!any) continue;
      llvm::Value* x = load(rows[s], d_.cache_dtype, at, lanes, bl.n);
      v = v ? b_.CreateSelect(llvm::ConstantVector::get(take), x, v) : x;
    }
    return v;
  }

  void heads(llvm::Value* base, llvm::Value* ts, llvm::Value* hs, int64_t count, llvm::Value* t,
             const char* name) {
    llvm::Type* et = storage(d_.dtype);
    llvm::Value* row = b_.CreateGEP(et, base, b_.CreateMul(t, ts));
    emit_loop(
        b_, i64(count), {},
        [&](llvm::Value* h, const std::vector<llvm::Value*>&) {
          llvm::Value* head = b_.CreateGEP(et, row, b_.CreateMul(h, hs));
          std::vector<Out> outs;
          for (size_t i = 0; i < blocks_.size(); ++i)
            rotate(head, blocks_[i], cos_[i], sin_[i], outs);
          store_head(head, outs);
          return std::vector<llvm::Value*>{};
        },
        name);
  }

  // One rotated vector of a head: f32 lanes 0 .. active - 1 are the results
  // for elements offset .. offset + active - 1 (the other lanes hold 0).
  struct Out {
    int64_t offset;
    llvm::Value* v;
    int active;
  };

  // Both outputs are one fma over a rounded product: within 2^-23·(|x·cos| +
  // |x'·sin|) of the exact value. Loads everything of the block before any
  // store of the head, so the stores may be grouped freely afterwards.
  void rotate(llvm::Value* head, const Block& bl, llvm::Value* cs, llvm::Value* sn,
              std::vector<Out>& outs) {
    if (d_.neox) {
      llvm::Value* x1 = load(head, d_.dtype, bl.a, kLanes, bl.n);
      llvm::Value* x2 = load(head, d_.dtype, bl.b, kLanes, bl.n);
      outs.push_back({bl.a, vm16_.fma(x1, cs, b_.CreateFNeg(b_.CreateFMul(x2, sn))), bl.n});
      outs.push_back({bl.b, vm16_.fma(x2, cs, b_.CreateFMul(x1, sn)), bl.n});
      return;
    }
    std::vector<int> swap;
    for (int l = 0; l < kLanes; ++l) swap.push_back(l ^ 1);
    llvm::Value* x = load(head, d_.dtype, bl.a, kLanes, 2 * bl.n);
    outs.push_back({bl.a, vm16_.fma(x, cs, b_.CreateFMul(shuffle(x, swap), sn)), 2 * bl.n});
  }

  // Stores a head's rotated vectors. f32, or bf16 without AVX512-BF16: one
  // store per vector (bf16 rounded by integer arithmetic). With AVX512-BF16
  // the rounding is vcvtne2ps2bf16, two vectors adjacent in memory packed
  // into one 64-byte store: the integer rounding (9 instructions per 16
  // values) made bf16 RoPE compute-bound. vcvtne2ps2bf16 rounds to nearest
  // even and quiets NaN exactly as the integer path does, but flushes f32
  // subnormals to zero; a head with a subnormal result (tiny inputs only)
  // takes the integer path instead, so every host rounds alike.
  void store_head(llvm::Value* head, const std::vector<Out>& outs) {
    const auto each = [&] {
      for (const Out& o : outs) store(head, o.offset, o.v, o.active);
      return std::vector<llvm::Value*>{};
    };
    if (!cvt_bf16_) {
      each();
      return;
    }
    // In memory order, so that neighbours (neox: the blocks of one half) pair up.
    std::vector<Out> sorted = outs;
    std::sort(sorted.begin(), sorted.end(),
              [](const Out& x, const Out& y) { return x.offset < y.offset; });
    llvm::Value* any = nullptr;
    for (const Out& o : sorted) {
      llvm::Value* m = vm16_.subnormal_lanes(o.v);
      any = any ? b_.CreateOr(any, m) : m;
    }
    llvm::Value* sub = b_.CreateICmpNE(b_.CreateBitCast(any, b_.getInt16Ty()), b_.getInt16(0));
    emit_if_else(
        b_, sub, each,
        [&] {
          auto* words = llvm::FixedVectorType::get(b_.getInt16Ty(), 2 * kLanes);
          llvm::Value* zero = llvm::Constant::getNullValue(sorted.front().v->getType());
          for (size_t i = 0; i < sorted.size(); ++i) {
            const Out& lo = sorted[i];
            // The next vector continues this one in memory: both in one store.
            const bool pair = lo.active == kLanes && i + 1 < sorted.size() &&
                              sorted[i + 1].offset == lo.offset + kLanes;
            const Out* hi = pair ? &sorted[++i] : nullptr;
            llvm::Value* w = b_.CreateBitCast(
                b_.CreateIntrinsic(llvm::Intrinsic::x86_avx512bf16_cvtne2ps2bf16_512, {},
                                   {hi ? hi->v : zero, lo.v}),
                words);
            const int active = lo.active + (hi ? hi->active : 0);
            llvm::Value* p = b_.CreateGEP(b_.getInt16Ty(), head, i64(lo.offset));
            if (active == 2 * kLanes)
              b_.CreateAlignedStore(w, p, llvm::Align(2));
            else
              b_.CreateMaskedStore(w, p, llvm::Align(2), const_mask(2 * kLanes, active));
          }
          return std::vector<llvm::Value*>{};
        },
        "subnormal");
  }

  const RopeDesc& d_;
  std::vector<Block> blocks_;
  VectorMath vm16_, vm8_;
  std::vector<llvm::Value*> cos_, sin_;  // per block, for the current token
  const bool cvt_bf16_;                  // bf16 stores through vcvtne2ps2bf16
};

}  // namespace

LlvmKernel compile_llvm_rope(const RopeDesc& desc, OptLevel opt) {
  check(desc);
  require_vector_host("compile_llvm_rope");
  return compile_emitter<RopeEmitter>(desc.name(), opt, desc);
}

}  // namespace tilejit::codegen::llvm_backend
