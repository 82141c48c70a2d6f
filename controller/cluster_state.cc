#include "controller/cluster_state.h"

#include <regex>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/metrics/metrics.h"
#include "controller/planner/job_planner.h"
#include "google/protobuf/util/message_differencer.h"

namespace tributary::controller {
namespace {

using google::protobuf::util::MessageDifferencer;

constexpr auto Log = common::ComponentLog<"controller">;

bool ValidId(const std::string& id) {
  static const std::regex kId("[A-Za-z0-9][A-Za-z0-9._:-]{0,127}");
  return std::regex_match(id, kId);
}

// Plans compare equal when everything but the version matches.
bool SamePlan(tributary::v1::JobPlan a, tributary::v1::JobPlan b) {
  a.set_version(0);
  b.set_version(0);
  return MessageDifferencer::Equals(a, b);
}

}  // namespace

ClusterState::ClusterState(const common::Clock* clock, Options options, uint64_t incarnation_seed,
                           prometheus::Registry* registry, StateStore* store)
    : clock_(clock), options_(options), store_(store), next_incarnation_(incarnation_seed) {
  if (registry == nullptr) {
    own_registry_ = std::make_unique<prometheus::Registry>();
    registry = own_registry_.get();
  }
  auto& plans = common::metrics::CounterFamily(
      *registry, "tributary_controller_plan_computations_total", "Plans computed, by result.");
  plans_ok_ = &plans.Add({{"result", "ok"}});
  plans_error_ = &plans.Add({{"result", "error"}});
  plan_duration_ =
      &common::metrics::HistogramFamily(*registry, "tributary_controller_plan_duration_seconds",
                                        "Time to compute one job's plan.")
           .Add({},
                prometheus::Histogram::BucketBoundaries{0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                                        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1});
  observed_bytes_ =
      &common::metrics::CounterFamily(*registry, "tributary_controller_observed_bytes_total",
                                      "Operation bytes agents reported, summed over worker nodes.");
  observed_seconds_ = &common::metrics::CounterFamily(
      *registry, "tributary_controller_observed_seconds_total",
      "Operation seconds agents reported, summed over worker nodes.");
  observed_per_byte_ = &common::metrics::GaugeFamily(
      *registry, "tributary_controller_observed_seconds_per_byte",
      "Seconds per byte of the latest heartbeat that reported the job.");
  restores_ = &common::metrics::CounterFamily(
                   *registry, "tributary_controller_state_restores_total",
                   "Starts that restored the state database an earlier controller wrote.")
                   .Add({});
  restored_jobs_ = &common::metrics::GaugeFamily(*registry, "tributary_controller_restored_jobs",
                                                 "Jobs read back from the state database at start.")
                        .Add({});
  auto& writes = common::metrics::CounterFamily(
      *registry, "tributary_controller_state_writes_total",
      "State database transactions (job create, delete, re-plan), by result.");
  writes_ok_ = &writes.Add({{"result", "ok"}});
  writes_error_ = &writes.Add({{"result", "error"}});
}

absl::StatusOr<size_t> ClusterState::Restore() {
  if (store_ == nullptr) return 0;
  absl::StatusOr<StateStore::Loaded> loaded = store_->Load();
  if (!loaded.ok()) return loaded.status();
  std::lock_guard lock(mu_);
  max_plan_version_ = std::max(max_plan_version_, loaded->max_plan_version);
  restored_at_ = clock_->Now();
  for (tributary::v1::Job& job : loaded->jobs) {
    JobEntry entry;
    for (const auto& w : job.plan().workers()) entry.awaiting.insert(w.node_id());
    for (const auto& s : job.plan().servers()) entry.awaiting.insert(s.node_id());
    for (const auto& w : job.spec().worker_nodes()) entry.awaiting.insert(w);
    for (const auto& [id, node] : nodes_) {
      if (node.alive) entry.awaiting.erase(id);
    }
    entry.job = std::move(job);
    UpdateJobStateLocked(entry.job, entry.awaiting);
    Log()->info("job {} restored with plan v{}: {}", entry.job.job_id(), entry.job.plan().version(),
                entry.awaiting.empty() ? "its nodes are registered" : entry.job.message());
    const std::string id = entry.job.job_id();
    jobs_[id] = std::move(entry);
  }
  if (!loaded->created) restores_->Increment();
  restored_jobs_->Set(static_cast<double>(loaded->jobs.size()));
  if (!loaded->jobs.empty()) {
    assignments_version_++;
    restoring_ = true;
  }
  return loaded->jobs.size();
}

absl::Status ClusterState::PersistLocked(const std::vector<const tributary::v1::Job*>& put,
                                         const std::vector<std::string>& deleted,
                                         uint64_t max_plan_version) {
  if (store_ == nullptr) return absl::OkStatus();
  absl::Status s = store_->Commit(put, deleted, max_plan_version);
  (s.ok() ? writes_ok_ : writes_error_)->Increment();
  if (!s.ok()) Log()->error("writing the state database failed: {}", s.message());
  return s;
}

uint64_t ClusterState::assignments_version() const {
  std::lock_guard lock(mu_);
  return assignments_version_;
}

absl::Status ClusterState::RegisterNode(const tributary::v1::RegisterNodeRequest& req,
                                        tributary::v1::RegisterNodeResponse* resp) {
  if (!ValidId(req.node_id())) {
    return absl::InvalidArgumentError(
        absl::StrCat("node_id '", req.node_id(), "' must be 1-128 characters of [A-Za-z0-9._:-]"));
  }
  const auto& inv = req.inventory();
  if (inv.data_plane_address().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("node '", req.node_id(), "' registered without a data_plane_address"));
  }
  if (!(inv.nic_bytes_per_s() >= 0) || !(inv.sum_bytes_per_s() >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("node '", req.node_id(), "' declares negative bandwidth"));
  }
  std::lock_guard lock(mu_);
  NodeEntry& node = nodes_[req.node_id()];
  const bool changed = !node.alive || !MessageDifferencer::Equals(node.inventory, inv);
  node.inventory = inv;
  node.incarnation = next_incarnation_++;
  node.last_heartbeat = clock_->Now();
  node.alive = true;
  Log()->info("node {} registered: data plane {}, nic {:.0f} MB/s, {} cores", req.node_id(),
              inv.data_plane_address(), inv.nic_bytes_per_s() / 1e6, inv.cpu_cores());
  // After a restore every node registers again: that is no membership change. Until the grace
  // has passed, registrations re-plan nothing, so restored jobs keep their plan and epoch and
  // collectives running through the controller's restart are not disturbed (a node that is
  // really new is planned in at the next change). A node back at another address than its
  // restored plan has (its agent restarted too) makes that plan stale: the job is re-planned as
  // soon as every node of it is back.
  const bool restoring = restoring_ && clock_->Now() - restored_at_ < options_.restore_grace;
  for (auto& [id, entry] : jobs_) {
    if (entry.awaiting.erase(req.node_id()) == 0) continue;
    bool here = false;
    for (const auto& w : entry.job.plan().workers()) {
      here |= w.node_id() == req.node_id() && w.data_plane_address() != inv.data_plane_address();
    }
    for (const auto& s : entry.job.plan().servers()) {
      here |= s.node_id() == req.node_id() && s.data_plane_address() != inv.data_plane_address();
    }
    if (here) {
      Log()->warn(
          "job {}: node {} came back at a new data-plane address {}: the job is re-planned "
          "once every node of it is back",
          id, req.node_id(), inv.data_plane_address());
      entry.stale = true;
    }
    UpdateJobStateLocked(entry.job, entry.awaiting);
    if (entry.awaiting.empty()) {
      Log()->info("job {}: every node of its restored plan v{} is back", id,
                  entry.job.plan().version());
    }
  }
  bool replan = changed && !restoring;
  for (const auto& [id, entry] : jobs_) replan |= entry.stale && entry.awaiting.empty();
  if (replan) (void)ReplanAllLocked();
  resp->set_incarnation(node.incarnation);
  resp->set_heartbeat_interval_ms(static_cast<uint32_t>(options_.heartbeat_interval.count()));
  resp->set_assignments_version(assignments_version_);
  return absl::OkStatus();
}

