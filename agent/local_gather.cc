#include "agent/local_gather.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace tributary::agent {
namespace {

constexpr auto Log = common::ComponentLog<"agent">;

std::string What(const GatherKey& key) {
  return absl::StrCat("job '", key.job_id, "' tensor '", key.tensor, "'");
}

}  // namespace

absl::StatusOr<dataplane::Reduction> ToReduction(tributary::v1::CollectiveOp op) {
  switch (op) {
    case tributary::v1::COLLECTIVE_OP_SUM:
      return dataplane::Reduction::kSum;
    case tributary::v1::COLLECTIVE_OP_AVERAGE:
      return dataplane::Reduction::kAverage;
    case tributary::v1::COLLECTIVE_OP_BROADCAST:
      return dataplane::Reduction::kBroadcast;
    case tributary::v1::COLLECTIVE_OP_ALLGATHER:
      return dataplane::Reduction::kAllGather;
    case tributary::v1::COLLECTIVE_OP_REDUCE_SCATTER_SUM:
      return dataplane::Reduction::kReduceScatterSum;
    case tributary::v1::COLLECTIVE_OP_REDUCE_SCATTER_AVERAGE:
      return dataplane::Reduction::kReduceScatterAverage;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown op ", static_cast<int>(op)));
  }
}

std::string Submission::Describe() const {
  std::string s = absl::StrCat(count, dataplane::IsBlockwise(reduction) ? " per process x " : " x ",
                               std::string(common::DataTypeName(dtype)), " ",
                               std::string(dataplane::ReductionName(reduction)));
  if (reduction == dataplane::Reduction::kBroadcast) absl::StrAppend(&s, " from rank ", root);
  return s;
}

bool Submission::Agrees(const Submission& o) const {
  return count == o.count && dtype == o.dtype && reduction == o.reduction &&
         (reduction != dataplane::Reduction::kBroadcast || root == o.root);
}

LocalGather::LocalGather(CollectiveRunner* runner, const common::Clock* clock)
    : runner_(runner), clock_(clock) {}

void LocalGather::Add(const LocalJob& job, const GatherKey& key, Submission sub, Deferred& after) {
  auto& gather = gathers_[key];
  if (!gather) {
    gather = std::make_unique<Gather>();
    gather->job = job;
    gather->slots.resize(job.procs_per_node);
    gather->created = clock_->Now();
  }
  const uint32_t rank = sub.local_rank;
  gather->slots[rank] = std::move(sub);
  if (++gather->filled < job.procs_per_node) {
    // A rank whose process already left will never submit: fail now, not at the deadline.
    for (const auto& [departed, why] : departed_[key.job_id]) {
      if (departed < gather->slots.size() && !gather->slots[departed]) {
        Fail(key, *gather,
             absl::AbortedError(absl::StrCat(What(key), " iteration ", key.iteration,
                                             ": local rank ", departed, " ended (", why,
                                             ") and cannot submit it")),
             after);
        gathers_.erase(key);
        break;
      }
    }
    return;
  }
  std::unique_ptr<Gather> full = std::move(gather);
  gathers_.erase(key);
  Complete(key, std::move(full), after);
}

void LocalGather::Complete(const GatherKey& key, std::unique_ptr<Gather> gather, Deferred& after) {
  const Submission& first = *gather->slots[0];
  for (const auto& slot : gather->slots) {
    if (!slot->Agrees(first)) {
      Fail(key, *gather,
           absl::InvalidArgumentError(absl::StrCat(What(key), " iteration ", key.iteration,
                                                   ": local rank 0 submitted ", first.Describe(),
                                                   " but local rank ", slot->local_rank,
                                                   " submitted ", slot->Describe())),
           after);
      return;  // the error travels through every handle
    }
  }
  const uint32_t procs = gather->job.procs_per_node;
  dataplane::Operation op;
  op.tensor_name = key.tensor;
  op.iteration = key.iteration;
  op.dtype = first.dtype;
  op.count = first.count;
  op.reduction = first.reduction;
  op.root_node = first.root / procs;
  op.root_local = first.root % procs;
  op.priority = first.priority;
  auto mappings = std::make_shared<std::vector<std::shared_ptr<SharedMemoryMapping>>>();
  std::vector<std::shared_ptr<OpHandle>> handles;
  for (const auto& slot : gather->slots) {
    op.buffers.push_back(slot->mapping->data() + slot->offset);
    op.priority = std::min(op.priority, slot->priority);
    mappings->push_back(slot->mapping);
    handles.push_back(slot->handle);
  }
  op.keepalive = mappings;
  op.done = [handles](absl::Status s) {
    for (const auto& h : handles) h->Complete(s);
  };
  after.Add([runner = runner_, job_id = key.job_id, op = std::move(op), handles]() mutable {
    const std::string tensor = op.tensor_name;
    const uint64_t iteration = op.iteration;
    absl::Status started = runner->Start(job_id, std::move(op));
    if (!started.ok()) {
      for (const auto& h : handles) h->Complete(started);
      runner->Abort(job_id, tensor, iteration, started);
    }
  });
}

void LocalGather::Fail(const GatherKey& key, Gather& gather, const absl::Status& status,
                       Deferred& after) {
  Log()->warn("{}", status.message());
  for (auto& slot : gather.slots) {
    if (slot) after.Add([h = slot->handle, status] { h->Complete(status); });
  }
  after.Add([runner = runner_, key, status] {
    runner->Abort(key.job_id, key.tensor, key.iteration, status);
  });
}

void LocalGather::RankEnded(const std::string& job_id, uint32_t rank, const std::string& why,
                            Deferred& after) {
  departed_[job_id][rank] = why;
  // Gathers that still wait for this rank can never complete.
  for (auto g = gathers_.begin(); g != gathers_.end();) {
    if (g->first.job_id == job_id && rank < g->second->slots.size() && !g->second->slots[rank]) {
      const GatherKey key = g->first;
      Fail(key, *g->second,
           absl::AbortedError(absl::StrCat(What(key), " iteration ", key.iteration, ": local rank ",
                                           rank, " ended (", why, ") before submitting it")),
           after);
      g = gathers_.erase(g);
    } else {
      ++g;
    }
  }
}

void LocalGather::RankJoined(const std::string& job_id, uint32_t rank) {
  departed_[job_id].erase(rank);
}

void LocalGather::Expire(common::Clock::TimePoint now, Deferred& after) {
  for (auto g = gathers_.begin(); g != gathers_.end();) {
    Gather& gather = *g->second;
    if (now - gather.created < gather.job.op_timeout) {
      ++g;
      continue;
    }
    std::vector<uint32_t> missing;
    for (uint32_t r = 0; r < gather.slots.size(); ++r) {
      if (!gather.slots[r]) missing.push_back(r);
    }
    Fail(g->first, gather,
         absl::DeadlineExceededError(
             absl::StrCat("job '", g->first.job_id, "' tensor '", g->first.tensor, "' iteration ",
                          g->first.iteration, ": local ranks [", absl::StrJoin(missing, ","),
                          "] did not submit it within ", gather.job.op_timeout.count(), " ms")),
         after);
    g = gathers_.erase(g);
  }
}

}  // namespace tributary::agent
