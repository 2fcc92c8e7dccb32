// One home for a rule of docs/reliability.md ("Resources"): a public call
// whose memory or threads the system refuses raises tilejit::Error naming
// the call, never std::bad_alloc or std::system_error (an engine catches
// tilejit::Error around our calls; the std ones escaped as "unknown" aborts).
#pragma once

#include <cstddef>
#include <new>
#include <string>
#include <system_error>

#include "runtime/lazy_statics.h"
#include "runtime/no_cancel.h"
#include "runtime/stack_room.h"
#include "tilejit/error.h"

namespace tilejit::runtime {

// The stack a call needs on the calling thread (24-32 KiB measured, cold or
// warm, every operator family; making a kernel moves to a thread of its own,
// runtime/stack_room.h). With less left the call is refused rather than run
// into the guard page.
inline constexpr size_t kCallStackBytes = size_t{32} << 10;

template <class F>
decltype(auto) api_guard(const char* op, F&& body) {
  const NoCancelScope no_cancel;  // the call's waits are no cancellation points
  mark_library_used();            // the fork handlers complete its lazy statics from now on
  if (const size_t room = stack_room(); room < kCallStackBytes)
    throw Error(std::string(op) + ": the calling thread has " + std::to_string(room >> 10) +
                " KiB of stack left; a call needs " + std::to_string(kCallStackBytes >> 10) +
                " KiB");
  try {
    return body();
  } catch (const std::bad_alloc&) {
    throw Error(std::string(op) +
                ": out of memory: an allocation failed (the call needs more memory than the "
                "process can get)");
  } catch (const std::system_error& e) {
    throw Error(std::string(op) + ": the system refused a resource: " + e.what());
  }
}

}  // namespace tilejit::runtime
