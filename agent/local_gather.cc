#include "agent/local_gather.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/cuda_buffer.h"
#include "common/logging.h"
#include "dataplane/collectives/operation.h"

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
    case tributary::v1::COLLECTIVE_OP_PS_INIT:
      return dataplane::Reduction::kPsInit;
    case tributary::v1::COLLECTIVE_OP_PS_PUSH_DELTA:
      return dataplane::Reduction::kPsDelta;
    case tributary::v1::COLLECTIVE_OP_PS_PULL:
      return dataplane::Reduction::kPsPull;
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

absl::Status MarkRetriable(const absl::Status& status, uint64_t epoch) {
  if (absl::StartsWith(status.message(), kRetriableMarker)) return status;
  return dataplane::WithEpoch(
      absl::Status(status.code(), absl::StrCat(kRetriableMarker, epoch, "] ", status.message())),
      epoch);
}

LocalGather::LocalGather(CollectiveRunner* runner, const common::Clock* clock,
                         std::shared_ptr<MirrorStager> stager)
    : runner_(runner),
      clock_(clock),
      stager_(stager != nullptr ? std::move(stager) : std::make_shared<MirrorStager>()),
      gpu_ops_factory_(MakeDeviceGpuOps) {}

std::shared_ptr<GpuAggregationSlot> LocalGather::GpuSlot(const GatherKey& key,
                                                         const Gather& gather) {
  // Sums and averages whose every buffer is GPU memory (a GPU buffer's region is `count`
  // elements, like every agreeing submission's).
  const dataplane::Reduction reduction = gather.slots[0]->reduction;
  if (gather.job.intra_node == nullptr || gather.slots.size() < 2 ||
      (reduction != dataplane::Reduction::kSum && reduction != dataplane::Reduction::kAverage)) {
    return nullptr;
  }
  std::vector<int> devices;
  for (const auto& slot : gather.slots) {
    const MirroredMemory* mirror = slot->mapping->mirror();
    if (mirror == nullptr || mirror->device_data() == nullptr) return nullptr;
    devices.push_back(mirror->device());
  }
  auto& [version, gpu] = gpu_slots_[key.job_id];
  if (gpu == nullptr || version != gather.job.plan_version || gpu->devices() != devices) {
    version = gather.job.plan_version;
    gpu = std::make_shared<GpuAggregationSlot>(key.job_id, gather.job.intra_node,
                                               std::move(devices), gpu_ops_factory_);
  }
  return gpu;
}