absl::Status ClusterState::Heartbeat(const tributary::v1::HeartbeatRequest& req,
                                     tributary::v1::HeartbeatResponse* resp) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(req.node_id());
  if (it == nodes_.end() || it->second.incarnation != req.incarnation()) {
    return absl::NotFoundError(absl::StrCat("node '", req.node_id(),
                                            "' is not registered with this controller; "
                                            "register again"));
  }
  NodeEntry& node = it->second;
  node.load = req.load();
  RecordObservationsLocked(req.load());
  node.last_heartbeat = clock_->Now();
  if (!node.alive) {
    node.alive = true;
    Log()->info("node {} is alive again", req.node_id());
    (void)ReplanAllLocked();
  }
  resp->set_assignments_version(assignments_version_);
  return absl::OkStatus();
}

absl::Status ClusterState::GetAssignments(const tributary::v1::GetAssignmentsRequest& req,
                                          tributary::v1::GetAssignmentsResponse* resp) {
  std::lock_guard lock(mu_);
  if (!nodes_.contains(req.node_id())) {
    return absl::NotFoundError(absl::StrCat("node '", req.node_id(), "' is not registered"));
  }
  resp->set_assignments_version(assignments_version_);
  for (const auto& [id, entry] : jobs_) {
    const auto& plan = entry.job.plan();
    bool involved = false;
    for (const auto& w : plan.workers()) involved |= w.node_id() == req.node_id();
    for (const auto& s : plan.servers()) involved |= s.node_id() == req.node_id();
    if (involved) *resp->add_plans() = plan;
  }
  return absl::OkStatus();
}

