#include "controller/cluster_state.h"

#include <sys/random.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <regex>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/metrics/metrics.h"
#include "common/status_macros.h"
#include "controller/planner/job_planner.h"
#include "dataplane/transport/socket_address.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/wire_format_lite.h"
#include "tributary/v1/assigned_plan.h"

namespace tributary::controller {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::util::MessageDifferencer;

constexpr auto Log = common::ComponentLog<"controller">;

bool ValidId(const std::string& id) {
  static const std::regex kId("[A-Za-z0-9][A-Za-z0-9._:-]{0,127}");
  return std::regex_match(id, kId);
}

// Plans compare equal when everything but the version matches.
// A job's data-plane secret: 32 bytes from the kernel's CSPRNG (dataplane/collectives/
// message_auth.h). Issued once per job, kept across re-plans and restarts.
std::string NewJobSecret() {
  std::string secret(32, '\0');
  size_t filled = 0;
  while (filled < secret.size()) {
    const ssize_t n = getrandom(secret.data() + filled, secret.size() - filled, 0);
    if (n > 0) filled += static_cast<size_t>(n);
  }
  return secret;
}

// What GetJob, ListJobs and CreateJob answer: the job without its secret, which only the job's
// own nodes receive (with their assignments).
tributary::v1::Job Redacted(tributary::v1::Job job) {
  job.mutable_plan()->clear_job_secret();
  return job;
}

// The fields a commit sets (job id, version, secret, generation), serialized: the head of a
// plan's wire form. Protobuf merges the fields of concatenated messages, so head + body parses as
// the whole plan; the job id and version come first.
grpc::Slice WireHead(const tributary::v1::JobPlan& plan) {
  tributary::v1::JobPlan head;
  head.set_job_id(plan.job_id());
  head.set_version(plan.version());
  head.set_job_secret(plan.job_secret());
  head.set_generation(plan.generation());
  return grpc::Slice(head.SerializeAsString());
}

bool SameBytes(const grpc::Slice& a, const grpc::Slice& b) {
  return a.size() == b.size() && std::memcmp(a.begin(), b.begin(), a.size()) == 0;
}

// Deterministic bytes (a re-plan is compared with the current plan by its bytes).
std::string Serialize(const google::protobuf::MessageLite& message) {
  std::string bytes;
  google::protobuf::io::StringOutputStream out(&bytes);
  google::protobuf::io::CodedOutputStream coded(&out);
  coded.SetSerializationDeterministic(true);
  message.SerializeToCodedStream(&coded);
  coded.Trim();
  return bytes;
}

}  // namespace

ClusterState::ClusterState(const common::Clock* clock, Options options, uint64_t incarnation_seed,
                           prometheus::Registry* registry, StateStore* store)
    : clock_(clock),
      options_(options),
      store_(store),
      next_incarnation_(incarnation_seed),
      job_stats_(options.job_stats_window) {
  if (registry == nullptr) {
    own_registry_ = std::make_unique<prometheus::Registry>();
    registry = own_registry_.get();
  }
  auto& plans = common::metrics::CounterFamily(
      *registry, "tributary_controller_plan_computations_total", "Plans computed, by result.");
  plans_ok_ = &plans.Add({{"result", "ok"}});
  plans_error_ = &plans.Add({{"result", "error"}});
  plan_conflicts_ =
      &common::metrics::CounterFamily(
           *registry, "tributary_controller_plan_conflicts_total",
           "Plans computed off the lock and thrown away because a node they use changed meanwhile.")
           .Add({});
  generation_changes_ =
      &common::metrics::CounterFamily(
           *registry, "tributary_controller_membership_generations_total",
           "Times a job's membership generation moved (a training process replaced, an agent "
           "restarted, an elastic job's worker nodes changed): its processes resync.")
           .Add({});
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
    const std::string id = job.job_id();
    JobEntry& entry = jobs_[id];
    for (const auto& w : job.plan().workers()) entry.awaiting.insert(w.node_id());
    for (const auto& s : job.plan().servers()) entry.awaiting.insert(s.node_id());
    for (const auto& w : job.spec().worker_nodes()) entry.awaiting.insert(w);
    for (const auto& [node_id, node] : nodes_) {
      if (node.alive) entry.awaiting.erase(node_id);
    }
    if (job.plan().job_secret().empty()) {
      // Written by a controller from before data-plane secrets: issue one now (kept in memory
      // until the job's next plan change is stored).
      job.mutable_plan()->set_job_secret(NewJobSecret());
    }
    tributary::v1::JobPlan plan = job.plan();
    entry.job = std::move(job);
    SetPlanLocked(entry, Prepare(std::move(plan)));
    UpdateJobStateLocked(entry.job, entry.awaiting);
    Log()->info("job {} restored with plan v{}: {}", id, entry.job.plan().version(),
                entry.awaiting.empty() ? "its nodes are registered" : entry.job.message());
  }
  if (!loaded->created) restores_->Increment();
  restored_jobs_->Set(static_cast<double>(loaded->jobs.size()));
  if (!loaded->jobs.empty()) restoring_ = true;
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
  return assignments_seq_;
}

uint64_t ClusterState::assignments_version(const std::string& node_id) const {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(node_id);
  return it == nodes_.end() ? 0 : it->second.assignments_version;
}

size_t ClusterState::pending_replans() const {
  std::lock_guard lock(mu_);
  return marked_.size();
}

std::chrono::milliseconds ClusterState::HeartbeatIntervalLocked() const {
  const auto by_size = std::chrono::milliseconds(static_cast<int64_t>(
      1000.0 * static_cast<double>(nodes_.size()) / std::max(1.0, options_.max_heartbeats_per_s)));
  return std::max(options_.heartbeat_interval, std::min(by_size, options_.heartbeat_timeout / 3));
}

