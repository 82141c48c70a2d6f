// Turns a cluster snapshot and a job spec into the job's plan. Pure: no I/O, no clock.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "tributary/v1/controller.pb.h"

namespace tributary::controller {

// What the planner knows of one node at planning time.
struct NodeSnapshot {
  std::string node_id;
  // Shared with the controller's registry (never null): a snapshot of 10,000 nodes copies
  // pointers, not topologies.
  std::shared_ptr<const tributary::v1::NodeInventory> inventory;
  bool alive = false;
  // Fraction of the node's CPU busy with other work (from heartbeats), in [0, 1].
  double cpu_busy_fraction = 0;
  // NIC bandwidth already promised to other jobs' summation, bytes/s.
  double committed_nic_bytes_per_s = 0;
  // NIC traffic the node's heartbeats measure that is not Tributary's own data plane (the busier
  // direction), bytes/s: ForeignNicBytesPerSecond. The planner subtracts committed + measured.
  double measured_nic_bytes_per_s = 0;
  // The node's agent process (RegisterNodeRequest.agent_instance; 0 = unknown): written into
  // the plan for each worker and server.
  uint64_t agent_instance = 0;
  // TopologyKey(inventory->topology()) when the caller keeps it (the controller computes it once
  // per registration); null: PlanJob computes it.
  std::shared_ptr<const std::string> topology_key;
};

// How useful a node is as a spare summation server; the planner takes the most useful first
// (ties by node id): min(free NIC, summation rate scaled by idle CPU), where free NIC is the
// declared bandwidth minus `committed` (other jobs' plans) and `measured` (foreign traffic).
// nullopt when it is no candidate: dead, offering no summation, declaring no NIC, or with less
// than 5 % of it free. One function for the planner and the controller's index of spares, so
// both order nodes identically.
std::optional<double> SpareUsefulness(const tributary::v1::NodeInventory& inventory, bool alive,
                                      double cpu_busy_fraction, double committed_nic_bytes_per_s,
                                      double measured_nic_bytes_per_s);

// What a node's intra-node plan depends on: its topology without hostname and source, serialized
// deterministically. Nodes of one model have the same key.
std::string TopologyKey(const tributary::v1::Topology& topology);

// Intra-node plans by topology key and GPU set, shared by the PlanJob calls given it: nodes of
// one model are planned once per controller, not once per job and re-plan (a DGX-1's max-flow
// trees take milliseconds). Thread-safe. Holds at most kMaxEntries; full, it starts again empty.
class IntraNodePlanCache {
 public:
  static constexpr size_t kMaxEntries = 256;
  // Null when absent.
  std::shared_ptr<const tributary::v1::IntraNodePlan> Find(const std::string& key) const;
  void Insert(const std::string& key, std::shared_ptr<const tributary::v1::IntraNodePlan> plan);
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const tributary::v1::IntraNodePlan>> plans_;
};

// Framing on the wire per data-plane byte that NIC counters see and the agent's message counts
// do not (Ethernet, IP, TCP, ACKs, UCX headers): generous for MTU 1500 (1514 / 1448 = 1.046).
inline constexpr double kWireOverhead = 1.06;

// The traffic of a node's heartbeat that is not its own data plane: max over directions of
// nic - kWireOverhead x data plane, never below 0. Tributary's own traffic is already in the
// other jobs' plans (committed), and traffic of a job that just ended must not count at all.
double ForeignNicBytesPerSecond(const tributary::v1::NodeLoad& load);

// The chunk size the planner picks when a job leaves partition_bytes at 0: the largest power of
// two in [64 KiB, 4 MiB] that still cuts `model_bytes` into >= 64 chunks per summation server.
// Push/pull is store-and-forward per chunk, so an all-reduce takes about (G + 1) group times
// for G groups of one chunk per server: 64 keeps the pipeline's fill and drain within ~2% of
// the model. (16 left ~6%: on the emulated cluster, 4 workers + 4 spares at 125 Mbit/s, a
// 64 MiB all-reduce took 4.97 s in 512 KiB chunks and 4.53 s in 128 KiB ones, the model 4.33 s.)
uint64_t AutoPartitionBytes(uint64_t model_bytes, uint32_t num_servers);

// The credit window the planner picks when a job leaves credit_bytes at 0: 4 chunks and at least
// 2 MiB per summation server (at least 4 chunks, at most 256 MiB). A worker must keep about two
// "groups" (one chunk on every server) in flight to push one group while the previous one is
// summed and pulled; with a single group, pushes and pulls alternate and the job runs at half
// speed. The 2 MiB floor keeps small chunks from shrinking the window: with many tensors in
// flight it holds the backlog of all of them (ResNet-50's gradients, 4 workers + 4 spares at
// 125 Mbit/s in 128 KiB chunks: 7.6-7.7 s with a 4 MiB window, 7.3 s with 16 MiB; spreads of
// 4-6 % per run, bench/results/partition_125mbit/).
uint64_t AutoCreditBytes(uint64_t partition_bytes, uint32_t num_servers);

// Fills in the defaults of a spec and checks its ranges. INVALID_ARGUMENT naming the field.
absl::StatusOr<tributary::v1::JobSpec> NormalizeJobSpec(const tributary::v1::JobSpec& spec);

// Plans `job_id` over `nodes`: the spec's worker nodes (all must be present) run the workers
// (those alive only, when the spec is elastic; FAILED_PRECONDITION when none is);
// worker nodes whose topologies are equal (hostname and source aside) share one intra-node plan;
// every other alive node that offers summation is a candidate spare server, with capacity
// B = declared NIC bandwidth minus what other jobs' plans use and minus the non-Tributary
// traffic its heartbeats measure, and C = summation rate scaled by idle CPU.
// The spec must be normalized. The plan's version is `version`. `cache` (may be null) keeps
// intra-node plans across calls.
absl::StatusOr<tributary::v1::JobPlan> PlanJob(const std::string& job_id,
                                               const tributary::v1::JobSpec& spec,
                                               const std::vector<NodeSnapshot>& nodes,
                                               uint64_t version,
                                               IntraNodePlanCache* cache = nullptr);

// NIC bandwidth (bytes/s) `server`, a summation server of `plan`, uses when the job runs at its
// predicted speed: n * share / seconds_per_byte. 0 for a worker.
double SpareNicUse(const tributary::v1::JobPlan& plan,
                   const tributary::v1::SummationServer& server);

}  // namespace tributary::controller
