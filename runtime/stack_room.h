// Work that needs more stack than an embedding host's thread may have: an
// LLVM compile takes 76-80 KiB of the calling thread's stack, and a thread
// made with a 64 KiB stack (musl's default is 128 KiB; some engines' pools use
// less), or a pool worker under a small `ulimit -s`, died by SIGSEGV inside
// LLVM. run_with_stack runs such work on the calling thread when its stack
// has room, else on a short-lived thread of its own with a large stack.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace tilejit::runtime {

// Bytes of stack left below the caller's frame on this thread; SIZE_MAX when
// that cannot be told.
size_t stack_room();

// Runs f here if stack_room() >= need, else (or when the room cannot be
// told: a fiber's stack) on a new thread with an 8 MiB stack, waiting for it
// without being cancellable; f's exception reaches the caller. A thread the
// system refuses is an Error naming `what` (e.g. "making kernel <name>") and
// what ran short.
void run_with_stack(size_t need, const std::function<void()>& f, const std::string& what = "");

}  // namespace tilejit::runtime
