#include "dataplane/collectives/node_collectives.h"

#include <cstring>

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
      JobEntry{choice, n, ModelThresholds(n, std::max(0, spares)), view.world_size()};
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

absl::Status NodeCollectives::Start(const std::string& job_id, LocalOperation op) {
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