void ClusterState::ListNodes(tributary::v1::ListNodesResponse* resp) {
  std::lock_guard lock(mu_);
  const auto now = clock_->Now();
  for (const auto& [id, node] : nodes_) {
    auto* out = resp->add_nodes();
    out->set_node_id(id);
    *out->mutable_inventory() = node.inventory;
    out->set_state(node.alive ? tributary::v1::NODE_STATE_ALIVE : tributary::v1::NODE_STATE_DEAD);
    *out->mutable_load() = node.load;
    out->set_last_heartbeat_age_s(std::chrono::duration<double>(now - node.last_heartbeat).count());
    double committed = 0;
    for (const auto& [job_id, entry] : jobs_) {
      for (const auto& w : entry.job.plan().workers()) {
        if (w.node_id() == id) out->add_worker_of(job_id);
      }
      for (const auto& s : entry.job.plan().servers()) {
        if (s.node_id() == id && !s.is_worker()) out->add_server_of(job_id);
      }
      committed += SpareNicUse(entry.job.plan(), id);
    }
    out->set_committed_nic_bytes_per_s(committed);
  }
}

absl::StatusOr<tributary::v1::JobPlan> ClusterState::PlanLocked(const std::string& job_id,
                                                                const tributary::v1::JobSpec& spec,
                                                                uint64_t version) const {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<tributary::v1::JobPlan> plan = ComputePlanLocked(job_id, spec, version);
  plan_duration_->Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  (plan.ok() ? plans_ok_ : plans_error_)->Increment();
  return plan;
}

void ClusterState::RecordObservationsLocked(const tributary::v1::NodeLoad& load) {
  for (const auto& o : load.jobs()) {
    if (!jobs_.contains(o.job_id())) continue;  // bounded label set: known jobs only
    const prometheus::Labels l{{"job", o.job_id()}};
    observed_bytes_->Add(l).Increment(static_cast<double>(o.bytes()));
    observed_seconds_->Add(l).Increment(o.seconds());
    if (o.bytes() > 0) observed_per_byte_->Add(l).Set(o.seconds() / o.bytes());
  }
}

