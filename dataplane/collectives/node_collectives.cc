#include "dataplane/collectives/node_collectives.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/status_macros.h"

namespace tributary::dataplane {

NodeCollectives::NodeCollectives(PushPullNode* node, CollectiveEngine* engine, Reducer* reducer)
    : node_(node), engine_(engine), reducer_(reducer) {
  node_->SetCollectiveEngine(engine_);
}

void NodeCollectives::SetJob(const JobView& view, AlgorithmChoice choice) {
  node_->SetJob(view);
  if (view.my_worker_rank >= 0) {
    RankView ranks;
    ranks.job_id = view.job_id;
    ranks.plan_version = view.plan_version;
    ranks.rank_addresses = view.worker_addresses;
    ranks.my_rank = view.my_worker_rank;
    ranks.partition_bytes = view.partition_bytes;
    ranks.op_timeout = view.op_timeout;
    engine_->SetJob(ranks);
  }
  const int n = static_cast<int>(view.worker_addresses.size());
  const int spares = static_cast<int>(view.server_addresses.size()) - n;
  std::lock_guard lock(mu_);
  jobs_[view.job_id] =
      JobEntry{choice, n,
               measured_ ? MeasuredSelectorThresholds(*measured_, n, std::max(0, spares))
                         : ModelThresholds(n, std::max(0, spares), cost_model_),
               view.world_size()};
}

void NodeCollectives::SetMeasuredThresholds(const MeasuredThresholds& measured) {
  std::lock_guard lock(mu_);
  measured_ = measured;
}

void NodeCollectives::SetCostModel(const CostModel& model) {
  std::lock_guard lock(mu_);
  cost_model_ = model;
}

void NodeCollectives::RemoveJob(const std::string& job_id) {
  node_->RemoveJob(common::StableHash64(job_id));
  engine_->RemoveJob(job_id);
  std::lock_guard lock(mu_);
  jobs_.erase(job_id);
}

absl::StatusOr<Algorithm> NodeCollectives::AlgorithmFor(const std::string& job_id,
                                                        uint64_t bytes) const {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job '", job_id, "' has no plan on this node"));
  }
  switch (it->second.choice) {
    case AlgorithmChoice::kPushPull:
      return Algorithm::kPushPull;
    case AlgorithmChoice::kRing:
      return Algorithm::kRing;
    case AlgorithmChoice::kHalvingDoubling:
      return Algorithm::kHalvingDoubling;
    case AlgorithmChoice::kAuto:
      break;
  }
  return Select(bytes, it->second.num_workers, it->second.thresholds);
}

void NodeCollectives::Abort(const std::string& job_id, const std::string& tensor_name,
                            uint64_t iteration, const absl::Status& reason) {
  // Ring and halving-doubling peers notice through their deadline; push/pull fails at once.
  node_->worker().Abort(job_id, tensor_name, iteration, reason);
}

void NodeCollectives::SetMetrics(DataPlaneMetrics* metrics, const common::Clock* clock) {
  metrics_ = metrics;
  clock_ = clock;
  node_->SetMetrics(metrics);
}

absl::Status NodeCollectives::Start(const std::string& job_id, LocalOperation op) {
  if (metrics_ == nullptr) return StartUninstrumented(job_id, std::move(op));
  const uint64_t bytes = op.count * common::DataTypeSize(op.dtype);
  absl::StatusOr<Algorithm> algorithm = AlgorithmFor(job_id, bytes);
  if (!algorithm.ok()) return algorithm.status();
  uint64_t id;
  const common::Clock::TimePoint started = clock_->Now();
  {
    std::lock_guard lock(pending_mu_);
    id = next_pending_++;
    pending_[id] = Pending{job_id, started};
  }
  // The wrapper may run before Start returns (on this thread): the entry exists already.
  op.done = [this, id, job_id, bytes, started, alg = *algorithm,
             done = std::move(op.done)](absl::Status s) {
    const double seconds = std::chrono::duration<double>(clock_->Now() - started).count();
    {
      std::lock_guard lock(pending_mu_);
      pending_.erase(id);
      if (s.ok()) {
        Observation& o = observations_[job_id];
        o.bytes += bytes;
        o.seconds += seconds;
      }
    }
    metrics_->OperationFinished(alg, bytes, seconds, s);
    if (done) done(std::move(s));
  };
  metrics_->OperationStarted(*algorithm);
  absl::Status s = StartUninstrumented(job_id, std::move(op));
  if (!s.ok()) {
    {
      std::lock_guard lock(pending_mu_);
      pending_.erase(id);
    }
    metrics_->OperationRefused(*algorithm, s);
  }
  return s;
}

