// A one-entry tuning database of this CPU and build, installed for the
// lifetime of the object: how the operator tests run a tuned plan
// (docs/tuning.md) without a file.
#pragma once

#include <map>
#include <string>
#include <utility>

#include "jit/tuning_db.h"
#include "runtime/cpu_features.h"

namespace tilejit::test {

class TunedEntryScope {
 public:
  TunedEntryScope(std::string family, jit::ShapeClass shape, std::map<std::string, int64_t> knobs) {
    jit::TunedEntry e;
    e.family = std::move(family);
    e.shape = std::move(shape);
    e.knobs = std::move(knobs);
    e.cpu = runtime::cpu_signature();
    e.version = jit::tuning_db_version();
    jit::validate_entry(e);
    jit::TuningDb db;
    db.put(std::move(e));
    jit::install_tuning_db(std::move(db), "");
  }
  ~TunedEntryScope() { jit::install_tuning_db({}, ""); }
  TunedEntryScope(const TunedEntryScope&) = delete;
  TunedEntryScope& operator=(const TunedEntryScope&) = delete;
};

}  // namespace tilejit::test
