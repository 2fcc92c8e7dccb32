// The 64-byte AMX tile configuration (palette 1) as the LDTILECFG instruction reads it.
#pragma once

#include <array>
#include <cstdint>

namespace tilejit::codegen::xbyak {

struct AmxTileConfig {
  std::array<uint8_t, 64> bytes{};
  AmxTileConfig() { bytes[0] = 1; }  // palette 1; start_row 0; reserved bytes zero
  void set(int tile, int rows, int colsb) {
    bytes[16 + 2 * tile] = static_cast<uint8_t>(colsb & 0xff);
    bytes[17 + 2 * tile] = static_cast<uint8_t>(colsb >> 8);
    bytes[48 + tile] = static_cast<uint8_t>(rows);
  }
};

}  // namespace tilejit::codegen::xbyak
