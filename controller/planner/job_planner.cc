#include "controller/planner/job_planner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "controller/planner/split_planner.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "topology/intra_node_planner.h"

namespace tributary::controller {
namespace {

constexpr uint64_t kMaxAutoPartitionBytes = 4 << 20;
constexpr uint64_t kMinAutoPartitionBytes = 64 << 10;
constexpr uint64_t kChunksPerServer = 64;
constexpr uint64_t kCreditGroups = 4;
constexpr uint64_t kMaxAutoCreditBytes = uint64_t{256} << 20;
constexpr uint64_t kMinCreditPerServer = uint64_t{2} << 20;
constexpr uint64_t kDefaultModelBytes = 64 << 20;
constexpr uint32_t kDefaultTimeoutMs = 30000;
constexpr uint64_t kMinAutoFusion = 4 << 20;  // automatic fusion_bytes, at least
// A spare machine left with less than this fraction of its NIC is not worth a connection.
constexpr double kMinUsefulNicFraction = 0.05;

// Summation rate scaled by idle CPU (at least a tenth of it).
double SumRate(const tributary::v1::NodeInventory& inventory, double cpu_busy_fraction) {
  const double c = inventory.sum_bytes_per_s();
  return c <= 0 ? 0.0 : c * std::max(0.1, 1.0 - std::clamp(cpu_busy_fraction, 0.0, 1.0));
}

double FreeNic(const tributary::v1::NodeInventory& inventory, double committed, double measured) {
  return inventory.nic_bytes_per_s() - committed - measured;
}

}  // namespace

std::optional<double> SpareUsefulness(const tributary::v1::NodeInventory& inventory, bool alive,
                                      double cpu_busy_fraction, double committed_nic_bytes_per_s,
                                      double measured_nic_bytes_per_s) {
  const double declared = inventory.nic_bytes_per_s();
  const double free_nic = FreeNic(inventory, committed_nic_bytes_per_s, measured_nic_bytes_per_s);
  if (!alive || !inventory.offers_summation() || declared <= 0 ||
      free_nic < kMinUsefulNicFraction * declared) {
    return std::nullopt;
  }
  const double sum = SumRate(inventory, cpu_busy_fraction);
  return std::min(free_nic, sum > 0 ? sum : free_nic);
}

std::string TopologyKey(const tributary::v1::Topology& topology) {
  tributary::v1::Topology anonymous = topology;
  anonymous.clear_hostname();
  anonymous.clear_source();
  std::string key;
  {
    google::protobuf::io::StringOutputStream out(&key);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    anonymous.SerializeToCodedStream(&coded);
  }
  return key;
}

std::shared_ptr<const tributary::v1::IntraNodePlan> IntraNodePlanCache::Find(
    const std::string& key) const {
  std::lock_guard lock(mu_);
  auto it = plans_.find(key);
  return it == plans_.end() ? nullptr : it->second;
}

void IntraNodePlanCache::Insert(const std::string& key,
                                std::shared_ptr<const tributary::v1::IntraNodePlan> plan) {
  std::lock_guard lock(mu_);
  if (plans_.size() >= kMaxEntries) plans_.clear();
  plans_[key] = std::move(plan);
}

size_t IntraNodePlanCache::size() const {
  std::lock_guard lock(mu_);
  return plans_.size();
}

double ForeignNicBytesPerSecond(const tributary::v1::NodeLoad& load) {
  const double tx = load.nic_tx_bytes_per_s() - kWireOverhead * load.dataplane_tx_bytes_per_s();
  const double rx = load.nic_rx_bytes_per_s() - kWireOverhead * load.dataplane_rx_bytes_per_s();
  return std::max({0.0, tx, rx});
}

uint64_t AutoPartitionBytes(uint64_t model_bytes, uint32_t num_servers) {
  const uint64_t per_chunk = model_bytes / (kChunksPerServer * std::max<uint32_t>(1, num_servers));
  uint64_t p = kMaxAutoPartitionBytes;
  while (p > kMinAutoPartitionBytes && p > per_chunk) p >>= 1;
  return p;
}

uint64_t AutoCreditBytes(uint64_t partition_bytes, uint32_t num_servers) {
  const uint64_t per_server = std::max(kCreditGroups * partition_bytes, kMinCreditPerServer);
  const uint64_t window = per_server * std::max<uint32_t>(1, num_servers);
  return std::max(4 * partition_bytes, std::min(window, kMaxAutoCreditBytes));
}

absl::StatusOr<tributary::v1::JobSpec> NormalizeJobSpec(const tributary::v1::JobSpec& in) {
  tributary::v1::JobSpec spec = in;
  if (spec.worker_nodes().empty()) {
    return absl::InvalidArgumentError("worker_nodes is empty: name the nodes that run workers");
  }
  std::set<std::string> seen;
  for (const std::string& n : spec.worker_nodes()) {
    if (n.empty()) return absl::InvalidArgumentError("worker_nodes contains an empty node id");
    if (!seen.insert(n).second) {
      return absl::InvalidArgumentError(absl::StrCat("worker node '", n, "' is listed twice"));
    }
  }
  if (spec.procs_per_node() == 0) spec.set_procs_per_node(1);
  if (spec.procs_per_node() > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("procs_per_node ", spec.procs_per_node(), " is above 1024"));
  }
  // 0 = chosen by the planner (AutoPartitionBytes / AutoCreditBytes).
  if (spec.partition_bytes() != 0 &&
      (spec.partition_bytes() < 64 || spec.partition_bytes() > (uint64_t{1} << 30))) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition_bytes ", spec.partition_bytes(), " is outside [64 B, 1 GiB]"));
  }
  if (spec.credit_bytes() != 0 &&
      (spec.credit_bytes() < std::max<uint64_t>(64, spec.partition_bytes()) ||
       spec.credit_bytes() > (uint64_t{1} << 34))) {
    return absl::InvalidArgumentError(
        absl::StrCat("credit_bytes ", spec.credit_bytes(), " must be in [partition_bytes (",
                     spec.partition_bytes() == 0 ? std::string("64 B")
                                                 : absl::StrCat(spec.partition_bytes(), " B"),
                     "), 16 GiB]"));
  }
  if (spec.op_timeout_ms() == 0) spec.set_op_timeout_ms(kDefaultTimeoutMs);
  if (spec.op_timeout_ms() > 3600 * 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("op_timeout_ms ", spec.op_timeout_ms(), " is above one hour"));
  }
  if (spec.model_bytes() == 0) spec.set_model_bytes(kDefaultModelBytes);
  if (spec.mode() != tributary::v1::JOB_MODE_SYNC && spec.mode() != tributary::v1::JOB_MODE_ASYNC) {
    return absl::InvalidArgumentError(absl::StrCat("unknown job mode ", spec.mode()));
  }
  if (spec.staleness() < -1) {
    return absl::InvalidArgumentError(absl::StrCat("staleness ", spec.staleness(),
                                                   " is below -1 (-1: unbounded, 0: synchronous)"));
  }
  if (spec.has_delta_scale() && !std::isfinite(spec.delta_scale())) {
    return absl::InvalidArgumentError("delta_scale must be a finite number");
  }
  if (spec.has_fusion_bytes() && spec.fusion_bytes() > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("fusion_bytes ", spec.fusion_bytes(),
                                                   " is above 1 GiB (0 turns tensor fusion off)"));
  }
  if (spec.fusion_cycle_us() > 1000 * 1000) {
    return absl::InvalidArgumentError(absl::StrCat("fusion_cycle_us ", spec.fusion_cycle_us(),
                                                   " is above one second (0: automatic)"));
  }
  if (spec.mode() == tributary::v1::JOB_MODE_SYNC &&
      (spec.staleness() != 0 || spec.has_delta_scale())) {
    return absl::InvalidArgumentError(
        "staleness and delta_scale apply to asynchronous jobs only (mode JOB_MODE_ASYNC)");
  }
  return spec;
}

