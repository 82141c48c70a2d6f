// The controller's state: registered nodes with liveness (soft state, rebuilt from
// registrations), jobs and their plans (durable when a StateStore is given).
#pragma once

#include <chrono>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "controller/job_stats.h"
#include "controller/planner/job_planner.h"
#include "controller/state_store.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "tributary/v1/controller.pb.h"
#include "tributary/v1/plan_pages.h"

namespace tributary::controller {

// Node registry, job lifecycle and plan versions. Every method is thread-safe, and none plans
// while holding the state's mutex: a plan is computed from a snapshot (the job's worker nodes and
// the alive summation nodes, inventories shared, not copied) off the lock and committed with a
// check that the nodes it uses are still there, alive and unchanged (else planned again), so
// heartbeats never wait for a planner. The only I/O is one StateStore transaction per job change
// (create, delete, re-plan), written under the mutex before the change is visible or answered.
//
// A node is dead once it has missed heartbeats for `heartbeat_timeout`; CheckLiveness (called
// periodically, or by tests after moving a FakeClock) applies that. Events mark only the jobs
// they affect for a re-plan: a death the jobs whose plan or worker list names the node, a return
// the jobs that name it as a worker or lost it when it died (not every job), a new node or a
// changed inventory every job (new capacity). Marked jobs are re-planned once `replan_debounce`
// has passed since they were first marked (so a burst of deaths and returns costs one re-plan
// per job), by CheckLiveness; with a zero debounce, at once, before the call that caused them
// returns. Any change to a job's plan bumps the job's plan version (its epoch: it never repeats,
// across restarts and across a delete and a create of the same id).
//
// Assignments: each node has its own assignments version, bumped only when a plan it takes part
// in changes (or it joins or leaves one), and gets only its part of each plan (every field but
// `intra_node`, of which only its own entry). The part is serialized once per plan version and
// shared by every message that carries it; AssignmentsWatchers (watch streams) get one message
// per change, in version order.
//
// Restore: jobs read back from the store keep their stored plan, and their version, until every
// node of the plan has registered again (or `restore_grace` has passed; the missing nodes then
// count as dead); meanwhile the job is DEGRADED and its message names the nodes it waits for.
// Registrations within the grace are rejoins, not membership changes: they re-plan nothing
// (a node back at a new data-plane address re-plans its jobs once all their nodes are back).
class ClusterState {
 public:
  struct Options {
    std::chrono::milliseconds heartbeat_interval{500};
    std::chrono::milliseconds heartbeat_timeout{3000};
    // How long restored jobs wait for their nodes to register before re-planning without them.
    std::chrono::milliseconds restore_grace{10000};
    // Jobs marked for a re-plan wait this long for more events (zero: re-planned at once).
    std::chrono::milliseconds replan_debounce{0};
    // Heartbeats per second the controller takes from all nodes together: the interval handed
    // to agents is heartbeat_interval, or nodes / this when that is longer (at most a third of
    // the timeout).
    double max_heartbeats_per_s = 10000;
    // GetJobStats and the per-job metrics cover the agents' reports of the last window; a node
    // that stops reporting a job drops out of it after this long.
    std::chrono::milliseconds job_stats_window{30000};
    // A node dead for this long has its watch streams ended (AssignmentsWatcher::End).
    std::chrono::milliseconds dead_watch_linger{60000};
    // About the most bytes of plan lists in one reply (CreateJob, GetJob, ListJobs).
    size_t reply_page_bytes = tributary::v1::kPlanPageBytes;
    // Jobs with max_spare_nodes plan over the index of spares (O(k log n)); false: over every
    // summation node, as jobs without it do (tests compare the two).
    bool spare_index = true;
  };

