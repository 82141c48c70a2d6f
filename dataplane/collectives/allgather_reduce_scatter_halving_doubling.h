// Halving-doubling all-gather (recursive doubling) and reduce-scatter (recursive halving) as
// schedules for CollectiveEngine, for a power-of-two number of ranks only (the engine runs the
// ring versions otherwise). Pure index math.
//
// The tensor is n blocks of `block` elements, block i belongs to rank i. Reduce-scatter step k
// (0 <= k < log2 n), distance d = n / 2^(k+1): rank r exchanges with r XOR d the two halves of
// the aligned group of 2d blocks that holds r: it sends the partner's half and adds the
// partner's contribution to its own half; after log2 n steps it holds the sum of block r. Each
// element is added in step order (a received sub-chunk waits for the earlier steps' receives on
// its elements), so the bits do not depend on timing. All-gather step k, distance d = 2^k: rank r
// sends the aligned group of d blocks it holds to r XOR d and copies the partner's group.
// Sub-chunks overlap across steps (kEarlierStepsCoveringRange): a send leaves as soon as the
// earlier receives into its elements are applied.
#pragma once

#include <cstdint>
#include <vector>

#include "dataplane/collectives/collective_engine.h"

namespace tributary::dataplane {

// Whether n is a power of two (>= 1): the sizes these schedules serve.
bool IsPowerOfTwo(int n);

// log2(n) steps; `block` elements per rank. n must be a power of two.
std::vector<ScheduleStep> HalvingDoublingAllGatherSchedule(uint64_t block, int n, int rank);
std::vector<ScheduleStep> HalvingDoublingReduceScatterSchedule(uint64_t block, int n, int rank);

}  // namespace tributary::dataplane
