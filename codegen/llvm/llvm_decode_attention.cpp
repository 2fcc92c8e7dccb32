// LLVM IR for paged decode attention. Shape of the emitted function:
//
//   entry: q packed (P rows per vector, see pack_q), O permuted (dpbf16)
//   for each chunk of 16 keys (aligned, so inside one cache block):  runtime count
//     K, V = the block's rows (block table lookup); the same for the chunk
//       prefetch_chunks ahead (2), whose rows are prefetched into L2 while this
//       chunk is computed: the table indirection defeats the hardware
//       prefetcher at every block boundary
//     for h in 0 .. heads (one more iteration than kv heads):          runtime count
//       if h < heads: scores and softmax of head h
//         per pack of P rows, 4 iterations of 4 keys:
//           per key one <16 x float> of partial dot products (vdpbf16ps on
//           the bf16 K row as it lies in the cache, or fp32 FMAs on its
//           even / odd halves), 4 keys folded into one vector by shuffles
//         then a transposing shuffle-add tree: one vector s of the 16 keys'
//         scores per row; softmax on up to 4 rows at once: scale, softcap,
//         ALiBi, mask; m' = max(m, max s), p = bf16(exp(s − m')),
//         α = exp(m − m'), l = α·l + Σp
//       if h > 0: O = α·O + P·V of head h − 1, row blocks × column groups in
//         registers: dpbf16: V rows j, j + 1 interleaved (vpunpck{l,h}wd)
//         against the broadcast pair (p_j, p_j+1); fma: widened V_j · p_j
//   exit: O permuted back
//
// Every K and V row of the range is read from memory once; q, O and the
// scratch stay in L1. Head sizes are any even D, Dv: the contraction's last
// K piece and the last V columns are loaded narrower and widened with zeros
// (q is packed zero-padded), so no load passes the end of a row and the
// padding adds 0 to every dot product; O's padded columns stay 0.
//
// Block sizes that are not a multiple of 16 scatter a chunk's rows over
// several cache blocks: then each chunk looks up the 16 K and V row offsets
// of the chunk it prefetches in the block table, into a ring of lists that
// serves that chunk's own rows two chunks later,
// blocks past the range's last one replaced by it (a block the sequence
// uses), and every row address comes from that list instead of base + j·stride. Full chunks run
// unmasked code; the first and last chunk of [j0, j1) a masked copy (invalid scores −inf, their V
// rows zeroed, so stale cache rows cannot turn 0·v into NaN). Those rows are still loaded: they lie
// inside a block the sequence uses.
//
// With dpbf16 the interleave puts O's columns of each 32-column group in the
// order (0-3, 8-11, 16-19, 24-27 | 4-7, 12-15, ...): O is permuted into that
// order on entry and back on exit, so callers see plain rows.
#include "codegen/llvm/llvm_decode_attention.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/IntrinsicsX86.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "codegen/llvm/emitter_base.h"
#include "codegen/llvm/ir_loop.h"
#include "codegen/llvm/vector_math.h"
#include "runtime/quant_formats.h"

namespace tilejit::codegen::llvm_backend {

bool DecodeAttentionDesc::uses_dpbf16() const {
  return dot == DecodeDot::dpbf16 || (dot == DecodeDot::best && host_target().avx512bf16);
}

namespace {

constexpr int kLanes = 16;
constexpr int kChunk = static_cast<int>(kDecodeChunkKeys);
// Prefetch distance in chunks (DecodeAttentionDesc::prefetch_chunks, default
// 2), hint and placement, measured on Zen 4 (B 16,
// 8k keys, block 16, cold cache, noisy shared box): prefetcht2 beats
// prefetcht1 and prefetcht0 (into L1 the lines evict the chunk in use); one
// burst per chunk stalls on the miss buffers (~10 GB/s on 2 threads); the
// list in address order (K rows, then V rows), a share at each key of the
// score loop, each prefetch a couple of dot instructions after the last:
// ~15 GB/s on 1 thread and ~22-24 on 2, against ~13 and ~18-23 with K and V
// requests issued back to back, V during the P·V pass, or rows interleaved.
constexpr int kPrefetchLocality = 1;  // llvm.prefetch locality 1 = prefetcht2

[[noreturn]] void fail(const DecodeAttentionDesc& d, const std::string& what) {
  throw Error("compile_llvm_decode_attention: " + d.name() + ": " + what);
}

// The head sizes this kernel compiles: wider than the operators' public
// Limits::max_head_dim, on purpose. Nothing in the kernel stops at 576; its
// per-row code is unrolled over the 16- and 32-element units of d and dv, and
// this bound only keeps that body a sane size. tilejit::decode_attention checks the public limit
// before it builds a descriptor, so only direct callers (tests, benchmarks)
// reach the wider range.
constexpr int64_t kKernelMaxHeadDim = 4096;

void check(const DecodeAttentionDesc& d) {
  auto dim = [&](const char* f, int64_t v) {
    constexpr int64_t step = Limits::head_dim_step;  // 2: bf16 k-pairs
    if (v < step || v % step != 0 || v > kKernelMaxHeadDim)
      fail(d, std::string(f) + "=" + std::to_string(v) + "; allowed: a multiple of " +
                  std::to_string(step) + " in [" + std::to_string(step) + ", " +
                  std::to_string(kKernelMaxHeadDim) + "]");
  };
  dim("d", d.d);
  dim("dv", d.dv);
  if (d.g < 1 || d.g > DecodeAttentionDesc::kMaxG)
    fail(d, "g=" + std::to_string(d.g) + "; allowed: 1 .. " +
                std::to_string(DecodeAttentionDesc::kMaxG));
  if (d.prefetch_chunks < 1 || d.prefetch_chunks > DecodeAttentionDesc::kPrefetchChunksMax)
    fail(d, "prefetch_chunks=" + std::to_string(d.prefetch_chunks) + "; allowed: 1 .. " +
                std::to_string(DecodeAttentionDesc::kPrefetchChunksMax));
  if (d.block_size < 1) fail(d, "block_size=" + std::to_string(d.block_size) + "; allowed: >= 1");
  // O rows are written in 16-column vectors up to dv rounded up to 16.
  const int64_t dv16 = (d.dv + 15) / 16 * 16;
  if (d.ldo < dv16)
    fail(d, "ldo=" + std::to_string(d.ldo) +
                "; allowed: >= dv rounded up to 16 = " + std::to_string(dv16));
  if (d.kv != DType::bf16 && !runtime::fp8_format_of(d.kv))
    fail(d, std::string("kv=") + dtype_name(d.kv) + "; allowed: bf16, f8e4m3, f8e5m2");
  if (d.dot == DecodeDot::dpbf16 && !host_target().avx512bf16)
    fail(d, "dot = dpbf16 needs AVX512-BF16, which this host (" + host_target().cpu + ") lacks");
}

using Mask = std::vector<int>;

// Shuffle masks over the concatenation (a: 0..15, b: 16..31) of two
// <16 x float> that fold 16 per-key partial-sum vectors into one vector of
// the 16 sums, lane k = key k, in four levels of (lo + hi):
//   0: keys (a, b) -> per 128-bit lane [a b a b]        (vunpck{l,h}ps)
//   1: two of those -> per 128-bit lane [a b c d]       (vshufps)
//   2, 3: 128-bit lanes paired across vectors           (vshuff32x4)
Mask tree_mask(int level, bool hi) {
  Mask m;
  for (int l = 0; l < 4; ++l) {
    const int o = 4 * l + (hi ? 2 : 0);
    if (level == 0) m.insert(m.end(), {o, 16 + o, o + 1, 17 + o});
    if (level == 1) m.insert(m.end(), {o, o + 1, 16 + o, 17 + o});
  }
  if (level >= 2)  // lo = [a.L0, a.L2, b.L0, b.L2], hi = [a.L1, a.L3, b.L1, b.L3]
    for (int src : {0, 16})
      for (int lane : {0, 2})
        for (int i = 0; i < 4; ++i) m.push_back(src + 4 * (lane + (hi ? 1 : 0)) + i);
  return m;
}

// Word interleave of two rows of 32 bf16 (a: 0..31, b: 32..63) as
// vpunpck{l,h}wd does it per 128-bit lane: dword 4L+i of lo holds the pair
// (a, b)[8L + i], of hi the pair (a, b)[8L + 4 + i].
Mask interleave_mask(bool hi) {
  Mask m;
  for (int l = 0; l < 4; ++l)
    for (int i = 0; i < 4; ++i) {
      const int c = 8 * l + (hi ? 4 : 0) + i;
      m.insert(m.end(), {c, 32 + c});
    }
  return m;
}

class DecodeEmitter : public KernelEmitter {
 public:
  DecodeEmitter(ModuleContext& mc, const DecodeAttentionDesc& d, bool dp)
      : KernelEmitter(mc), d_(d), dp_(dp), vm_(b_, kLanes) {}

 private:
  using Args = DecodeAttentionArgs;

  // The prefetch distance in chunks, and the row-offset lists kept for
  // unaligned block sizes: this chunk's and the prefetched ones'.
  int64_t pf_chunks() const { return d_.prefetch_chunks; }
  int64_t ring() const { return d_.prefetch_chunks + 1; }