  // One watch stream of a node's assignments (the service's reactor). Push and End run with the
  // state's mutex held: they must not block or call into ClusterState.
  class AssignmentsWatcher {
   public:
    virtual ~AssignmentsWatcher() = default;
    // `message` is a serialized WatchAssignmentsResponse at `version`.
    virtual void Push(uint64_t version, const grpc::ByteBuffer& message) = 0;
    // The node has been dead for Options::dead_watch_linger: ClusterState has dropped the watcher
    // (no Push follows), and the stream should end with `why` (the agent watches again).
    virtual void End(const absl::Status& why) = 0;
  };

  // `registry` receives the controller's event metrics (dashboards/METRICS.md); null: one of its
  // own. `store` makes jobs durable; null: they live in memory only. Both must outlive this
  // object.
  ClusterState(const common::Clock* clock, Options options, uint64_t incarnation_seed,
               prometheus::Registry* registry = nullptr, StateStore* store = nullptr);

  // Reads the store's jobs back (call once, before serving): returns how many. Without a store:
  // 0. Errors (a corrupt row, a locked file) name the file; the controller must not start.
  absl::StatusOr<size_t> Restore();

  absl::Status RegisterNode(const tributary::v1::RegisterNodeRequest& req,
                            tributary::v1::RegisterNodeResponse* resp);
  absl::Status Heartbeat(const tributary::v1::HeartbeatRequest& req,
                         tributary::v1::HeartbeatResponse* resp);
  absl::Status GetAssignments(const tributary::v1::GetAssignmentsRequest& req,
                              tributary::v1::GetAssignmentsResponse* resp);
  // Subscribes `watcher` to the node's assignments: pushes the current ones at once unless they
  // are at req.since_version, then every change, until Unwatch. NOT_FOUND for an unknown node or
  // a stale incarnation.
  absl::Status Watch(const tributary::v1::WatchAssignmentsRequest& req,
                     AssignmentsWatcher* watcher);
  // After it returns, `watcher` is never called again. Idempotent.
  void Unwatch(const std::string& node_id, AssignmentsWatcher* watcher);
  // One page, in node id order. INVALID_ARGUMENT for a page token that is no node id.
  absl::Status ListNodes(const tributary::v1::ListNodesRequest& req,
                         tributary::v1::ListNodesResponse* resp);

  // The reply is the job's first page (PlanPage).
  absl::Status CreateJob(const tributary::v1::CreateJobRequest& req, tributary::v1::Job* job);
  // Replies carry at most about Options::reply_page_bytes of a plan's per-node lists
  // (controller.proto, PlanPage). GetJob: NOT_FOUND for an unknown job, INVALID_ARGUMENT for a
  // page token it did not write, ABORTED when the job was re-planned since the token's page.
  absl::Status GetJob(const tributary::v1::GetJobRequest& req, tributary::v1::Job* job);
  // The first page of the job.
  absl::Status GetJob(const std::string& job_id, tributary::v1::Job* job);
  // One page, in job id order. INVALID_ARGUMENT for a page token that is no job id.
  absl::Status ListJobs(const tributary::v1::ListJobsRequest& req,
                        tributary::v1::ListJobsResponse* resp);
  absl::Status DeleteJob(const std::string& job_id);
  // The job's observed communication over the window (agents' JobObservations aggregated over
  // its nodes), the plan's prediction beside it, and the split planner's what-if predictions
  // (req.what_if, or a default grid). NOT_FOUND for an unknown job, INVALID_ARGUMENT for a
  // what-if pair out of range.
  absl::Status GetJobStats(const tributary::v1::GetJobStatsRequest& req,
                           tributary::v1::JobStats* stats);

  // Marks nodes without a recent heartbeat dead, and re-plans the jobs whose debounce is over.
  void CheckLiveness();
  // When CheckLiveness next has something to do as things stand (the first alive node's
  // heartbeat expiring, a marked job's debounce ending, a dead node's watch linger ending, the
  // restore grace ending); later events may make it sooner.
  common::Clock::TimePoint NextCheck() const;