std::shared_ptr<prometheus::Collectable> ClusterState::collector() const {
  return std::make_shared<common::metrics::FunctionCollector>([this] { return CollectMetrics(); });
}

std::vector<prometheus::MetricFamily> ClusterState::CollectMetrics() const {
  using common::metrics::AddSample;
  using common::metrics::MakeFamily;
  using prometheus::MetricType;
  std::lock_guard lock(mu_);
  std::set<std::string> workers;
  for (const auto& [id, entry] : jobs_) {
    for (const auto& w : entry.job.plan().workers()) workers.insert(w.node_id());
    for (const auto& w : entry.job.spec().worker_nodes()) workers.insert(w);
  }
  double alive = 0, dead = 0, spare = 0;
  for (const auto& [id, node] : nodes_) {
    if (!node.alive) {
      ++dead;
      continue;
    }
    ++alive;
    if (node.inventory.offers_summation() && !workers.contains(id)) ++spare;
  }
  std::vector<prometheus::MetricFamily> out;
  out.push_back(MakeFamily("tributary_controller_nodes", "Nodes by state.", MetricType::Gauge));
  AddSample(out.back(), alive, {{"state", "alive"}});
  AddSample(out.back(), dead, {{"state", "dead"}});
  AddSample(out.back(), spare, {{"state", "spare"}});
  std::map<std::string, double> by_state{{"running", 0}, {"degraded", 0}, {"unspecified", 0}};
  for (const auto& [id, entry] : jobs_) {
    switch (entry.job.state()) {
      case tributary::v1::JOB_STATE_RUNNING:
        by_state["running"]++;
        break;
      case tributary::v1::JOB_STATE_DEGRADED:
        by_state["degraded"]++;
        break;
      default:
        by_state["unspecified"]++;
    }
  }
  out.push_back(MakeFamily("tributary_controller_jobs", "Jobs by state.", MetricType::Gauge));
  for (const auto& [state, n] : by_state) AddSample(out.back(), n, {{"state", state}});
  double waiting = 0;
  for (const auto& [id, entry] : jobs_) waiting += !entry.awaiting.empty();
  out.push_back(MakeFamily("tributary_controller_restored_jobs_waiting",
                           "Restored jobs still waiting for the nodes of their plan to register.",
                           MetricType::Gauge));
  AddSample(out.back(), waiting, {});
  out.push_back(MakeFamily("tributary_controller_predicted_seconds_per_byte",
                           "The current plan's predicted all-reduce seconds per byte.",
                           MetricType::Gauge));
  for (const auto& [id, entry] : jobs_) {
    AddSample(out.back(), entry.job.plan().predicted_seconds_per_byte(), {{"job", id}});
  }
  out.push_back(MakeFamily("tributary_controller_ring_seconds_per_byte",
                           "Predicted ring all-reduce seconds per byte for the job.",
                           MetricType::Gauge));
  for (const auto& [id, entry] : jobs_) {
    AddSample(out.back(), entry.job.plan().ring_seconds_per_byte(), {{"job", id}});
  }
  return out;
}

absl::StatusOr<tributary::v1::JobPlan> ClusterState::ComputePlanLocked(
    const std::string& job_id, const tributary::v1::JobSpec& spec, uint64_t version) const {
  std::vector<NodeSnapshot> snapshot;
  for (const auto& [id, node] : nodes_) {
    NodeSnapshot s;
    s.node_id = id;
    s.inventory = node.inventory;
    s.alive = node.alive;
    s.cpu_busy_fraction = node.load.cpu_busy_fraction();
    s.measured_nic_bytes_per_s = ForeignNicBytesPerSecond(node.load);
    for (const auto& [other_id, entry] : jobs_) {
      if (other_id != job_id) s.committed_nic_bytes_per_s += SpareNicUse(entry.job.plan(), id);
    }
    snapshot.push_back(std::move(s));
  }
  return PlanJob(job_id, spec, snapshot, version);
}

