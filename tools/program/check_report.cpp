#include "tools/program/check_report.h"

#include <algorithm>
#include <cmath>

namespace tilejit::tools {

bool CheckReport::add(double got, double want, double tol) {
  // A reference of ±Inf or NaN is matched exactly (every path gives the same
  // non-finite outputs, docs/reliability.md): its bound, which sums |x·w|,
  // is infinite too and would pass any value.
  double err = std::fabs(got - want);
  if (!std::isfinite(want))
    err = (std::isnan(want) ? std::isnan(got) : got == want) ? 0.0 : INFINITY;
  else if (std::isnan(err))
    err = INFINITY;
  ++checked;
  // A non-finite reference matched exactly passes whatever its bound (a NaN
  // input makes the bound NaN too: the NaN output it predicts failed).
  const bool matched = !std::isfinite(want) && err == 0;
  const bool failed =
      !(matched || (std::isfinite(err) && err <= tol));  // infinite: fails any bound
  if (failed) ++failures;
  max_abs = std::max(max_abs, err);
  max_rel = std::max(max_rel, err / std::max(std::fabs(want), 1e-6));
  // A failing element is always worse than a passing one (a NaN bound made
  // the ratio NaN, and the report named a passing element beside its FAIL).
  const double ratio = failed ? INFINITY : tol > 0 ? err / tol : 0.0;
  if (!(ratio > worst_ratio)) return false;
  worst_ratio = ratio;
  worst_err = err;
  worst_got = got;
  worst_ref = want;
  worst_tol = tol;
  return true;
}

std::vector<int64_t> unflatten(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    const int64_t sz = std::max<int64_t>(1, shape[d]);
    idx[d] = flat % sz;
    flat /= sz;
  }
  return idx;
}

}  // namespace tilejit::tools