  // The highest assignments version handed to any node.
  uint64_t assignments_version() const;
  // The node's assignments version (0 for an unknown node).
  uint64_t assignments_version(const std::string& node_id) const;
  // Jobs marked for a re-plan and not re-planned yet.
  size_t pending_replans() const;

  // Scrape-time metrics of the state: nodes and jobs by state, predicted seconds per byte.
  std::vector<prometheus::MetricFamily> CollectMetrics() const;
  // A collector calling CollectMetrics (this object must outlive its scrapes).
  std::shared_ptr<prometheus::Collectable> collector() const;

 private:
  // Heartbeats whose foreign traffic a spare must show before the planner discounts it: the
  // agent counts its data plane's bytes when a message is handed to the transport, the NIC when
  // they leave, so the heartbeat after a large transfer shows them as foreign traffic once (on
  // the emulated cluster a job planned right after another gave its spares 0.69-1.0 of their
  // share and ran 15 % slower). Traffic that is really another's lasts.
  static constexpr size_t kForeignSamples = 3;
  struct NodeEntry {
    std::shared_ptr<const tributary::v1::NodeInventory> inventory;
    // TopologyKey of the inventory's topology, computed when the inventory changes.
    std::shared_ptr<const std::string> topology_key;
    tributary::v1::NodeLoad load;
    // ForeignNicBytesPerSecond of its last kForeignSamples heartbeats, oldest first (one that
    // kept the load counts again); the planner sees their minimum (ForeignOf).
    std::deque<double> foreign;
    uint64_t incarnation = 0;
    // RegisterNodeRequest.agent_instance of its last registration (0 = unknown).
    uint64_t agent_instance = 0;
    // RegisterNodeRequest.expands_packed_plans of its last registration.
    bool packed_plans = false;
    common::Clock::TimePoint last_heartbeat;
    bool alive = false;
    // Its place in beats_, while alive.
    std::list<std::pair<std::string, NodeEntry*>>::iterator beat;
    // Since when it is dead, and its place in dead_ until its watchers are ended.
    common::Clock::TimePoint died_at;
    std::list<std::pair<std::string, NodeEntry*>>::iterator dead;
    bool in_dead = false;
    uint64_t assignments_version = 0;
    // Jobs whose worker list or plan names this node, or that lost it when it died.
    std::set<std::string> jobs;
    // NIC the plans of `jobs` use on it as a spare server, summed in `jobs` order
    // (RecommitLocked, whenever a plan naming it changes).
    double committed_nic_bytes_per_s = 0;
    // Its usefulness as a spare (SpareUsefulness): its key in spare_index_, while it is there.
    std::optional<double> spare_usefulness;
    std::vector<AssignmentsWatcher*> watchers;
  };
  // A node's part in a job's current plan.
  struct Member {
    bool worker = false;
    bool server = false;
    double spare_nic_bytes_per_s = 0;  // SpareNicUse: NIC this job uses on it as a spare server
  };
  struct JobEntry {
    tributary::v1::Job job;
    // Restored jobs: nodes of the stored plan that have not registered since the restore. The
    // plan is not recomputed while this is non-empty.
    std::set<std::string> awaiting;
    // A node came back at another data-plane address than the restored plan has: re-plan once
    // `awaiting` is empty.
    bool stale = false;
    // Nodes of the plan that died since: their return re-plans the job.
    std::set<std::string> lost;
    // A worker node's agent restarted (its processes lost their sessions): the next plan moves
    // the membership generation.
    bool new_generation = false;
    std::unordered_map<std::string, Member> members;
    // The plan on the wire: the head (job id, version, secret, generation: what a commit sets),
    // the body (every other field but intra_node, built off the lock once per plan) and each
    // worker node's own intra_node entry (tag included). A node's copy is head + body + its entry.
    grpc::Slice wire_head;
    grpc::Slice wire_body;        // packed (api/tributary/v1/assigned_plan.h)
    grpc::Slice wire_body_whole;  // the same fields whole, for agents that do not expand
    std::unordered_map<std::string, grpc::Slice> wire_intra;
  };
  // A plan with its wire body, intra-node entries and member index, built off the lock.
  struct PreparedPlan {
    tributary::v1::JobPlan plan;
    grpc::Slice wire_body;
    grpc::Slice wire_body_whole;
    std::unordered_map<std::string, grpc::Slice> wire_intra;
    std::unordered_map<std::string, Member> members;
  };
  // A plan computed off the lock, and what it was computed from.
  struct PlanWork {
    std::string job_id;
    tributary::v1::JobSpec spec;
    uint64_t base_version = 0;  // the job's plan version when snapshotted
    std::vector<NodeSnapshot> snapshot;
    absl::Status status = absl::UnknownError("not planned");
    PreparedPlan prepared;  // when status is OK
    // The snapshot by node id (built off the lock, for StillValidLocked).
    std::unordered_map<std::string, const NodeSnapshot*> planned;
  };

