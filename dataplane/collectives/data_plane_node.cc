#include "dataplane/collectives/data_plane_node.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/trace.h"

namespace tributary::dataplane {
namespace {

constexpr auto Log = common::ComponentLog<"dataplane">;

}  // namespace

DataPlaneNode::DataPlaneNode(Transport* transport, Reducer* reducer, const common::Clock* clock)
    : transport_(transport),
      push_pull_(transport, reducer, clock),
      engine_(transport, reducer, clock),
      ps_(transport, clock) {
  transport_->SetReceiveHandler(
      [this](std::span<const std::byte> header, std::span<const std::byte> payload) {
        OnMessage(header, payload);
      });
}

DataPlaneNode::~DataPlaneNode() = default;

void DataPlaneNode::OnMessage(std::span<const std::byte> header,
                              std::span<const std::byte> payload) {
  absl::StatusOr<WireHeader> h = ParseHeader(header, payload.size());
  if (!h.ok()) {
    stats_.malformed_messages++;
    Log()->warn("malformed data-plane message dropped: {}", h.status().message());
    return;
  }
  // ParseHeader admits only algorithms that run (never kAuto).
  For(static_cast<Algorithm>(h->algorithm)).HandleMessage(*h, payload);
}

CollectiveAlgorithm& DataPlaneNode::For(Algorithm algorithm) {
  if (algorithm == Algorithm::kPushPull) return push_pull_;
  if (algorithm == Algorithm::kParameterServer) return ps_;
  return engine_;
}

uint64_t DataPlaneNode::malformed_messages() const {
  return stats_.malformed_messages.load() + push_pull_.stats().malformed_messages.load() +
         engine_.stats().malformed_messages.load() + ps_.stats().malformed_messages.load();
}

void DataPlaneNode::SetJob(const JobView& in, Algorithm algorithm) {
  JobView view = in;
  if (metrics_ != nullptr) view.counters = metrics_->ForJob(view);
  push_pull_.SetJob(view);
  ps_.SetJob(view);
  // Ring and halving-doubling run among the worker nodes only.
  if (view.my_worker_rank >= 0) engine_.SetJob(view);
  const int n = view.num_workers();
  // The selector's k: the plan's spare hosts. Not servers - workers: with spares, a plan may
  // leave the workers out of the servers (their share rounds to 0), and 4 spares serving 4
  // workers alone counted as none sent every tensor of an auto job to ring.
  const int spares = view.num_spare_servers();
  std::lock_guard lock(mu_);
  // Every node of the job prices the network by the plan's NIC rate (the slowest of the job's
  // nodes), not by its own: nodes with different NICs would otherwise put a tensor near a
  // threshold on different algorithms.
  CostModel model = cost_model_;
  if (std::isfinite(view.selector_nic_bytes_per_s) && view.selector_nic_bytes_per_s > 0) {
    model.beta_seconds_per_byte = 1 / view.selector_nic_bytes_per_s;
  }
  JobEntry& entry = jobs_[view.job_id];
  entry = JobEntry{algorithm, n, view.procs_per_node,
                   measured_ ? MeasuredSelectorThresholds(*measured_, n, spares)
                             : ModelThresholds(n, spares, model)};
  // Push/pull never runs: not the job's algorithm, and not the selector's pick at any size (a
  // suite calibration may price it below the ring without spares).
  const bool push_pull =
      algorithm == Algorithm::kPushPull ||
      (algorithm == Algorithm::kAuto && entry.thresholds.push_pull_from != UINT64_MAX);
  entry.among_workers = spares == 0 && !push_pull && !view.async_mode && view.my_worker_rank >= 0;
  std::set<std::string> peers(view.worker_addresses.begin(), view.worker_addresses.end());
  if (!entry.among_workers)
    peers.insert(view.server_addresses.begin(), view.server_addresses.end());
  // Not this node's own addresses.
  if (view.my_worker_rank >= 0 &&
      static_cast<size_t>(view.my_worker_rank) < view.worker_addresses.size()) {
    peers.erase(view.worker_addresses[view.my_worker_rank]);
  }
  if (view.my_server_index >= 0 &&
      static_cast<size_t>(view.my_server_index) < view.server_addresses.size()) {
    peers.erase(view.server_addresses[view.my_server_index]);
  }
  entry.peers.assign(peers.begin(), peers.end());
  UpdateCongestionControlsLocked();
}

void DataPlaneNode::SetWorkerCongestionControl(const std::string& name) {
  std::lock_guard lock(mu_);
  if (name == worker_congestion_) return;
  worker_congestion_ = name;
  UpdateCongestionControlsLocked(/*renamed=*/true);
}

void DataPlaneNode::UpdateCongestionControlsLocked(bool renamed) {
  std::set<std::string> want, shared;
  if (!worker_congestion_.empty()) {
    for (const auto& [id, job] : jobs_) {
      (job.among_workers ? want : shared).insert(job.peers.begin(), job.peers.end());
    }
  }
  for (const std::string& address : shared) want.erase(address);
  for (const std::string& address : worker_congestion_peers_) {
    if (!want.contains(address)) transport_->SetPeerCongestionControl(address, "");
  }
  for (const std::string& address : want) {
    if (renamed || !worker_congestion_peers_.contains(address)) {
      transport_->SetPeerCongestionControl(address, worker_congestion_);
    }
  }
  worker_congestion_peers_ = std::move(want);
}

void DataPlaneNode::RemoveJob(const std::string& job_id) {
  const uint64_t job_hash = common::StableHash64(job_id);
  push_pull_.RemoveJob(job_hash);
  engine_.RemoveJob(job_hash);
  ps_.RemoveJob(job_hash);
  {
    std::lock_guard lock(pending_mu_);
    activity_.erase(job_id);
  }
  {
    std::lock_guard lock(mu_);
    jobs_.erase(job_id);
    UpdateCongestionControlsLocked();
  }
  // After jobs_: UpdatePendingMetrics no longer names the job, so its gauges stay removed.
  if (metrics_ != nullptr) metrics_->RemoveJob(job_id);
}

void DataPlaneNode::SetMeasuredThresholds(const MeasuredThresholds& measured) {
  std::lock_guard lock(mu_);
  measured_ = measured;
}

void DataPlaneNode::SetCostModel(const CostModel& model) {
  std::lock_guard lock(mu_);
  cost_model_ = model;
}

absl::StatusOr<Algorithm> DataPlaneNode::AlgorithmFor(const std::string& job_id,
                                                      uint64_t bytes) const {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job '", job_id, "' has no plan on this node"));
  }
  if (it->second.algorithm != Algorithm::kAuto) return it->second.algorithm;
  return Select(bytes, it->second.num_workers, it->second.thresholds);
}

