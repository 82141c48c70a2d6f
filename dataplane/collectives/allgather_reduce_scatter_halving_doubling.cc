#include "dataplane/collectives/allgather_reduce_scatter_halving_doubling.h"

namespace tributary::dataplane {

bool IsPowerOfTwo(int n) { return n >= 1 && (n & (n - 1)) == 0; }

std::vector<ScheduleStep> HalvingDoublingAllGatherSchedule(uint64_t block, int n, int rank) {
  std::vector<ScheduleStep> steps;
  if (!IsPowerOfTwo(n) || n == 1) return steps;
  for (int d = 1; d < n; d *= 2) {
    const int partner = rank ^ d;
    ScheduleStep step;
    step.send_peer = partner;
    step.send_offset = static_cast<uint64_t>(rank & ~(d - 1)) * block;
    step.send_count = static_cast<uint64_t>(d) * block;
    step.send_after = d == 1 ? ScheduleStep::SendAfter::kStart
                             : ScheduleStep::SendAfter::kEarlierStepsCoveringRange;
    step.recv_peer = partner;
    step.recv_offset = static_cast<uint64_t>(partner & ~(d - 1)) * block;
    step.recv_count = static_cast<uint64_t>(d) * block;
    step.action = ScheduleStep::Action::kCopy;
    // The partner's group is written once and was never sent by this rank.
    step.apply_early = true;
    steps.push_back(step);
  }
  return steps;
}

std::vector<ScheduleStep> HalvingDoublingReduceScatterSchedule(uint64_t block, int n, int rank) {
  std::vector<ScheduleStep> steps;
  if (!IsPowerOfTwo(n) || n == 1) return steps;
  for (int d = n / 2; d >= 1; d /= 2) {
    const int partner = rank ^ d;
    const int base = rank & ~(2 * d - 1);  // first block of the group of 2d being split
    ScheduleStep step;
    step.send_peer = partner;
    step.send_offset = static_cast<uint64_t>(base + (partner & d)) * block;
    step.send_count = static_cast<uint64_t>(d) * block;
    step.send_after = d == n / 2 ? ScheduleStep::SendAfter::kStart
                                 : ScheduleStep::SendAfter::kEarlierStepsCoveringRange;
    step.recv_peer = partner;
    step.recv_offset = static_cast<uint64_t>(base + (rank & d)) * block;
    step.recv_count = static_cast<uint64_t>(d) * block;
    step.action = ScheduleStep::Action::kReduce;
    step.apply_after = ScheduleStep::ApplyAfter::kEarlierStepsCoveringRange;
    steps.push_back(step);
  }
  return steps;
}

}  // namespace tributary::dataplane
