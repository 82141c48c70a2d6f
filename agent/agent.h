// One node's agent: discovers the node, registers with the controller, follows its plans, runs
// the summation service and the communication service, and serves local training processes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/buffer_socket.h"
#include "agent/collective_runner.h"
#include "agent/control_ring_host.h"
#include "agent/controller_client.h"
#include "agent/data_plane_transport.h"
#include "agent/local_grpc_service.h"
#include "agent/local_service.h"
#include "common/buffer_pool.h"
#include "common/clock.h"
#include "common/rpc/tls.h"
#include "dataplane/collectives/allreduce_push_pull.h"
#include "dataplane/collectives/collective_engine.h"
#include "dataplane/transport/tcp/tcp_transport.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/collectable.h"
#include "prometheus/registry.h"
#include "tributary/v1/controller.pb.h"

namespace tributary::agent {

inline constexpr double kDefaultSelectorAlphaSeconds = 150e-6;

struct AgentOptions {
  std::string node_id;  // default: the hostname
  std::string controller_address = "127.0.0.1:7070";
  // mTLS to the controller (--tls-cert/--tls-key/--tls-ca); empty: plaintext. The local
  // socket for training processes is not affected.
  common::TlsConfig controller_tls;
  std::string data_plane_host = "127.0.0.1";  // data-plane listener; peers dial this address
  uint16_t data_plane_port = 0;               // 0 = ephemeral
  // The data plane's transport: auto picks TCP unless UCX_TLS allows RDMA (DataPlaneRunner).
  DataPlaneTransport data_plane_transport = DataPlaneTransport::kAuto;
  std::string local_address = "unix:/tmp/tributary-agent.sock";  // for training processes
  // Who may use the local sockets (the gRPC one and the buffer socket beside it).
  SocketAccess socket_access;
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
  int reducer_threads = 0;  // 0 = all cores
  // Messages up to this size to a busy peer share one transport message (fusion on the wire,
  // dataplane/transport/bundling); 0 = off.
  size_t bundle_record_bytes = 64 << 10;
  // At most this many bytes of push/pull sums kept for peer recovery (up to twice each tensor's
  // size while it fits); 0 = keep none.
  uint64_t peer_recovery_bytes = dataplane::kDefaultRetainBytes;
  // Free fused buffers and copies of sums kept for the next collectives, at most
  // (common/buffer_pool.h; the pool is the process's).
  uint64_t buffer_pool_bytes = common::BufferPool::kDefaultKeepBytes;
  // The ring / halving-doubling engine's memory for messages of collectives not started here yet
  // (CollectiveEngine::SetEarlyMessageLimit).
  uint64_t early_message_bytes = dataplane::CollectiveEngine::kMaxEarlyBytes;
  // Push/pull: unsent pushes per summation server at most before the job's later chunks wait
  // (PushPullWorker::SetServerBacklog); 0 = off.
  uint64_t push_backlog_bytes = dataplane::kDefaultServerBacklog;
  // With a backlog: what a connection to a spare summation server holds unsent in the kernel at
  // most (PushPullWorker::SetSpareServerUnsentLimit); 0 = the transport's default.
  uint32_t push_spare_unsent_bytes = dataplane::kDefaultSpareServerUnsent;
  // The TCP data plane's TCP_NOTSENT_LOWAT (TcpTransportOptions::notsent_lowat_bytes); 0 = the
  // kernel's default.
  uint32_t tcp_notsent_lowat_bytes = dataplane::kDefaultNotSentLowat;
  // The TCP data plane's congestion control (DataPlaneRunner::Options::tcp_congestion_control);
  // empty (the default): the host's.
  std::string tcp_congestion_control = dataplane::kDefaultCongestionControl;
  // The congestion control among the workers of jobs without spare servers
  // (DataPlaneRunner::Options::tcp_worker_congestion_control): "auto", empty (off) or a name.
  std::string tcp_worker_congestion_control = kAutoWorkerCongestion;
  std::chrono::milliseconds tick{50};  // deadline sweep period
  // The control rings' ring threads poll for up to this long before sleeping, when their recent
  // idle spells were shorter (ControlRings::Options::spin); zero: never.
  std::chrono::microseconds ring_spin = common::shm_ring::kDefaultSpin;
  // Where the agent's metrics go (dashboards/METRICS.md); null: a registry of its own.
  std::shared_ptr<prometheus::Registry> registry;
};

// Threading: a controller-client thread applies plans; a tick thread sweeps deadlines; the
// data plane's threads run operations; gRPC threads serve local processes.
class Agent {
 public:
  // What an agent is made of. `Start` builds the production parts; tests inject fakes.
  struct Parts {
    std::string node_id;
    // What the controller is told about the node (data-plane address, rates, topology).
    tributary::v1::NodeInventory inventory;
    std::unique_ptr<CollectiveRunner> runner;      // required
    std::unique_ptr<ControllerClient> controller;  // required
    const common::Clock* clock = common::SystemClock::Get();
    // Where the agent's control gauges are read from; null: a registry of its own.
    std::shared_ptr<prometheus::Registry> registry;
    // More to expose on /metrics with the registry (the data plane's statistics).
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables;
    // The host's CPU, memory and NIC use over the elapsed seconds, for heartbeats; null: none.
    std::function<tributary::v1::NodeLoad(double elapsed_seconds)> host_load;
    // Period of the deadline sweep; zero: no tick thread (the owner calls Tick).
    std::chrono::milliseconds tick{50};
  };