absl::StatusOr<Algorithm> DataPlaneNode::AlgorithmForOperation(const std::string& job_id,
                                                               const Operation& op,
                                                               uint64_t* bytes) const {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job '", job_id, "' has no plan on this node"));
  }
  const JobEntry& job = it->second;
  const bool blockwise = IsBlockwise(op.reduction);
  // Saturates instead of overflowing: the algorithm's Post rejects such sizes.
  const uint64_t blocks =
      blockwise ? static_cast<uint64_t>(std::max(job.num_workers, 1)) * job.procs_per_node : 1;
  const uint64_t esize = common::DataTypeSize(op.dtype);
  *bytes = op.count > UINT64_MAX / std::max<uint64_t>(esize * blocks, 1)
               ? UINT64_MAX
               : op.count * esize * blocks;
  // Parameter-server operations run only there (and count in the job's activity like the rest).
  if (IsParameterServer(op.reduction)) return Algorithm::kParameterServer;
  Algorithm algorithm = job.algorithm != Algorithm::kAuto
                            ? job.algorithm
                            : Select(*bytes, job.num_workers, job.thresholds);
  if (blockwise && algorithm == Algorithm::kPushPull) algorithm = Algorithm::kRing;
  // The agent's own coordination (tensor fusion's list and decisions) runs among the workers,
  // never through a summation server: there it waited behind the gradients queued on the links
  // to and from the server (0.5-3 s per decision broadcast on ResNet-50 with 4 spares at
  // 125 Mbit/s), while the workers' links to each other carry nothing in push/pull.
  if (op.control && job.num_workers > 1) algorithm = Algorithm::kRing;
  return algorithm;
}

