// What the program subcommands (dump, run, bench) share: loading a .tir file,
// the NAME=VALUE option forms, and moving tensors between .npy files, random
// generators and the runner.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ir/program.h"
#include "tools/npy.h"
#include "tools/program/program_runner.h"

namespace tilejit::tools {

// The text of `path`, or of stdin for "-", at most kMaxProgramBytes
// (tools/file_limits.h). Throws Error "path: cannot open: ...", "path: is a
// directory, not a file", "path: is N bytes, more than ...".
std::string read_text(const std::string& path);
// Parses `path` ("-" = stdin, shown as <stdin>). Throws ir::ParseError, whose
// what() is "file:line:col: error: ...".
ir::Function load_program(const std::string& path);
// Errors are one line on stderr (docs/tool.md), whatever they quote: a file
// name or an option value may hold a newline or other control bytes, which
// one_line prints escaped (\x0a).
std::string one_line(const std::string& s);
// The name under which errors refer to `path`.
std::string display_name(const std::string& path);
// ProgramRunner(f), its errors (verifier, "no lowering ...") prefixed
// "file: error: " like the parser's.
ProgramRunner make_runner(const ir::Function& f, const std::string& path);

// "NAME=VALUE" → {NAME, VALUE}; a leading '%' of NAME is dropped so that
// both `--input x=...` and `--input %x=...` work. Error names the option.
std::pair<std::string, std::string> split_assignment(const std::string& arg, const char* option,
                                                     const char* value_hint);
// The largest value --dim takes: the largest dim an operator takes (the
// shapes it makes are capped again, in bytes, by dense_bytes).
inline constexpr int64_t kMaxDimValue = Limits::max_dim;
// --dim M=512 ... → {"M": 512}; every symbol must occur in f. UsageError
// (tools/commands.h) for a malformed, negative, too large or unknown dim.
DimBindings parse_dims(const std::vector<std::string>& args, const ir::Function& f);
// The symbols of f's params, in order of first appearance.
std::vector<std::string> program_symbols(const ir::Function& f);

// The .npy convention (docs/tool.md): an IR bf16 input is a '<u2' array of
// bf16 bits, or '<f4' rounded to nearest even; f32 '<f4'; i32 '<i4'; u8 '|u1';
// i8 '|i1'; i64 (rope positions) '<i4', widened (tools/npy.h has no '<i8').
// Errors name the input and the file. An i64 tensor is written as '<i4' when
// every value fits, else it is an Error.
HostTensor tensor_from_npy(const NpyArray& a, const ir::Value& param, const std::string& file);
NpyArray npy_from_tensor(const HostTensor& t, const std::string& what);

// What an input feeds, when that constrains its values: random data must be
// valid data for the operator that reads it.
enum class InputRole {
  plain,        // floats uniform in [-1, 1), ints in [0, 16)
  g_idx,        // a quantized gemm's g_idx [K]: k / ceil(K/G), shuffled (range = G)
  quant_scale,  // a quantized gemm's scale: 2^e·(1 + m/8), e in {-8, -7} (exact in f16)
  positions,    // rope positions: in [0, range) (range = the cache's rows)
  cos_sin,  // rope cos/sin cache [P, R]: row p = cos(p·θ_j), then sin(p·θ_j), θ_j = 10000^(-2j/R)
  topk_ids,      // moe expert ids [T, k]: k distinct ids per row in [0, range) (range = E)
  topk_weights,  // moe routing weights [T, k]: positive, each row summing to 1
  block_table,   // decode_attention's block table [B, MB]: block ids in [0, range) (range =
                 // the cache's blocks), distinct over the whole table while there are enough
  seq_lens,      // decode_attention's lengths [B]: in [1, range] (range = MB·block_size),
                 // the first sequence full
};
// The role of param `id` in f (the first op reading it decides) and, for
// positions and topk_ids, the bound range (-1 when its dim is unbound) and
// the value whose dim 0 it is (the cos/sin cache, w13).
InputRole input_role(const ir::Function& f, int id, const DimBindings& dims, int64_t* range,
                     int* range_of = nullptr);
// The role a file name's stem names, for `tilejit gen-npy`: "pos" or
// "positions", "cos_sin", "topk_ids", "topk_weights"; else plain.
InputRole role_from_name(const std::string& stem);
// Fills t (shape and bytes set) with random values of `role` from one stream
// of `seed`. Errors name `what` when the dtype, shape or range do not fit.
void fill_role(HostTensor& t, InputRole role, int64_t range, uint64_t seed,
               const std::string& what);

// Random contents for param `id` of f with its symbols bound by `dims` (Error
// naming the input and the unbound symbol otherwise), valid for its role
// (input_role). One stream per (seed, name), so giving some inputs from files
// leaves the others unchanged.
HostTensor random_tensor(const ir::Function& f, int id, const DimBindings& dims, uint64_t seed);

// --threads N of bench and llama-layer (0: not given): set_num_threads, its
// Error (which states the allowed range) a UsageError naming the option.
void set_threads_option(int threads);
// --seconds S of bench and llama-layer: a timing budget, finite and positive,
// at most kMaxSeconds (batches are sized by S / time per call: 1e308 would
// run for ever); UsageError otherwise.
inline constexpr double kMaxSeconds = 3600;
void check_seconds_option(double seconds);
// How many calls of `measured` seconds each fill `budget` seconds: at least
// 1, and finite even when the clock measured 0 (an empty problem).
int64_t calls_for_budget(double budget, double measured);

// A note on stderr when --isa asked for a path other than the one that runs
// (TILEJIT_ISA is a cap: the active path is the best one at or below it).
void note_isa_request(const std::string& requested);

}  // namespace tilejit::tools
