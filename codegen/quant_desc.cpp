#include "codegen/quant_desc.h"

namespace tilejit::codegen {

const char* act_quant_mode_name(ActQuantMode m) {
  switch (m) {
    case ActQuantMode::sym:
      return "sym";
    case ActQuantMode::asym:
      return "asym";
    case ActQuantMode::fixed:
      return "fixed";
  }
  return "?";
}

}  // namespace tilejit::codegen
