// The pieces of the quantized packers (defined in ops/pack_quant.cpp) that
// the packers of other files (ops/pack_mxfp4.cpp) use too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "ops/packed_weight_impl.h"

namespace tilejit::ops {

using Buffer = std::unique_ptr<std::byte[], runtime::FreeDeleter>;

// A zeroed 64-byte aligned buffer of at least `bytes` (and 64) bytes.
Buffer zeroed(size_t bytes);

// A row-major copy of a checked 1-D or 2-D view, and its way back into a
// view of the same shape and dtype (an Error naming `arg` otherwise).
// check_restore refuses a view restore would refuse, writing nothing; an
// unpack checks every output that way before it writes any of them.
SavedTensor save(const TensorView& t);
// A weight's scales (f32 / f16 / bf16, rank 1 or 2, checked): an Error naming
// the first ±Inf one (pack_quant.cpp says why).
void check_no_infinite_scale(const char* op, const TensorView& s);
void check_restore(const char* op, const char* arg, const SavedTensor& s, const TensorView& out);
void restore(const char* op, const char* arg, const SavedTensor& s, const TensorView& out);

// The fp8 / int4 / MXFP4 packing's common part: the packed K order of the
// channels' groups into q, q into the weight, and the zeroed code buffer
// (returned).
uint8_t* place_tables(PackedWeight::Impl& impl, std::unique_ptr<QuantTables> q,
                      const std::vector<int32_t>& group_of, int64_t n_groups);

// Whether every scale of the table is 0, non-finite or large enough that
// no dequantized product is an f32 subnormal (DequantDesc::normal_products).
bool normal_products(const float* s, size_t count, DType code);

// The weight's Impl if its format is one of `allowed`, else an Error of `op`.
const PackedWeight::Impl& need_format(const PackedWeight::Impl* impl, const char* op,
                                      std::initializer_list<WeightFormat> allowed);

// Every check of PackedWeight::unpack(out) of that format, nothing written:
// an unpack (and PackedExperts::unpack, over all its experts) checks all its
// outputs before it writes one, so a refused call leaves them as they were.
void check_unpack(const PackedWeight::Impl* impl, const Int8Weight& out);
void check_unpack(const PackedWeight::Impl* impl, const Fp8Weight& out);
void check_unpack(const PackedWeight::Impl* impl, const Int4Weight& out);
void check_unpack(const PackedWeight::Impl* impl, const Mxfp4Weight& out);

}  // namespace tilejit::ops
