// The result of comparing a run's outputs with the scalar reference, element
// by element, each under its own bound.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tilejit::tools {

struct CheckReport {
  double max_abs = 0;  // max |got - ref|
  double max_rel = 0;  // max |got - ref| / max(|ref|, 1e-6)
  int64_t failures = 0;
  int64_t checked = 0;
  // The element with the largest error / tolerance ratio.
  double worst_ratio = -1;  // its ratio (a zero tolerance: 0 for no error, else ∞)
  std::vector<int64_t> worst_index;
  std::string worst_value;  // "%o": the result holding it, when several are compared
  double worst_got = 0, worst_ref = 0, worst_tol = 0;
  double worst_err = 0;   // its error as counted (0 for a matched infinity)
  std::string tolerance;  // the formula used, for the report
  std::string reference;  // what the outputs were compared with
  bool pass() const { return failures == 0; }

  // Counts one element: `got` against `want` under `tol` (a NaN error fails;
  // a non-finite `want` needs the same value: NaN, or the same infinity).
  // True when it is the new worst (got, ref and tol are then recorded): the
  // caller sets worst_index, and worst_value where several results are compared.
  bool add(double got, double want, double tol);
};

// The index of element `flat` of a C-order tensor of `shape` (a 0 dim counts as 1).
std::vector<int64_t> unflatten(int64_t flat, const std::vector<int64_t>& shape);

}  // namespace tilejit::tools
