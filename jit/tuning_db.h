// The tuning database (docs/tuning.md): plan knobs that `tilejit tune`
// measured to beat the heuristics on the full operator call, one entry per
// (CPU, tilejit build, kernel family, shape class). The library loads it
// from TILEJIT_TUNING_DB or tilejit::load_tuning_db; ops/ looks entries up
// by the shape class of each call and applies their knobs as plan overrides.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codegen/gemm_plan.h"

namespace tilejit::jit {

// A shape class: the fields that pick a tuned entry, e.g. {path: amx, n:
// 4096, k: 4096, ..., m: "5-16"}; text() is its canonical "k=v;k=v" form.
struct ShapeClass {
  std::map<std::string, std::string> fields;
  std::string text() const;
};

// Buckets of a row / batch / token count (1, 2-4, 5-16, 17-64, 65-256,
// 257-1024, 1025+): one tuned entry serves every count of its bucket.
std::string count_bucket(int64_t n);
// Buckets of a sequence length (1-256, 257-1024, 1025-4096, 4097-16384, 16385+).
std::string seq_bucket(int64_t n);

// The shape classes of the tuned families (one home: ops/ and the tune tool
// build them here). path: the active ISA path; threads: the pool size.
// fmt: the weight format (a quantized GEMM's entries are its own: its
// routes run other kernels; docs/tuning.md "Quantized weights").
ShapeClass gemm_shape_class(Isa path, int threads, int64_t n, int64_t k, codegen::BiasKind bias,
                            Activation act, DType out, int64_t m,
                            WeightFormat fmt = WeightFormat::bf16);
ShapeClass decode_shape_class(Isa path, int threads, int64_t d, int64_t dv, int64_t hq, int64_t hkv,
                              int64_t block_size, DType kv, int64_t batch, int64_t longest);
// Prefill (flash_attn_varlen): batch = sequences, longest = the longest
// sequence's keys. Extend: longest_new = the most new tokens of a sequence,
// longest = the most keys (prefix + new) of one.
ShapeClass prefill_shape_class(Isa path, int threads, int64_t d, int64_t dv, int64_t hq,
                               int64_t hkv, bool causal, int64_t batch, int64_t longest);
ShapeClass extend_shape_class(Isa path, int threads, int64_t d, int64_t dv, int64_t hq, int64_t hkv,
                              int64_t block_size, DType kv, int64_t batch, int64_t longest_new,
                              int64_t longest);
ShapeClass moe_shape_class(Isa path, int threads, int64_t e, int64_t k, int64_t h, int64_t i,
                           int64_t t, WeightFormat fmt = WeightFormat::bf16);

// The weight format of a name (weight_format_name's inverse over the enum:
// the one list), or nullopt; weight_format_list() names them all for messages.
std::optional<WeightFormat> weight_format_from_name(const std::string& name);
std::string weight_format_list();

struct TunedEntry {
  // "gemm" | "decode_attention" | "prefill_attention" | "extend_attention" | "moe"
  std::string family;
  ShapeClass shape;
  // Knob -> value; the allowed knobs per family and their ranges live in
  // one place, tuning_db.cpp's kKnobs (docs/tuning.md lists them).
  std::map<std::string, int64_t> knobs;
  std::string cpu;      // runtime::cpu_signature() of the machine it was measured on
  std::string version;  // tuning_db_version() of the build that measured it
  // An entry of another CPU or build, as read (its JSON text): written back
  // unchanged and never applied. Its other fields are what could be read
  // (another build may have other families, knobs and fields).
  std::string verbatim;
  // What tune measured (medians over interleaved runs, microseconds): the
  // default plan, this entry's, and the noise (the larger median absolute
  // deviation); candidates: how many plans were timed.
  double default_us = 0, tuned_us = 0, noise_us = 0;
  int64_t candidates = 0;

