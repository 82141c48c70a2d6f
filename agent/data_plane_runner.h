// The production CollectiveRunner: the node's whole data plane (TCP or UCX transport, optionally
// paced to an emulated NIC, bundled, counted; CPU reducer; the `dataplane::DataPlaneNode` that
// routes push/pull, ring and halving-doubling).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/collective_runner.h"
#include "agent/data_plane_transport.h"
#include "dataplane/collectives/algorithm_selector.h"
#include "dataplane/collectives/collective_engine.h"
#include "dataplane/collectives/data_plane_node.h"
#include "dataplane/collectives/dataplane_metrics.h"
#include "dataplane/collectives/message_auth.h"
#include "dataplane/reduce/cpu/cpu_reducer.h"
#include "dataplane/transport/bundling/bundling_transport.h"
#include "dataplane/transport/counting_transport.h"
#include "dataplane/transport/tcp/tcp_transport.h"
#include "prometheus/collectable.h"
#include "prometheus/registry.h"

namespace tributary::agent {

// Owns every data-plane object; thread-safe as CollectiveRunner requires.
class DataPlaneRunner final : public CollectiveRunner {
 public:
  struct Options {
    std::string listen_host = "127.0.0.1";  // data-plane listener; peers dial this address
    uint16_t port = 0;                      // 0 = ephemeral
    DataPlaneTransport transport = DataPlaneTransport::kAuto;
    // > 0: pace egress to this rate in bytes per second (a NIC emulated on loopback).
    double paced_bytes_per_s = 0;
    int reducer_threads = 0;  // 0 = all cores
    // Small messages to a busy peer travel together (dataplane/transport/bundling).
    dataplane::BundlingOptions bundling;
    // Push/pull's budget for sums kept for peer recovery (PushPullWorker::SetRetainBudget).
    uint64_t peer_recovery_bytes = dataplane::kDefaultRetainBytes;
    // CollectiveEngine::SetEarlyMessageLimit.
    uint64_t early_message_bytes = dataplane::CollectiveEngine::kMaxEarlyBytes;
    // Push/pull's per-server backlog of unsent pushes (PushPullWorker::SetServerBacklog); 0 = off.
    uint64_t push_backlog_bytes = dataplane::kDefaultServerBacklog;
    // What a connection to a spare summation server holds unsent with a backlog set
    // (PushPullWorker::SetSpareServerUnsentLimit); 0 = the transport's default.
    uint32_t push_spare_unsent_bytes = dataplane::kDefaultSpareServerUnsent;
    // The TCP transport's TCP_NOTSENT_LOWAT (TcpTransportOptions::notsent_lowat_bytes).
    uint32_t tcp_notsent_lowat_bytes = dataplane::kDefaultNotSentLowat;
    // The TCP transport's congestion control (TcpTransportOptions::congestion_control; empty:
    // the host's default). One this process cannot set fails Create with INVALID_ARGUMENT; the
    // UCX transport ignores it, with a warning.
    std::string tcp_congestion_control = dataplane::kDefaultCongestionControl;
    // The TCP transport's congestion control on the connections among the workers of jobs
    // whose collectives run among their workers alone (DataPlaneNode::SetWorkerCongestionControl):
    // kAutoWorkerCongestion (the default) is dataplane::kWorkerCongestionControl where the
    // connections would otherwise run BBR (tcp_congestion_control, else the host's) and this
    // process may set it, and off otherwise (logged when it may not); empty: off; a name this
    // process cannot set fails Create with INVALID_ARGUMENT. The UCX transport has no use for it.
    std::string tcp_worker_congestion_control = kAutoWorkerCongestion;
  };

  // Starts the transport (chosen as ChooseDataPlaneTransport says, from the environment's
  // UCX_TLS; the choice is logged) and builds the data plane on it; its metrics go into
  // `registry`, times come from `clock` (both must outlive the runner). The transport's errors
  // name the listen host.
  static absl::StatusOr<std::unique_ptr<DataPlaneRunner>> Create(const Options& options,
                                                                 prometheus::Registry& registry,
                                                                 const common::Clock* clock);
  ~DataPlaneRunner() override;

  // The address peers dial.
  std::string address() const;
  // The transport actually running (never kAuto).
  DataPlaneTransport transport() const { return transport_kind_; }
  dataplane::Reducer& reducer() { return *reducer_; }
  // ALGORITHM_AUTO's cost model for jobs set from now on: `alpha_seconds` per message, the NIC's
  // and the summation's rates in bytes per second (a non-positive summation rate counts as
  // 10 GB/s).
  void SetCostModel(double alpha_seconds, double nic_bytes_per_s, double sum_bytes_per_s);
  // Thresholds measured by bench/suite/run.py (selector_calibration.json's text) replace the
  // cost model's for jobs set from now on. INVALID_ARGUMENT when the text does not parse.
  absl::Status SetSelectorCalibration(std::string_view json);
  // The scrape-time collector of the data plane's statistics.
  std::shared_ptr<prometheus::Collectable> stats_collector() const { return stats_collector_; }
  // The scrape-time collector of the listener's rejection counters (zero under UCX).
  std::shared_ptr<prometheus::Collectable> transport_stats_collector() const {
    return transport_stats_collector_;
  }

  // This agent process's incarnation (RegisterNodeRequest.agent_instance): stamped into every
  // data-plane message it sends (WireHeader::sender_instance).
  void SetInstance(uint64_t agent_instance);
  void SetJob(const dataplane::JobView& view, dataplane::Algorithm algorithm) override;
  void RemoveJob(const std::string& job_id) override;
  absl::Status Start(const std::string& job_id, dataplane::Operation op) override;
  void StagedInputAdvanced(const std::string& job_id, const std::string& tensor,
                           uint64_t iteration) override;
  void Abort(const std::string& job_id, const std::string& tensor, uint64_t iteration,
             const absl::Status& reason) override;
  void Tick() override;
  std::map<std::string, JobObservation> TakeObservations() override;
  uint64_t bytes_sent() const override { return counting_->bytes_sent(); }
  uint64_t bytes_received() const override { return counting_->bytes_received(); }
  void SetPlanMissingCallback(std::function<void()> callback) override;
  void Shutdown() override;

 private:
  DataPlaneRunner() = default;

  std::unique_ptr<dataplane::DataPlaneMetrics> metrics_;
  std::shared_ptr<prometheus::Collectable> stats_collector_;
  std::shared_ptr<prometheus::Collectable> transport_stats_collector_;
  DataPlaneTransport transport_kind_ = DataPlaneTransport::kTcp;
  std::unique_ptr<dataplane::CpuReducer> reducer_;
  std::unique_ptr<dataplane::Transport> transport_;
  dataplane::CountingTransport* counting_ = nullptr;    // under auth_
  dataplane::AuthenticatingTransport* auth_ = nullptr;  // the outermost transport (transport_)
  std::unique_ptr<dataplane::DataPlaneNode> node_;
  std::mutex jobs_mu_;
  std::map<uint64_t, std::string> job_ids_;  // by job hash, the jobs set; guarded by jobs_mu_
};

// Measures this CPU's fp32 summation rate (bytes of input added per second).
double MeasureSumRate(dataplane::Reducer& reducer);

}  // namespace tributary::agent