void DataPlaneNode::Abort(const std::string& job_id, const std::string& tensor_name,
                          uint64_t iteration, const absl::Status& in) {
  const absl::Status reason = in.ok() ? absl::AbortedError("aborted") : in;
  std::optional<StagedWaiting> waiting;
  {
    std::lock_guard lock(staged_mu_);
    auto it = staged_waiting_.find(std::make_tuple(job_id, tensor_name, iteration));
    if (it != staged_waiting_.end()) {
      waiting = std::move(it->second);
      staged_waiting_.erase(it);
    }
  }
  if (waiting && waiting->op.done) waiting->op.done(reason);
  Algorithm algorithm = Algorithm::kAuto;
  {
    std::lock_guard lock(mu_);
    if (auto it = jobs_.find(job_id); it != jobs_.end()) algorithm = it->second.algorithm;
  }
  // A kAuto job's tensor may run with any algorithm (the pick depends on its size), and a
  // push/pull job's all-gathers and reduce-scatters run on the engine: tell both.
  if (algorithm == Algorithm::kAuto || algorithm == Algorithm::kPushPull) {
    push_pull_.Abort(job_id, tensor_name, iteration, reason);
  }
  engine_.Abort(job_id, tensor_name, iteration, reason);
}

void DataPlaneNode::ExpireStale() {
  push_pull_.ExpireStale();
  engine_.ExpireStale();
  ps_.ExpireStale();
}

void DataPlaneNode::SetMetrics(DataPlaneMetrics* metrics, const common::Clock* clock) {
  metrics_ = metrics;
  metrics_clock_ = clock;
}

