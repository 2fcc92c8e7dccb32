// NumPy .npy files (format versions 1.0, 2.0 and 3.0), the array exchange
// format of `tilejit run`: little-endian, C order, dtypes <f4, <i4, |u1, |i1
// and <u2 (which carries bf16 bit patterns; see docs/tool.md).
//
//   NpyArray a = read_npy("x.npy");        // throws tilejit::Error "x.npy: ..."
//   write_npy("y.npy", a);
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tilejit::tools {

enum class NpyDtype { f4, i4, u1, i1, u2 };

// "<f4", "<i4", "|u1", "|i1", "<u2": the descr a written file carries.
const char* npy_descr(NpyDtype t);
int npy_item_bytes(NpyDtype t);

struct NpyArray {
  NpyDtype dtype = NpyDtype::f4;
  std::vector<int64_t> shape;  // () is a scalar
  std::vector<uint8_t> data;   // numel × item bytes, little-endian, C order

  int64_t numel() const;
};

// Throws tilejit::Error naming the file and what is wrong with it (bad magic,
// unsupported dtype or byte order, Fortran order, size not matching the header).
NpyArray read_npy(const std::string& path);
// Parses a whole .npy image held in memory; `name` is used in messages.
NpyArray parse_npy(std::string_view bytes, const std::string& name);
// Writes version 1.0 (2.0 when the header does not fit in 64 KiB).
void write_npy(const std::string& path, const NpyArray& a);
std::string serialize_npy(const NpyArray& a);

// Writes bytes to a file the user names (created or truncated, mode 0644):
// the tool's one writer of output files (`run --output`, `gen-npy`, `tune
// --save-workload`). A FIFO with no reader is an Error ("<path>: cannot
// create: a FIFO with no reader"), never a wait in open(2).
void write_output_file(const std::string& path, const std::string& bytes);

}  // namespace tilejit::tools