  void generate() override {
    f32_ = b_.getFloatTy();
    llvm::Value* j0 = arg(TILEJIT_ARG(Args, j0));
    llvm::Value* j1 = arg(TILEJIT_ARG(Args, j1));
    // Rows of the kv head being done: moved along by each head's loop.
    slopes_ = arg(TILEJIT_ARG(Args, slopes)), m_ = arg(TILEJIT_ARG(Args, m));
    l_ = arg(TILEJIT_ARG(Args, l)), o_ = arg(TILEJIT_ARG(Args, o));

    // Working memory: carved from args->scratch (DecodeAttentionArgs says
    // why not the stack), the packed q rows last.
    scratch_ = arg(TILEJIT_ARG(Args, scratch));
    // Scratch of one chunk and head: the weights [G][16] (bf16 for dpbf16,
    // f32 for fma) and α [G].
    probs_ = carve(2 * d_.g * kChunk * (dp_ ? 2 : 4));
    alpha_ = carve(2 * d_.g * 4);

    // Rows per packed q vector: 4 (or 2) when G allows and the pack's q
    // fits in half the registers, else 1.
    {
      const HostTarget& host = mc_.host;
      const int64_t w = std::max(1, 512 / host.vector_bits);
      pack_ = 1;
      // A pack splits D in pieces of 32/P elements: D must hold whole pieces.
      for (int64_t p : {4, 2})
        if (d_.g % p == 0 && d_.d % (32 / p) == 0 &&
            w * (d_.d * p / 32) * (dp_ ? 1 : 2) <= host.vector_regs / 2) {
          pack_ = p;
          break;
        }
    }
    zscr_ = carve(4 * kLanes * 4);
    if (!aligned_) offs_ = carve(ring() * 2 * kChunk * 8);
    if (fp8_) {
      // The chunk's K rows of one head and its V rows of two (by head
      // parity: P·V of head h − 1 runs while head h is scored), as bf16.
      kscr_ = carve(kChunk * pitch(false) * 2);
      vscr_ = carve(2 * kChunk * pitch(true) * 2);
    }
    // The bound the caller allocates by must hold this layout.
    if (scratch_used_ > decode_attention_fixed_scratch(d_) || qpitch() > (d_.d + 31) / 32 * 32)
      throw InternalError("decode_attention_scratch_bytes is below the kernel's layout (" +
                          std::to_string(scratch_used_) + " fixed bytes)");
    qpack_ = carve(0);  // heads·G·qpitch bf16, the rest of the scratch
    pack_q();
    if (dp_) permute_o(/*to_kernel=*/true);

    // Chunks are aligned to 16 keys (inside one cache block when the block
    // size is a multiple of 16; otherwise rows come from the offset list).
    llvm::Value* c_begin = b_.CreateAnd(j0, i64(~int64_t{kChunk - 1}));
    c_last_ = b_.CreateAnd(b_.CreateSub(j1, i64(1)), i64(~int64_t{kChunk - 1}));
    llvm::Value* chunks =
        b_.CreateUDiv(b_.CreateAdd(b_.CreateSub(j1, c_begin), i64(kChunk - 1)), i64(kChunk));
    // Offset lists: a ring of ring() chunks. Chunk i's list is written when
    // chunk i − prefetch_chunks runs (its prefetches use it), so each chunk
    // looks up 16 keys, not 32; the first lists are written here.
    if (!aligned_)
      for (int64_t i = 0; i < pf_chunks(); ++i)
        key_offsets(b_.CreateAdd(c_begin, i64(i * kChunk)), j1, i64(i * 2 * kChunk));
    emit_loop(
        b_, chunks, {},
        [&](llvm::Value* ci, const std::vector<llvm::Value*>&) {
          llvm::Value* c0 = b_.CreateAdd(c_begin, b_.CreateMul(ci, i64(kChunk)));
          if (!aligned_) {
            cur_ = b_.CreateMul(b_.CreateURem(ci, i64(ring())), i64(2 * kChunk));
            fut_ = b_.CreateMul(b_.CreateURem(b_.CreateAdd(ci, i64(pf_chunks())), i64(ring())),
                                i64(2 * kChunk));
          }
          llvm::Value* full = b_.CreateAnd(b_.CreateICmpSGE(c0, j0),
                                           b_.CreateICmpSLE(b_.CreateAdd(c0, i64(kChunk)), j1));
          emit_if_else(
              b_, full,
              [&] {
                chunk(c0, j0, j1, false);
                return std::vector<llvm::Value*>{};
              },
              [&] {
                chunk(c0, j0, j1, true);
                return std::vector<llvm::Value*>{};
              },
              "full");
          return std::vector<llvm::Value*>{};
        },
        "chunk");
    if (dp_) permute_o(/*to_kernel=*/false);
  }

  template <class T>
  static T* cast(llvm::Value* v) {
    return llvm::cast<T>(v);
  }
  llvm::Type* i16t() { return b_.getInt16Ty(); }
  // The cache's element type: bf16 (i16) or fp8 bytes (strides count them).
  llvm::Type* et() { return fp8_ ? b_.getInt8Ty() : b_.getInt16Ty(); }
  // bf16 between the rows of the fp8 scratch: D (K) or Dv (V) rounded up to 32.
  int64_t pitch(bool is_v) const { return ((is_v ? d_.dv : d_.d) + 31) / 32 * 32; }
  llvm::Type* i32x(unsigned n) { return llvm::FixedVectorType::get(b_.getInt32Ty(), n); }

  llvm::Value* load_f32(llvm::Value* base, llvm::Value* index) {
    return b_.CreateAlignedLoad(f32_, b_.CreateGEP(f32_, base, index), llvm::Align(4));
  }
  void store_f32(llvm::Value* v, llvm::Value* base, llvm::Value* index) {
    b_.CreateAlignedStore(v, b_.CreateGEP(f32_, base, index), llvm::Align(4));
  }
  llvm::Value* load_vf32(llvm::Value* base, llvm::Value* index) {
    return b_.CreateAlignedLoad(vm_.f32v(), b_.CreateGEP(f32_, base, index), llvm::Align(4));
  }
  void store_vf32(llvm::Value* v, llvm::Value* base, llvm::Value* index) {
    b_.CreateAlignedStore(v, b_.CreateGEP(f32_, base, index), llvm::Align(4));
  }
  // <width x t> at p of which only the first n exist: a load of those n
  // widened with zero lanes, so a row's tail never reads past its end.
  llvm::Value* load_part(llvm::Type* t, int64_t width, llvm::Value* p, int64_t n) {
    auto* full = llvm::FixedVectorType::get(t, static_cast<unsigned>(width));
    const llvm::Align align(t->isIntegerTy(8) ? 1 : 2);  // fp8 codes: bytes
    if (n >= width) return b_.CreateAlignedLoad(full, p, align);
    auto* part = llvm::FixedVectorType::get(t, static_cast<unsigned>(n));
    llvm::Value* x = b_.CreateAlignedLoad(part, p, align);
    Mask m;  // lane n of the pair (x, 0) is a zero
    for (int64_t i = 0; i < width; ++i) m.push_back(static_cast<int>(i < n ? i : n));
    return b_.CreateShuffleVector(x, llvm::Constant::getNullValue(part), m);
  }
  // Columns [col, col + 32) of a bf16 row of `cols` (even) columns as
  // <16 x i32> (pairs); pairs past the row are zero.
  llvm::Value* load_pairs(llvm::Value* row, int64_t col, int64_t cols) {
    return load_part(b_.getInt32Ty(), 16, b_.CreateGEP(i16t(), row, i64(col)), (cols - col) / 2);
  }
  // `width` bf16 of a V row at column col (zeros past Dv).
  llvm::Value* load_v(llvm::Value* row, int64_t col, int64_t width) {
    return load_part(i16t(), width, b_.CreateGEP(i16t(), row, i64(col)), d_.dv - col);
  }
  // 16 bf16 at row[col..] widened to f32 (exact); zeros past Dv.
  llvm::Value* load_bf16(llvm::Value* row, int64_t col) {
    return vm_.bf16_to_f32(load_v(row, col, kLanes));
  }
  // Columns of O the P·V code computes: Dv rounded up to 16 (the rest are 0).
  int64_t dv16() const { return (d_.dv + kLanes - 1) / kLanes * kLanes; }
  // The even / odd bf16 of 16 pairs as exact f32.
  llvm::Value* even(llvm::Value* pairs) {
    return b_.CreateBitCast(b_.CreateShl(pairs, vm_.i32(16)), vm_.f32v());
  }
  llvm::Value* odd(llvm::Value* pairs) {
    return b_.CreateBitCast(b_.CreateAnd(pairs, vm_.i32(0xffff0000u)), vm_.f32v());
  }
  llvm::Value* dpbf16(llvm::Value* acc, llvm::Value* a, llvm::Value* b) {
    auto* bf = llvm::FixedVectorType::get(b_.getBFloatTy(), 2 * kLanes);
    return b_.CreateIntrinsic(llvm::Intrinsic::x86_avx512bf16_dpbf16ps_512, {},
                              {acc, b_.CreateBitCast(a, bf), b_.CreateBitCast(b, bf)});
  }
  llvm::Value* shuffle_add(llvm::Value* a, llvm::Value* b, int level) {
    return b_.CreateFAdd(b_.CreateShuffleVector(a, b, tree_mask(level, false)),
                         b_.CreateShuffleVector(a, b, tree_mask(level, true)));
  }

