// Halving-doubling all-reduce (Rabenseifner: recursive-halving reduce-scatter, then
// recursive-doubling all-gather) as a schedule for CollectiveEngine. Pure index math.
//
// With p = 2^floor(log2 n) and e = n - p extra ranks, ranks 0..2e-1 pair up (2i, 2i+1): in step
// 0 (the fold) rank 2i sends its whole buffer to 2i+1, which adds it, and rank 2i sits out until
// the last step, in which 2i+1 sends it the result. The p remaining ranks ("new rank" i for 2i+1,
// r - e for r >= 2e) run log2(p) reduce-scatter steps over p near-equal blocks (distance p/2
// first: exchange halves of the current range, keep the lower half when the distance bit is
// clear), ending with block "new rank", then log2(p) all-gather steps in the reverse order.
// 2·log2(p) + 2 steps in all (the fold steps are empty when n is a power of two).
//
// Pipelined (the default), the steps overlap sub-chunk by sub-chunk: a send sub-chunk leaves as
// soon as the earlier steps' receives into its elements are applied, and a received sub-chunk is
// applied as soon as the earlier steps' receives into its elements are (kEarlierStepsCoveringRange
// for both). Which earlier steps write into an element: at a folding partner 2i+1 the fold (step
// 0) and every reduce-scatter step that kept it, then the all-gather step that brought it back if
// it was given away; at a rank that folded (2i), nothing but the last step. The range rule finds
// them by overlap, whatever the sub-chunk boundaries of each step. Each element is still reduced
// in step order on every rank, so the result has the same bits as the non-pipelined schedule
// (every step after the whole previous one: kAllPreviousSteps), which is kept for comparison; the
// messages are the same in both.
#pragma once

#include <cstdint>
#include <vector>

#include "dataplane/collectives/collective_engine.h"

namespace tributary::dataplane {

// The fold both halving-doubling and recursive doubling use: p = 2^levels = 2^floor(log2 n),
// extra = n - p; ranks 2i < 2·extra fold into 2i+1 ("new rank" i, new_rank -1 for 2i), ranks
// r >= 2·extra are new rank r - extra.
struct FoldLayout {
  int levels = 0;
  int p = 1;
  int extra = 0;
  int new_rank = -1;

  FoldLayout(int n, int rank) {
    while ((2 << levels) <= n) ++levels;
    p = 1 << levels;
    extra = n - p;
    new_rank = rank < 2 * extra ? (rank % 2 == 1 ? rank / 2 : -1) : rank - extra;
  }
  // The rank of new rank `nr`.
  int RealRank(int nr) const { return nr < extra ? 2 * nr + 1 : nr + extra; }
};

std::vector<ScheduleStep> HalvingDoublingSchedule(uint64_t count, int n, int rank,
                                                  bool pipelined = true);

}  // namespace tributary::dataplane