absl::Status DataPlaneNode::Start(const std::string& job_id, Operation op) {
  if (op.control && common::Trace::enabled()) {
    // The agent's own control operations (tensor fusion's list and decisions): outside the
    // metrics, but spans "control <tensor>" in the trace.
    op.done = [name = absl::StrCat("control ", op.tensor_name), iteration = op.iteration,
               started = std::chrono::steady_clock::now(),
               done = std::move(op.done)](absl::Status s) {
      common::Trace::Async(
          name, iteration, started, std::chrono::steady_clock::now(),
          {{"iteration", static_cast<int64_t>(iteration)}, {"ok", s.ok() ? 1 : 0}});
      done(std::move(s));
    };
  }
  if (metrics_ == nullptr || op.control) return StartUninstrumented(job_id, std::move(op));
  uint64_t bytes = 0;
  absl::StatusOr<Algorithm> algorithm = AlgorithmForOperation(job_id, op, &bytes);
  if (!algorithm.ok()) return algorithm.status();
  uint64_t id;
  const common::Clock::TimePoint started = metrics_clock_->Now();
  {
    std::lock_guard lock(pending_mu_);
    id = next_pending_++;
    pending_[id] = Pending{job_id, started};
    ActivityStartLocked(job_id, op, started);
  }
  // With --trace, every operation is a span "<algorithm> <tensor>" (push/pull's chunks have
  // their own rows): which algorithm ran each tensor of an iteration, and when it finished.
  std::optional<common::Trace::TimePoint> traced;
  std::string trace_name;
  if (common::Trace::enabled()) {
    traced = std::chrono::steady_clock::now();
    trace_name = absl::StrCat(std::string(AlgorithmName(*algorithm)), " ", op.tensor_name);
  }
  // The wrapper may run before Start returns (on this thread): the entry exists already.
  op.done = [this, id, job_id, bytes, started, alg = *algorithm, traced,
             trace_name = std::move(trace_name), iteration = op.iteration,
             done = std::move(op.done)](absl::Status s) {
    if (traced) {
      common::Trace::Async(trace_name, id, *traced, std::chrono::steady_clock::now(),
                           {{"bytes", static_cast<int64_t>(bytes)},
                            {"iteration", static_cast<int64_t>(iteration)},
                            {"ok", s.ok() ? 1 : 0}});
    }
    const common::Clock::TimePoint now = metrics_clock_->Now();
    const double seconds = std::chrono::duration<double>(now - started).count();
    std::optional<double> recovered;
    {
      std::lock_guard lock(pending_mu_);
      pending_.erase(id);
      ActivityEndLocked(job_id, now, /*completed=*/true);
      if (auto it = activity_.find(job_id); it != activity_.end()) {
        Activity& a = it->second;
        if (s.ok()) {
          a.taken.bytes += bytes;
          a.taken.seconds += seconds;
          if (a.failing_since) {
            recovered = std::chrono::duration<double>(now - *a.failing_since).count();
            a.failing_since.reset();
          }
        } else if (!a.failing_since) {
          a.failing_since = now;
        }
      }
    }
    metrics_->OperationFinished(alg, bytes, seconds, s);
    if (recovered) metrics_->RecoveryObserved(*recovered);
    if (done) done(std::move(s));
  };
  metrics_->OperationStarted(*algorithm);
  absl::Status s = StartUninstrumented(job_id, std::move(op));
  if (!s.ok()) {
    {
      std::lock_guard lock(pending_mu_);
      pending_.erase(id);
      ActivityEndLocked(job_id, metrics_clock_->Now(), /*completed=*/false);
    }
    metrics_->OperationRefused(*algorithm, s);
  }
  return s;
}

absl::Status DataPlaneNode::StartUninstrumented(const std::string& job_id, Operation op) {
  uint64_t bytes = 0;
  ASSIGN_OR_RETURN(const Algorithm picked, AlgorithmForOperation(job_id, op, &bytes));
  Algorithm algorithm = picked;
  if (absl::Status declined = For(picked).CanServe(picked, op); !declined.ok()) {
    // The selector's fallback order (SelectServable): ring, halving-doubling, push/pull.
    bool served = false;
    for (Algorithm a : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kPushPull}) {
      if (a != picked && For(a).CanServe(a, op).ok()) {
        algorithm = a;
        served = true;
        break;
      }
    }
    if (!served) return declined;
    stats_.fallbacks++;
    Log()->debug("{} of tensor '{}' falls back to {}: {}", AlgorithmName(picked), op.tensor_name,
                 AlgorithmName(algorithm), declined.message());
  }
  if (op.staged != nullptr && !op.staged->complete() &&
      !(algorithm == Algorithm::kPushPull &&
        (op.reduction == Reduction::kSum || op.reduction == Reduction::kAverage))) {
    // Only push/pull's sums read and write the buffers chunk by chunk as the input arrives.
    std::lock_guard lock(staged_mu_);
    // Checked again under the lock that StagedInputAdvanced takes after the producer's Advance:
    // either that call finds this entry, or the input is complete here.
    if (!op.staged->complete()) {
      auto key = std::make_tuple(job_id, op.tensor_name, op.iteration);
      if (staged_waiting_.contains(key)) {
        return absl::AlreadyExistsError(absl::StrCat("job '", job_id, "' tensor '", op.tensor_name,
                                                     "' iteration ", op.iteration,
                                                     " is already running"));
      }
      staged_waiting_.emplace(std::move(key), StagedWaiting{algorithm, std::move(op)});
      return absl::OkStatus();
    }
  }
  return For(algorithm).Post(job_id, algorithm, std::move(op));
}