  // fn(first row, rows) over the G rows in blocks of `per`: a loop over the
  // full blocks (code size stays bounded for G = 128) and one tail block.
  void row_blocks(int64_t per, const std::function<void(llvm::Value*, int64_t)>& fn,
                  const char* name) {
    const int64_t full = d_.g / per, tail = d_.g % per;
    if (full == 1) {
      fn(i64(0), per);
    } else if (full > 1) {
      emit_loop(
          b_, i64(full), {},
          [&](llvm::Value* rb, const std::vector<llvm::Value*>&) {
            fn(b_.CreateMul(rb, i64(per)), per);
            return std::vector<llvm::Value*>{};
          },
          name);
    }
    if (tail) fn(i64(full * per), tail);
  }

  // Row pointer of key jl (0..15) of the chunk, base being the chunk's row 0
  // of the head (aligned blocks) or the head's block 0 (offset list: the
  // chunk's K entries at cur_, its V entries at cur_ + 16).
  llvm::Value* key_row(llvm::Value* base, bool is_v, llvm::Value* jl) {
    // fp8: the rows the bf16 code reads are the scratch's (convert_rows).
    if (fp8_) return b_.CreateGEP(i16t(), base, b_.CreateMul(jl, i64(pitch(is_v))));
    return cache_row(base, is_v, jl);
  }
  // The cache row itself (elements of et()).
  llvm::Value* cache_row(llvm::Value* base, bool is_v, llvm::Value* jl) {
    if (!aligned_)
      return b_.CreateGEP(
          et(), base,
          b_.CreateAlignedLoad(
              b_.getInt64Ty(),
              b_.CreateGEP(b_.getInt64Ty(), offs_,
                           b_.CreateAdd(cur_, b_.CreateAdd(jl, i64(is_v ? kChunk : 0)))),
              llvm::Align(8)));
    return b_.CreateGEP(et(), base,
                        b_.CreateMul(jl, is_v ? arg(TILEJIT_ARG(Args, v_row_stride))
                                              : arg(TILEJIT_ARG(Args, k_row_stride))));
  }
  llvm::Value* key_row(llvm::Value* base, bool is_v, int64_t jl) {
    return key_row(base, is_v, i64(jl));
  }

  // p, as a value LLVM cannot see through: loads from it are not merged with
  // equal loads elsewhere. Without it EarlyCSE merges each row's K (or each
  // column pass's P) loads into one and keeps 64 vectors live: spills.
  llvm::Value* opaque(llvm::Value* p) {
    auto* fty = llvm::FunctionType::get(p->getType(), {p->getType()}, false);
    return b_.CreateCall(llvm::InlineAsm::get(fty, "", "=r,0", /*hasSideEffects=*/false), {p});
  }

  void emit_if(llvm::Value* cond, const std::function<void()>& then) {
    llvm::Function* f = b_.GetInsertBlock()->getParent();
    auto* yes = llvm::BasicBlock::Create(mc_.ctx, "then", f);
    auto* done = llvm::BasicBlock::Create(mc_.ctx, "endif", f);
    b_.CreateCondBr(cond, yes, done);
    b_.SetInsertPoint(yes);
    then();
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
  }

  // Spreads the instructions [a, b) of block bb evenly between those from b
  // to the end (which must not use them), keeping each group's own order.
  // The block must still be straight-line code from a to its end.
  static void interleave(llvm::BasicBlock* bb, size_t a, size_t b) {
    std::vector<llvm::Instruction*> first, second;
    size_t i = 0;
    for (llvm::Instruction& inst : *bb) {
      if (i >= a && i < b) first.push_back(&inst);
      if (i >= b) second.push_back(&inst);
      ++i;
    }
    if (first.empty() || second.empty()) return;
    for (size_t k = 0; k < first.size(); ++k)
      first[k]->moveBefore(second[k * second.size() / first.size()]);
  }

  // The cache rows of key c (a multiple of 16) for kv head 0: (K, V).
  std::pair<llvm::Value*, llvm::Value*> chunk_rows(llvm::Value* c) {
    llvm::Value* slot = b_.CreateUDiv(c, i64(d_.block_size));
    llvm::Value* blk = b_.CreateSExt(
        b_.CreateAlignedLoad(b_.getInt32Ty(),
                             b_.CreateGEP(b_.getInt32Ty(), arg(TILEJIT_ARG(Args, table)),
                                          b_.CreateMul(slot, arg(TILEJIT_ARG(Args, table_stride)))),
                             llvm::Align(4)),
        b_.getInt64Ty());
    llvm::Value* off = b_.CreateURem(c, i64(d_.block_size));
    return {b_.CreateGEP(et(), arg(TILEJIT_ARG(Args, k)),
                         b_.CreateAdd(b_.CreateMul(blk, arg(TILEJIT_ARG(Args, k_block_stride))),
                                      b_.CreateMul(off, arg(TILEJIT_ARG(Args, k_row_stride))))),
            b_.CreateGEP(et(), arg(TILEJIT_ARG(Args, v)),
                         b_.CreateAdd(b_.CreateMul(blk, arg(TILEJIT_ARG(Args, v_block_stride))),
                                      b_.CreateMul(off, arg(TILEJIT_ARG(Args, v_row_stride)))))};
  }

  // Unaligned blocks: the element offsets (from block 0, head 0) of the K
  // and V rows of keys c .. c + 15 (c a multiple of 16) into offs_[at ..]
  // and offs_[at + 16 ..]. Blocks past the one of key j1 − 1 are replaced by
  // it (a block the sequence uses; keys below j0 but >= 0 are the
  // sequence's too), so no unchecked table entry is read; their rows are
  // masked off or only prefetched. When the block size divides 16 a chunk
  // holds whole blocks: one table read per block, row offsets in it constant.
  void key_offsets(llvm::Value* c, llvm::Value* j1, llvm::Value* at) {
    const int64_t bs = d_.block_size;
    llvm::Value* last_slot = b_.CreateUDiv(b_.CreateSub(j1, i64(1)), i64(bs));
    auto block = [&](llvm::Value* slot) {  // (K, V) offsets of the block's row 0
      slot = b_.CreateSelect(b_.CreateICmpULT(slot, last_slot), slot, last_slot);
      llvm::Value* blk =
          b_.CreateSExt(b_.CreateAlignedLoad(
                            b_.getInt32Ty(),
                            b_.CreateGEP(b_.getInt32Ty(), arg(TILEJIT_ARG(Args, table)),
                                         b_.CreateMul(slot, arg(TILEJIT_ARG(Args, table_stride)))),
                            llvm::Align(4)),
                        b_.getInt64Ty());
      return std::make_pair(b_.CreateMul(blk, arg(TILEJIT_ARG(Args, k_block_stride))),
                            b_.CreateMul(blk, arg(TILEJIT_ARG(Args, v_block_stride))));
    };
    auto store = [&](llvm::Value* kb, llvm::Value* vb, llvm::Value* row, int64_t jl) {
      auto put = [&](llvm::Value* v, int64_t i) {
        b_.CreateAlignedStore(v, b_.CreateGEP(b_.getInt64Ty(), offs_, b_.CreateAdd(at, i64(i))),
                              llvm::Align(8));
      };
      put(b_.CreateAdd(kb, b_.CreateMul(row, arg(TILEJIT_ARG(Args, k_row_stride)))), jl);
      put(b_.CreateAdd(vb, b_.CreateMul(row, arg(TILEJIT_ARG(Args, v_row_stride)))), kChunk + jl);
    };
    if (kChunk % bs == 0) {
      llvm::Value* slot0 = b_.CreateUDiv(c, i64(bs));
      for (int64_t i = 0; i < kChunk / bs; ++i) {
        llvm::Value *kb, *vb;
        std::tie(kb, vb) = block(b_.CreateAdd(slot0, i64(i)));
        for (int64_t r = 0; r < bs; ++r) store(kb, vb, i64(r), i * bs + r);
      }
      return;
    }
    for (int64_t jl = 0; jl < kChunk; ++jl) {
      llvm::Value* key = b_.CreateAdd(c, i64(jl));
      llvm::Value *kb, *vb;
      std::tie(kb, vb) = block(b_.CreateUDiv(key, i64(bs)));
      store(kb, vb, b_.CreateURem(key, i64(bs)), jl);
    }
  }

  // The V scratch of head h (parity h & 1).
  llvm::Value* vscr_of(llvm::Value* h) {
    return b_.CreateGEP(i16t(), vscr_,
                        b_.CreateMul(b_.CreateAnd(h, i64(1)), i64(kChunk * pitch(true))));
  }