absl::StatusOr<tributary::v1::JobPlan> PlanJob(const std::string& job_id,
                                               const tributary::v1::JobSpec& requested,
                                               const std::vector<NodeSnapshot>& nodes,
                                               uint64_t version, IntraNodePlanCache* cache) {
  std::unordered_map<std::string_view, const NodeSnapshot*> by_id;
  by_id.reserve(nodes.size());
  for (const NodeSnapshot& n : nodes) by_id.try_emplace(n.node_id, &n);
  // An elastic job runs on the worker nodes that are alive, ranked in the spec's order.
  tributary::v1::JobSpec alive_workers;
  if (requested.elastic()) {
    alive_workers = requested;
    alive_workers.clear_worker_nodes();
    for (const std::string& id : requested.worker_nodes()) {
      auto it = by_id.find(id);
      if (it != by_id.end() && it->second->alive) alive_workers.add_worker_nodes(id);
    }
    if (alive_workers.worker_nodes().empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", job_id, "' is elastic but none of its ",
                       requested.worker_nodes_size(), " worker nodes is alive"));
    }
  }
  const tributary::v1::JobSpec& spec = requested.elastic() ? alive_workers : requested;
  const std::set<std::string> worker_set(spec.worker_nodes().begin(), spec.worker_nodes().end());

  auto sum_rate = [](const NodeSnapshot& n) { return SumRate(*n.inventory, n.cpu_busy_fraction); };

  std::vector<MachineCapacity> workers;
  for (const std::string& id : spec.worker_nodes()) {
    auto it = by_id.find(id);
    if (it == by_id.end()) {
      return absl::NotFoundError(
          absl::StrCat("job '", job_id, "': worker node '", id, "' is not registered"));
    }
    const NodeSnapshot& n = *it->second;
    if (n.inventory->nic_bytes_per_s() <= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", job_id, "': worker node '", id, "' declares no NIC bandwidth"));
    }
    workers.push_back({id, n.inventory->nic_bytes_per_s(), sum_rate(n)});
  }

  struct Candidate {
    MachineCapacity cap;
    double usefulness;
  };
  std::vector<Candidate> candidates;
  for (const NodeSnapshot& n : nodes) {
    if (worker_set.contains(n.node_id)) continue;
    const std::optional<double> usefulness =
        SpareUsefulness(*n.inventory, n.alive, n.cpu_busy_fraction, n.committed_nic_bytes_per_s,
                        n.measured_nic_bytes_per_s);
    if (!usefulness) continue;
    const double free_nic =
        FreeNic(*n.inventory, n.committed_nic_bytes_per_s, n.measured_nic_bytes_per_s);
    candidates.push_back({{n.node_id, free_nic, sum_rate(n)}, *usefulness});
  }
  // The most useful spares first; node id breaks ties so the plan is deterministic.
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.usefulness != b.usefulness ? a.usefulness > b.usefulness
                                        : a.cap.node_id < b.cap.node_id;
  });
  if (spec.has_max_spare_nodes() && candidates.size() > spec.max_spare_nodes()) {
    candidates.resize(spec.max_spare_nodes());
  }
  std::vector<MachineCapacity> spares;
  for (const Candidate& c : candidates) spares.push_back(c.cap);

  absl::StatusOr<SplitPlan> split = PlanSplit(workers, spares);
  if (!split.ok()) {
    return absl::Status(split.status().code(),
                        absl::StrCat("job '", job_id, "': ", split.status().message()));
  }

  tributary::v1::JobPlan plan;
  plan.set_job_id(job_id);
  plan.set_version(version);
  for (int r = 0; r < spec.worker_nodes_size(); ++r) {
    auto* w = plan.add_workers();
    w->set_node_id(spec.worker_nodes(r));
    w->set_data_plane_address(by_id.at(spec.worker_nodes(r))->inventory->data_plane_address());
    w->set_rank(r);
    w->set_down(!by_id.at(spec.worker_nodes(r))->alive);
    w->set_agent_instance(by_id.at(spec.worker_nodes(r))->agent_instance);
  }
  std::map<std::string, MachineCapacity> caps;
  for (const auto& m : workers) caps[m.node_id] = m;
  for (const auto& m : spares) caps[m.node_id] = m;
  for (const ServerShare& s : split->servers) {
    auto* out = plan.add_servers();
    out->set_node_id(s.node_id);
    out->set_data_plane_address(by_id.at(s.node_id)->inventory->data_plane_address());
    out->set_is_worker(s.is_worker);
    out->set_share(s.fraction);
    out->set_weight(s.weight);
    out->set_nic_bytes_per_s(caps[s.node_id].nic_bytes_per_s);
    out->set_sum_bytes_per_s(caps[s.node_id].sum_bytes_per_s);
    out->set_agent_instance(by_id.at(s.node_id)->agent_instance);
  }
  // Intra-node aggregation per worker node; nodes with the same topology are planned once (per
  // controller, with a cache).
  std::unordered_map<std::string, std::shared_ptr<const tributary::v1::IntraNodePlan>> by_topology;
  for (const std::string& id : spec.worker_nodes()) {
    const NodeSnapshot& node = *by_id.at(id);
    const tributary::v1::Topology& topo = node.inventory->topology();
    std::vector<int> gpus(spec.gpus().begin(), spec.gpus().end());
    if (gpus.empty()) {
      for (const auto& g : topo.gpus()) {
        if (gpus.size() < spec.procs_per_node()) gpus.push_back(g.index());
      }
      std::sort(gpus.begin(), gpus.end());
    }
    // Keyed by content: nodes of one model differ only in hostname (and maybe the file read).
    // GPUs the spec names make a failure the job's error; GPUs chosen here, the plan's.
    std::string key = node.topology_key != nullptr ? *node.topology_key : TopologyKey(topo);
    key += spec.gpus().empty() ? "|auto" : "|named";
    for (int g : gpus) key += "," + std::to_string(g);
    auto cached = by_topology.find(key);
    if (cached == by_topology.end()) {
      std::shared_ptr<const tributary::v1::IntraNodePlan> found =
          cache != nullptr ? cache->Find(key) : nullptr;
      if (found == nullptr) {
        auto intra = std::make_shared<tributary::v1::IntraNodePlan>();
        absl::StatusOr<topology::IntraNodeResult> result =
            topology::PlanIntraNode(topo, gpus, topology::LinkMode::kAll);
        if (result.ok()) {
          *intra = topology::ToProto(*result);
        } else if (!spec.gpus().empty()) {
          return absl::InvalidArgumentError(absl::StrCat("job '", job_id, "': worker node '", id,
                                                         "': ", result.status().message()));
        } else {
          intra->set_error(std::string(result.status().message()));
        }
        intra->clear_node_id();
        found = std::move(intra);
        if (cache != nullptr) cache->Insert(key, found);
      }
      cached = by_topology.emplace(std::move(key), std::move(found)).first;
    }
    tributary::v1::IntraNodePlan* intra = plan.add_intra_node();
    *intra = *cached->second;
    intra->set_node_id(id);
  }
  plan.set_algorithm(spec.algorithm());
  plan.set_procs_per_node(spec.procs_per_node());
  uint32_t active_servers = 0;
  for (const ServerShare& s : split->servers) active_servers += s.weight > 0 ? 1 : 0;
  uint64_t partition = spec.partition_bytes();
  if (partition == 0) {
    partition = AutoPartitionBytes(spec.model_bytes(), active_servers);
    if (spec.credit_bytes() != 0) partition = std::min(partition, spec.credit_bytes());
  }
  plan.set_partition_bytes(partition);
  plan.set_fixed_partition(spec.fixed_partition());
  plan.set_mode(spec.mode());
  plan.set_staleness(spec.staleness());
  plan.set_delta_scale(spec.has_delta_scale() ? spec.delta_scale() : 1.0);
  plan.set_credit_bytes(spec.credit_bytes() != 0 ? spec.credit_bytes()
                                                 : AutoCreditBytes(partition, active_servers));
  plan.set_op_timeout_ms(spec.op_timeout_ms());
  // Tensor fusion: by default the tensors smaller than one chunk and than 4 MiB, never in
  // asynchronous jobs (each process's own operations). At 125 Mbit/s with 4 workers
  // (bench/results/fusion_125mbit/, bench/results/fusion_in_place_125mbit_s29/): BERT-large's 243
  // biases and LayerNorm tensors (1.29 MB) ran Tributary's ring at 0.86x Gloo ring's speed with
  // 64 KiB and 0.94x with 1 MiB; once fused collectives ran in place and the leader decided at
  // the iteration's last tensor, 4 MiB (one fused collective, one decision) took push/pull with
  // 4 spares from 101 ms to 96-97 and the ring from 132-133 to 130-132. ResNet-50 alike
  // (push/pull 4 spares 7033 ms against 7074).
  if (spec.mode() == tributary::v1::JOB_MODE_SYNC) {
    plan.set_fusion_bytes(spec.has_fusion_bytes() ? spec.fusion_bytes()
                                                  : std::max<uint64_t>(partition, kMinAutoFusion));
    plan.set_fusion_cycle_us(spec.fusion_cycle_us());
  }
  // One cost model for the whole job: ALGORITHM_AUTO's choice on every node uses the slowest
  // declared NIC of the job's nodes (ring and push/pull both run at the pace of their slowest
  // link), so nodes with different NICs agree on each tensor's algorithm.
  double selector_nic = 0;
  auto slowest = [&](const std::string& node_id) {
    const double b = by_id.at(node_id)->inventory->nic_bytes_per_s();
    if (b > 0 && (selector_nic == 0 || b < selector_nic)) selector_nic = b;
  };
  for (const std::string& id : spec.worker_nodes()) slowest(id);
  for (const ServerShare& s : split->servers) slowest(s.node_id);
  plan.set_selector_nic_bytes_per_s(selector_nic);
  plan.set_predicted_seconds_per_byte(split->seconds_per_byte);
  plan.set_ring_seconds_per_byte(split->ring_seconds_per_byte);
  plan.set_model_bytes(spec.model_bytes());
  plan.set_predicted_seconds(split->seconds_per_byte * static_cast<double>(spec.model_bytes()));
  plan.set_ring_seconds(split->ring_seconds_per_byte * static_cast<double>(spec.model_bytes()));
  return plan;
}

double SpareNicUse(const tributary::v1::JobPlan& plan,
                   const tributary::v1::SummationServer& server) {
  if (plan.predicted_seconds_per_byte() <= 0 || server.is_worker()) return 0;
  return plan.workers_size() * server.share() / plan.predicted_seconds_per_byte();
}

}  // namespace tributary::controller
