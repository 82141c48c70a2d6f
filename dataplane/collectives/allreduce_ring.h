// Ring all-reduce (reduce-scatter + all-gather), ring (chain) broadcast and star broadcast as
// schedules for CollectiveEngine. Pure index math.
//
// All-reduce over n ranks splits the tensor into n near-equal blocks (empty ones when count < n).
// Reduce-scatter step s (0 <= s < n-1): rank r sends block (r - s) mod n to r + 1 and adds block
// (r - s - 1) mod n from r - 1; after it rank r owns the full sum of block (r + 1) mod n.
// All-gather step t: rank r sends block (r + 1 - t) mod n to r + 1 and copies block (r - t) mod n
// from r - 1. Every step sends what the previous step received, so the engine forwards sub-chunk
// c of a block as soon as it has summed it: the ring is pipelined at sub-chunk granularity. Each
// element is summed once per rank in a fixed order, so the result is deterministic and identical
// on every rank.
#pragma once

#include <cstdint>
#include <vector>

#include "dataplane/collectives/collective_engine.h"

namespace tributary::dataplane {

// 2(n - 1) steps (none for n == 1).
std::vector<ScheduleStep> RingAllReduceSchedule(uint64_t count, int n, int rank);

// One step along the chain root, root + 1, ..., root - 1: each rank forwards sub-chunk c to its
// successor once it has it (none for n == 1).
std::vector<ScheduleStep> RingBroadcastSchedule(uint64_t count, int n, int rank, int root);

// n - 1 steps: in step s the root sends the whole buffer to rank root + 1 + s, which receives it
// there; nobody forwards (none for n == 1). For small control messages (the agent's tensor fusion
// decisions): every rank is one hop from the root, and a rank that posts late delays nobody else
// (the root's message waits in its early buffer), where the chain puts n - 1 hops, each waiting
// for its rank to post, between the root and the last rank.
std::vector<ScheduleStep> StarBroadcastSchedule(uint64_t count, int n, int rank, int root);

}  // namespace tributary::dataplane