  // fp8_to_bf16 without AVX512-BW, in 16-bit lanes (16 codes a ymm op): a
  // normal magnitude's bf16 is (mag << (7 − M)) + ((127 − bias) << 7) (M the
  // mantissa bits); the subnormal ones (mag < 2^M: 8 for e4m3, 4 for e5m2)
  // come from one vpshufb per ymm over a 16-byte table (bytes 0-7 the bf16s'
  // low bytes, 8-15 their high bytes; each word's index bytes are (mag, mag |
  // 8), i.e. (m, m + 8) where it is selected); Inf / NaN selected; the sign
  // or-ed in. Integer operations only (MXCSR cannot touch them): ~15 ops per
  // 16 codes, where the route through f32 (VectorMath::f8e4m3_to_f32, then
  // the top halves) took ~30.
  template <class MagBf16>
  llvm::Value* fp8_to_bf16_avx2(llvm::Value* codes, MagBf16 mag_bf16) {
    const runtime::Fp8Format& f = *runtime::fp8_format_of(d_.kv);
    auto* v32 = llvm::FixedVectorType::get(i16t(), 32);
    auto c16 = [&](uint16_t x) { return llvm::ConstantInt::get(v32, x); };
    llvm::Value* w = b_.CreateZExt(codes, v32);
    llvm::Value* mag = b_.CreateAnd(w, c16(0x7f));
    llvm::Value* normal =
        b_.CreateAdd(b_.CreateShl(mag, c16(static_cast<uint16_t>(7 - f.man_bits))),
                     c16(static_cast<uint16_t>((127 - f.bias) << 7)));
    llvm::Value* idx = b_.CreateOr(b_.CreateOr(mag, b_.CreateShl(mag, c16(8))), c16(0x0800));
    std::vector<llvm::Constant*> t;
    for (int lane = 0; lane < 2; ++lane)
      for (int byte = 0; byte < 16; ++byte)
        t.push_back(b_.getInt8(static_cast<uint8_t>(mag_bf16(byte % 8) >> (byte < 8 ? 0 : 8))));
    llvm::Value* table = llvm::ConstantVector::get(t);
    llvm::Value* idx8 = b_.CreateBitCast(idx, llvm::FixedVectorType::get(b_.getInt8Ty(), 64));
    std::vector<llvm::Value*> halves;
    for (int h = 0; h < 2; ++h) {
      Mask m;
      for (int i = 0; i < 32; ++i) m.push_back(32 * h + i);
      halves.push_back(b_.CreateIntrinsic(llvm::Intrinsic::x86_avx2_pshuf_b, {},
                                          {table, b_.CreateShuffleVector(idx8, m)}));
    }
    Mask all;
    for (int i = 0; i < 64; ++i) all.push_back(i);
    llvm::Value* sub = b_.CreateBitCast(b_.CreateShuffleVector(halves[0], halves[1], all), v32);
    llvm::Value* r = b_.CreateSelect(
        b_.CreateICmpULT(mag, c16(static_cast<uint16_t>(1 << f.man_bits))), sub, normal);
    if (f.has_inf)  // S.11111.mm: 0x7F80 | mm << 5 (Inf for mm = 0, else a NaN)
      r = b_.CreateSelect(b_.CreateICmpUGT(mag, c16(f.max_code)),
                          b_.CreateOr(c16(0x7F80), b_.CreateShl(b_.CreateAnd(mag, c16(3)), c16(5))),
                          r);
    else
      r = b_.CreateSelect(b_.CreateICmpEQ(mag, c16(0x7f)), c16(0x7FC0), r);
    return b_.CreateOr(r, b_.CreateAnd(b_.CreateShl(w, c16(8)), c16(0x8000)));
  }

  // 32 fp8 codes (<32 x i8>, the cache's format) -> their values as bf16
  // (<32 x i16>), exactly (every e4m3 and e5m2 value is a bf16; NaN codes
  // give a NaN, e5m2's Inf codes ±Inf). With AVX512-BW: w = the
  // sign-extended code, the bf16 of its 7 magnitude bits from a 128-entry
  // table (two vpermi2w of 64 entries, bit 6 picks one), the sign or-ed in:
  // 6 ops for 32 codes, subnormals and NaN included (an arithmetic form,
  // shift / mask / add for normals with an 8-entry table for e = 0 and a NaN
  // select, took 10). Elsewhere: fp8_to_bf16_avx2.
  llvm::Value* fp8_to_bf16(llvm::Value* codes) {
    const runtime::Fp8Format& f = *runtime::fp8_format_of(d_.kv);
    auto* v32 = llvm::FixedVectorType::get(i16t(), 32);
    auto c16 = [&](uint16_t x) { return llvm::ConstantInt::get(v32, x); };
    // bf16 of the magnitude code c = code & 0x7F: the top half of its f32
    // (exact: 2 or 3 mantissa bits), a quiet NaN for the NaN codes.
    auto mag_bf16 = [&f](int c) -> uint16_t {
      const float x = runtime::fp8_to_f32(f, static_cast<uint8_t>(c));
      if (std::isnan(x)) return 0x7FC0;
      uint32_t u;
      std::memcpy(&u, &x, 4);
      return static_cast<uint16_t>(u >> 16);
    };
    if (!mc_.host.avx512bw) return fp8_to_bf16_avx2(codes, mag_bf16);
    llvm::Value* w = b_.CreateSExt(codes, v32);
    // bf16 of the 128 magnitudes (code & 0x7F), four vectors of 32.
    std::vector<llvm::Value*> table;
    for (int t = 0; t < 4; ++t) {
      std::vector<llvm::Constant*> e;
      for (int i = 0; i < 32; ++i) e.push_back(b_.getInt16(mag_bf16(32 * t + i)));
      table.push_back(llvm::ConstantVector::get(e));
    }
    // vpermi2w looks up 64 entries by the index's low 6 bits; bit 6 picks
    // the half; the sign is or-ed in.
    auto lookup = [&](int t) {
      return b_.CreateIntrinsic(llvm::Intrinsic::x86_avx512_vpermi2var_hi_512, {},
                                {table[2 * t], w, table[2 * t + 1]});
    };
    llvm::Value* lo = lookup(0);
    llvm::Value* hi = lookup(1);
    llvm::Value* r = b_.CreateSelect(b_.CreateICmpNE(b_.CreateAnd(w, c16(0x40)), c16(0)), hi, lo);
    return b_.CreateOr(r, b_.CreateAnd(w, c16(0x8000)));
  }

  // fp8: the chunk's 16 rows of one head (K or V; base = the head's row 0 of
  // the chunk, or its block 0 with the offset list) converted into dst, bf16
  // rows pitch(is_v) apart. A row's last piece is loaded narrower and widened
  // with zero codes (+0), so nothing past the row is read.
  void convert_rows(llvm::Value* base, bool is_v, llvm::Value* dst) {
    const int64_t n = is_v ? d_.dv : d_.d;
    emit_loop(
        b_, i64(kChunk), {},
        [&](llvm::Value* jl, const std::vector<llvm::Value*>&) {
          llvm::Value* src = cache_row(base, is_v, jl);
          llvm::Value* out = b_.CreateGEP(i16t(), dst, b_.CreateMul(jl, i64(pitch(is_v))));
          for (int64_t col = 0; col < n; col += 32) {
            llvm::Value* codes =
                load_part(b_.getInt8Ty(), 32, b_.CreateGEP(b_.getInt8Ty(), src, i64(col)), n - col);
            b_.CreateAlignedStore(fp8_to_bf16(codes), b_.CreateGEP(i16t(), out, i64(col)),
                                  llvm::Align(64));
          }
          return std::vector<llvm::Value*>{};
        },
        is_v ? "convert_v" : "convert_k");
  }