void DataPlaneNode::StagedInputAdvanced(const std::string& job_id, const std::string& tensor_name,
                                        uint64_t iteration) {
  std::optional<StagedWaiting> ready;
  {
    std::lock_guard lock(staged_mu_);
    auto it = staged_waiting_.find(std::make_tuple(job_id, tensor_name, iteration));
    if (it != staged_waiting_.end() && it->second.op.staged->complete()) {
      ready = std::move(it->second);
      staged_waiting_.erase(it);
    }
  }
  if (ready) {
    std::function<void(absl::Status)> done = ready->op.done;
    absl::Status s = For(ready->algorithm).Post(job_id, ready->algorithm, std::move(ready->op));
    // Start returned OK for it: its done reports the post's error.
    if (!s.ok() && done) done(std::move(s));
  }
  push_pull_.worker().Pump();
}

void DataPlaneNode::UpdatePendingMetrics() {
  if (metrics_ == nullptr) return;
  std::map<std::string, std::pair<size_t, double>> by_job;
  {
    std::lock_guard lock(mu_);
    for (const auto& [job_id, entry] : jobs_) by_job[job_id] = {0, 0.0};
  }
  const common::Clock::TimePoint now = metrics_clock_->Now();
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

void DataPlaneNode::ActivityStartLocked(const std::string& job_id, const Operation& op,
                                        common::Clock::TimePoint now) {
  auto it = activity_.find(job_id);
  if (it == activity_.end()) it = activity_.emplace(job_id, Activity{}).first;
  Activity& a = it->second;
  if (a.first_tensor.empty()) a.first_tensor = op.tensor_name;
  // An iteration starts with the first tensor's next iteration; in an asynchronous job (no
  // iterations) with each delta pushed for the first tensor.
  const bool next = IsParameterServer(op.reduction)
                        ? op.reduction == Reduction::kPsDelta
                        : !a.iteration_open || op.iteration != a.iteration_number;
  if (op.tensor_name == a.first_tensor && next) {
    // Busy time up to now, before this operation counts: it belongs to the next iteration.
    const double busy = a.BusyAt(now);
    if (a.iteration_open) {
      const double length = std::chrono::duration<double>(now - a.iteration_start).count();
      a.taken.iterations++;
      a.taken.iteration_seconds += length;
      a.taken.iteration_max_seconds = std::max(a.taken.iteration_max_seconds, length);
      a.taken.iteration_busy_seconds += busy - a.busy_at_iteration_start;
    }
    a.iteration_open = true;
    a.iteration_number = op.iteration;
    a.iteration_start = now;
    a.busy_at_iteration_start = busy;
  }
  if (a.in_flight++ == 0) a.busy_since = now;
}

void DataPlaneNode::ActivityEndLocked(const std::string& job_id, common::Clock::TimePoint now,
                                      bool completed) {
  auto it = activity_.find(job_id);
  if (it == activity_.end()) return;  // the job was removed meanwhile
  Activity& a = it->second;
  if (a.in_flight > 0 && --a.in_flight == 0) {
    a.busy_closed += std::chrono::duration<double>(now - a.busy_since).count();
  }
  if (completed) a.taken.collectives++;
}

std::map<std::string, DataPlaneNode::Observation> DataPlaneNode::TakeObservations() {
  std::map<std::string, Observation> out;
  const common::Clock::TimePoint now =
      metrics_clock_ != nullptr ? metrics_clock_->Now() : common::Clock::TimePoint{};
  std::lock_guard lock(pending_mu_);
  for (auto& [job_id, a] : activity_) {
    const double busy = a.BusyAt(now);
    a.taken.busy_seconds = busy - a.busy_at_take;
    a.busy_at_take = busy;
    const Observation& o = a.taken;
    if (o.collectives == 0 && o.bytes == 0 && o.iterations == 0 && o.busy_seconds <= 0) continue;
    out[job_id] = std::exchange(a.taken, Observation{});
  }
  return out;
}

}  // namespace tributary::dataplane
