#include "dataplane/collectives/operation.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "dataplane/collectives/job_view.h"

namespace tributary::dataplane {

std::string_view ReductionName(Reduction r) {
  switch (r) {
    case Reduction::kSum:
      return "sum";
    case Reduction::kAverage:
      return "average";
    case Reduction::kBroadcast:
      return "broadcast";
    case Reduction::kAllGather:
      return "allgather";
    case Reduction::kReduceScatterSum:
      return "reduce_scatter_sum";
    case Reduction::kReduceScatterAverage:
      return "reduce_scatter_average";
    case Reduction::kPsInit:
      return "init_params";
    case Reduction::kPsDelta:
      return "push_delta";
    case Reduction::kPsPull:
      return "pull_params";
  }
  return "unknown";
}

bool IsValidReduction(uint32_t raw) { return raw >= 1 && raw <= 9; }

bool IsParameterServer(Reduction r) {
  return r == Reduction::kPsInit || r == Reduction::kPsDelta || r == Reduction::kPsPull;
}

bool IsBlockwise(Reduction r) { return r == Reduction::kAllGather || IsReduceScatter(r); }

bool IsReduceScatter(Reduction r) {
  return r == Reduction::kReduceScatterSum || r == Reduction::kReduceScatterAverage;
}

absl::Status PlanChangedError(absl::string_view job_id, uint64_t from, uint64_t to,
                              absl::string_view what) {
  return WithEpoch(
      absl::UnavailableError(absl::StrCat("plan of job ", job_id, " changed from v", from, " to v",
                                          to, " during ", what, "; retry")),
      from);
}

absl::Status WithEpoch(absl::Status status, uint64_t epoch) {
  if (!status.ok()) status.SetPayload(kEpochPayloadUrl, absl::Cord(absl::StrCat(epoch)));
  return status;
}

std::optional<uint64_t> EpochOf(const absl::Status& status) {
  auto payload = status.GetPayload(kEpochPayloadUrl);
  uint64_t epoch = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &epoch)) return std::nullopt;
  return epoch;
}

void StagedInput::Advance(uint64_t ready) {
  ready = std::min(ready, bytes_);
  uint64_t before = ready_.load(std::memory_order_relaxed);
  while (before < ready && !ready_.compare_exchange_weak(before, ready, std::memory_order_release,
                                                         std::memory_order_relaxed)) {
  }
}

void StagedInput::SetFinalSink(std::function<void(uint64_t, uint64_t)> sink) {
  sink_ = std::move(sink);
}

void StagedInput::Final(uint64_t offset, uint64_t bytes) const {
  if (sink_) sink_(offset, bytes);
}

uint64_t JobView::job_hash() const { return common::StableHash64(job_id); }

}  // namespace tributary::dataplane