  void chunk(llvm::Value* c0, llvm::Value* j0, llvm::Value* j1, bool masked) {
    masked_ = masked;
    if (masked) {
      a_ = b_.CreateSelect(b_.CreateICmpSGT(j0, c0), b_.CreateSub(j0, c0), i64(0));
      llvm::Value* rest = b_.CreateSub(j1, c0);
      b_lim_ = b_.CreateSelect(b_.CreateICmpSLT(rest, i64(kChunk)), rest, i64(kChunk));
      std::vector<llvm::Constant*> lane;
      for (int l = 0; l < kLanes; ++l) lane.push_back(b_.getInt32(static_cast<uint32_t>(l)));
      llvm::Value* lanes = llvm::ConstantVector::get(lane);
      llvm::Type* i32t = b_.getInt32Ty();
      valid_ = b_.CreateAnd(b_.CreateICmpSGE(lanes, vm_.splat(b_.CreateTrunc(a_, i32t))),
                            b_.CreateICmpSLT(lanes, vm_.splat(b_.CreateTrunc(b_lim_, i32t))));
    }
    if (d_.alibi) {
      std::vector<llvm::Constant*> lane;
      for (int l = 0; l < kLanes; ++l)
        lane.push_back(llvm::ConstantFP::get(f32_, static_cast<double>(l)));
      dist_ = b_.CreateFAdd(
          vm_.splat(b_.CreateSIToFP(b_.CreateSub(c0, arg(TILEJIT_ARG(Args, i_pos))), f32_)),
          llvm::ConstantVector::get(lane));
    }
    // std::tie, not structured bindings: the lambdas below capture these,
    // which clang accepts only from version 16 (Debian 12's clang is 14).
    // The chunk prefetch_chunks ahead, clamped to the last one (so the table
    // read stays inside the entries the sequence uses).
    llvm::Value* cf = b_.CreateAdd(c0, i64(kChunk * pf_chunks()));
    cf = b_.CreateSelect(b_.CreateICmpSLT(cf, c_last_), cf, c_last_);
    llvm::Value *kp, *vp, *kf, *vf;
    if (aligned_) {
      std::tie(kp, vp) = chunk_rows(c0);
      std::tie(kf, vf) = chunk_rows(cf);
    } else {
      // The list of chunk c0 + prefetch_chunks·16 (unclamped: past the range
      // its keys map to the last block), used now for prefetches and later
      // as that chunk's rows.
      key_offsets(b_.CreateAdd(c0, i64(kChunk * pf_chunks())), j1, fut_);
      kp = kf = arg(TILEJIT_ARG(Args, k));
      vp = vf = arg(TILEJIT_ARG(Args, v));
    }
    llvm::Value *slopes = slopes_, *m = m_, *l = l_, *o = o_;
    llvm::Value *probs = probs_, *alpha = alpha_;
    // Software-pipelined over the heads: iteration h scores head h and then
    // accumulates P·V of head h − 1, so the latency chain of h's softmax
    // (reduce, exp, reduce) overlaps h − 1's P·V instead of stalling.
    // P and α are double-buffered by head parity.
    auto buffers = [&](llvm::Value* h) {
      llvm::Value* parity = b_.CreateAnd(h, i64(1));
      probs_ = b_.CreateGEP(dp_ ? i16t() : f32_, probs, b_.CreateMul(parity, i64(d_.g * kChunk)));
      alpha_ = b_.CreateGEP(f32_, alpha, b_.CreateMul(parity, i64(d_.g)));
    };
    auto score_head = [&](llvm::Value* h) {
      llvm::Value* row0 = b_.CreateMul(h, i64(d_.g));
      slopes_ = b_.CreateGEP(f32_, slopes, row0);
      m_ = b_.CreateGEP(f32_, m, row0);
      l_ = b_.CreateGEP(f32_, l, row0);
      buffers(h);
      kf_ = b_.CreateGEP(et(), kf, b_.CreateMul(h, arg(TILEJIT_ARG(Args, k_head_stride))));
      vf_ = b_.CreateGEP(et(), vf, b_.CreateMul(h, arg(TILEJIT_ARG(Args, v_head_stride))));
      if (d_.g > 8) prefetch_all();
      llvm::Value* kh =
          b_.CreateGEP(et(), kp, b_.CreateMul(h, arg(TILEJIT_ARG(Args, k_head_stride))));
      if (fp8_) {
        hscale_ = load_f32(arg(TILEJIT_ARG(Args, k_scale)), h);
        convert_rows(kh, false, kscr_);
        convert_rows(b_.CreateGEP(et(), vp, b_.CreateMul(h, arg(TILEJIT_ARG(Args, v_head_stride)))),
                     true, vscr_of(h));
        kh = kscr_;
      }
      scores(kh, row0);
    };
    auto pv_head = [&](llvm::Value* hp) {
      o_ = b_.CreateGEP(f32_, o, b_.CreateMul(b_.CreateMul(hp, i64(d_.g)), i64(d_.ldo)));
      buffers(hp);
      accumulate(
          fp8_ ? vscr_of(hp)
               : b_.CreateGEP(et(), vp, b_.CreateMul(hp, arg(TILEJIT_ARG(Args, v_head_stride)))));
    };
    if (d_.g <= 8) {
      // Prologue (scores of head 0), heads 1 .. heads − 1 (scores of h, then
      // its softmax interleaved instruction by instruction with P·V of
      // h − 1), epilogue (P·V of the last head). Interleaved, the softmax's
      // dependent chain does not fill the FP scheduler while P·V's
      // independent work waits behind it.
      auto softmax_pending = [&] {
        for (auto& [row0, s] : pending_) softmax(row0, s);
        pending_.clear();
      };
      score_head(i64(0));
      softmax_pending();
      emit_loop(
          b_, b_.CreateSub(arg(TILEJIT_ARG(Args, heads)), i64(1)), {},
          [&](llvm::Value* i, const std::vector<llvm::Value*>&) {
            llvm::Value* h = b_.CreateAdd(i, i64(1));
            score_head(h);
            llvm::BasicBlock* bb = b_.GetInsertBlock();
            const size_t before = bb->size();
            softmax_pending();
            const size_t mid = bb->size();
            pv_head(i);
            interleave(bb, before, mid);
            return std::vector<llvm::Value*>{};
          },
          "head");
      pv_head(b_.CreateSub(arg(TILEJIT_ARG(Args, heads)), i64(1)));
    } else {
      // Same order with a loop of heads + 1 iterations (G > 8 has loops
      // inside the score and P·V parts, so no instruction interleave).
      emit_loop(
          b_, b_.CreateAdd(arg(TILEJIT_ARG(Args, heads)), i64(1)), {},
          [&](llvm::Value* h, const std::vector<llvm::Value*>&) {
            emit_if(b_.CreateICmpSLT(h, arg(TILEJIT_ARG(Args, heads))), [&] { score_head(h); });
            emit_if(b_.CreateICmpSGT(h, i64(0)), [&] { pv_head(b_.CreateSub(h, i64(1))); });
            return std::vector<llvm::Value*>{};
          },
          "head");
    }
    probs_ = probs, alpha_ = alpha;
    slopes_ = slopes, m_ = m, l_ = l, o_ = o;
  }

  // The future chunk's rows of this head (kf_, vf_) are requested into L2,
  // one prefetch per 64-byte line, as one list of 32 rows: K rows 0 .. 15,
  // then V rows 0 .. 15, each row's lines in address order. For G ≤ 8 the
  // score loop issues an equal share of the rows at each key (the loop runs
  // over keys, so a share's first row is a runtime index); for larger G the
  // head issues the whole list at once (compute-bound anyway).
  //
  // The line addresses of row `unit` (0 .. 31) of the list.
  std::vector<llvm::Value*> prefetch_row_lines(llvm::Value* unit) {
    // Elements per 64-byte line: 32 bf16 or 64 fp8 codes.
    const int64_t per_line = fp8_ ? 64 : 32;
    const int64_t lk = (d_.d + per_line - 1) / per_line, lv = (d_.dv + per_line - 1) / per_line;
    llvm::Value* is_k = b_.CreateICmpULT(unit, i64(kChunk));
    llvm::Value* row = b_.CreateAnd(unit, i64(kChunk - 1));
    llvm::Value* base;
    if (aligned_)
      base =
          b_.CreateGEP(et(), b_.CreateSelect(is_k, kf_, vf_),
                       b_.CreateMul(row, b_.CreateSelect(is_k, arg(TILEJIT_ARG(Args, k_row_stride)),
                                                         arg(TILEJIT_ARG(Args, v_row_stride)))));
    else  // the prefetched chunk's list: K rows, then V rows
      base = b_.CreateGEP(
          et(), b_.CreateSelect(is_k, kf_, vf_),
          b_.CreateAlignedLoad(b_.getInt64Ty(),
                               b_.CreateGEP(b_.getInt64Ty(), offs_, b_.CreateAdd(fut_, unit)),
                               llvm::Align(8)));
    std::vector<llvm::Value*> lines;
    for (int64_t c = 0; c < std::max(lk, lv); ++c) {
      llvm::Value* col = i64(per_line * c);
      if (c >= std::min(lk, lv))  // the shorter row repeats its last line
        col = b_.CreateSelect(is_k, i64(per_line * std::min(c, lk - 1)),
                              i64(per_line * std::min(c, lv - 1)));
      lines.push_back(b_.CreateGEP(et(), base, col));
    }
    return lines;
  }
  void prefetch(llvm::Value* line) {
    b_.CreateIntrinsic(llvm::Intrinsic::prefetch, {b_.getPtrTy()},
                       {line, b_.getInt32(0), b_.getInt32(kPrefetchLocality), b_.getInt32(1)});
  }
  void prefetch_row(llvm::Value* unit) {
    for (llvm::Value* line : prefetch_row_lines(unit)) prefetch(line);
  }
  void prefetch_all() {
    emit_loop(
        b_, i64(2 * kChunk), {},
        [&](llvm::Value* unit, const std::vector<llvm::Value*>&) {
          prefetch_row(unit);
          return std::vector<llvm::Value*>{};
        },
        "prefetch");
  }
  // The lines to prefetch at key jj (0 .. 3) of score-loop iteration `it` of
  // pack `pack`: rows [u0 + a, u0 + b) of the list, u0 = (pack·4 + it)·per
  // for `per` rows per iteration.
  std::vector<llvm::Value*> prefetch_share(int64_t pack, llvm::Value* it, int64_t jj) {
    const int64_t iters = d_.g / pack_ * 4, per = (2 * kChunk + iters - 1) / iters;
    const int64_t a = jj * per / 4, b = (jj + 1) * per / 4;
    llvm::Value* u0 = b_.CreateMul(b_.CreateAdd(i64(pack * 4), it), i64(per));
    std::vector<llvm::Value*> lines;
    for (int64_t u = a; u < b; ++u) {
      // Rows past the list (when 32 rows do not split evenly) repeat the last.
      llvm::Value* unit = b_.CreateAdd(u0, i64(u));
      if (2 * kChunk % iters != 0)
        unit = b_.CreateSelect(b_.CreateICmpULT(unit, i64(2 * kChunk)), unit, i64(2 * kChunk - 1));
      for (llvm::Value* line : prefetch_row_lines(unit)) lines.push_back(line);
    }
    return lines;
  }

  // 128-bit lanes (la of a, lb of a, lc of b, ld of b) of two <16 x float>.
  static Mask lanes4(int la, int lb, int lc, int ld) {
    Mask m;
    for (int src = 0; src < 2; ++src)
      for (int l : {src ? lc : la, src ? ld : lb})
        for (int i = 0; i < 4; ++i) m.push_back(16 * src + 4 * l + i);
    return m;
  }
  // Same, lanes taken alternately from a and b: (a.la, b.la, a.lb, b.lb).
  static Mask lanes_alt(int la, int lb) {
    Mask m;
    for (int l : {la, lb})
      for (int src = 0; src < 2; ++src)
        for (int i = 0; i < 4; ++i) m.push_back(16 * src + 4 * l + i);
    return m;
  }

