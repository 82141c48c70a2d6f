#include "dataplane/collectives/allreduce_recursive_doubling.h"

namespace tributary::dataplane {

std::vector<ScheduleStep> RecursiveDoublingSchedule(uint64_t count, int n, int rank) {
  std::vector<ScheduleStep> steps;
  if (n <= 1) return steps;
  const FoldLayout fold(n, rank);
  const int levels = fold.levels;
  const int extra = fold.extra;
  steps.resize(levels + 2);
  for (auto& s : steps) {
    s.send_after = ScheduleStep::SendAfter::kEarlierStepsCoveringRange;
    s.apply_after = ScheduleStep::ApplyAfter::kThisAndEarlierStepsCoveringRange;
  }
  const auto whole_send = [count](ScheduleStep& s, int peer) {
    s.send_peer = peer;
    s.send_offset = 0;
    s.send_count = count;
  };
  const auto whole_recv = [count](ScheduleStep& s, int peer, ScheduleStep::Action action) {
    s.recv_peer = peer;
    s.recv_offset = 0;
    s.recv_count = count;
    s.action = action;
  };
  // Step 0: fold the extra ranks into their partners.
  if (rank < 2 * extra) {
    if (rank % 2 == 0) {
      whole_send(steps[0], rank + 1);
      steps[0].send_after = ScheduleStep::SendAfter::kStart;
    } else {
      whole_recv(steps[0], rank - 1, ScheduleStep::Action::kReduce);
    }
  }
  if (fold.new_rank >= 0) {
    for (int k = 0; k < levels; ++k) {
      const int partner = fold.RealRank(fold.new_rank ^ (1 << k));
      whole_send(steps[1 + k], partner);
      whole_recv(steps[1 + k], partner, ScheduleStep::Action::kReduce);
    }
  }
  // Last step: hand the result back to the extra ranks.
  if (rank < 2 * extra) {
    if (rank % 2 == 1) {
      whole_send(steps.back(), rank - 1);
    } else {
      whole_recv(steps.back(), rank + 1, ScheduleStep::Action::kCopy);
    }
  }
  return steps;
}

}  // namespace tributary::dataplane
