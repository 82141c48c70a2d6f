#include "dataplane/collectives/allreduce_halving_doubling.h"

namespace tributary::dataplane {

std::vector<ScheduleStep> HalvingDoublingSchedule(uint64_t count, int n, int rank, bool pipelined) {
  std::vector<ScheduleStep> steps;
  if (n <= 1) return steps;
  const FoldLayout fold(n, rank);
  const int levels = fold.levels;
  const int p = fold.p;
  const int extra = fold.extra;
  const int new_rank = fold.new_rank;
  // Element range of blocks [lo, hi) of p.
  const auto range = [count, p](int lo, int hi) {
    const BlockRange a = GetBlock(count, p, lo);
    const BlockRange b = GetBlock(count, p, hi - 1);
    return BlockRange{a.offset, b.offset + b.count - a.offset};
  };
  const BlockRange all{0, count};
  // Pipelined: a sub-chunk waits only for the earlier receives into its own elements (sends:
  // those elements are final; receives: they are reduced in step order, and no earlier send of
  // them is still borrowed by the transport). Otherwise every step waits for the whole previous.
  const ScheduleStep::SendAfter after = pipelined
                                            ? ScheduleStep::SendAfter::kEarlierStepsCoveringRange
                                            : ScheduleStep::SendAfter::kAllPreviousSteps;
  steps.resize(2 * levels + 2);
  for (auto& s : steps) {
    s.send_after = after;
    s.apply_after = pipelined ? ScheduleStep::ApplyAfter::kEarlierStepsCoveringRange
                              : ScheduleStep::ApplyAfter::kAllPreviousSteps;
  }

  // Step 0: fold the extra ranks into their partners.
  if (rank < 2 * extra) {
    ScheduleStep& s = steps[0];
    if (rank % 2 == 0) {
      s.send_peer = rank + 1;
      s.send_offset = all.offset;
      s.send_count = all.count;
      s.send_after = ScheduleStep::SendAfter::kStart;
    } else {
      s.recv_peer = rank - 1;
      s.recv_offset = all.offset;
      s.recv_count = all.count;
      s.action = ScheduleStep::Action::kReduce;
    }
  }
  if (new_rank >= 0) {
    // Reduce-scatter: halve the range held, distance p/2 first.
    int lo = 0;
    int hi = p;
    for (int k = 0; k < levels; ++k) {
      const int mask = p >> (k + 1);
      const int mid = (lo + hi) / 2;
      const bool keep_low = (new_rank & mask) == 0;
      const BlockRange send = keep_low ? range(mid, hi) : range(lo, mid);
      if (keep_low) {
        hi = mid;
      } else {
        lo = mid;
      }
      const BlockRange keep = range(lo, hi);
      ScheduleStep& s = steps[1 + k];
      s.send_peer = s.recv_peer = fold.RealRank(new_rank ^ mask);
      s.send_offset = send.offset;
      s.send_count = send.count;
      s.recv_offset = keep.offset;
      s.recv_count = keep.count;
      s.action = ScheduleStep::Action::kReduce;
    }
    // All-gather: double the range held, distance 1 first. lo == new_rank here.
    for (int k = 0; k < levels; ++k) {
      const int size = 1 << k;
      const int mine = new_rank & ~(size - 1);
      const int partner = new_rank ^ size;
      const int theirs = partner & ~(size - 1);
      const BlockRange send = range(mine, mine + size);
      const BlockRange recv = range(theirs, theirs + size);
      ScheduleStep& s = steps[1 + levels + k];
      s.send_peer = s.recv_peer = fold.RealRank(partner);
      s.send_offset = send.offset;
      s.send_count = send.count;
      s.recv_offset = recv.offset;
      s.recv_count = recv.count;
      s.action = ScheduleStep::Action::kCopy;
    }
  }
  // Last step: hand the result back to the extra ranks.
  if (rank < 2 * extra) {
    ScheduleStep& s = steps.back();
    if (rank % 2 == 1) {
      s.send_peer = rank - 1;
      s.send_offset = all.offset;
      s.send_count = all.count;
    } else {
      s.recv_peer = rank + 1;
      s.recv_offset = all.offset;
      s.recv_count = all.count;
      s.action = ScheduleStep::Action::kCopy;
    }
  }
  return steps;
}

}  // namespace tributary::dataplane
