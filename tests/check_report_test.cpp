// The `tilejit run --check` comparison (tools/program/check_report.h): one
// element at a time against the reference under its bound.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tools/program/check_report.h"

namespace tilejit::tools {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool passes(double got, double want, double tol) {
  CheckReport r;
  r.add(got, want, tol);
  return r.pass();
}

TEST(CheckReport, FiniteElementsAgainstTheirBound) {
  EXPECT_TRUE(passes(1.0, 1.5, 0.5));
  EXPECT_FALSE(passes(1.0, 1.5, 0.25));
  EXPECT_FALSE(passes(kNaN, 1.5, 1e30));
  EXPECT_FALSE(passes(kInf, 1.5, 1e30));
}

// A reference of ±Inf (an input holding an infinity) comes with an infinite
// bound (it sums |x·w|): the output must be that infinity, not any value. A
// forged kernel writing 0 there passed, and the honest run reported a max
// abs error of inf beside its PASS.
TEST(CheckReport, NonFiniteReferencesAreMatchedExactly) {
  EXPECT_TRUE(passes(-kInf, -kInf, kInf));
  EXPECT_FALSE(passes(0.0, -kInf, kInf));
  EXPECT_FALSE(passes(kInf, -kInf, kInf));
  EXPECT_FALSE(passes(kNaN, kInf, kInf));
  EXPECT_TRUE(passes(kNaN, kNaN, kInf));
  EXPECT_FALSE(passes(0.0, kNaN, kInf));
  // A NaN input makes the bound NaN as well (|x·w| of a NaN): the NaN output
  // it predicts passes (it FAILed: err 0 <= NaN is false), any other fails.
  EXPECT_TRUE(passes(kNaN, kNaN, kNaN));
  EXPECT_FALSE(passes(0.0, kNaN, kNaN));
  EXPECT_FALSE(passes(1.0, 1.0, kNaN));
  // The worst element of a FAIL is a failing one (a NaN bound's ratio is
  // NaN: the report named a passing element beside its FAIL).
  CheckReport w;
  w.add(1.0, 1.1, 0.2);   // passes, err/tol 0.5
  w.add(1.0, 1.0, kNaN);  // fails
  EXPECT_EQ(w.failures, 1);
  EXPECT_TRUE(std::isnan(w.worst_tol));
  CheckReport r;
  r.add(kInf, kInf, kInf);
  r.add(2.0, 2.0, 0.1);
  EXPECT_TRUE(r.pass());
  EXPECT_EQ(r.max_abs, 0.0);
  EXPECT_EQ(r.max_rel, 0.0);
  r.add(1.0, 1.0, 0.5);
  r.add(0.0, -kInf, kInf);  // the mismatch is the worst element
  EXPECT_EQ(r.failures, 1);
  EXPECT_EQ(r.worst_ref, -kInf);
  EXPECT_EQ(r.worst_err, kInf);
}

}  // namespace
}  // namespace tilejit::tools
