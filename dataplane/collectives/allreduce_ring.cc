#include "dataplane/collectives/allreduce_ring.h"

namespace tributary::dataplane {

std::vector<ScheduleStep> RingAllReduceSchedule(uint64_t count, int n, int rank) {
  std::vector<ScheduleStep> steps;
  if (n <= 1) return steps;
  const auto mod = [n](int64_t x) { return static_cast<uint64_t>(((x % n) + n) % n); };
  const int next = static_cast<int>(mod(rank + 1));
  const int prev = static_cast<int>(mod(rank - 1));
  for (int s = 0; s < 2 * (n - 1); ++s) {
    const bool gather = s >= n - 1;
    const int t = gather ? s - (n - 1) : s;
    const BlockRange send = GetBlock(count, n, gather ? mod(rank + 1 - t) : mod(rank - t));
    const BlockRange recv = GetBlock(count, n, gather ? mod(rank - t) : mod(rank - t - 1));
    ScheduleStep step;
    step.send_peer = next;
    step.send_offset = send.offset;
    step.send_count = send.count;
    step.send_after =
        s == 0 ? ScheduleStep::SendAfter::kStart : ScheduleStep::SendAfter::kPrevStepSameChunk;
    step.recv_peer = prev;
    step.recv_offset = recv.offset;
    step.recv_count = recv.count;
    step.action = gather ? ScheduleStep::Action::kCopy : ScheduleStep::Action::kReduce;
    // Each block is received once per rank and sent only in the step after: nothing pending
    // reads it, and its single addition keeps the order fixed.
    step.apply_early = true;
    steps.push_back(step);
  }
  return steps;
}

namespace {

// Rank's place after the root, in [0, n).
int BroadcastPosition(int rank, int root, int n) { return ((rank - root) % n + n) % n; }

// The step sends the whole buffer to `peer`.
void SendWhole(ScheduleStep& step, int peer, uint64_t count, ScheduleStep::SendAfter after) {
  step.send_peer = peer;
  step.send_offset = 0;
  step.send_count = count;
  step.send_after = after;
}

// The step receives the whole buffer from `peer`, copied over it.
void ReceiveWhole(ScheduleStep& step, int peer, uint64_t count) {
  step.recv_peer = peer;
  step.recv_offset = 0;
  step.recv_count = count;
  step.action = ScheduleStep::Action::kCopy;
}

}  // namespace

std::vector<ScheduleStep> RingBroadcastSchedule(uint64_t count, int n, int rank, int root) {
  std::vector<ScheduleStep> steps;
  if (n <= 1) return steps;
  const int position = BroadcastPosition(rank, root, n);
  ScheduleStep step;
  if (position < n - 1) {
    SendWhole(step, (rank + 1) % n, count,
              position == 0 ? ScheduleStep::SendAfter::kStart
                            : ScheduleStep::SendAfter::kThisStepSameChunk);
  }
  if (position > 0) ReceiveWhole(step, (rank + n - 1) % n, count);
  step.apply_early = true;
  steps.push_back(step);
  return steps;
}

std::vector<ScheduleStep> StarBroadcastSchedule(uint64_t count, int n, int rank, int root) {
  std::vector<ScheduleStep> steps;
  if (n <= 1) return steps;
  const int position = BroadcastPosition(rank, root, n);
  for (int s = 0; s < n - 1; ++s) {
    ScheduleStep step;
    if (position == 0) {
      SendWhole(step, (root + 1 + s) % n, count, ScheduleStep::SendAfter::kStart);
    } else if (position == s + 1) {
      ReceiveWhole(step, root, count);
    }
    step.apply_early = true;
    steps.push_back(step);
  }
  return steps;
}

}  // namespace tributary::dataplane
