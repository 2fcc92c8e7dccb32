// The inside of a PackedWeight: the layout tag and the packed bytes.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "codegen/packed_layout.h"
#include "runtime/aligned_buffer.h"
#include "tilejit/tilejit.h"

namespace tilejit {

struct PackedWeight::Impl {
  // The tag a gemm checks before reading the bytes: format + block parameters.
  static constexpr const char* kLayoutName = "bf16_vnni2_n64k32";
  std::string layout_name = kLayoutName;
  DType dtype = DType::bf16;
  codegen::PackedLayout layout;
  std::unique_ptr<std::byte[], runtime::FreeDeleter> data;

  const uint16_t* bf16() const { return reinterpret_cast<const uint16_t*>(data.get()); }
};

}  // namespace tilejit