void ClusterState::UpdateJobStateLocked(tributary::v1::Job& job,
                                        const std::set<std::string>& awaiting) const {
  if (!awaiting.empty()) {
    job.set_state(tributary::v1::JOB_STATE_DEGRADED);
    job.set_message(
        absl::StrCat("restored after a controller restart: keeping plan v", job.plan().version(),
                     " until these nodes register again: ", absl::StrJoin(awaiting, ", ")));
    return;
  }
  std::string dead;
  for (const auto& w : job.spec().worker_nodes()) {
    auto it = nodes_.find(w);
    if (it == nodes_.end() || !it->second.alive) dead += (dead.empty() ? "" : ", ") + w;
  }
  job.set_state(dead.empty() ? tributary::v1::JOB_STATE_RUNNING
                             : tributary::v1::JOB_STATE_DEGRADED);
  job.set_message(dead.empty() ? "" : absl::StrCat("worker nodes down: ", dead));
}

absl::Status ClusterState::CreateJob(const tributary::v1::CreateJobRequest& req,
                                     tributary::v1::Job* job) {
  if (!ValidId(req.job_id())) {
    return absl::InvalidArgumentError(
        absl::StrCat("job_id '", req.job_id(), "' must be 1-128 characters of [A-Za-z0-9._:-]"));
  }
  absl::StatusOr<tributary::v1::JobSpec> spec = NormalizeJobSpec(req.spec());
  if (!spec.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job '", req.job_id(), "': ", spec.status().message()));
  }
  std::lock_guard lock(mu_);
  if (auto it = jobs_.find(req.job_id()); it != jobs_.end()) {
    if (!MessageDifferencer::Equals(it->second.job.spec(), *spec)) {
      return absl::AlreadyExistsError(
          absl::StrCat("job '", req.job_id(), "' exists with a different spec; delete it first"));
    }
    *job = it->second.job;  // idempotent retry
    return absl::OkStatus();
  }
  for (const std::string& w : spec->worker_nodes()) {
    auto it = nodes_.find(w);
    if (it == nodes_.end()) {
      return absl::NotFoundError(
          absl::StrCat("job '", req.job_id(), "': worker node '", w, "' is not registered"));
    }
    if (!it->second.alive) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", req.job_id(), "': worker node '", w, "' is dead"));
    }
  }
  // Above every version handed out: a job created again under an old id never reuses an epoch.
  const uint64_t version = max_plan_version_ + 1;
  absl::StatusOr<tributary::v1::JobPlan> plan = PlanLocked(req.job_id(), *spec, version);
  if (!plan.ok()) return plan.status();
  tributary::v1::Job created;
  created.set_job_id(req.job_id());
  *created.mutable_spec() = *spec;
  *created.mutable_plan() = *std::move(plan);
  UpdateJobStateLocked(created);
  *job = created;
  if (req.dry_run()) return absl::OkStatus();
  if (absl::Status s = PersistLocked({&created}, {}, version); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("job '", req.job_id(), "' was not created: ", s.message()));
  }
  max_plan_version_ = version;
  jobs_[req.job_id()].job = std::move(created);
  assignments_version_++;
  Log()->info(
      "job {} created: {} workers, {} summation servers, predicted {:.3f} s vs ring "
      "{:.3f} s for {} bytes",
      req.job_id(), job->plan().workers_size(), job->plan().servers_size(),
      job->plan().predicted_seconds(), job->plan().ring_seconds(), job->plan().model_bytes());
  return absl::OkStatus();
}

absl::Status ClusterState::GetJob(const std::string& job_id, tributary::v1::Job* job) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  *job = it->second.job;
  return absl::OkStatus();
}