  // The P score vectors of a pack from its four level-1 vectors z (keys 4m ..
  // 4m + 3; 128-bit lane L holds partial sums of row L·P/4).
  std::vector<llvm::Value*> finish_tree(const std::vector<llvm::Value*>& z) {
    auto sh = [&](llvm::Value* a, llvm::Value* b, const Mask& m) {
      return b_.CreateShuffleVector(a, b, m);
    };
    if (pack_ == 1) return {shuffle_add(shuffle_add(z[0], z[1], 2), shuffle_add(z[2], z[3], 2), 3)};
    if (pack_ == 2) {
      // Row r = lanes 2r, 2r + 1: add them, then gather each row's halves.
      auto w = [&](llvm::Value* a, llvm::Value* b) {
        return b_.CreateFAdd(sh(a, b, lanes_alt(0, 2)), sh(a, b, lanes_alt(1, 3)));
      };
      llvm::Value *w0 = w(z[0], z[1]), *w1 = w(z[2], z[3]);
      return {sh(w0, w1, lanes4(0, 1, 0, 1)), sh(w0, w1, lanes4(2, 3, 2, 3))};
    }
    // pack 4: row r = lane r of every z, a 4 x 4 transpose of 128-bit lanes.
    llvm::Value* t0 = sh(z[0], z[1], lanes4(0, 1, 0, 1));
    llvm::Value* t1 = sh(z[0], z[1], lanes4(2, 3, 2, 3));
    llvm::Value* t2 = sh(z[2], z[3], lanes4(0, 1, 0, 1));
    llvm::Value* t3 = sh(z[2], z[3], lanes4(2, 3, 2, 3));
    return {sh(t0, t2, lanes4(0, 2, 0, 2)), sh(t0, t2, lanes4(1, 3, 1, 3)),
            sh(t1, t3, lanes4(0, 2, 0, 2)), sh(t1, t3, lanes4(1, 3, 1, 3))};
  }

  // Packs q at entry: P rows share each vector, row i of a pack in lanes
  // [16i/P, 16(i+1)/P) as bf16 pairs, so one broadcast K piece scores P
  // rows at once and the transposing tree shrinks P-fold.
  void pack_q() {
    const int64_t per = 16 / pack_, nvec = qvecs();
    llvm::Value* packs =
        b_.CreateUDiv(b_.CreateMul(arg(TILEJIT_ARG(Args, heads)), i64(d_.g)), i64(pack_));
    emit_loop(
        b_, packs, {},
        [&](llvm::Value* pk, const std::vector<llvm::Value*>&) {
          llvm::Value* r0 = b_.CreateMul(pk, i64(pack_));
          llvm::Value* dst = b_.CreateGEP(i16t(), qpack_, b_.CreateMul(r0, i64(qpitch())));
          for (int64_t e = 0; e < nvec; ++e) {
            std::vector<llvm::Value*> parts;
            for (int64_t i = 0; i < pack_; ++i) {
              llvm::Value* qrow = b_.CreateGEP(
                  i16t(), arg(TILEJIT_ARG(Args, q)),
                  b_.CreateMul(b_.CreateAdd(r0, i64(i)), arg(TILEJIT_ARG(Args, q_row_stride))));
              parts.push_back(
                  pack_ == 1 ? load_pairs(qrow, e * 32, d_.d)
                             : b_.CreateAlignedLoad(i32x(static_cast<unsigned>(per)),
                                                    b_.CreateGEP(i16t(), qrow, i64(e * 2 * per)),
                                                    llvm::Align(2)));
            }
            b_.CreateAlignedStore(concat(parts), b_.CreateGEP(i16t(), dst, i64(e * 32)),
                                  llvm::Align(64));
          }
          return std::vector<llvm::Value*>{};
        },
        "pack_q");
  }
  int64_t qvecs() const { return pack_ == 1 ? (d_.d + 31) / 32 : d_.d * pack_ / 32; }
  // bf16 per packed row (a pack of P rows takes P·qpitch).
  int64_t qpitch() const { return pack_ == 1 ? (d_.d + 31) / 32 * 32 : d_.d; }

  // Scores of the chunk's 16 keys for every row, then the softmax step. Rows
  // in blocks of ≤ 8 (packs of P rows unrolled inside a block). Each pack runs
  // a loop of 4 iterations of 4 keys, each ending in one level-1 tree vector:
  // a loop body is its own scheduling region, so LLVM cannot interleave all
  // 16 keys' dot chains and spill them (straight-line code did exactly that).
  void scores(llvm::Value* kp, llvm::Value* head_row0) {
    const int64_t nvec = qvecs(), per = 16 / pack_;
    const int64_t nacc = std::min<int64_t>(nvec, 2);
    const int64_t block = std::min<int64_t>(d_.g, 8);
    const bool spread = block == d_.g;
    row_blocks(
        block,
        [&](llvm::Value* row0, int64_t rows) {
          std::vector<llvm::Value*> s;
          for (int64_t r = 0; r < rows; r += pack_) {
            llvm::Value* qp = b_.CreateGEP(
                i16t(), qpack_,
                b_.CreateMul(b_.CreateAdd(head_row0, b_.CreateAdd(row0, i64(r))), i64(qpitch())));
            std::vector<llvm::Value*> qa, qb;  // dpbf16: pairs; fma: even, odd halves
            for (int64_t e = 0; e < nvec; ++e) {
              llvm::Value* pairs = b_.CreateAlignedLoad(
                  i32x(16), b_.CreateGEP(i16t(), qp, i64(e * 32)), llvm::Align(64));
              qa.push_back(dp_ ? pairs : even(pairs));
              if (!dp_) qb.push_back(odd(pairs));
            }
            emit_loop(
                b_, i64(kChunk / 4), {},
                [&](llvm::Value* it, const std::vector<llvm::Value*>&) {
                  llvm::Value* j0 = b_.CreateMul(it, i64(4));
                  std::vector<llvm::Value*> acc;
                  for (int64_t jj = 0; jj < 4; ++jj) {
                    llvm::Value* krow = key_row(kp, false, b_.CreateAdd(j0, i64(jj)));
                    std::vector<llvm::Value*> av(static_cast<size_t>(2 * nacc), vm_.f32(0.0f));
                    // This key's share of the prefetches, one after every few
                    // dot instructions: back to back they are partly lost.
                    std::vector<llvm::Value*> pf;
                    if (spread) pf = prefetch_share(r / pack_, it, jj);
                    size_t pf_next = 0;
                    for (int64_t e = 0; e < nvec; ++e) {
                      for (; pf_next <
                             pf.size() * static_cast<size_t>(e + 1) / static_cast<size_t>(nvec);
                           ++pf_next)
                        prefetch(pf[pf_next]);
                      llvm::Value*& a = av[static_cast<size_t>(2 * (e % nacc))];
                      llvm::Value*& a2 = av[static_cast<size_t>(2 * (e % nacc) + 1)];
                      llvm::Value* kv;
                      if (pack_ == 1) {
                        kv = load_pairs(krow, e * 32, d_.d);
                      } else {  // K[e·2per ..) broadcast to the P rows' lanes
                        Mask bc;
                        for (int i = 0; i < 16; ++i) bc.push_back(static_cast<int>(i % per));
                        kv = b_.CreateShuffleVector(
                            b_.CreateAlignedLoad(i32x(static_cast<unsigned>(per)),
                                                 b_.CreateGEP(i16t(), krow, i64(e * 2 * per)),
                                                 llvm::Align(2)),
                            bc);
                      }
                      if (dp_) {
                        a = dpbf16(a, kv, qa[e]);
                      } else {
                        a = vm_.fma(qa[e], even(kv), a);
                        a2 = vm_.fma(qb[e], odd(kv), a2);
                      }
                    }
                    // Chains folded pairwise (the FMA path's odd halves too).
                    std::vector<llvm::Value*> sums;
                    for (size_t i = 0; i < av.size(); i += 2)
                      sums.push_back(dp_ ? av[i] : b_.CreateFAdd(av[i], av[i + 1]));
                    while (sums.size() > 1) {
                      std::vector<llvm::Value*> next;
                      for (size_t i = 0; i + 1 < sums.size(); i += 2)
                        next.push_back(b_.CreateFAdd(sums[i], sums[i + 1]));
                      if (sums.size() % 2) next.push_back(sums.back());
                      sums = std::move(next);
                    }
                    acc.push_back(sums[0]);
                  }
                  llvm::Value* z = shuffle_add(shuffle_add(acc[0], acc[1], 0),
                                               shuffle_add(acc[2], acc[3], 0), 1);
                  store_vf32(z, zscr_, b_.CreateMul(it, i64(kLanes)));
                  return std::vector<llvm::Value*>{};
                },
                "keys");
            std::vector<llvm::Value*> z;
            for (int64_t m = 0; m < 4; ++m) z.push_back(load_vf32(zscr_, i64(m * kLanes)));
            for (llvm::Value* x : finish_tree(z)) s.push_back(x);
            // Softmax in groups of ≤ 4 rows: one wide vector per step, so
            // the rows' latency chains (reduce, exp, reduce) run side by side.
            if (s.size() == 4 || r + pack_ == rows) {
              const int64_t first = r + pack_ - static_cast<int64_t>(s.size());
              if (d_.g <= 8)
                pending_.push_back({b_.CreateAdd(row0, i64(first)), s});
              else
                softmax(b_.CreateAdd(row0, i64(first)), s);
              s.clear();
            }
          }
        },
        "score_rows");
  }

