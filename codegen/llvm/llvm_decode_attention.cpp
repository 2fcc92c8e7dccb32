// LLVM IR for paged decode attention. Shape of the emitted function:
//
//   for each chunk of 16 keys (aligned, so inside one cache block):  runtime count
//     K, V = the block's rows of this head (block table lookup)
//     valid lanes [a, b) = the chunk ∩ [j0, j1)
//     scores: for rows in blocks of ≤ 8, for valid keys:             runtime count
//        acc_r = Σ_c qf[r][c] · K[j][c]     <16 x float> FMAs, K widened once per key
//        s[r][j] = horizontal sum of acc_r
//     softmax, for each row (loop):
//        s = softcap / ALiBi / −inf outside [a, b); m' = max(m, max s)
//        p = exp(s − m'), α = exp(m − m'), l = α·l + Σp
//     O: for rows in blocks, for column groups:
//        acc = α·O[r][cols]; for valid keys: acc += p[r][j] · V[j][cols]; store
//
// Keys outside [j0, j1) are never loaded. Every chunk's 16 K rows and 16 V
// rows are read once; O, q and the score/weight scratch stay in L1, so the
// work per key is a few dozen vector instructions against ~230 cycles of DRAM
// time per key and core: the kernel runs at the memory's speed.
#include "codegen/llvm/llvm_decode_attention.h"

#include <llvm/IR/IRBuilder.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include "codegen/llvm/ir_loop.h"
#include "codegen/llvm/module_context.h"
#include "codegen/llvm/vector_math.h"

namespace tilejit::codegen::llvm_backend {

std::string DecodeAttentionDesc::name() const {
  std::string s = "decode_attn_llvm_d" + std::to_string(d) + "_dv" + std::to_string(dv) + "_g" +
                  std::to_string(g) + "_bs" + std::to_string(block_size) + "_ldo" +
                  std::to_string(ldo);
  if (softcap) s += "_softcap";
  if (alibi) s += "_alibi";
  return s;
}

namespace {

constexpr int kLanes = 16;
constexpr int kChunk = 16;  // keys per softmax step (= lanes of a score vector)

[[noreturn]] void fail(const DecodeAttentionDesc& d, const std::string& what) {
  throw Error("compile_llvm_decode_attention: " + d.name() + ": " + what);
}

void check(const DecodeAttentionDesc& d) {
  auto dim = [&](const char* f, int64_t v) {
    if (v < 16 || v % 16 != 0 || v > 4096)
      fail(d,
           std::string(f) + "=" + std::to_string(v) + "; allowed: a multiple of 16 in [16, 4096]");
  };
  dim("d", d.d);
  dim("dv", d.dv);
  if (d.g < 1 || d.g > 1024) fail(d, "g=" + std::to_string(d.g) + "; allowed: 1 .. 1024");
  if (d.block_size < 16 || d.block_size % 16 != 0)
    fail(d, "block_size=" + std::to_string(d.block_size) + "; allowed: a multiple of 16");
  if (d.ldo < d.dv) fail(d, "ldo=" + std::to_string(d.ldo) + "; allowed: >= dv");
}

class DecodeEmitter {
 public:
  DecodeEmitter(ModuleContext& mc, const DecodeAttentionDesc& d)
      : mc_(mc), d_(d), b_(mc.ctx), vm_(b_, kLanes) {}