  // The planner's input for a job: its worker nodes and the alive summation nodes, with the NIC
  // other jobs' plans use on each. mu_ held.
  std::vector<NodeSnapshot> SnapshotLocked(const std::string& job_id,
                                           const tributary::v1::JobSpec& spec) const;
  // Plans and prepares off the lock; times and counts it.
  void Plan(PlanWork& work) const;
  // The wire body, intra-node entries and member index of `plan`.
  static PreparedPlan Prepare(tributary::v1::JobPlan plan);
  // Whether every node the work's plan uses is still registered at the inventory it was planned
  // with and every spare server is alive. mu_ held.
  bool StillValidLocked(const PlanWork& work) const;
  // Sums the NIC the plans of node.jobs use on the node. mu_ held.
  void RecommitLocked(const std::string& node_id, NodeEntry& node);
  // Puts the node at its place in spare_index_ (or out of it). mu_ held.
  void UpdateSpareLocked(const std::string& node_id, NodeEntry& node);
  // The foreign NIC traffic the planner counts for `node`: the least of its last heartbeats'.
  static double ForeignOf(const NodeEntry& node);
  // Re-plans `job_ids` one at a time, smallest first (a small job's new plan does not wait for
  // a large one's planning). mu_ NOT held.
  void Replan(std::vector<std::string> job_ids);
  // Re-plans one job (snapshot, plan, commit; again on a conflict) and stores a changed plan.
  // When the write fails the previous plan stays (a plan is never handed out before it is
  // durable) and the job is marked again. mu_ NOT held.
  void ReplanJob(std::string job_id);
  // CreateJob with the whole plan in the reply.
  absl::Status CreateWholeJob(const tributary::v1::CreateJobRequest& req, tributary::v1::Job* job);
  // Re-plans the marked jobs whose debounce is over. mu_ NOT held.
  void ReplanDue();
  void MarkLocked(const std::string& job_id);
  // Heartbeat's NodeLoad.membership_changes from `node_id`: each job still at the reported
  // generation moves to the next one (same plan, next version). mu_ held.
  void MembershipChangesLocked(const std::string& node_id, const tributary::v1::NodeLoad& load);
  // Whether `prepared` is the job's current plan but for its version (by their bytes, whole:
  // planner outputs that packing leaves out count too).
  static bool SamePlanLocked(const PreparedPlan& prepared, const JobEntry& entry);
  // Installs `prepared` (its version, secret and generation set) as the job's plan: indexes, the
  // wire form, and the assignments of every node it adds, keeps or drops. mu_ held.
  void SetPlanLocked(JobEntry& entry, PreparedPlan prepared);
  // Re-reads which of `nodes` the job names (worker list, plan, lost) into their indexes.
  void ReindexLocked(const JobEntry& entry, const std::set<std::string>& nodes);
  // Bumps the nodes' assignments versions and pushes their assignments to their watchers.
  void BumpLocked(const std::set<std::string>& nodes);
  grpc::ByteBuffer AssignmentsMessageLocked(const std::string& node_id,
                                            const NodeEntry& node) const;
  void MarkDeadLocked(const std::string& node_id, NodeEntry& node);
  // The node was heard from now: alive, and last in beats_.
  void TouchLocked(const std::string& node_id, NodeEntry& node);
  std::chrono::milliseconds HeartbeatIntervalLocked() const;
  // One store transaction (no-op without a store); counts and logs failures. mu_ held.
  absl::Status PersistLocked(const std::vector<const tributary::v1::Job*>& put,
                             const std::vector<std::string>& deleted, uint64_t max_plan_version);
  void RecordObservationsLocked(const std::string& node_id, const tributary::v1::NodeLoad& load);
  // GetJobStats' answer for an existing job, without the what-if rows. mu_ held.
  void JobStatsLocked(const JobEntry& entry, tributary::v1::JobStats* stats) const;
  // The slowest NIC among the job's worker nodes (0 when none is registered). mu_ held.
  double WorkerNicLocked(const tributary::v1::Job& job) const;
  void UpdateJobStateLocked(tributary::v1::Job& job,
                            const std::set<std::string>& awaiting = {}) const;