  // The production agent: discovers the node, starts the UCX data plane, serves local
  // processes on options.local_address and links to options.controller_address.
  static absl::StatusOr<std::unique_ptr<Agent>> Start(const AgentOptions& options);
  // An agent from `parts`: starts the controller link (plans applied as they come) and, when
  // parts.tick is positive, the tick thread. It serves no gRPC until ServeLocal.
  static std::unique_ptr<Agent> Assemble(Parts parts);
  ~Agent();

  // Serves the local service over gRPC at `address` (unix:PATH or host:port; a stale socket
  // file is removed first). UNAVAILABLE when it cannot listen.
  // For a unix: address: claims the path (a live socket of another agent is ALREADY_EXISTS, a
  // file that is not a socket is never deleted), applies `access` to it and serves the buffer
  // socket (agent/buffer_socket.h) at "<path>.buffers".
  absl::Status ServeLocal(const std::string& address, const SocketAccess& access = {},
                          ControlRings::Options rings = {});
  // One deadline sweep: the data plane's, then the local gathers' and waits'.
  void Tick();
  void Stop();

  const std::string& node_id() const { return node_id_; }
  std::string data_plane_address() const { return inventory_.data_plane_address(); }
  const tributary::v1::NodeInventory& inventory() const { return inventory_; }
  LocalService& local() { return *local_; }
  // The plan version applied per job.
  std::map<std::string, uint64_t> applied_plans() const;
  // Everything to expose on /metrics: the registry and the scrape-time collectors.
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables() const;

 private:
  explicit Agent(Parts parts);
  // Starts the controller link and the tick thread.
  void StartLoops();
  void ApplyPlans(const std::vector<tributary::v1::JobPlan>& plans);
  tributary::v1::NodeLoad SampleLoad(double elapsed_seconds);
  void TickLoop();

  std::vector<prometheus::MetricFamily> CollectControl();

  const std::string node_id_;
  const tributary::v1::NodeInventory inventory_;
  const common::Clock* clock_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  std::shared_ptr<prometheus::Collectable> control_collector_;
  std::function<tributary::v1::NodeLoad(double)> host_load_;
  const std::chrono::milliseconds tick_;
  std::unique_ptr<CollectiveRunner> runner_;
  std::unique_ptr<LocalService> local_;
  std::unique_ptr<ControlRings> rings_;  // the local processes' fast path, from ServeLocal
  std::unique_ptr<LocalGrpcService> grpc_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<BufferSocketServer> buffer_socket_;  // from ServeLocal, unix: addresses only
  // unix: addresses: the gRPC socket's listener (peer checked per connection) and the server
  // that refuses the peers it does not allow.
  std::unique_ptr<RefusingServer> refuse_server_;
  std::unique_ptr<GrpcUnixListener> grpc_listener_;
  std::unique_ptr<ControllerClient> controller_;
  uint64_t last_dataplane_sent_ = 0;      // heartbeat thread only
  uint64_t last_dataplane_received_ = 0;  // heartbeat thread only
  mutable std::mutex plans_mu_;
  std::map<std::string, uint64_t> applied_;  // job id -> plan version; guarded by plans_mu_
  std::mutex tick_mu_;
  std::condition_variable tick_cv_;
  bool stopping_ = false;  // guarded by tick_mu_
  std::thread tick_thread_;
};

}  // namespace tributary::agent