  // "gemm:path=amx;n=4096;...": how dump, TILEJIT_VERBOSE and tune name it.
  std::string id() const { return family + ":" + shape.text(); }
  std::optional<int64_t> knob(const std::string& name) const;
};

// "splits=5 prefetch_chunks=4": knobs as the report, the main job and
// TILEJIT_VERBOSE print them ("" for none).
std::string knobs_text(const std::map<std::string, int64_t>& knobs);

// The plan overrides of a gemm entry (validated at load).
codegen::PlanOverrides gemm_overrides(const TunedEntry& e);

// The largest database file read (runtime::CappedFile): an entry is ~400
// bytes, so this holds ~150000 of them; /dev/zero stops here.
inline constexpr int64_t kMaxTuningDbBytes = int64_t(64) << 20;
// The JSON a database may hold, checked by a scan of the text before it is
// parsed (and of the text save writes): nesting (an entry's fields are 4
// levels deep; 16 leaves room for another build's fields) and objects,
// arrays and items (an entry has ~25: ~170000 entries, what 64 MiB of real
// entries hold). Without them a file of 10 MB of '[' or of 60 MB of tiny
// items cost GBs of memory to parse.
inline constexpr int kMaxTuningDbDepth = 16;
inline constexpr int64_t kMaxTuningDbValues = int64_t(1) << 22;

struct TuningDb {
  std::vector<TunedEntry> entries;  // in file order; id() unique per cpu and build

  // Reads a database file (at most kMaxTuningDbBytes; a FIFO, a device or a
  // directory is an Error, never a hang). A file that is not JSON, or an
  // entry of this CPU and build with a field missing or of the wrong type
  // or a knob not allowed, is an Error naming the file, the line and the
  // field. Entries of another CPU or build are kept verbatim, checked only
  // for being objects with string family, cpu and tilejit (tune --resume
  // rewrites them); current() is what the library applies.
  static TuningDb load(const std::string& path);
  // Writes the database to path (through a symbolic link: to its target).
  // Under an flock(2) on "<path>.lock" it reads the file again and merges:
  // entries another writer saved meanwhile are kept, this database's
  // replace those of the same id, machine and build (stale ones excepted:
  // the file's copy wins; a file that does not load as a database is
  // replaced). The text goes to a temporary file of its own
  // (mkstemp) renamed over path, so a reader (or a ^C) never sees half a
  // file and two tune processes never lose each other's entries.
  // The result is at most kMaxTuningDbBytes (indented while that fits, else
  // compact) within the structure bounds, or an Error before the file is
  // replaced: a save never leaves a file load refuses.
  void save(const std::string& path) const;
  // Adds or replaces the entry with e's id, machine and build.
  void put(TunedEntry e);
  const TunedEntry* find(const std::string& id) const;
  // Only the entries of this CPU and build; `stale` counts the others.
  TuningDb current(int64_t* stale = nullptr) const;
};

// Whether save(path) can write there: the lock file and a temporary file
// next to the target are made (and the temporary removed), as save makes
// them; an Error naming what failed (no directory, a read-only file
// system, a name too long). tune calls it before the first measurement.
void check_db_writable(const std::string& path);

// The build the entries are tied to (the disk cache's build id).
std::string tuning_db_version();
// Checks an entry's family, knobs and ranges (and, for gemm, that the plan
// takes them); throws Error naming the knob, value and what is allowed.
void validate_entry(const TunedEntry& e);

// The process-wide database: installed by load_tuning_db (or, on the first
// lookup, from TILEJIT_TUNING_DB); holds only current entries. `source`
// names it in the one TILEJIT_VERBOSE line ("": no line, for tune's
// per-sample installs).
void install_tuning_db(TuningDb db, const std::string& source);
// The entry for a shape class of a family, or nullptr. Cheap when no
// database is loaded (one atomic load). A returned entry is counted once
// in cache_stats().tuned_plans and logged once under TILEJIT_VERBOSE.
const TunedEntry* find_tuned(const std::string& family, const ShapeClass& shape);
// The plan overrides of the entry for a GEMM's shape class
// (gemm_shape_class; empty: none), answered from a per-thread table after
// the first call per shape and database: what tilejit::gemm asks on every
// call when a database is loaded. The reference is valid until this thread's
// next call.
const codegen::PlanOverrides& find_tuned_gemm(Isa path, int threads, int64_t n, int64_t k,
                                              codegen::BiasKind bias, Activation act, DType out,
                                              int64_t m, WeightFormat fmt = WeightFormat::bf16);
// Whether a database with entries is loaded (callers skip building shape
// classes when not): one atomic load after the first call.
bool tuning_db_active();
// Tuned entries applied so far in this process (CacheStats::tuned_plans).
uint64_t tuned_plans_used();

}  // namespace tilejit::jit