  void emit(const std::string& name) {
    llvm::Function* fn = mc_.define_kernel(name);
    b_.SetInsertPoint(llvm::BasicBlock::Create(mc_.ctx, "entry", fn));
    llvm::Value* args = fn->getArg(0);
    llvm::Type* ptr = b_.getPtrTy();
    llvm::Type* i64t = b_.getInt64Ty();
    f32_ = b_.getFloatTy();
    qf_ = field(args, 0, ptr);
    k_ = field(args, 1, ptr);
    v_ = field(args, 2, ptr);
    table_ = field(args, 3, ptr);
    ts_ = field(args, 4, i64t);
    kbs_ = field(args, 5, i64t);
    krs_ = field(args, 6, i64t);
    vbs_ = field(args, 7, i64t);
    vrs_ = field(args, 8, i64t);
    llvm::Value* j0 = field(args, 9, i64t);
    llvm::Value* j1 = field(args, 10, i64t);
    i_pos_ = field(args, 11, i64t);
    slopes_ = field(args, 12, ptr);
    softcap_ = field(args, 13, f32_);  // the float at byte 104
    m_ = field(args, 14, ptr);
    l_ = field(args, 15, ptr);
    o_ = field(args, 16, ptr);
    heads_ = field(args, 17, i64t);
    khs_ = field(args, 18, i64t);
    vhs_ = field(args, 19, i64t);

    // Scratch of one chunk: scores and weights [G][16], α [G].
    scores_ = b_.CreateAlloca(f32_, i64(d_.g * kChunk));
    probs_ = b_.CreateAlloca(f32_, i64(d_.g * kChunk));
    alpha_ = b_.CreateAlloca(f32_, i64(d_.g));
    cast<llvm::AllocaInst>(scores_)->setAlignment(llvm::Align(64));
    cast<llvm::AllocaInst>(probs_)->setAlignment(llvm::Align(64));

    // Chunks are aligned to 16 keys, so each lies inside one cache block.
    llvm::Value* c_begin = b_.CreateAnd(j0, i64(~int64_t{kChunk - 1}));
    llvm::Value* chunks =
        b_.CreateUDiv(b_.CreateAdd(b_.CreateSub(j1, c_begin), i64(kChunk - 1)), i64(kChunk));
    emit_loop(
        b_, chunks, {},
        [&](llvm::Value* ci, const std::vector<llvm::Value*>&) {
          chunk(b_.CreateAdd(c_begin, b_.CreateMul(ci, i64(kChunk))), j0, j1);
          return std::vector<llvm::Value*>{};
        },
        "chunk");
    b_.CreateRetVoid();
  }

 private:
  template <class T>
  static T* cast(llvm::Value* v) {
    return llvm::cast<T>(v);
  }
  llvm::Value* i64(int64_t v) { return b_.getInt64(static_cast<uint64_t>(v)); }