void ClusterState::MarkLocked(const std::string& job_id) {
  marked_.emplace(job_id, clock_->Now());  // keeps the first mark's time
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
  // What peers dial: numeric, never resolved (the data plane's own parser).
  if (!dataplane::ParsePeerAddress(inv.data_plane_address()).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("node '", req.node_id(), "': data_plane_address '", inv.data_plane_address(),
                     "' must be a numeric a.b.c.d:port or [v6]:port with a port in 1-65535"));
  }
  // One absurd node (infinite, zero or NaN bandwidth) would poison every plan it enters.
  constexpr double kMaxBytesPerS = 1e13;  // 80 Tbit/s: far above any NIC or memory bus
  const auto in_range = [](double v, bool zero_ok) {
    return std::isfinite(v) && v <= kMaxBytesPerS && (zero_ok ? v >= 0 : v > 0);
  };
  if (!in_range(inv.nic_bytes_per_s(), false)) {
    return absl::InvalidArgumentError(absl::StrCat("node '", req.node_id(), "': nic_bytes_per_s ",
                                                   inv.nic_bytes_per_s(),
                                                   " must be finite and in (0, 1e13]"));
  }
  if (!in_range(inv.sum_bytes_per_s(), !inv.offers_summation())) {
    return absl::InvalidArgumentError(
        absl::StrCat("node '", req.node_id(), "': sum_bytes_per_s ", inv.sum_bytes_per_s(),
                     " must be finite and in ", inv.offers_summation() ? "(0" : "[0", ", 1e13]",
                     inv.offers_summation() ? " for a node that offers summation" : ""));
  }
  {
    std::lock_guard lock(mu_);
    auto existing = nodes_.find(req.node_id());
    if (existing != nodes_.end() && existing->second.alive && existing->second.inventory &&
        existing->second.inventory->hostname() != inv.hostname() &&
        clock_->Now() - existing->second.last_heartbeat < options_.heartbeat_timeout) {
      // Two live agents claiming one node id (on different hosts) would take the node from each
      // other at every registration and re-plan its jobs each time. An agent restarting on its
      // own host (same hostname) is a new incarnation, not a second claimant.
      return absl::AlreadyExistsError(absl::StrCat(
          "node id '", req.node_id(), "' is held by a live agent on host '",
          existing->second.inventory->hostname(), "' (data plane ",
          existing->second.inventory->data_plane_address(), "); start this agent on host '",
          inv.hostname(), "' with another --node-id, or stop the other one"));
    }
    auto [it, is_new] = nodes_.try_emplace(req.node_id());
    NodeEntry& node = it->second;
    const bool same_inventory =
        !is_new && MessageDifferencer::Equals(*node.inventory, req.inventory());
    const bool returned = !is_new && !node.alive;
    if (!same_inventory) {
      node.inventory = std::make_shared<const tributary::v1::NodeInventory>(inv);
      node.topology_key = std::make_shared<const std::string>(TopologyKey(inv.topology()));
    }
    node.incarnation = next_incarnation_++;
    if (!is_new && node.agent_instance != 0 && req.agent_instance() != 0 &&
        node.agent_instance != req.agent_instance()) {
      // A restarted agent: the training processes it served lost their sessions and join again
      // from iteration 0, so every process of its jobs must start again with them.
      for (const std::string& id : node.jobs) {
        JobEntry& entry = jobs_.at(id);
        MarkLocked(id);  // its plan names the old process: messages of the new one are dropped
        const auto& workers = entry.job.spec().worker_nodes();
        if (std::find(workers.begin(), workers.end(), req.node_id()) == workers.end()) continue;
        Log()->info(
            "job {}: the agent of worker node {} restarted; the next plan moves the "
            "membership generation",
            id, req.node_id());
        entry.new_generation = true;
      }
    }
    if (req.agent_instance() != 0) node.agent_instance = req.agent_instance();
    node.packed_plans = req.expands_packed_plans();
    TouchLocked(req.node_id(), node);
    if (node.inventory->offers_summation()) {
      summation_nodes_.try_emplace(req.node_id(), &node);
    } else {
      summation_nodes_.erase(req.node_id());
    }
    if (is_new) {
      node.assignments_version = ++assignments_seq_;  // never 0: a watch since 0 gets the set
      for (const auto& [id, entry] : jobs_) {
        bool named = entry.members.contains(req.node_id()) || entry.lost.contains(req.node_id());
        for (const auto& w : entry.job.spec().worker_nodes()) named |= w == req.node_id();
        if (named) node.jobs.insert(id);
      }
      RecommitLocked(req.node_id(), node);
    }
    Log()->debug("node {} registered: data plane {}, nic {:.0f} MB/s, {} cores", req.node_id(),
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
      // Another agent process than the restored plan names (it restarted while the controller
      // was down): its training processes lost their sessions, and its messages would be fenced.
      const auto other_process = [&](uint64_t planned) {
        return planned != 0 && req.agent_instance() != 0 && planned != req.agent_instance();
      };
      for (const auto& w : entry.job.plan().workers()) {
        if (w.node_id() != req.node_id()) continue;
        here |= w.data_plane_address() != inv.data_plane_address();
        if (other_process(w.agent_instance())) {
          here = true;
          entry.new_generation = true;
        }
      }
      for (const auto& s : entry.job.plan().servers()) {
        if (s.node_id() != req.node_id()) continue;
        here |=
            s.data_plane_address() != inv.data_plane_address() || other_process(s.agent_instance());
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
    if (!restoring) {
      if (!same_inventory) {
        // New capacity, or a node whose plans name an address it no longer has: every job.
        for (const auto& [id, entry] : jobs_) MarkLocked(id);
      } else if (returned) {
        for (const std::string& id : node.jobs) MarkLocked(id);
        const std::set<std::string> jobs = node.jobs;
        for (const std::string& id : jobs) {
          JobEntry& entry = jobs_.at(id);
          entry.lost.erase(req.node_id());
          ReindexLocked(entry, {req.node_id()});  // still named as a worker or member?
        }
      }
      for (const std::string& id : node.jobs) UpdateJobStateLocked(jobs_.at(id).job);
    }
    for (const auto& [id, entry] : jobs_) {
      if (entry.stale && entry.awaiting.empty()) MarkLocked(id);
    }
    UpdateSpareLocked(req.node_id(), node);
    resp->set_incarnation(node.incarnation);
    resp->set_takes_load_deltas(true);
    resp->set_heartbeat_interval_ms(static_cast<uint32_t>(HeartbeatIntervalLocked().count()));
    resp->set_assignments_version(node.assignments_version);
  }
  if (options_.replan_debounce.count() == 0) ReplanDue();
  return absl::OkStatus();
}

absl::Status ClusterState::Heartbeat(const tributary::v1::HeartbeatRequest& req,
                                     tributary::v1::HeartbeatResponse* resp) {
  bool returned = false;
  {
    std::lock_guard lock(mu_);
    auto it = nodes_.find(req.node_id());
    if (it == nodes_.end() || it->second.incarnation != req.incarnation()) {
      return absl::NotFoundError(absl::StrCat("node '", req.node_id(),
                                              "' is not registered with this controller; "
                                              "register again"));
    }
    NodeEntry& node = it->second;
    if (req.load_unchanged()) {
      // Only the deltas came (agent/load_delta.h): the measured load stays as last reported.
      *node.load.mutable_jobs() = req.load().jobs();
      *node.load.mutable_membership_changes() = req.load().membership_changes();
    } else {
      node.load = req.load();
    }
    node.foreign.push_back(ForeignNicBytesPerSecond(node.load));
    while (node.foreign.size() > kForeignSamples) node.foreign.pop_front();
    if (!req.load().jobs().empty()) RecordObservationsLocked(req.node_id(), req.load());
    if (!req.load().membership_changes().empty())
      MembershipChangesLocked(req.node_id(), req.load());
    returned = !node.alive;
    TouchLocked(req.node_id(), node);
    if (returned) {
      if (node.inventory->offers_summation()) summation_nodes_.try_emplace(req.node_id(), &node);
      Log()->info("node {} is alive again", req.node_id());
      // Only the jobs that need it: those it works for, and those that lost it when it died.
      const std::set<std::string> jobs = node.jobs;
      for (const std::string& id : jobs) {
        JobEntry& entry = jobs_.at(id);
        entry.lost.erase(req.node_id());
        ReindexLocked(entry, {req.node_id()});  // still named as a worker or member?
        UpdateJobStateLocked(entry.job, entry.awaiting);
        MarkLocked(id);
      }
    }
    UpdateSpareLocked(req.node_id(), node);
    resp->set_assignments_version(node.assignments_version);
    resp->set_heartbeat_interval_ms(static_cast<uint32_t>(HeartbeatIntervalLocked().count()));
  }
  if (returned && options_.replan_debounce.count() == 0) ReplanDue();
  return absl::OkStatus();
}

grpc::ByteBuffer ClusterState::AssignmentsMessageLocked(const std::string& node_id,
                                                        const NodeEntry& node) const {
  // WatchAssignmentsResponse by hand: field 1 (the version), then one field 2 per plan whose
  // bytes are the shared common part followed by this node's intra_node entry. Protobuf merges
  // concatenated fields, so the receiver parses one JobPlan per field 2.
  std::vector<grpc::Slice> slices;
  {
    std::string head;
    google::protobuf::io::StringOutputStream out(&head);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.WriteTag(WireFormatLite::MakeTag(1, WireFormatLite::WIRETYPE_VARINT));
    coded.WriteVarint64(node.assignments_version);
    coded.Trim();
    slices.emplace_back(head);
  }
  for (const std::string& id : node.jobs) {
    const JobEntry& entry = jobs_.at(id);
    if (!entry.members.contains(node_id)) continue;
    auto intra = entry.wire_intra.find(node_id);
    const grpc::Slice& body = node.packed_plans ? entry.wire_body : entry.wire_body_whole;
    const size_t length = entry.wire_head.size() + body.size() +
                          (intra == entry.wire_intra.end() ? 0 : intra->second.size());
    std::string tag;
    {
      google::protobuf::io::StringOutputStream out(&tag);
      google::protobuf::io::CodedOutputStream coded(&out);
      coded.WriteTag(WireFormatLite::MakeTag(2, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
      coded.WriteVarint64(length);
      coded.Trim();
    }
    slices.emplace_back(tag);
    slices.push_back(entry.wire_head);
    slices.push_back(body);
    if (intra != entry.wire_intra.end()) slices.push_back(intra->second);
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

void ClusterState::BumpLocked(const std::set<std::string>& nodes) {
  for (const std::string& id : nodes) {
    auto it = nodes_.find(id);
    if (it == nodes_.end()) continue;  // a restored plan's node that has not registered yet
    NodeEntry& node = it->second;
    node.assignments_version = ++assignments_seq_;
    if (node.watchers.empty()) continue;
    const grpc::ByteBuffer message = AssignmentsMessageLocked(id, node);
    for (AssignmentsWatcher* w : node.watchers) w->Push(node.assignments_version, message);
  }
}

void ClusterState::ReindexLocked(const JobEntry& entry, const std::set<std::string>& nodes) {
  const std::string& job_id = entry.job.job_id();
  const auto& workers = entry.job.spec().worker_nodes();
  // A whole plan's nodes (thousands) are looked up in a set; one node (a return) by a scan.
  std::unordered_set<std::string_view> worker_set;
  if (nodes.size() > 1) worker_set.insert(workers.begin(), workers.end());
  for (const std::string& id : nodes) {
    auto it = nodes_.find(id);
    if (it == nodes_.end()) continue;
    const bool named =
        entry.members.contains(id) || entry.lost.contains(id) ||
        (nodes.size() > 1 ? worker_set.contains(id)
                          : std::find(workers.begin(), workers.end(), id) != workers.end());
    if (named) {
      it->second.jobs.insert(job_id);
    } else {
      it->second.jobs.erase(job_id);
    }
  }
}

void ClusterState::MembershipChangesLocked(const std::string& node_id,
                                           const tributary::v1::NodeLoad& load) {
  for (const tributary::v1::MembershipChange& change : load.membership_changes()) {
    auto it = jobs_.find(change.job_id());
    if (it == jobs_.end()) continue;
    JobEntry& entry = it->second;
    const auto member = entry.members.find(node_id);
    if (member == entry.members.end() || !member->second.worker) continue;
    tributary::v1::JobPlan& plan = *entry.job.mutable_plan();
    if (plan.generation() != change.generation()) continue;  // moved already
    const uint64_t version = std::max(plan.version(), max_plan_version_) + 1;
    const uint64_t generation = plan.generation() + 1;
    if (store_ != nullptr) {
      tributary::v1::Job stored = entry.job;
      stored.mutable_plan()->set_version(version);
      stored.mutable_plan()->set_generation(generation);
      if (absl::Status s = PersistLocked({&stored}, {}, version); !s.ok()) {
        Log()->warn("job {}: membership generation not moved (not stored): {}", change.job_id(),
                    s.message());
        continue;  // the node reports it again with its next heartbeat
      }
    }
    max_plan_version_ = version;
    generation_changes_->Increment();
    Log()->info(
        "job {}: membership generation {} -> {} (plan v{}): local rank {} of node {} was "
        "replaced",
        change.job_id(), plan.generation(), generation, version, change.local_rank(), node_id);
    // The same plan under a new head: its body and intra-node entries stay.
    plan.set_version(version);
    plan.set_generation(generation);
    entry.wire_head = WireHead(plan);
    std::set<std::string> members;
    for (const auto& [id, member] : entry.members) members.insert(id);
    BumpLocked(members);
  }
}

ClusterState::PreparedPlan ClusterState::Prepare(tributary::v1::JobPlan plan) {
  PreparedPlan prepared;
  for (const auto& w : plan.workers()) prepared.members[w.node_id()].worker = true;
  for (const auto& server : plan.servers()) {
    Member& member = prepared.members[server.node_id()];
    member.server = true;
    member.spare_nic_bytes_per_s = SpareNicUse(plan, server);
  }
  for (const auto& intra : plan.intra_node()) {
    std::string bytes;
    {
      google::protobuf::io::StringOutputStream out(&bytes);
      google::protobuf::io::CodedOutputStream coded(&out);
      coded.SetSerializationDeterministic(true);
      coded.WriteTag(WireFormatLite::MakeTag(tributary::v1::JobPlan::kIntraNodeFieldNumber,
                                             WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
      coded.WriteVarint64(intra.ByteSizeLong());
      intra.SerializeWithCachedSizes(&coded);
    }
    prepared.wire_intra.insert_or_assign(intra.node_id(), grpc::Slice(bytes));
  }
  {
    // The body: the head's fields and intra_node are set aside meanwhile (no copy of the plan).
    google::protobuf::RepeatedPtrField<tributary::v1::IntraNodePlan> intra;
    intra.Swap(plan.mutable_intra_node());
    std::string job_id = std::move(*plan.mutable_job_id());
    std::string secret = std::move(*plan.mutable_job_secret());
    const uint64_t version = plan.version(), generation = plan.generation();
    plan.clear_job_id();
    plan.clear_job_secret();
    plan.clear_version();
    plan.clear_generation();
    prepared.wire_body_whole = grpc::Slice(Serialize(plan));
    tributary::v1::JobPlan packed = plan;  // without intra_node: a few hundred KB at most
    tributary::v1::PackAssignedPlan(packed);
    prepared.wire_body = grpc::Slice(Serialize(packed));
    plan.set_job_id(std::move(job_id));
    plan.set_job_secret(std::move(secret));
    plan.set_version(version);
    plan.set_generation(generation);
    intra.Swap(plan.mutable_intra_node());
  }
  prepared.plan = std::move(plan);
  return prepared;
}

bool ClusterState::SamePlanLocked(const PreparedPlan& prepared, const JobEntry& entry) {
  const tributary::v1::JobPlan& plan = prepared.plan;
  const tributary::v1::JobPlan& current = entry.job.plan();
  if (plan.job_secret() != current.job_secret() || plan.generation() != current.generation() ||
      !SameBytes(prepared.wire_body_whole, entry.wire_body_whole) ||
      prepared.wire_intra.size() != entry.wire_intra.size()) {
    return false;
  }
  for (const auto& [node_id, bytes] : prepared.wire_intra) {
    auto it = entry.wire_intra.find(node_id);
    if (it == entry.wire_intra.end() || !SameBytes(bytes, it->second)) return false;
  }
  return true;
}

void ClusterState::SetPlanLocked(JobEntry& entry, PreparedPlan prepared) {
  std::set<std::string> touched;
  for (const auto& [id, member] : entry.members) touched.insert(id);
  entry.members = std::move(prepared.members);
  for (const auto& [id, member] : entry.members) {
    touched.insert(id);
    entry.lost.erase(id);
  }
  entry.wire_intra = std::move(prepared.wire_intra);
  entry.wire_body = std::move(prepared.wire_body);
  entry.wire_body_whole = std::move(prepared.wire_body_whole);
  entry.wire_head = WireHead(prepared.plan);
  *entry.job.mutable_plan() = std::move(prepared.plan);
  ReindexLocked(entry, touched);
  for (const std::string& id : touched) {
    if (auto it = nodes_.find(id); it != nodes_.end()) RecommitLocked(id, it->second);
  }
  BumpLocked(touched);
}

void ClusterState::RecommitLocked(const std::string& node_id, NodeEntry& node) {
  double sum = 0;
  for (const std::string& job_id : node.jobs) {
    auto job = jobs_.find(job_id);
    if (job == jobs_.end()) continue;
    const auto& members = job->second.members;
    if (auto m = members.find(node_id); m != members.end()) sum += m->second.spare_nic_bytes_per_s;
  }
  node.committed_nic_bytes_per_s = sum;
  UpdateSpareLocked(node_id, node);
}

double ClusterState::ForeignOf(const NodeEntry& node) {
  if (node.foreign.empty()) return 0;
  return *std::min_element(node.foreign.begin(), node.foreign.end());
}

void ClusterState::UpdateSpareLocked(const std::string& node_id, NodeEntry& node) {
  const std::optional<double> usefulness =
      SpareUsefulness(*node.inventory, node.alive, node.load.cpu_busy_fraction(),
                      node.committed_nic_bytes_per_s, ForeignOf(node));
  if (usefulness == node.spare_usefulness) return;
  if (node.spare_usefulness) spare_index_.erase({-*node.spare_usefulness, node_id});
  if (usefulness) spare_index_.emplace(std::make_pair(-*usefulness, node_id), &node);
  node.spare_usefulness = usefulness;
}

std::vector<NodeSnapshot> ClusterState::SnapshotLocked(const std::string& job_id,
                                                       const tributary::v1::JobSpec& spec) const {
  std::vector<NodeSnapshot> snapshot;
  auto job = jobs_.find(job_id);
  const auto* own = job != jobs_.end() ? &job->second.members : nullptr;
  auto add = [&](const std::string& id, const NodeEntry& node) {
    NodeSnapshot& s = snapshot.emplace_back();
    s.node_id = id;
    s.inventory = node.inventory;
    s.topology_key = node.topology_key;
    s.alive = node.alive;
    s.agent_instance = node.agent_instance;
    s.cpu_busy_fraction = node.load.cpu_busy_fraction();
    s.measured_nic_bytes_per_s = ForeignOf(node);
    // What the other jobs use: the node's sum, unless this job uses some of it too (its own
    // spares, a few hundred at most), then summed again without it, in the same order.
    const Member* mine = nullptr;
    if (own != nullptr) {
      if (auto m = own->find(id); m != own->end()) mine = &m->second;
    }
    if (mine == nullptr || mine->spare_nic_bytes_per_s == 0) {
      s.committed_nic_bytes_per_s = node.committed_nic_bytes_per_s;
      return;
    }
    for (const std::string& other : node.jobs) {
      if (other == job_id) continue;
      const auto& members = jobs_.at(other).members;
      if (auto o = members.find(id); o != members.end()) {
        s.committed_nic_bytes_per_s += o->second.spare_nic_bytes_per_s;
      }
    }
  };
  std::set<std::string> workers(spec.worker_nodes().begin(), spec.worker_nodes().end());
  for (const std::string& w : workers) {
    if (auto it = nodes_.find(w); it != nodes_.end()) add(w, it->second);
  }
  if (!options_.spare_index || !spec.has_max_spare_nodes()) {
    snapshot.reserve(snapshot.size() + summation_nodes_.size());
    for (const auto& [id, node] : summation_nodes_) {
      if (!workers.contains(id)) add(id, *node);
    }
    return snapshot;
  }
  // At most k spares: the job's own (more useful to it than the index says: their use by this
  // job does not count) and the k most useful others. Any other candidate has k at least as
  // useful ahead of it in the planner's order, so the plan is the one of the full snapshot.
  std::unordered_set<std::string_view> taken(workers.begin(), workers.end());
  if (own != nullptr) {
    for (const auto& [id, member] : *own) {
      if (!member.server || taken.contains(id)) continue;
      if (auto it = nodes_.find(id); it != nodes_.end()) {
        add(id, it->second);
        taken.insert(it->first);
      }
    }
  }
  uint32_t more = spec.max_spare_nodes();
  for (auto it = spare_index_.begin(); it != spare_index_.end() && more > 0; ++it) {
    const std::string& id = it->first.second;
    if (taken.contains(id)) continue;
    add(id, *it->second);
    --more;
  }
  return snapshot;
}

void ClusterState::Plan(PlanWork& work) const {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<tributary::v1::JobPlan> plan =
      PlanJob(work.job_id, work.spec, work.snapshot, work.base_version + 1, &intra_cache_);
  plan_duration_->Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  (plan.ok() ? plans_ok_ : plans_error_)->Increment();
  work.status = plan.status();
  if (!plan.ok()) return;
  // The nodes the plan uses, for StillValidLocked (not the thousands of other candidates).
  std::unordered_set<std::string_view> used;
  for (const auto& w : plan->workers()) used.insert(w.node_id());
  for (const auto& s : plan->servers()) used.insert(s.node_id());
  for (const NodeSnapshot& node : work.snapshot) {
    if (used.contains(node.node_id)) work.planned[node.node_id] = &node;
  }
  work.prepared = Prepare(*std::move(plan));
}

bool ClusterState::StillValidLocked(const PlanWork& work) const {
  const tributary::v1::JobPlan& plan = work.prepared.plan;
  auto same = [&](const std::string& id, bool must_be_alive) {
    auto it = nodes_.find(id);
    auto p = work.planned.find(id);
    return it != nodes_.end() && p != work.planned.end() &&
           it->second.inventory.get() == p->second->inventory.get() &&
           it->second.agent_instance == p->second->agent_instance &&
           (!must_be_alive || it->second.alive);
  };
  for (const auto& w : plan.workers()) {
    if (!same(w.node_id(), false)) return false;
  }
  for (const auto& s : plan.servers()) {
    if (!same(s.node_id(), !s.is_worker())) return false;
  }
  return true;
}

void ClusterState::ReplanDue() {
  std::vector<std::string> due;
  {
    std::lock_guard lock(mu_);
    const auto now = clock_->Now();
    for (auto it = marked_.begin(); it != marked_.end();) {
      if (now - it->second >= options_.replan_debounce) {
        due.push_back(it->first);
        it = marked_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (!due.empty()) Replan(std::move(due));
}

void ClusterState::Replan(std::vector<std::string> job_ids) {
  std::vector<std::pair<int, std::string>> by_size;
  {
    std::lock_guard lock(mu_);
    for (std::string& id : job_ids) {
      auto it = jobs_.find(id);
      const int workers = it == jobs_.end() ? 0 : it->second.job.spec().worker_nodes_size();
      by_size.emplace_back(workers, std::move(id));
    }
  }
  std::sort(by_size.begin(), by_size.end());
  for (auto& [workers, id] : by_size) ReplanJob(std::move(id));
}

void ClusterState::ReplanJob(std::string job_id) {
  std::vector<std::string> job_ids = {std::move(job_id)};  // empty once committed or given up
  constexpr int kAttempts = 4;
  using Ms = std::chrono::duration<double, std::milli>;
  for (int attempt = 0; attempt < kAttempts && !job_ids.empty(); ++attempt) {
    std::vector<PlanWork> work;
    const auto t0 = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(mu_);
      for (const std::string& id : job_ids) {
        auto it = jobs_.find(id);
        if (it == jobs_.end()) continue;  // deleted meanwhile
        JobEntry& entry = it->second;
        UpdateJobStateLocked(entry.job, entry.awaiting);
        if (!entry.awaiting.empty()) continue;  // restored: its plan stays until its nodes are back
        PlanWork w;
        w.job_id = id;
        w.spec = entry.job.spec();
        w.base_version = entry.job.plan().version();
        w.snapshot = SnapshotLocked(id, w.spec);
        work.push_back(std::move(w));
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    for (PlanWork& w : work) Plan(w);  // off the lock: the plan, its wire form and index
    job_ids.clear();
    const auto t2 = std::chrono::steady_clock::now();
    std::lock_guard lock(mu_);
    std::vector<std::pair<JobEntry*, PreparedPlan*>> changed;
    uint64_t max_version = max_plan_version_;
    for (PlanWork& w : work) {
      auto it = jobs_.find(w.job_id);
      if (it == jobs_.end()) continue;
      JobEntry& entry = it->second;
      if (entry.job.plan().version() != w.base_version || !entry.awaiting.empty()) {
        continue;  // re-planned (or restored) by someone else meanwhile
      }
      if (!w.status.ok()) {
        Log()->warn("re-planning job {} failed, keeping plan v{}: {}", w.job_id,
                    entry.job.plan().version(), w.status.message());
        continue;
      }
      if (!StillValidLocked(w)) {
        plan_conflicts_->Increment();
        job_ids.push_back(w.job_id);  // a node it uses changed while planning: again
        continue;
      }
      entry.stale = false;
      tributary::v1::JobPlan& plan = w.prepared.plan;
      const tributary::v1::JobPlan& current = entry.job.plan();
      plan.set_job_secret(current.job_secret());  // the job keeps its secret
      // The membership generation moves when the worker nodes change (an elastic job) or a
      // worker's agent restarted; a re-plan for a lost summation server keeps it.
      bool same_workers = plan.workers_size() == current.workers_size();
      for (int i = 0; same_workers && i < plan.workers_size(); ++i) {
        same_workers = plan.workers(i).node_id() == current.workers(i).node_id();
      }
      plan.set_generation(current.generation() + (same_workers && !entry.new_generation ? 0 : 1));
      if (SamePlanLocked(w.prepared, entry)) continue;
      max_version = std::max(max_version, plan.version());
      changed.emplace_back(&entry, &w.prepared);
    }
    if (changed.empty()) continue;
    if (store_ != nullptr) {
      std::vector<tributary::v1::Job> put_jobs;
      put_jobs.reserve(changed.size());
      for (auto& [entry, prepared] : changed) {
        put_jobs.push_back(entry->job);
        *put_jobs.back().mutable_plan() = prepared->plan;
        UpdateJobStateLocked(put_jobs.back(), entry->awaiting);
      }
      std::vector<const tributary::v1::Job*> put;
      for (const auto& j : put_jobs) put.push_back(&j);
      if (absl::Status s = PersistLocked(put, {}, max_version); !s.ok()) {
        for (auto& [entry, prepared] : changed) {
          Log()->warn("job {}: keeping plan v{} (the re-plan could not be stored)",
                      entry->job.job_id(), entry->job.plan().version());
          MarkLocked(entry->job.job_id());  // CheckLiveness tries again
        }
        continue;
      }
    }
    max_plan_version_ = max_version;
    for (auto& [entry, prepared] : changed) {
      const tributary::v1::JobPlan& plan = prepared->plan;
      if (plan.generation() != entry->job.plan().generation()) {
        generation_changes_->Increment();
        Log()->info("job {}: membership generation {} -> {} ({} worker nodes)", entry->job.job_id(),
                    entry->job.plan().generation(), plan.generation(), plan.workers_size());
      }
      entry->new_generation = false;
      SetPlanLocked(*entry, std::move(*prepared));
      UpdateJobStateLocked(entry->job, entry->awaiting);
      Log()->info(
          "job {} re-planned: v{} with {} summation servers (snapshot {:.1f} ms, plan {:.1f} ms, "
          "commit {:.1f} ms)",
          entry->job.job_id(), entry->job.plan().version(), entry->job.plan().servers_size(),
          Ms(t1 - t0).count(), Ms(t2 - t1).count(),
          Ms(std::chrono::steady_clock::now() - t2).count());
    }
  }
  if (!job_ids.empty()) {
    std::lock_guard lock(mu_);
    for (const std::string& id : job_ids) {
      Log()->warn("job {}: its nodes kept changing while it was planned; trying again later", id);
      MarkLocked(id);
    }
  }
}

absl::Status ClusterState::GetAssignments(const tributary::v1::GetAssignmentsRequest& req,
                                          tributary::v1::GetAssignmentsResponse* resp) {
  grpc::ByteBuffer message;
  {
    std::lock_guard lock(mu_);
    auto it = nodes_.find(req.node_id());
    if (it == nodes_.end()) {
      return absl::NotFoundError(absl::StrCat("node '", req.node_id(), "' is not registered"));
    }
    message = AssignmentsMessageLocked(req.node_id(), it->second);
  }
  // The same bytes as a watch message (GetAssignmentsResponse has the same fields).
  std::vector<grpc::Slice> slices;
  if (!message.Dump(&slices).ok()) return absl::InternalError("cannot read the assignments");
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (!resp->ParseFromString(bytes)) return absl::InternalError("cannot parse the assignments");
  return absl::OkStatus();
}

absl::Status ClusterState::Watch(const tributary::v1::WatchAssignmentsRequest& req,
                                 AssignmentsWatcher* watcher) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(req.node_id());
  if (it == nodes_.end() || it->second.incarnation != req.incarnation()) {
    return absl::NotFoundError(absl::StrCat("node '", req.node_id(),
                                            "' is not registered with this controller at this "
                                            "incarnation; register again"));
  }
  NodeEntry& node = it->second;
  node.watchers.push_back(watcher);
  if (node.assignments_version != req.since_version()) {
    watcher->Push(node.assignments_version, AssignmentsMessageLocked(req.node_id(), node));
  }
  return absl::OkStatus();
}

void ClusterState::Unwatch(const std::string& node_id, AssignmentsWatcher* watcher) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return;
  std::erase(it->second.watchers, watcher);
}

absl::Status ClusterState::ListNodes(const tributary::v1::ListNodesRequest& req,
                                     tributary::v1::ListNodesResponse* resp) {
  constexpr uint32_t kDefaultPage = 500, kMaxPage = 5000;
  constexpr size_t kMaxPageBytes = 1 << 20;
  if (!req.page_token().empty() && !ValidId(req.page_token())) {
    return absl::InvalidArgumentError(
        "page_token is not one ListNodes returned; pass next_page_token as it was, or none");
  }
  const uint32_t page = req.page_size() == 0 ? kDefaultPage : std::min(req.page_size(), kMaxPage);
  std::lock_guard lock(mu_);
  const auto now = clock_->Now();
  size_t bytes = 0;
  auto it = req.page_token().empty() ? nodes_.begin() : nodes_.upper_bound(req.page_token());
  for (; it != nodes_.end(); ++it) {
    if (resp->nodes_size() >= static_cast<int>(page) || bytes >= kMaxPageBytes) {
      resp->set_next_page_token(std::prev(it)->first);
      break;
    }
    const auto& [id, node] = *it;
    auto* out = resp->add_nodes();
    out->set_node_id(id);
    *out->mutable_inventory() = *node.inventory;
    out->set_state(node.alive ? tributary::v1::NODE_STATE_ALIVE : tributary::v1::NODE_STATE_DEAD);
    *out->mutable_load() = node.load;
    out->set_last_heartbeat_age_s(std::chrono::duration<double>(now - node.last_heartbeat).count());
    double committed = 0;
    for (const std::string& job_id : node.jobs) {
      const auto& members = jobs_.at(job_id).members;
      auto m = members.find(id);
      if (m == members.end()) continue;
      if (m->second.worker) out->add_worker_of(job_id);
      if (m->second.server && !m->second.worker) out->add_server_of(job_id);
      committed += m->second.spare_nic_bytes_per_s;
    }
    out->set_committed_nic_bytes_per_s(committed);
    bytes += out->ByteSizeLong();
  }
  return absl::OkStatus();
}

void ClusterState::RecordObservationsLocked(const std::string& node_id,
                                            const tributary::v1::NodeLoad& load) {
  const auto now = clock_->Now();
  for (const auto& o : load.jobs()) {
    if (!jobs_.contains(o.job_id())) continue;  // bounded label set: known jobs only
    job_stats_.Record(node_id, o, now);
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
    if (node.inventory->offers_summation() && !workers.contains(id)) ++spare;
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
  // Per-job statistics over the window (GetJobStats): only jobs with reports in it.
  std::vector<std::pair<std::string, tributary::v1::JobStats>> stats;
  const auto now = clock_->Now();
  for (const auto& [id, entry] : jobs_) {
    if (!job_stats_.HasData(id, now)) continue;
    JobStatsLocked(entry, &stats.emplace_back(id, tributary::v1::JobStats()).second);
  }
  out.push_back(MakeFamily("tributary_controller_job_achieved_bytes_per_second",
                           "Data-plane bytes a worker node sent and received per second of its "
                           "busy time (the job's collectives in flight), over the window.",
                           MetricType::Gauge));
  for (const auto& [id, s] : stats) {
    if (s.achieved_bytes_per_s() > 0)
      AddSample(out.back(), s.achieved_bytes_per_s(), {{"job", id}});
  }
  out.push_back(MakeFamily("tributary_controller_job_comm_fraction",
                           "Fraction of the job's iteration time with a collective in flight, "
                           "over the window's iterations on worker nodes.",
                           MetricType::Gauge));
  for (const auto& [id, s] : stats) {
    if (s.iterations() > 0) AddSample(out.back(), s.comm_fraction(), {{"job", id}});
  }
  out.push_back(MakeFamily("tributary_controller_job_iteration_seconds",
                           "The job's iteration time on worker nodes over the window (stat: mean, "
                           "max).",
                           MetricType::Gauge));
  for (const auto& [id, s] : stats) {
    if (s.iterations() == 0) continue;
    AddSample(out.back(), s.mean_iteration_seconds(), {{"job", id}, {"stat", "mean"}});
    AddSample(out.back(), s.max_iteration_seconds(), {{"job", id}, {"stat", "max"}});
  }
  out.push_back(MakeFamily("tributary_controller_job_observed_to_predicted_ratio",
                           "Observed all-reduce seconds per byte (busy time / operation bytes on "
                           "worker nodes) over the plan's prediction.",
                           MetricType::Gauge));
  for (const auto& [id, s] : stats) {
    if (s.observed_to_predicted() > 0) {
      AddSample(out.back(), s.observed_to_predicted(), {{"job", id}});
    }
  }
  return out;
}

double ClusterState::WorkerNicLocked(const tributary::v1::Job& job) const {
  double nic = 0;
  for (const std::string& w : job.spec().worker_nodes()) {
    auto it = nodes_.find(w);
    if (it == nodes_.end()) continue;
    const double b = it->second.inventory->nic_bytes_per_s();
    if (b > 0 && (nic == 0 || b < nic)) nic = b;
  }
  return nic;
}

void ClusterState::JobStatsLocked(const JobEntry& entry, tributary::v1::JobStats* stats) const {
  const tributary::v1::Job& job = entry.job;
  const tributary::v1::JobPlan& plan = job.plan();
  stats->set_job_id(job.job_id());
  stats->set_plan_version(plan.version());
  stats->set_algorithm(plan.algorithm());
  stats->set_workers(static_cast<uint32_t>(plan.workers_size()));
  uint32_t spares = 0;
  for (const auto& s : plan.servers()) spares += !s.is_worker();
  stats->set_spares(spares);
  std::set<std::string> workers(job.spec().worker_nodes().begin(), job.spec().worker_nodes().end());
  job_stats_.Summarize(job.job_id(), workers, clock_->Now(), stats);
  stats->set_predicted_seconds_per_byte(plan.predicted_seconds_per_byte());
  stats->set_model_bytes(plan.model_bytes());
  stats->set_predicted_seconds(plan.predicted_seconds());
  if (stats->observed_seconds_per_byte() > 0 && plan.predicted_seconds_per_byte() > 0) {
    stats->set_observed_to_predicted(stats->observed_seconds_per_byte() /
                                     plan.predicted_seconds_per_byte());
  }
  stats->set_nic_bytes_per_s(WorkerNicLocked(job));
}

absl::Status ClusterState::GetJobStats(const tributary::v1::GetJobStatsRequest& req,
                                       tributary::v1::JobStats* stats) {
  constexpr int kMaxWhatIf = 64;
  constexpr uint32_t kMaxNodes = 65536;
  if (req.what_if_size() > kMaxWhatIf) {
    return absl::InvalidArgumentError(
        absl::StrCat("at most ", kMaxWhatIf, " what-if pairs, got ", req.what_if_size()));
  }
  std::vector<std::pair<uint32_t, uint32_t>> what_if;
  for (const auto& w : req.what_if()) {
    if (w.workers() < 1 || w.workers() > kMaxNodes || w.spares() > kMaxNodes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "what-if (", w.workers(), " workers, ", w.spares(), " spares): workers must be in [1, ",
          kMaxNodes, "] and spares in [0, ", kMaxNodes, "]"));
    }
    what_if.emplace_back(w.workers(), w.spares());
  }
  std::lock_guard lock(mu_);
  auto it = jobs_.find(req.job_id());
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job '", req.job_id(), "' not found"));
  }
  JobStatsLocked(it->second, stats);
  if (what_if.empty()) {
    const auto& spec_workers = it->second.job.spec().worker_nodes();
    uint32_t available = 0;
    for (const auto& [id, node] : summation_nodes_) {
      available += std::find(spec_workers.begin(), spec_workers.end(), id) == spec_workers.end();
    }
    what_if = DefaultWhatIfGrid(stats->workers(), stats->spares(), available);
  }
  for (tributary::v1::WhatIfPrediction& p :
       PredictWhatIf(what_if, stats->nic_bytes_per_s(), stats->model_bytes(), stats->workers(),
                     stats->spares())) {
    *stats->add_what_if() = std::move(p);
  }
  return absl::OkStatus();
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
  if (job.spec().elastic() && !dead.empty() &&
      job.plan().workers_size() < job.spec().worker_nodes_size()) {
    // Elastic: the plan runs on the survivors.
    job.set_state(tributary::v1::JOB_STATE_RUNNING);
    job.set_message(absl::StrCat(
        "elastic: running on ", job.plan().workers_size(), " of ", job.spec().worker_nodes_size(),
        " worker nodes (membership generation ", job.plan().generation(), "); down: ", dead));
    return;
  }
  job.set_state(dead.empty() ? tributary::v1::JOB_STATE_RUNNING
                             : tributary::v1::JOB_STATE_DEGRADED);
  job.set_message(dead.empty() ? "" : absl::StrCat("worker nodes down: ", dead));
}

absl::Status ClusterState::CreateJob(const tributary::v1::CreateJobRequest& req,
                                     tributary::v1::Job* job) {
  tributary::v1::Job whole;
  RETURN_IF_ERROR(CreateWholeJob(req, &whole));
  tributary::v1::CopyJobPage(whole, 0, options_.reply_page_bytes, /*continuable=*/!req.dry_run(),
                             job);
  return absl::OkStatus();
}

absl::Status ClusterState::CreateWholeJob(const tributary::v1::CreateJobRequest& req,
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
  // Returns true when the request is answered (an existing job, or an error).
  auto existing = [&](absl::Status* status) {
    auto it = jobs_.find(req.job_id());
    if (it == jobs_.end()) return false;
    if (!MessageDifferencer::Equals(it->second.job.spec(), *spec)) {
      *status = absl::AlreadyExistsError(
          absl::StrCat("job '", req.job_id(), "' exists with a different spec; delete it first"));
    } else {
      *job = Redacted(it->second.job);  // idempotent retry
      *status = absl::OkStatus();
    }
    return true;
  };
  constexpr int kAttempts = 4;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    PlanWork work;
    work.job_id = req.job_id();
    work.spec = *spec;
    {
      std::lock_guard lock(mu_);
      if (absl::Status s; existing(&s)) return s;
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
      work.snapshot = SnapshotLocked(req.job_id(), *spec);
    }
    Plan(work);  // off the lock: the plan, its wire form and index
    if (!work.status.ok()) return work.status;
    tributary::v1::JobPlan& plan = work.prepared.plan;
    plan.set_job_secret(NewJobSecret());
    // The answer, copied off the lock (without the secret); its version and state come below.
    job->Clear();
    job->set_job_id(req.job_id());
    *job->mutable_spec() = *spec;
    *job->mutable_plan() = plan;
    job->mutable_plan()->clear_job_secret();
    std::lock_guard lock(mu_);
    if (absl::Status s; existing(&s)) return s;  // created by a concurrent call meanwhile
    if (!StillValidLocked(work)) {
      plan_conflicts_->Increment();
      continue;
    }
    // Above every version handed out: a job created again under an old id never reuses an epoch.
    const uint64_t version = max_plan_version_ + 1;
    plan.set_version(version);
    job->mutable_plan()->set_version(version);
    UpdateJobStateLocked(*job);
    if (req.dry_run()) return absl::OkStatus();
    if (store_ != nullptr) {
      tributary::v1::Job stored = *job;
      stored.mutable_plan()->set_job_secret(plan.job_secret());
      if (absl::Status s = PersistLocked({&stored}, {}, version); !s.ok()) {
        return absl::UnavailableError(
            absl::StrCat("job '", req.job_id(), "' was not created: ", s.message()));
      }
    }
    max_plan_version_ = version;
    JobEntry& entry = jobs_[req.job_id()];
    entry.job.set_job_id(req.job_id());
    *entry.job.mutable_spec() = *spec;
    entry.job.set_state(job->state());
    entry.job.set_message(job->message());
    SetPlanLocked(entry, std::move(work.prepared));
    Log()->info(
        "job {} created: {} workers, {} summation servers, predicted {:.3f} s vs ring "
        "{:.3f} s for {} bytes",
        req.job_id(), job->plan().workers_size(), job->plan().servers_size(),
        job->plan().predicted_seconds(), job->plan().ring_seconds(), job->plan().model_bytes());
    return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat("job '", req.job_id(),
                   "' was not created: its nodes kept changing while it was planned; retry"));
}

absl::Status ClusterState::GetJob(const std::string& job_id, tributary::v1::Job* job) {
  tributary::v1::GetJobRequest req;
  req.set_job_id(job_id);
  return GetJob(req, job);
}

absl::Status ClusterState::GetJob(const tributary::v1::GetJobRequest& req,
                                  tributary::v1::Job* job) {
  tributary::v1::PlanPageToken token;
  if (!req.plan_page_token().empty()) {
    absl::StatusOr<tributary::v1::PlanPageToken> decoded =
        tributary::v1::DecodePlanPageToken(req.plan_page_token());
    if (!decoded.ok()) return decoded.status();
    token = *decoded;
  }
  std::lock_guard lock(mu_);
  auto it = jobs_.find(req.job_id());
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job '", req.job_id(), "' not found"));
  }
  tributary::v1::Job& stored = it->second.job;
  if (!req.plan_page_token().empty()) {
    if (token.version != stored.plan().version()) {
      return absl::AbortedError(
          absl::StrCat("job '", req.job_id(), "' was re-planned (version ", token.version, " -> ",
                       stored.plan().version(),
                       ") since the page token's page; read it again from the first "
                       "page"));
    }
    if (token.first >= tributary::v1::PlanEntries(stored.plan())) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan_page_token of job '", req.job_id(), "' points past its plan"));
    }
  }
  tributary::v1::CopyJobPage(stored, token.first, options_.reply_page_bytes,
                             /*continuable=*/true, job);
  job->mutable_plan()->clear_job_secret();
  return absl::OkStatus();
}

absl::Status ClusterState::ListJobs(const tributary::v1::ListJobsRequest& req,
                                    tributary::v1::ListJobsResponse* resp) {
  constexpr uint32_t kDefaultPage = 100, kMaxPage = 1000;
  if (!req.page_token().empty() && !ValidId(req.page_token())) {
    return absl::InvalidArgumentError(
        "page_token is not one ListJobs returned; pass next_page_token as it was, or none");
  }
  const uint32_t page = req.page_size() == 0 ? kDefaultPage : std::min(req.page_size(), kMaxPage);
  std::lock_guard lock(mu_);
  size_t bytes = 0;
  auto it = req.page_token().empty() ? jobs_.begin() : jobs_.upper_bound(req.page_token());
  for (; it != jobs_.end(); ++it) {
    if (resp->jobs_size() >= static_cast<int>(page) || bytes >= options_.reply_page_bytes) {
      resp->set_next_page_token(std::prev(it)->first);
      break;
    }
    // A job's plan gets what is left of the page (its first entry at least); GetJob reads the
    // rest of a cut one.
    tributary::v1::Job* job = resp->add_jobs();
    bytes += tributary::v1::CopyJobPage(it->second.job, 0, options_.reply_page_bytes - bytes,
                                        /*continuable=*/true, job);
    job->mutable_plan()->clear_job_secret();
    bytes += job->ByteSizeLong() - job->plan().ByteSizeLong();
  }
  return absl::OkStatus();
}

absl::Status ClusterState::DeleteJob(const std::string& job_id) {
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return absl::OkStatus();
    if (absl::Status s = PersistLocked({}, {job_id}, max_plan_version_); !s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("job '", job_id, "' was not deleted: ", s.message()));
    }
    JobEntry entry = std::move(it->second);
    jobs_.erase(it);
    marked_.erase(job_id);
    // Its series go with it (the scrape-time ones follow jobs_ and the book).
    job_stats_.RemoveJob(job_id);
    const prometheus::Labels labels{{"job", job_id}};
    if (observed_bytes_->Has(labels)) observed_bytes_->Remove(&observed_bytes_->Add(labels));
    if (observed_seconds_->Has(labels)) observed_seconds_->Remove(&observed_seconds_->Add(labels));
    if (observed_per_byte_->Has(labels)) {
      observed_per_byte_->Remove(&observed_per_byte_->Add(labels));
    }
    std::set<std::string> touched;
    for (const auto& [id, member] : entry.members) touched.insert(id);
    for (const std::string& id : entry.lost) touched.insert(id);
    for (const auto& w : entry.job.spec().worker_nodes()) touched.insert(w);
    for (auto& [id, node] : nodes_) node.jobs.erase(job_id);  // rare: the whole index, to be sure
    entry.members.clear();
    for (const std::string& id : touched) {
      if (auto n = nodes_.find(id); n != nodes_.end()) RecommitLocked(id, n->second);
    }
    BumpLocked(touched);
    // The capacity it used on spare nodes is free again.
    for (const auto& [id, other] : jobs_) MarkLocked(id);
    Log()->info("job {} deleted", job_id);
  }
  if (options_.replan_debounce.count() == 0) ReplanDue();
  return absl::OkStatus();
}

void ClusterState::TouchLocked(const std::string& node_id, NodeEntry& node) {
  node.last_heartbeat = clock_->Now();
  if (node.alive) {
    beats_.splice(beats_.end(), beats_, node.beat);
  } else {
    node.beat = beats_.emplace(beats_.end(), node_id, &node);
    node.alive = true;
    if (node.in_dead) dead_.erase(node.dead);
    node.in_dead = false;
  }
}

void ClusterState::MarkDeadLocked(const std::string& node_id, NodeEntry& node) {
  beats_.erase(node.beat);
  node.alive = false;
  node.died_at = clock_->Now();
  node.dead = dead_.emplace(dead_.end(), node_id, &node);
  node.in_dead = true;
  summation_nodes_.erase(node_id);
  UpdateSpareLocked(node_id, node);
  for (const std::string& id : node.jobs) {
    JobEntry& entry = jobs_.at(id);
    if (entry.members.contains(node_id)) entry.lost.insert(node_id);
    UpdateJobStateLocked(entry.job, entry.awaiting);
    MarkLocked(id);
  }
}

common::Clock::TimePoint ClusterState::NextCheck() const {
  std::lock_guard lock(mu_);
  common::Clock::TimePoint next = common::Clock::TimePoint::max();
  if (!beats_.empty()) {
    // Dead once strictly more than the timeout has passed.
    next = beats_.front().second->last_heartbeat + options_.heartbeat_timeout +
           std::chrono::microseconds(1);
  }
  for (const auto& [id, since] : marked_) next = std::min(next, since + options_.replan_debounce);
  if (!dead_.empty())
    next = std::min(next, dead_.front().second->died_at + options_.dead_watch_linger);
  if (restoring_) next = std::min(next, restored_at_ + options_.restore_grace);
  return next;
}

void ClusterState::CheckLiveness() {
  {
    std::lock_guard lock(mu_);
    const auto now = clock_->Now();
    if (now - stats_expired_at_ >= std::chrono::seconds(1)) {  // a window is tens of seconds
      job_stats_.Expire(now);
      stats_expired_at_ = now;
    }
    if (restoring_ && now - restored_at_ >= options_.restore_grace) {
      restoring_ = false;
      for (auto& [id, entry] : jobs_) {
        if (entry.awaiting.empty()) continue;
        Log()->warn(
            "job {}: nodes {} did not register within {} ms of the restore; re-planning "
            "without them",
            id, absl::StrJoin(entry.awaiting, ", "), options_.restore_grace.count());
        entry.awaiting.clear();
        MarkLocked(id);
      }
    }
    size_t died = 0;
    while (!beats_.empty() &&
           now - beats_.front().second->last_heartbeat > options_.heartbeat_timeout) {
      const std::string id = beats_.front().first;
      MarkDeadLocked(id, *beats_.front().second);
      if (++died <= 10) {
        Log()->warn("node {} missed heartbeats for {} ms: dead", id,
                    options_.heartbeat_timeout.count());
      }
    }
    if (died > 10) Log()->warn("{} more nodes missed heartbeats: dead", died - 10);
    // Nodes dead for a while lose their watch streams: a vanished machine's connection then has
    // no call, and the server closes it once idle (controller/main.cc), instead of keeping it for
    // good without keepalive pings. A node back within the linger keeps its stream.
    while (!dead_.empty() && now - dead_.front().second->died_at >= options_.dead_watch_linger) {
      auto [id, node] = dead_.front();
      dead_.pop_front();
      node->in_dead = false;
      const absl::Status why = absl::UnavailableError(absl::StrCat(
          "node '", id, "' has been dead (no heartbeat) for ",
          options_.dead_watch_linger.count() / 1000, " s; watch again once it heartbeats"));
      for (AssignmentsWatcher* w : std::exchange(node->watchers, {})) w->End(why);
    }
  }
  ReplanDue();
}

}  // namespace tributary::controller
