// One home for a rule of docs/reliability.md ("Resources"): a public call
// whose memory or threads the system refuses raises tilejit::Error naming
// the call, never std::bad_alloc or std::system_error (an engine catches
// tilejit::Error around our calls; the std ones escaped as "unknown" aborts).
#pragma once

#include <new>
#include <string>
#include <system_error>

#include "runtime/lazy_statics.h"
#include "tilejit/error.h"

namespace tilejit::runtime {

template <class F>
decltype(auto) api_guard(const char* op, F&& body) {
  mark_library_used();  // the fork handlers complete its lazy statics from now on
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
