// One node's agent: discovers the node, registers with the controller, follows its plans, runs
// the summation service and the communication service, and serves local training processes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "agent/controller_client.h"
#include "agent/local_service.h"
#include "agent/node_discovery.h"
#include "dataplane/collectives/data_plane_node.h"
#include "dataplane/collectives/dataplane_metrics.h"
#include "dataplane/reduce/cpu/cpu_reducer.h"
#include "dataplane/transport/counting_transport.h"
#include "dataplane/transport/transport.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/collectable.h"
#include "prometheus/registry.h"

namespace tributary::agent {

inline constexpr double kDefaultSelectorAlphaSeconds = 150e-6;

struct AgentOptions {
  std::string node_id;  // default: the hostname
  std::string controller_address = "127.0.0.1:7070";
  std::string data_plane_host = "127.0.0.1";  // UCX listener; peers dial this address
  uint16_t data_plane_port = 0;               // 0 = ephemeral
  std::string local_address = "unix:/tmp/tributary-agent.sock";  // for training processes
  double nic_bytes_per_s = 0;  // declared NIC bandwidth; 0 = discover from sysfs
  double sum_bytes_per_s = 0;  // declared summation rate; 0 = measure at start-up
  // Per-message cost alpha of ALGORITHM_AUTO's cost model (beta and gamma come from the NIC and
  // summation rates above). The default is what bench/suite/run.py fitted for Tributary on the
  // emulated cluster (bench/results/selector_calibration.json): an agent's message costs far
  // more than the wire's latency, because it crosses gRPC, threads and UCX progress.
  double selector_alpha_seconds = kDefaultSelectorAlphaSeconds;
  // selector_calibration.json from bench/suite/run.py: its measured crossovers replace the cost
  // model's thresholds (empty: the model).
  std::string selector_calibration_file;
  // Report this topology file (NCCL XML, nvidia-smi topo -m, JSON, YAML) instead of discovering.
  std::string topology_file;
  bool offers_summation = true;  // serve jobs this node is not a worker of
  // Pace data-plane egress to nic_bytes_per_s (a local cluster on loopback emulating NICs).
  bool emulate_nic = false;
  int reducer_threads = 0;             // 0 = all cores
  std::chrono::milliseconds tick{50};  // deadline sweep period
  // Where the agent's metrics go (dashboards/METRICS.md); null: a registry of its own.
  std::shared_ptr<prometheus::Registry> registry;
};

// Threading: a controller-client thread applies plans; a tick thread sweeps deadlines; the
// transport's progress thread runs the data plane; gRPC threads serve local processes.
class Agent {
 public:
  static absl::StatusOr<std::unique_ptr<Agent>> Start(const AgentOptions& options);
  ~Agent();

  void Stop();
  const std::string& node_id() const { return options_.node_id; }
  std::string data_plane_address() const { return transport_->Address(); }
  const tributary::v1::NodeInventory& inventory() const { return inventory_; }
  // Everything to expose on /metrics: the registry and the scrape-time collectors.
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables() const;

 private:
  explicit Agent(AgentOptions options) : options_(std::move(options)) {}
  void ApplyPlans(const std::vector<tributary::v1::JobPlan>& plans);
  void TickLoop();

  std::vector<prometheus::MetricFamily> CollectControl();

  AgentOptions options_;
  tributary::v1::NodeInventory inventory_;
  std::unique_ptr<dataplane::DataPlaneMetrics> metrics_;
  std::shared_ptr<prometheus::Collectable> stats_collector_;
  std::shared_ptr<prometheus::Collectable> control_collector_;
  std::unique_ptr<dataplane::CpuReducer> reducer_;
  std::unique_ptr<dataplane::Transport> transport_;
  std::unique_ptr<dataplane::DataPlaneNode> collectives_;
  std::unique_ptr<LocalService> local_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ControllerClient> controller_;
  LoadMonitor load_;
  dataplane::CountingTransport* counting_ =
      nullptr;                            // the outermost transport (owned by transport_)
  uint64_t last_dataplane_sent_ = 0;      // heartbeat thread only
  uint64_t last_dataplane_received_ = 0;  // heartbeat thread only
  mutable std::mutex plans_mu_;
  std::map<std::string, uint64_t> applied_;  // job id -> plan version
  std::mutex tick_mu_;
  std::condition_variable tick_cv_;
  bool stopping_ = false;
  std::thread tick_thread_;
};

// Measures this CPU's fp32 summation rate (bytes of input added per second).
double MeasureSumRate(dataplane::Reducer& reducer);

}  // namespace tributary::agent
