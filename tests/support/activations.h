// Every activation, for the batteries that run each epilogue: read from the
// one table of them (ir/activation.h), so a new activation is tested by every
// battery that loops over these without touching the battery.
#pragma once

#include <vector>

#include "ir/activation.h"

namespace tilejit::testing_support {

// none included: the plain epilogue.
inline std::vector<Activation> all_activations() {
  std::vector<Activation> v;
  for (const ir::ActivationInfo& r : ir::kActivations) v.push_back(r.act);
  return v;
}

// Every activation but none.
inline std::vector<Activation> applied_activations() {
  std::vector<Activation> v;
  for (const ir::ActivationInfo& r : ir::kActivations)
    if (r.act != Activation::none) v.push_back(r.act);
  return v;
}

}  // namespace tilejit::testing_support
