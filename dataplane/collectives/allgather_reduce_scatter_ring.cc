#include "dataplane/collectives/allgather_reduce_scatter_ring.h"

namespace tributary::dataplane {
namespace {

// n - 1 steps around the ring; step s sends block send_block(s) and receives recv_block(s).
template <typename SendBlock, typename RecvBlock>
std::vector<ScheduleStep> RingSteps(uint64_t block, int n, int rank, ScheduleStep::Action action,
                                    SendBlock send_block, RecvBlock recv_block) {
  std::vector<ScheduleStep> steps;
  if (n <= 1) return steps;
  for (int s = 0; s < n - 1; ++s) {
    ScheduleStep step;
    step.send_peer = (rank + 1) % n;
    step.send_offset = send_block(s) * block;
    step.send_count = block;
    step.send_after =
        s == 0 ? ScheduleStep::SendAfter::kStart : ScheduleStep::SendAfter::kPrevStepSameChunk;
    step.recv_peer = (rank + n - 1) % n;
    step.recv_offset = recv_block(s) * block;
    step.recv_count = block;
    step.action = action;
    // Each block is received once per rank, never sent before it is received, and sent only in
    // the step after: nothing pending reads it, and its single addition keeps the order fixed.
    step.apply_early = true;
    steps.push_back(step);
  }
  return steps;
}

}  // namespace

std::vector<ScheduleStep> RingAllGatherSchedule(uint64_t block, int n, int rank) {
  const auto mod = [n](int64_t x) { return static_cast<uint64_t>(((x % n) + n) % n); };
  return RingSteps(
      block, n, rank, ScheduleStep::Action::kCopy, [&](int t) { return mod(rank - t); },
      [&](int t) { return mod(rank - t - 1); });
}

std::vector<ScheduleStep> RingReduceScatterSchedule(uint64_t block, int n, int rank) {
  const auto mod = [n](int64_t x) { return static_cast<uint64_t>(((x % n) + n) % n); };
  return RingSteps(
      block, n, rank, ScheduleStep::Action::kReduce, [&](int s) { return mod(rank - s - 1); },
      [&](int s) { return mod(rank - s - 2); });
}

}  // namespace tributary::dataplane
