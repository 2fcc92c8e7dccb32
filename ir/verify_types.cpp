// Every value's type is well formed: the rules are check_type()'s, stated once
// in types.cpp; here they are applied to each value and phrased per value.
#include "ir/text_util.h"
#include "ir/verify_rules.h"

namespace tilejit::ir {

void verify_types(const Function& f, std::vector<Diagnostic>& out) {
  for (size_t i = 0; i < f.values.size(); ++i) {
    const Value& v = f.values[i];
    std::vector<std::string> problems;
    check_type(v.type, problems);
    for (std::string& p : problems) {
      out.push_back(
          Diagnostic{cat("value %", v.name, ": ", v.type.str(), ": ", p), -1, static_cast<int>(i)});
    }
  }
}

}  // namespace tilejit::ir