void ClusterState::ListJobs(tributary::v1::ListJobsResponse* resp) {
  std::lock_guard lock(mu_);
  for (const auto& [id, entry] : jobs_) *resp->add_jobs() = entry.job;
}

absl::Status ClusterState::DeleteJob(const std::string& job_id) {
  std::lock_guard lock(mu_);
  auto entry = jobs_.extract(job_id);
  if (entry.empty()) return absl::OkStatus();
  // The removal and the re-plans it causes (capacity it used on spare nodes is free again) are
  // one transaction.
  if (absl::Status s = ReplanAllLocked({job_id}); !s.ok()) {
    jobs_.insert(std::move(entry));
    return absl::UnavailableError(
        absl::StrCat("job '", job_id, "' was not deleted: ", s.message()));
  }
  Log()->info("job {} deleted", job_id);
  return absl::OkStatus();
}

absl::Status ClusterState::ReplanAllLocked(const std::vector<std::string>& deleted) {
  replan_pending_ = false;
  std::map<std::string, tributary::v1::JobPlan> previous;  // of the jobs whose plan changed
  uint64_t max_version = max_plan_version_;
  for (auto& [id, entry] : jobs_) {
    tributary::v1::Job& job = entry.job;
    UpdateJobStateLocked(job, entry.awaiting);
    if (!entry.awaiting.empty()) continue;  // restored: its plan stays until its nodes are back
    entry.stale = false;
    absl::StatusOr<tributary::v1::JobPlan> plan =
        PlanLocked(id, job.spec(), job.plan().version() + 1);
    if (!plan.ok()) {
      Log()->warn("re-planning job {} failed, keeping plan v{}: {}", id, job.plan().version(),
                  plan.status().message());
      continue;
    }
    if (SamePlan(*plan, job.plan())) continue;
    previous.emplace(id, job.plan());
    *job.mutable_plan() = *std::move(plan);
    max_version = std::max(max_version, job.plan().version());
  }
  if (previous.empty() && deleted.empty()) return absl::OkStatus();
  std::vector<const tributary::v1::Job*> put;
  for (const auto& [id, plan] : previous) put.push_back(&jobs_.at(id).job);
  if (absl::Status s = PersistLocked(put, deleted, max_version); !s.ok()) {
    for (auto& [id, plan] : previous) {
      Log()->warn("job {}: keeping plan v{} (the re-plan could not be stored)", id, plan.version());
      tributary::v1::Job& job = jobs_.at(id).job;
      *job.mutable_plan() = std::move(plan);
      UpdateJobStateLocked(job);
    }
    replan_pending_ = true;
    return s;
  }
  for (const auto& [id, plan] : previous) {
    const tributary::v1::JobPlan& now = jobs_.at(id).job.plan();
    Log()->info("job {} re-planned: v{} with {} summation servers", id, now.version(),
                now.servers_size());
  }
  max_plan_version_ = max_version;
  assignments_version_++;
  return absl::OkStatus();
}

void ClusterState::CheckLiveness() {
  std::lock_guard lock(mu_);
  const auto now = clock_->Now();
  bool died = replan_pending_;
  if (restoring_ && now - restored_at_ >= options_.restore_grace) {
    restoring_ = false;
    for (auto& [id, entry] : jobs_) {
      if (entry.awaiting.empty()) continue;
      Log()->warn(
          "job {}: nodes {} did not register within {} ms of the restore; re-planning "
          "without them",
          id, absl::StrJoin(entry.awaiting, ", "), options_.restore_grace.count());
      entry.awaiting.clear();
      died = true;
    }
  }
  for (auto& [id, node] : nodes_) {
    if (node.alive && now - node.last_heartbeat > options_.heartbeat_timeout) {
      node.alive = false;
      died = true;
      Log()->warn("node {} missed heartbeats for {} ms: dead", id,
                  options_.heartbeat_timeout.count());
    }
  }
  if (died) (void)ReplanAllLocked();
}

}  // namespace tributary::controller
