// Batch-invariant mode (tilejit::set_batch_invariant): the one switch the
// operators read to choose kernels whose per-row (per-sequence) sums do not
// depend on the other rows of the call or on the thread count.
#pragma once

namespace tilejit::runtime {

// On or off: set_batch_invariant's value, else TILEJIT_BATCH_INVARIANT's
// (0 or 1; unset or empty: 0). A bad value is an Error naming it (raised by
// the first call that reads it, as with TILEJIT_NUM_THREADS).
bool batch_invariant();
void set_batch_invariant(bool on);

}  // namespace tilejit::runtime
