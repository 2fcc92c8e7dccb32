// libFuzzer harness: the .npy reader of the `tilejit` tool (tools/npy.cpp),
// both entry points: parse_npy on the bytes in memory and read_npy on the
// same bytes as a file (the streaming reader behind `tilejit run -i`).
//
// The contract under test: any bytes give an NpyArray or a tilejit::Error;
// both readers agree (same array, or both refuse); an array read back from
// serialize_npy is the same array.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "tilejit/error.h"
#include "tools/npy.h"

namespace {

using tilejit::Error;
using tilejit::tools::NpyArray;

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "npy_fuzzer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

bool same(const NpyArray& a, const NpyArray& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.data == b.data;
}

// One scratch file per process, rewritten for every input.
const std::string& scratch_path() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    std::string p = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") +
                    "/tilejit_npy_fuzz_" + std::to_string(::getpid()) + ".npy";
    return p;
  }();
  return path;
}

void write_scratch(std::string_view bytes) {
  const int fd = ::open(scratch_path().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) fail("cannot create the scratch file", scratch_path());
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w <= 0) fail("cannot write the scratch file", scratch_path());
    done += static_cast<size_t>(w);
  }
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::optional<NpyArray> parsed, read;
  std::string parse_error, read_error;
  try {
    parsed = tilejit::tools::parse_npy(bytes, "fuzz.npy");
  } catch (const Error& e) {
    parse_error = e.what();
  }
  write_scratch(bytes);
  try {
    read = tilejit::tools::read_npy(scratch_path());
  } catch (const Error& e) {
    read_error = e.what();
  }
  if (parsed.has_value() != read.has_value())
    fail("parse_npy and read_npy disagree",
         "parse_npy: " + (parsed ? std::string("ok") : parse_error) +
             "\nread_npy: " + (read ? std::string("ok") : read_error));
  if (!parsed) return 0;
  if (!same(*parsed, *read)) fail("parse_npy and read_npy read different arrays", "");
  if (parsed->numel() * tilejit::tools::npy_item_bytes(parsed->dtype) !=
      static_cast<int64_t>(parsed->data.size()))
    fail("an accepted array's data does not match its shape", "");
  // Written back and read again: the same array.
  const std::string again = tilejit::tools::serialize_npy(*parsed);
  try {
    if (!same(tilejit::tools::parse_npy(again, "again.npy"), *parsed))
      fail("serialize_npy -> parse_npy changed the array", "");
  } catch (const Error& e) {
    fail("an array serialize_npy wrote does not parse", e.what());
  }
  return 0;
}
