// The Xbyak emitters, behind an interface free of Xbyak types: callers get
// position-independent machine code bytes (constants are RIP-relative) and
// place them in executable memory themselves.
#pragma once

#include <cstdint>
#include <vector>

#include "codegen/brgemm_desc.h"
#include "codegen/kv_quant_desc.h"
#include "codegen/quant_desc.h"

namespace tilejit::codegen::xbyak {

std::vector<uint8_t> emit_avx512_brgemm(const BrgemmDesc& d);
std::vector<uint8_t> emit_amx_brgemm(const BrgemmDesc& d);
// The fused W4A16 / W8A16 decode kernel: b = u4 or f8e4m3 (codes and group
// tables of BrgemmArgs read directly), a = bf16, acc = f32, mr 1..4, batch 1.
std::vector<uint8_t> emit_quant_brgemm(const BrgemmDesc& d);
// The scratch a quant_brgemm call needs in args.q_scratch (0: none).
int64_t quant_brgemm_scratch_bytes(const BrgemmDesc& d);

// The quantized GEMMs' helper kernels (contracts in codegen/quant_desc.h):
// `void f(const DequantArgs*)` and `void f(const ActQuantArgs*)`.
std::vector<uint8_t> emit_dequant(const DequantDesc& d);
std::vector<uint8_t> emit_act_quant(const ActQuantDesc& d);
// store_kv's bf16 -> e4m3 rows (codegen/kv_quant_desc.h): `void f(const KvQuantArgs*)`.
std::vector<uint8_t> emit_kv_quant(const KvQuantDesc& d);

// Register-blocking rules of the AVX-512 kernel, shared with the planner.
int avx512_brgemm_ksplit(int mr, int nz);
int avx512_brgemm_max_mr(int nz);
// Bytes an AMX kernel with desc.a_packed prefetches from args.b_prefetch per
// call (8 cache lines per K step of each column pass).
int64_t amx_b_prefetch_bytes(const BrgemmDesc& d);

// Peak-throughput probes for the benchmarks: `void f(int64_t iters)` running
// iters × 8 tdpbf16ps (isa amx) or, for any other isa, the host's best
// vector dot product on independent accumulators held in registers:
// vdpbf16ps zmm (AVX512-BF16), else vfmadd231ps zmm (AVX-512) or ymm (AVX2:
// what the llvm path's widened bf16 kernels run). FLOPs per iteration: see
// peak_flops_per_iter(). op = u8: the int8 probes (tdpbusd; vpdpbusd zmm with
// AVX512-VNNI, else vpmaddwd: the i16 products the widened int8 kernels cannot
// beat); "FLOPs" are int8 ops, 2 per product.
std::vector<uint8_t> emit_peak_probe(Isa isa, DType op = DType::bf16);
double peak_flops_per_iter(Isa isa, DType op = DType::bf16);

// `void f(int64_t iters, const void* operands, int64_t steps)`: a 2×2 AMX
// kernel that reloads two A and two B tiles per K step from `operands`
// (steps × 4 KiB, walked iters times): 4 tdpbf16ps per step. Its rate with a
// 1-step footprint is the L1 ceiling of any kernel that streams its operands.
std::vector<uint8_t> emit_amx_reload_probe();

}  // namespace tilejit::codegen::xbyak
