// Recursive-doubling all-reduce as a schedule for CollectiveEngine: the latency-optimal
// all-reduce for small tensors (log2 n steps instead of ring's 2(n - 1) or halving-doubling's
// 2 log2 n), each step exchanging the whole tensor. Pure index math.
//
// With p = 2^floor(log2 n) and e = n - p extra ranks, ranks 0..2e-1 pair up (2i, 2i+1) exactly
// as in halving-doubling: in step 0 (the fold) rank 2i sends its whole buffer to 2i+1, which adds
// it, and rank 2i sits out until the last step, in which 2i+1 sends it the result. The p
// remaining ranks ("new rank" i for 2i+1, r - e for r >= 2e) then run log2(p) steps: in step k
// new rank j exchanges its whole buffer with new rank j ^ 2^k and adds what it receives.
//
// Every step sends the range it receives into, so a received sub-chunk is added only once this
// step's own send of those elements has completed (ApplyAfter::kThisAndEarlierStepsCoveringRange:
// the transport no longer reads them), and the next step's send of a sub-chunk leaves as soon as
// the earlier steps' receives into it are added (pipelined by sub-chunk). Bits: each addition has
// two operands, the partners add the same two values (x + y on one side, y + x on the other, and
// IEEE addition is commutative), so every rank ends with the same bits.
#pragma once

#include <cstdint>
#include <vector>

#include "dataplane/collectives/allreduce_halving_doubling.h"
#include "dataplane/collectives/collective_engine.h"

namespace tributary::dataplane {

// log2(p) + 2 steps (the fold steps are empty when n is a power of two; none for n == 1).
std::vector<ScheduleStep> RecursiveDoublingSchedule(uint64_t count, int n, int rank);

}  // namespace tributary::dataplane