  const common::Clock* clock_;
  const Options options_;
  std::unique_ptr<prometheus::Registry> own_registry_;
  prometheus::Counter* plans_ok_;
  prometheus::Counter* plans_error_;
  prometheus::Counter* plan_conflicts_;
  prometheus::Counter* generation_changes_;
  prometheus::Histogram* plan_duration_;
  prometheus::Family<prometheus::Counter>* observed_bytes_;
  prometheus::Family<prometheus::Counter>* observed_seconds_;
  prometheus::Family<prometheus::Gauge>* observed_per_byte_;
  prometheus::Counter* restores_;
  prometheus::Gauge* restored_jobs_;
  prometheus::Counter* writes_ok_;
  prometheus::Counter* writes_error_;
  StateStore* const store_;
  mutable std::mutex mu_;
  uint64_t next_incarnation_;
  uint64_t assignments_seq_ = 1;   // the last assignments version handed to a node
  uint64_t max_plan_version_ = 0;  // highest plan version handed out, restored ones included
  common::Clock::TimePoint restored_at_;
  // Jobs were restored and the grace has not passed yet: registrations are rejoins.
  bool restoring_ = false;
  std::map<std::string, NodeEntry> nodes_;
  // The alive nodes, least recently heard from first (the clock never goes back, so a heartbeat
  // moves its node to the end): CheckLiveness looks only at the nodes that expire.
  std::list<std::pair<std::string, NodeEntry*>> beats_;
  // Dead nodes whose watch streams are still open, longest dead first.
  std::list<std::pair<std::string, NodeEntry*>> dead_;
  // Alive nodes that offer summation: the spare candidates a snapshot takes.
  // The alive nodes that offer summation: the planner's spare candidates.
  std::map<std::string, NodeEntry*> summation_nodes_;
  // Every spare candidate by usefulness (its SpareUsefulness with every job's use of it
  // counted), most useful first, ties by node id: the planner's order. A job with
  // max_spare_nodes = k snapshots its workers, its own spares and the k first others here
  // instead of every summation node (Options::spare_index).
  std::map<std::pair<double, std::string>, NodeEntry*> spare_index_;
  // Intra-node plans of the nodes' topologies, across jobs and re-plans.
  mutable IntraNodePlanCache intra_cache_;
  std::map<std::string, JobEntry> jobs_;
  // Jobs to re-plan, and since when they wait.
  std::map<std::string, common::Clock::TimePoint> marked_;
  JobStatsBook job_stats_;
  common::Clock::TimePoint stats_expired_at_;  // when CheckLiveness last expired job_stats_
};

}  // namespace tributary::controller
