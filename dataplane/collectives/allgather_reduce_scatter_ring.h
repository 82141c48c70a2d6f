// Ring all-gather and ring reduce-scatter as schedules for CollectiveEngine: the two halves of
// the ring all-reduce (allreduce_ring.h), each on its own, with the block of rank r at its own
// place. Pure index math.
//
// The tensor is n blocks of `block` elements, block i = [i·block, (i+1)·block) belongs to rank i.
// All-gather step t (0 <= t < n-1): rank r sends block (r - t) mod n to r + 1 and copies block
// (r - t - 1) mod n from r - 1; after n - 1 steps every rank holds every block. Reduce-scatter
// step s: rank r sends block (r - s - 1) mod n to r + 1 and adds block (r - s - 2) mod n from
// r - 1; after n - 1 steps rank r holds the full sum of its own block r (each element added once
// per rank in a fixed order: the bits do not depend on timing). Every step after the first sends
// what the previous one received, so the engine forwards sub-chunk c as soon as it has it: both
// are pipelined at sub-chunk granularity. n == 1: no steps.
#pragma once

#include <cstdint>
#include <vector>

#include "dataplane/collectives/collective_engine.h"

namespace tributary::dataplane {

// n - 1 steps; `block` elements per rank.
std::vector<ScheduleStep> RingAllGatherSchedule(uint64_t block, int n, int rank);
std::vector<ScheduleStep> RingReduceScatterSchedule(uint64_t block, int n, int rank);

}  // namespace tributary::dataplane