  // Argument fields are 8 bytes wide: field i is at byte 8·i.
  llvm::Value* field(llvm::Value* args, int64_t i, llvm::Type* t) {
    llvm::Value* p = b_.CreateGEP(b_.getInt8Ty(), args, i64(8 * i));
    auto* v = b_.CreateAlignedLoad(t, p, llvm::Align(t->isFloatTy() ? 4 : 8));
    v->setMetadata(llvm::LLVMContext::MD_invariant_load, llvm::MDNode::get(mc_.ctx, {}));
    return v;
  }

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
  // 16 bf16 at row[col..] widened to f32 (exact).
  llvm::Value* load_bf16(llvm::Value* row, int64_t col) {
    llvm::Value* p = b_.CreateGEP(b_.getInt16Ty(), row, i64(col));
    return vm_.bf16_to_f32(b_.CreateAlignedLoad(vm_.i16v(), p, llvm::Align(2)));
  }
  llvm::Value* hsum(llvm::Value* v) {
    auto* r = b_.CreateFAddReduce(llvm::ConstantFP::get(f32_, -0.0), v);
    llvm::FastMathFlags f;
    f.setAllowReassoc();  // a tree of shuffles + adds instead of 15 serial adds
    r->setFastMathFlags(f);
    return r;
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

  // Valid keys of the chunk: jl = a + iv for iv < b − a.
  void keys(llvm::Value* a, llvm::Value* b, std::vector<llvm::Value*> carried,
            const std::function<std::vector<llvm::Value*>(llvm::Value*,
                                                          const std::vector<llvm::Value*>&)>& fn,
            std::vector<llvm::Value*>* out, const char* name) {
    auto res = emit_loop(
        b_, b_.CreateSub(b, a), std::move(carried),
        [&](llvm::Value* iv, const std::vector<llvm::Value*>& c) {
          return fn(b_.CreateAdd(a, iv), c);
        },
        name);
    if (out) *out = std::move(res);
  }

  void chunk(llvm::Value* c0, llvm::Value* j0, llvm::Value* j1) {
    llvm::Value* a = b_.CreateSelect(b_.CreateICmpSGT(j0, c0), b_.CreateSub(j0, c0), i64(0));
    llvm::Value* rest = b_.CreateSub(j1, c0);
    llvm::Value* b = b_.CreateSelect(b_.CreateICmpSLT(rest, i64(kChunk)), rest, i64(kChunk));
    llvm::Value* slot = b_.CreateUDiv(c0, i64(d_.block_size));
    llvm::Value* blk = b_.CreateSExt(
        b_.CreateAlignedLoad(b_.getInt32Ty(),
                             b_.CreateGEP(b_.getInt32Ty(), table_, b_.CreateMul(slot, ts_)),
                             llvm::Align(4)),
        b_.getInt64Ty());
    llvm::Value* off = b_.CreateURem(c0, i64(d_.block_size));
    llvm::Type* i16 = b_.getInt16Ty();
    llvm::Value* kp =
        b_.CreateGEP(i16, k_, b_.CreateAdd(b_.CreateMul(blk, kbs_), b_.CreateMul(off, krs_)));
    llvm::Value* vp =
        b_.CreateGEP(i16, v_, b_.CreateAdd(b_.CreateMul(blk, vbs_), b_.CreateMul(off, vrs_)));
    prefetch_next(c0, j1);
    llvm::Value *qf = qf_, *slopes = slopes_, *m = m_, *l = l_, *o = o_;
    emit_loop(
        b_, heads_, {},
        [&](llvm::Value* h, const std::vector<llvm::Value*>&) {
          llvm::Value* row0 = b_.CreateMul(h, i64(d_.g));
          qf_ = b_.CreateGEP(f32_, qf, b_.CreateMul(row0, i64(d_.d)));
          slopes_ = b_.CreateGEP(f32_, slopes, row0);
          m_ = b_.CreateGEP(f32_, m, row0);
          l_ = b_.CreateGEP(f32_, l, row0);
          o_ = b_.CreateGEP(f32_, o, b_.CreateMul(row0, i64(d_.ldo)));
          scores(b_.CreateGEP(i16, kp, b_.CreateMul(h, khs_)), a, b);
          softmax(c0, a, b);
          accumulate(b_.CreateGEP(i16, vp, b_.CreateMul(h, vhs_)), a, b);
          return std::vector<llvm::Value*>{};
        },
        "head");
    qf_ = qf, slopes_ = slopes, m_ = m, l_ = l, o_ = o;
  }

  // The next chunk's K and V rows (16 rows of a random block each, 256-byte
  // pieces at the cache's row stride) requested now, so their DRAM latency
  // overlaps this chunk's arithmetic: the hardware prefetcher cannot guess
  // the next block of the table.
  void prefetch_next(llvm::Value* c0, llvm::Value* j1) {
    llvm::Value* c1 = b_.CreateAdd(c0, i64(kChunk));
    llvm::Function* fn = b_.GetInsertBlock()->getParent();
    auto* then = llvm::BasicBlock::Create(mc_.ctx, "prefetch", fn);
    auto* done = llvm::BasicBlock::Create(mc_.ctx, "prefetch_done", fn);
    b_.CreateCondBr(b_.CreateICmpSLT(c1, j1), then, done);
    b_.SetInsertPoint(then);
    llvm::Value* slot = b_.CreateUDiv(c1, i64(d_.block_size));
    llvm::Value* blk = b_.CreateSExt(
        b_.CreateAlignedLoad(b_.getInt32Ty(),
                             b_.CreateGEP(b_.getInt32Ty(), table_, b_.CreateMul(slot, ts_)),
                             llvm::Align(4)),
        b_.getInt64Ty());
    llvm::Value* off = b_.CreateURem(c1, i64(d_.block_size));
    for (auto [base, bstride, rstride, hstride, cols] :
         {std::tuple{k_, kbs_, krs_, khs_, d_.d}, std::tuple{v_, vbs_, vrs_, vhs_, d_.dv}}) {
      llvm::Value* p = b_.CreateGEP(
          i16t(), base, b_.CreateAdd(b_.CreateMul(blk, bstride), b_.CreateMul(off, rstride)));
      // Every head's part of the row: (heads − 1)·head stride + cols elements.
      llvm::Value* span =
          b_.CreateAdd(b_.CreateMul(b_.CreateSub(heads_, i64(1)), hstride), i64(cols));
      llvm::Value* lines = b_.CreateUDiv(b_.CreateAdd(span, i64(31)), i64(32));
      for (int64_t j = 0; j < kChunk; ++j) {
        llvm::Value* row = b_.CreateGEP(i16t(), p, b_.CreateMul(i64(j), rstride));
        emit_loop(
            b_, lines, {},
            [&](llvm::Value* line, const std::vector<llvm::Value*>&) {
              // One request per 64-byte line, into L2 (prefetcht1): into L1 the
              // 2·16 rows of a chunk overflow its miss buffers and stall.
              b_.CreateIntrinsic(llvm::Intrinsic::prefetch, {b_.getPtrTy()},
                                 {b_.CreateGEP(i16t(), row, b_.CreateMul(line, i64(32))),
                                  b_.getInt32(0), b_.getInt32(2), b_.getInt32(1)});
              return std::vector<llvm::Value*>{};
            },
            "prefetch_line");
      }
    }
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
  }

  // s[r][j] = q_r · K_j. Rows in blocks of 8: 8 independent FMA chains hide
  // the FMA latency; smaller blocks split each row's sum over two chains.
  void scores(llvm::Value* kp, llvm::Value* a, llvm::Value* b) {
    const int64_t nvec = d_.d / kLanes;
    row_blocks(
        std::min<int64_t>(d_.g, 8),
        [&](llvm::Value* row0, int64_t rows) {
          const int64_t chains = rows >= 8 ? 1 : rows >= 4 ? 2 : 4;
          keys(
              a, b, {},
              [&](llvm::Value* jl, const std::vector<llvm::Value*>&) {
                llvm::Value* krow = b_.CreateGEP(i16t(), kp, b_.CreateMul(jl, krs_));
                std::vector<llvm::Value*> acc(static_cast<size_t>(rows * chains), vm_.f32(0.0f));
                for (int64_t c = 0; c < nvec; ++c) {
                  llvm::Value* kv = load_bf16(krow, c * kLanes);
                  for (int64_t r = 0; r < rows; ++r) {
                    llvm::Value* qi = b_.CreateAdd(
                        b_.CreateMul(b_.CreateAdd(row0, i64(r)), i64(d_.d)), i64(c * kLanes));
                    llvm::Value*& s = acc[static_cast<size_t>(r * chains + c % chains)];
                    s = vm_.fma(load_vf32(qf_, qi), kv, s);
                  }
                }
                for (int64_t r = 0; r < rows; ++r) {
                  llvm::Value* sum = acc[static_cast<size_t>(r * chains)];
                  for (int64_t k = 1; k < chains; ++k)
                    sum = b_.CreateFAdd(sum, acc[static_cast<size_t>(r * chains + k)]);
                  llvm::Value* row = b_.CreateAdd(row0, i64(r));
                  store_f32(hsum(sum), scores_, b_.CreateAdd(b_.CreateMul(row, i64(kChunk)), jl));
                }
                return std::vector<llvm::Value*>{};
              },
              nullptr, "key");
        },
        "score_rows");
  }

  void softmax(llvm::Value* c0, llvm::Value* a, llvm::Value* b) {
    std::vector<llvm::Constant*> lane;
    for (int l = 0; l < kLanes; ++l) lane.push_back(b_.getInt32(static_cast<uint32_t>(l)));
    llvm::Value* lanes = llvm::ConstantVector::get(lane);
    llvm::Type* i32t = b_.getInt32Ty();
    llvm::Value* valid = b_.CreateAnd(b_.CreateICmpSGE(lanes, vm_.splat(b_.CreateTrunc(a, i32t))),
                                      b_.CreateICmpSLT(lanes, vm_.splat(b_.CreateTrunc(b, i32t))));
    const float inf = std::numeric_limits<float>::infinity();
    llvm::Value* dist = nullptr;  // ALiBi: key − i_pos per lane
    if (d_.alibi)
      dist = b_.CreateFAdd(vm_.splat(b_.CreateSIToFP(b_.CreateSub(c0, i_pos_), f32_)),
                           b_.CreateSIToFP(lanes, vm_.f32v()));
    emit_loop(
        b_, i64(d_.g), {},
        [&](llvm::Value* r, const std::vector<llvm::Value*>&) {
          llvm::Value* at = b_.CreateMul(r, i64(kChunk));
          llvm::Value* s = load_vf32(scores_, at);
          if (d_.softcap) {
            // cap·tanh(s/cap), tanh x = 1 − 2/(e^{2x} + 1): exp saturates both ways.
            llvm::Value* cap = vm_.splat(softcap_);
            llvm::Value* e = vm_.exp(b_.CreateFMul(b_.CreateFDiv(s, cap), vm_.f32(2.0f)));
            llvm::Value* t = b_.CreateFSub(
                vm_.f32(1.0f), b_.CreateFDiv(vm_.f32(2.0f), b_.CreateFAdd(e, vm_.f32(1.0f))));
            s = b_.CreateFMul(cap, t);
          }
          if (d_.alibi) s = vm_.fma(vm_.splat(load_f32(slopes_, r)), dist, s);
          s = b_.CreateSelect(valid, s, vm_.f32(-inf));
          auto* cmax = b_.CreateFPMaxReduce(s);
          llvm::FastMathFlags f;
          f.setNoNaNs();
          cmax->setFastMathFlags(f);
          llvm::Value* m_old = load_f32(m_, r);
          llvm::Value* m_new = b_.CreateMaxNum(m_old, cmax);
          llvm::Value* p =
              b_.CreateSelect(valid, vm_.exp(b_.CreateFSub(s, vm_.splat(m_new))), vm_.f32(0.0f));
          // α = 0 before the first key (m = −inf: O and l are 0 anyway, but
          // exp's clamp would give 1e-38, not 0, and −inf − −inf is NaN).
          llvm::Value* e_old =
              b_.CreateExtractElement(vm_.exp(vm_.splat(b_.CreateFSub(m_old, m_new))), i64(0));
          llvm::Value* alpha =
              b_.CreateSelect(b_.CreateFCmpOEQ(m_old, llvm::ConstantFP::getInfinity(f32_, true)),
                              llvm::ConstantFP::get(f32_, 0.0), e_old);
          store_vf32(p, probs_, at);
          store_f32(alpha, alpha_, r);
          store_f32(m_new, m_, r);
          store_f32(b_.CreateFAdd(b_.CreateFMul(load_f32(l_, r), alpha), hsum(p)), l_, r);
          return std::vector<llvm::Value*>{};
        },
        "softmax_row");
  }

  // O[r][cols] = α_r·O[r][cols] + Σ_j p[r][j]·V[j][cols]: per (row block,
  // column group) the accumulators stay in registers across the chunk's
  // keys; every V vector is loaded and widened once per key.
  void accumulate(llvm::Value* vp, llvm::Value* a, llvm::Value* b) {
    const int64_t nvec = d_.dv / kLanes;
    const int64_t per = std::min<int64_t>(d_.g, 8);
    row_blocks(
        per,
        [&](llvm::Value* row0, int64_t rows) {
          const int64_t cw = std::min<int64_t>(nvec, std::max<int64_t>(1, 16 / rows));
          for (int64_t c0 = 0; c0 < nvec; c0 += cw) {
            const int64_t cols = std::min(cw, nvec - c0);
            std::vector<llvm::Value*> acc;
            for (int64_t r = 0; r < rows; ++r) {
              llvm::Value* row = b_.CreateAdd(row0, i64(r));
              llvm::Value* al = vm_.splat(load_f32(alpha_, row));
              for (int64_t c = 0; c < cols; ++c)
                acc.push_back(b_.CreateFMul(load_vf32(o_, o_index(row, c0 + c)), al));
            }
            keys(
                a, b, acc,
                [&](llvm::Value* jl, const std::vector<llvm::Value*>& in) {
                  llvm::Value* vrow = b_.CreateGEP(i16t(), vp, b_.CreateMul(jl, vrs_));
                  std::vector<llvm::Value*> v, out = in;
                  for (int64_t c = 0; c < cols; ++c)
                    v.push_back(load_bf16(vrow, (c0 + c) * kLanes));
                  for (int64_t r = 0; r < rows; ++r) {
                    llvm::Value* row = b_.CreateAdd(row0, i64(r));
                    llvm::Value* pr = vm_.splat(
                        load_f32(probs_, b_.CreateAdd(b_.CreateMul(row, i64(kChunk)), jl)));
                    for (int64_t c = 0; c < cols; ++c) {
                      llvm::Value*& x = out[static_cast<size_t>(r * cols + c)];
                      x = vm_.fma(pr, v[static_cast<size_t>(c)], x);
                    }
                  }
                  return out;
                },
                &acc, "pv_key");
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t c = 0; c < cols; ++c)
                store_vf32(acc[static_cast<size_t>(r * cols + c)], o_,
                           o_index(b_.CreateAdd(row0, i64(r)), c0 + c));
          }
        },
        "pv_rows");
  }