  // <16·n> lanes from n <16 x float>, or lane i of v repeated 16 times ([n] -> [16n]).
  llvm::Value* concat(const std::vector<llvm::Value*>& v) {
    std::vector<llvm::Value*> cur = v;
    while (cur.size() > 1) {  // pairwise: shufflevector joins equal widths only
      std::vector<llvm::Value*> next;
      for (size_t i = 0; i + 1 < cur.size(); i += 2) {
        const unsigned n = llvm::cast<llvm::FixedVectorType>(cur[i]->getType())->getNumElements();
        const unsigned n2 =
            llvm::cast<llvm::FixedVectorType>(cur[i + 1]->getType())->getNumElements();
        llvm::Value* b = cur[i + 1];
        if (n2 < n) {  // widen the odd one out with poison lanes
          Mask w;
          for (unsigned k = 0; k < n; ++k) w.push_back(k < n2 ? static_cast<int>(k) : -1);
          b = b_.CreateShuffleVector(b, w);
        }
        Mask m;
        for (unsigned k = 0; k < n + n2; ++k) m.push_back(k < n ? k : n + (k - n));
        next.push_back(b_.CreateShuffleVector(cur[i], b, m));
      }
      if (cur.size() % 2) next.push_back(cur.back());
      cur = std::move(next);
    }
    return cur[0];
  }
  llvm::Value* spread(llvm::Value* v, int64_t n) {
    Mask m;
    for (int64_t i = 0; i < 16 * n; ++i) m.push_back(static_cast<int>(i / 16));
    return b_.CreateShuffleVector(v, m);
  }
  llvm::Value* repeat(llvm::Value* v, int64_t n) {
    Mask m;
    for (int64_t i = 0; i < 16 * n; ++i) m.push_back(static_cast<int>(i % 16));
    return b_.CreateShuffleVector(v, m);
  }
  // Butterfly within each 16-lane segment: every lane ends with the
  // segment's max (or sum), no scalar extraction and re-broadcast.
  llvm::Value* segment_reduce(llvm::Value* x, bool max) {
    const unsigned n = llvm::cast<llvm::FixedVectorType>(x->getType())->getNumElements();
    for (unsigned k : {8u, 4u, 2u, 1u}) {
      Mask m;
      for (unsigned i = 0; i < n; ++i) m.push_back(static_cast<int>(i ^ k));
      llvm::Value* y = b_.CreateShuffleVector(x, m);
      x = max ? b_.CreateSelect(b_.CreateFCmpOGT(x, y), x, y) : b_.CreateFAdd(x, y);
    }
    return x;
  }
  llvm::Value* row_lanes(llvm::Value* x, int64_t n) {  // lane 16r of each segment
    Mask m;
    for (int64_t r = 0; r < n; ++r) m.push_back(static_cast<int>(16 * r));
    return b_.CreateShuffleVector(x, m);
  }

  // The online-softmax step of rows row0 .. row0 + n − 1 (n ≤ 4), scores s.
  void softmax(llvm::Value* row0, const std::vector<llvm::Value*>& s_rows) {
    const int64_t n = static_cast<int64_t>(s_rows.size());
    const unsigned lanes = static_cast<unsigned>(16 * n);
    VectorMath vw(b_, lanes), vr(b_, static_cast<unsigned>(n));
    llvm::Type* rowv = llvm::FixedVectorType::get(f32_, static_cast<unsigned>(n));
    const float inf = std::numeric_limits<float>::infinity();
    llvm::Value* s =
        b_.CreateFMul(concat(s_rows), vw.splat(fp8_ ? hscale_ : arg(TILEJIT_ARG(Args, scale))));
    if (d_.softcap) {
      // cap·tanh(s/cap), tanh x = 1 − 2/(e^{2x} + 1): exp saturates both ways.
      llvm::Value* cap = vw.splat(arg(TILEJIT_ARG(Args, softcap)));
      llvm::Value* e = vw.exp(b_.CreateFMul(b_.CreateFDiv(s, cap), vw.f32(2.0f)));
      llvm::Value* t =
          b_.CreateFSub(vw.f32(1.0f), b_.CreateFDiv(vw.f32(2.0f), b_.CreateFAdd(e, vw.f32(1.0f))));
      s = b_.CreateFMul(cap, t);
    }
    if (d_.alibi) {
      llvm::Value* sl =
          b_.CreateAlignedLoad(rowv, b_.CreateGEP(f32_, slopes_, row0), llvm::Align(4));
      s = vw.fma(spread(sl, n), repeat(dist_, n), s);
    }
    llvm::Value* valid = masked_ ? repeat(valid_, n) : nullptr;
    if (masked_) s = b_.CreateSelect(valid, s, vw.f32(-inf));
    llvm::Value* m_old = b_.CreateAlignedLoad(rowv, b_.CreateGEP(f32_, m_, row0), llvm::Align(4));
    llvm::Value* cmax = segment_reduce(s, true);
    llvm::Value* mo = spread(m_old, n);
    llvm::Value* m_new = b_.CreateSelect(b_.CreateFCmpOGT(cmax, mo), cmax, mo);
    llvm::Value* p = vw.exp(b_.CreateFSub(s, m_new));
    if (masked_) p = b_.CreateSelect(valid, p, vw.f32(0.0f));
    // P rounded to bf16 (as vdpbf16ps needs it) and l summing the rounded
    // weights, so numerator and denominator agree.
    llvm::Value* pb = vw.f32_to_bf16(p);
    p = vw.bf16_to_f32(pb);
    llvm::Value* sum = row_lanes(segment_reduce(p, false), n);
    llvm::Value* m_row = row_lanes(m_new, n);
    // α = 0 before the first key (m = −inf: O and l are 0 anyway, but
    // exp's clamp would give 1e-38, not 0, and −inf − −inf is NaN).
    llvm::Value* alpha = b_.CreateSelect(b_.CreateFCmpOEQ(m_old, vr.f32(-inf)), vr.f32(0.0f),
                                         vr.exp(b_.CreateFSub(m_old, m_row)));
    llvm::Value* l_at = b_.CreateGEP(f32_, l_, row0);
    llvm::Value* l_old = b_.CreateAlignedLoad(rowv, l_at, llvm::Align(4));
    b_.CreateAlignedStore(vr.fma(l_old, alpha, sum), l_at, llvm::Align(4));
    b_.CreateAlignedStore(m_row, b_.CreateGEP(f32_, m_, row0), llvm::Align(4));
    b_.CreateAlignedStore(alpha, b_.CreateGEP(f32_, alpha_, row0), llvm::Align(4));
    llvm::Value* at = b_.CreateMul(row0, i64(kChunk));
    if (dp_)
      b_.CreateAlignedStore(pb, b_.CreateGEP(i16t(), probs_, at), llvm::Align(2));
    else
      b_.CreateAlignedStore(p, b_.CreateGEP(f32_, probs_, at), llvm::Align(4));
  }

  // V row of key jl, zeroed when the key is outside [j0, j1) (masked chunk).
  llvm::Value* v_masked(llvm::Value* v, int64_t jl) {
    if (!masked_) return v;
    llvm::Value* ok =
        b_.CreateAnd(b_.CreateICmpSLE(a_, i64(jl)), b_.CreateICmpSGT(b_lim_, i64(jl)));
    return b_.CreateSelect(ok, v, llvm::Constant::getNullValue(v->getType()));
  }

  // O[r][cols] = α_r·O[r][cols] + Σ_j p[r][j]·V[j][cols]: per (row block,
  // column group) the accumulators stay in registers across the chunk's keys;
  // every V vector is loaded (and interleaved or widened) once per row block.
  void accumulate(llvm::Value* vp) {
    const HostTarget& host = mc_.host;
    const int64_t w = std::max(1, 512 / host.vector_bits), regs = host.vector_regs;
    if (dp_) {
      // Registers: R·2U accumulators, 2U interleaved + 2U loaded V, 1 splat.
      const int64_t units = dv16() / 32, tail = dv16() % 32 != 0;
      int64_t rows = std::min<int64_t>(d_.g, 8), u = 1;
      while (u < units && w * (rows * 2 * (u + 1) + 4 * (u + 1) + 1) <= regs) ++u;
      row_blocks(
          rows, [&](llvm::Value* row0, int64_t nr) { pv_dpbf16(vp, row0, nr, u, units, tail); },
          "pv_rows");
    } else {
      // Registers: R·W accumulators, W widened V, 1 splat.
      const int64_t nvec = dv16() / kLanes;
      int64_t rows = std::min<int64_t>(d_.g, 8);
      while (rows > 1 && w * (rows + 2) > regs) --rows;
      int64_t cw = 1;
      while (cw < nvec && w * (rows * (cw + 1) + (cw + 1) + 1) <= regs) ++cw;
      row_blocks(
          rows, [&](llvm::Value* row0, int64_t nr) { pv_fma(vp, row0, nr, cw, nvec); }, "pv_rows");
    }
  }