void LocalGather::Add(const LocalJob& job, const GatherKey& key, Submission sub, Deferred& after) {
  auto& gather = gathers_[key];
  if (!gather) {
    gather = std::make_unique<Gather>();
    gather->slots.resize(job.procs_per_node);
    gather->created = clock_->Now();
  }
  gather->job = job;  // the newest plan seen by a submission
  if (sub.retry_of_epoch) {
    gather->retry_of_epoch = std::max(gather->retry_of_epoch.value_or(0), *sub.retry_of_epoch);
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
  if (gather->retry_of_epoch && gather->job.plan_version <= *gather->retry_of_epoch) {
    // A resubmission of an iteration that failed under this plan: it runs on a newer one.
    Log()->info("{} iteration {} waits for a plan newer than v{} to run again", What(key),
                key.iteration, *gather->retry_of_epoch);
    gather->created = clock_->Now();
    waiting_[key] = std::move(gather);
    return;
  }
  Start(key, std::move(gather), after);
}

void LocalGather::Start(const GatherKey& key, std::unique_ptr<Gather> gather, Deferred& after) {
  const Submission& first = *gather->slots[0];
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
  std::vector<std::string> session_ids;
  std::vector<MirroredRegion> mirrored;
  for (const auto& slot : gather->slots) {
    op.buffers.push_back(slot->mapping->data() + slot->offset);
    op.priority = std::min(op.priority, slot->priority);
    mappings->push_back(slot->mapping);
    handles.push_back(slot->handle);
    session_ids.push_back(slot->session_id);
    if (slot->mapping->mirror() != nullptr) {
      mirrored.push_back({slot->mapping, slot->offset, slot->bytes});
    }
  }
  op.keepalive = mappings;
  op.done = [handles, key, session_ids = std::move(session_ids),
             on_retriable = on_retriable_](absl::Status s) {
    // Recorded before the handles complete, so that the process's resubmission (which may
    // follow at once) finds it.
    if (std::optional<uint64_t> epoch = dataplane::EpochOf(s);
        epoch && s.code() == absl::StatusCode::kUnavailable) {
      if (on_retriable) on_retriable(key, session_ids, *epoch);
      s = MarkRetriable(s, *epoch);
    }
    for (const auto& h : handles) h->Complete(s);
  };
  if (mirrored.empty()) {
    // Host memory only (the common case): straight to the runner, with none of the staging
    // path's closures to build.
    after.Add([runner = runner_, job_id = key.job_id, op = std::move(op),
               handles = std::move(handles)]() mutable {
      const std::string tensor = op.tensor_name;
      const uint64_t iteration = op.iteration;
      absl::Status started = runner->Start(job_id, std::move(op));
      if (started.ok()) return;
      for (const auto& h : handles) h->Complete(started);
      runner->Abort(job_id, tensor, iteration, started);
    });
    return;
  }
  std::shared_ptr<GpuAggregationSlot> gpu = GpuSlot(key, *gather);
  after.Add([runner = runner_, stager = stager_, job_id = key.job_id, op = std::move(op), handles,
             mirrored = std::move(mirrored), timeout = gather->job.op_timeout,
             gpu = std::move(gpu)]() mutable {
    const std::string tensor = op.tensor_name;
    const uint64_t iteration = op.iteration;
    auto fail = [runner, job_id, tensor, iteration, handles](const absl::Status& status) {
      for (const auto& h : handles) h->Complete(status);
      runner->Abort(job_id, tensor, iteration, status);
    };
    // Mirrored buffers (a process's CUDA memory) are copied in on the staging thread: first,
    // or chunk by chunk while the collective runs (streaming).
    MirrorStreaming streaming{
        [runner, job_id](dataplane::Operation op) { return runner->Start(job_id, std::move(op)); },
        [runner, job_id, tensor, iteration] {
          runner->StagedInputAdvanced(job_id, tensor, iteration);
        },
        [runner, job_id, tensor, iteration](const absl::Status& status) {
          runner->Abort(job_id, tensor, iteration, status);
        }};
    StartMirrored(
        stager, std::move(mirrored), std::move(op), timeout,
        [runner, job_id, fail](dataplane::Operation op) {
          absl::Status started = runner->Start(job_id, std::move(op));
          if (!started.ok()) fail(started);
        },
        fail, std::move(gpu), std::move(streaming));
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

void LocalGather::AbortJob(const std::string& job_id, const absl::Status& status, Deferred& after) {
  // A new generation: gathers wait for every rank again (a replacement may still be joining).
  departed_.erase(job_id);
  for (auto* map : {&gathers_, &waiting_}) {
    for (auto g = map->begin(); g != map->end();) {
      if (g->first.job_id != job_id) {
        ++g;
        continue;
      }
      // Only the local handles: the data plane already runs the new plan, where this iteration
      // number belongs to the iterations counted again from 0 (an Abort would reach them).
      const absl::Status failed(status.code(),
                                absl::StrCat(status.message(), " (", What(g->first), " iteration ",
                                             g->first.iteration, ")"));
      for (auto& slot : g->second->slots) {
        if (slot) after.Add([h = slot->handle, failed] { h->Complete(failed); });
      }
      g = map->erase(g);
    }
  }
}

void LocalGather::JobsChanged(const std::vector<LocalJob>& jobs, Deferred& after) {
  std::map<std::string, const LocalJob*> by_id;
  for (const LocalJob& j : jobs) by_id[j.job_id] = &j;
  for (auto g = waiting_.begin(); g != waiting_.end();) {
    auto job = by_id.find(g->first.job_id);
    if (job == by_id.end()) {
      Fail(g->first, *g->second,
           absl::FailedPreconditionError(
               absl::StrCat(What(g->first), " iteration ", g->first.iteration,
                            ": the job is no longer planned on this node")),
           after);
      g = waiting_.erase(g);
    } else if (job->second->plan_version > *g->second->retry_of_epoch) {
      const GatherKey key = g->first;
      std::unique_ptr<Gather> gather = std::move(g->second);
      g = waiting_.erase(g);
      gather->job = *job->second;
      Log()->info("{} iteration {} runs again on plan v{} (failed on v{})", What(key),
                  key.iteration, gather->job.plan_version, *gather->retry_of_epoch);
      Start(key, std::move(gather), after);
    } else {
      ++g;
    }
  }
}

void LocalGather::Expire(common::Clock::TimePoint now, Deferred& after) {
  for (auto g = waiting_.begin(); g != waiting_.end();) {
    Gather& gather = *g->second;
    if (now - gather.created < gather.job.op_timeout) {
      ++g;
      continue;
    }
    // Retriable again: the processes may submit it once more (the controller may be slow).
    if (on_retriable_) {
      std::vector<std::string> session_ids;
      for (const auto& slot : gather.slots) session_ids.push_back(slot->session_id);
      after.Add([cb = on_retriable_, key = g->first, session_ids, e = *gather.retry_of_epoch] {
        cb(key, session_ids, e);
      });
    }
    // No Abort: this node's plan is the old one; the other nodes run (or wait for) the new one.
    const absl::Status status = MarkRetriable(
        absl::UnavailableError(absl::StrCat(
            What(g->first), " iteration ", g->first.iteration, " failed on plan v",
            *gather.retry_of_epoch, " and no newer plan of the job reached this node within ",
            gather.job.op_timeout.count(), " ms; retry")),
        *gather.retry_of_epoch);
    Log()->warn("{}", status.message());
    for (auto& slot : gather.slots) after.Add([h = slot->handle, status] { h->Complete(status); });
    g = waiting_.erase(g);
  }
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