  llvm::Value* o_index(llvm::Value* row, int64_t vec) {
    return b_.CreateAdd(b_.CreateMul(row, i64(d_.ldo)), i64(vec * kLanes));
  }
  llvm::Type* i16t() { return b_.getInt16Ty(); }

  ModuleContext& mc_;
  const DecodeAttentionDesc& d_;
  llvm::IRBuilder<> b_;
  VectorMath vm_;
  llvm::Type* f32_ = nullptr;
  llvm::Value *qf_ = nullptr, *k_ = nullptr, *v_ = nullptr, *table_ = nullptr;
  llvm::Value *ts_ = nullptr, *kbs_ = nullptr, *krs_ = nullptr, *vbs_ = nullptr, *vrs_ = nullptr;
  llvm::Value *i_pos_ = nullptr, *slopes_ = nullptr, *softcap_ = nullptr;
  llvm::Value *m_ = nullptr, *l_ = nullptr, *o_ = nullptr;
  llvm::Value *heads_ = nullptr, *khs_ = nullptr, *vhs_ = nullptr;
  llvm::Value *scores_ = nullptr, *probs_ = nullptr, *alpha_ = nullptr;
};

}  // namespace

LlvmKernel compile_llvm_decode_attention(const DecodeAttentionDesc& desc, OptLevel opt) {
  check(desc);
  require_vector_host("compile_llvm_decode_attention");
  const std::string name = desc.name();
  return compile_module(
      name, [&](ModuleContext& mc) { DecodeEmitter(mc, desc).emit(name); }, opt);
}

}  // namespace tilejit::codegen::llvm_backend