  void pv_dpbf16(llvm::Value* vp, llvm::Value* row0, int64_t rows, int64_t per, int64_t units,
                 bool tail) {
    std::vector<llvm::Value*> al, prow;
    for (int64_t r = 0; r < rows; ++r) {
      llvm::Value* row = b_.CreateAdd(row0, i64(r));
      al.push_back(vm_.splat(load_f32(alpha_, row)));
      prow.push_back(b_.CreateMul(row, i64(kChunk)));
    }
    // Column groups: `per` units of 32 columns, then the 16-column tail.
    for (int64_t u0 = 0; u0 < units + tail; u0 += per) {
      const int64_t nu = std::min(per, units + tail - u0);
      const bool has_tail = tail && u0 + nu == units + tail;
      const int64_t nfull = nu - (has_tail ? 1 : 0);
      const int64_t nacc = 2 * nfull + (has_tail ? 1 : 0);
      llvm::Value* probs = opaque(probs_);
      std::vector<llvm::Value*> acc;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t a = 0; a < nacc; ++a)
          acc.push_back(b_.CreateFMul(load_vf32(o_, o_index(b_.CreateAdd(row0, i64(r)), u0, a)),
                                      al[static_cast<size_t>(r)]));
      for (int64_t j = 0; j < kChunk; j += 2) {
        llvm::Value* va = key_row(vp, true, j);
        llvm::Value* vb = key_row(vp, true, j + 1);
        std::vector<llvm::Value*> x;  // interleaved (V_j, V_j+1) pairs
        for (int64_t u = 0; u < nfull; ++u) {
          const int64_t col = (u0 + u) * 32;
          auto load = [&](llvm::Value* row, int64_t jl) {
            return v_masked(load_v(row, col, 32), jl);
          };
          llvm::Value* ra = load(va, j);
          llvm::Value* rb = load(vb, j + 1);
          x.push_back(
              b_.CreateBitCast(b_.CreateShuffleVector(ra, rb, interleave_mask(false)), i32x(16)));
          x.push_back(
              b_.CreateBitCast(b_.CreateShuffleVector(ra, rb, interleave_mask(true)), i32x(16)));
        }
        if (has_tail) {
          const int64_t col = units * 32;
          auto load = [&](llvm::Value* row, int64_t jl) {
            return v_masked(load_v(row, col, 16), jl);
          };
          Mask m;
          for (int i = 0; i < 16; ++i) m.insert(m.end(), {i, 16 + i});
          x.push_back(
              b_.CreateBitCast(b_.CreateShuffleVector(load(va, j), load(vb, j + 1), m), i32x(16)));
        }
        for (int64_t r = 0; r < rows; ++r) {
          // (p_j, p_j+1) as one dword, broadcast.
          llvm::Value* pp = vm_.splat(b_.CreateAlignedLoad(
              b_.getInt32Ty(),
              b_.CreateGEP(i16t(), probs, b_.CreateAdd(prow[static_cast<size_t>(r)], i64(j))),
              llvm::Align(4)));
          for (int64_t a = 0; a < nacc; ++a) {
            llvm::Value*& y = acc[static_cast<size_t>(r * nacc + a)];
            y = dpbf16(y, x[static_cast<size_t>(a)], pp);
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t a = 0; a < nacc; ++a)
          store_vf32(acc[static_cast<size_t>(r * nacc + a)], o_,
                     o_index(b_.CreateAdd(row0, i64(r)), u0, a));
    }
  }

  void pv_fma(llvm::Value* vp, llvm::Value* row0, int64_t rows, int64_t cw, int64_t nvec) {
    std::vector<llvm::Value*> al;
    for (int64_t r = 0; r < rows; ++r)
      al.push_back(vm_.splat(load_f32(alpha_, b_.CreateAdd(row0, i64(r)))));
    for (int64_t c0 = 0; c0 < nvec; c0 += cw) {
      const int64_t cols = std::min(cw, nvec - c0);
      std::vector<llvm::Value*> acc;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          acc.push_back(b_.CreateFMul(
              load_vf32(o_, b_.CreateAdd(b_.CreateMul(b_.CreateAdd(row0, i64(r)), i64(d_.ldo)),
                                         i64((c0 + c) * kLanes))),
              al[static_cast<size_t>(r)]));
      for (int64_t j = 0; j < kChunk; ++j) {
        llvm::Value* vrow = key_row(vp, true, j);
        std::vector<llvm::Value*> v;
        for (int64_t c = 0; c < cols; ++c)
          v.push_back(v_masked(load_bf16(vrow, (c0 + c) * kLanes), j));
        for (int64_t r = 0; r < rows; ++r) {
          llvm::Value* row = b_.CreateAdd(row0, i64(r));
          llvm::Value* pr =
              vm_.splat(load_f32(probs_, b_.CreateAdd(b_.CreateMul(row, i64(kChunk)), i64(j))));
          for (int64_t c = 0; c < cols; ++c) {
            llvm::Value*& x = acc[static_cast<size_t>(r * cols + c)];
            x = vm_.fma(pr, v[static_cast<size_t>(c)], x);
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          store_vf32(acc[static_cast<size_t>(r * cols + c)], o_,
                     b_.CreateAdd(b_.CreateMul(b_.CreateAdd(row0, i64(r)), i64(d_.ldo)),
                                  i64((c0 + c) * kLanes)));
    }
  }

  // Float index of accumulator a (16 columns) of the group starting at unit
  // u0 in row `row`: units are 32 columns, the tail 16.
  llvm::Value* o_index(llvm::Value* row, int64_t u0, int64_t a) {
    return b_.CreateAdd(b_.CreateMul(row, i64(d_.ldo)), i64(u0 * 32 + a * kLanes));
  }

  // O's full 32-column groups between plain order and the interleaved
  // order of pv_dpbf16 (see the file comment), for every row of every head.
  void permute_o(bool to_kernel) {
    const int64_t units = dv16() / 32;
    if (units == 0) return;
    Mask lo, hi;  // plain -> kernel: lane 4L+i of lo = column 8L+i, of hi = 8L+4+i
    for (int l = 0; l < 4; ++l)
      for (int i = 0; i < 4; ++i) lo.push_back(8 * l + i), hi.push_back(8 * l + 4 + i);
    Mask n0, n1;  // kernel -> plain: column c = lo[4(c/8) + c%8] or hi[4(c/8) + c%8 − 4]
    for (int c = 0; c < 32; ++c) {
      const int w = c % 8, idx = w < 4 ? 4 * (c / 8) + w : 16 + 4 * (c / 8) + w - 4;
      (c < 16 ? n0 : n1).push_back(idx);
    }
    emit_loop(
        b_, b_.CreateMul(arg(TILEJIT_ARG(Args, heads)), i64(d_.g)), {},
        [&](llvm::Value* row, const std::vector<llvm::Value*>&) {
          for (int64_t u = 0; u < units; ++u) {
            llvm::Value* at = b_.CreateAdd(b_.CreateMul(row, i64(d_.ldo)), i64(u * 32));
            llvm::Value* at2 = b_.CreateAdd(at, i64(kLanes));
            llvm::Value* x0 = load_vf32(o_, at);
            llvm::Value* x1 = load_vf32(o_, at2);
            store_vf32(b_.CreateShuffleVector(x0, x1, to_kernel ? lo : n0), o_, at);
            store_vf32(b_.CreateShuffleVector(x0, x1, to_kernel ? hi : n1), o_, at2);
          }
          return std::vector<llvm::Value*>{};
        },
        "permute_o");
  }

  const DecodeAttentionDesc& d_;
  const bool dp_;
  VectorMath vm_;
  llvm::Type* f32_ = nullptr;
  llvm::Value *slopes_ = nullptr, *m_ = nullptr, *l_ = nullptr, *o_ = nullptr;
  llvm::Value *probs_ = nullptr, *alpha_ = nullptr, *c_last_ = nullptr, *qpack_ = nullptr,
              *zscr_ = nullptr;
  // args->scratch and the bytes of it carved so far (64-byte aligned pieces).
  llvm::Value* scratch_ = nullptr;
  int64_t scratch_used_ = 0;
  llvm::Value* carve(int64_t bytes) {
    llvm::Value* p = b_.CreateGEP(b_.getInt8Ty(), scratch_, i64(scratch_used_));
    scratch_used_ += decode_scratch_align(bytes);
    return p;
  }
  int64_t pack_ = 1;
  // Softmax groups (first row, score vectors) of the head being scored (G ≤ 8).
  std::vector<std::pair<llvm::Value*, std::vector<llvm::Value*>>> pending_;
  // The chunk being emitted.
  bool masked_ = false;
  llvm::Value *a_ = nullptr, *b_lim_ = nullptr, *valid_ = nullptr, *dist_ = nullptr;
  llvm::Value *kf_ = nullptr, *vf_ = nullptr;  // this head's rows of the chunk prefetched
  // Block size a multiple of 16: a chunk's rows lie in one block, j·stride
  // apart; otherwise offs_ holds the chunk's row offsets (key_offsets).
  const bool aligned_ = d_.block_size % kChunk == 0;
  // fp8 cache: each head's 16 K and V rows of the chunk are converted to bf16
  // into kscr_ / vscr_ (two V buffers by head parity) before the bf16 code
  // runs on them; hscale_ is the score scale of the head being scored.
  const bool fp8_ = d_.kv != DType::bf16;
  llvm::Value *kscr_ = nullptr, *vscr_ = nullptr, *hscale_ = nullptr;
  llvm::Value* offs_ = nullptr;
  llvm::Value *cur_ = nullptr, *fut_ = nullptr;  // this chunk's / the prefetched list in offs_
};

}  // namespace

LlvmKernel compile_llvm_decode_attention(const DecodeAttentionDesc& desc, OptLevel opt) {
  check(desc);
  require_vector_host("compile_llvm_decode_attention");
  return compile_emitter<DecodeEmitter>(desc.name(), opt, desc, desc.uses_dpbf16());
}

}  // namespace tilejit::codegen::llvm_backend