void NodeCollectives::UpdatePendingMetrics() {
  if (metrics_ == nullptr) return;
  std::map<std::string, std::pair<size_t, double>> by_job;
  {
    std::lock_guard lock(mu_);
    for (const auto& [job_id, entry] : jobs_) by_job[job_id] = {0, 0.0};
  }
  const common::Clock::TimePoint now = clock_->Now();
  {
    std::lock_guard lock(pending_mu_);
    for (const auto& [id, p] : pending_) {
      auto& [n, oldest] = by_job[p.job_id];
      ++n;
      oldest = std::max(oldest, std::chrono::duration<double>(now - p.started).count());
    }
  }
  for (const auto& [job_id, v] : by_job) metrics_->SetPending(job_id, v.first, v.second);
}

std::map<std::string, NodeCollectives::Observation> NodeCollectives::TakeObservations() {
  std::lock_guard lock(pending_mu_);
  return std::exchange(observations_, {});
}

absl::Status NodeCollectives::StartUninstrumented(const std::string& job_id, LocalOperation op) {
  const size_t esize = common::DataTypeSize(op.dtype);
  ASSIGN_OR_RETURN(Algorithm algorithm, AlgorithmFor(job_id, op.count * esize));
  if (algorithm == Algorithm::kPushPull) return node_->worker().Start(job_id, std::move(op));
  uint32_t world;
  {
    std::lock_guard lock(mu_);
    world = jobs_[job_id].world_size;
  }
  if (op.buffers.empty() || op.count == 0 || esize == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("job '", job_id, "' tensor '", op.tensor_name, "': empty operation"));
  }
  const bool broadcast = op.kind == LocalOperation::Kind::kBroadcast;
  if (broadcast && op.root_local >= op.buffers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("job '", job_id, "' tensor '", op.tensor_name,
                                                   "': broadcast root out of range"));
  }
  // The buffer that takes part among the nodes: the root's for a broadcast, else the first one
  // with every local contribution added in (the result replaces the input anyway).
  const size_t lead = broadcast ? op.root_local : 0;
  if (!broadcast) {
    for (size_t b = 1; b < op.buffers.size(); ++b) {
      reducer_->Sum(op.dtype, op.buffers[0], op.buffers[b], op.count);
    }
  }
  CollectiveOperation c;
  c.tensor_name = op.tensor_name;
  c.iteration = op.iteration;
  c.dtype = op.dtype;
  c.count = op.count;
  c.kind = broadcast ? CollectiveKind::kBroadcast : CollectiveKind::kSum;
  c.root = op.root_node;
  c.buffer = op.buffers[lead];
  c.priority = op.priority;
  c.keepalive = op.keepalive;
  c.done = [this, op = std::move(op), lead, world](absl::Status s) mutable {
    if (s.ok()) {
      const size_t bytes = op.count * common::DataTypeSize(op.dtype);
      if (op.kind == LocalOperation::Kind::kAverage) {
        reducer_->Divide(op.dtype, op.buffers[lead], op.count, world);
      }
      for (size_t b = 0; b < op.buffers.size(); ++b) {
        if (b != lead) std::memcpy(op.buffers[b], op.buffers[lead], bytes);
      }
    }
    if (op.done) op.done(s);
  };
  return engine_->Start(job_id, algorithm, std::move(c));
}

}  // namespace tributary::dataplane
