#include "agent/data_plane_runner.h"

#include <chrono>
#include <cstdlib>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/logging.h"
#include "dataplane/collectives/message_auth.h"
#include "dataplane/transport/paced/paced_transport.h"
#include "dataplane/transport/tcp/tcp_transport.h"
#include "dataplane/transport/ucx/ucx_transport.h"

namespace tributary::agent {
namespace {

constexpr auto Log = common::ComponentLog<"agent">;

}  // namespace

double MeasureSumRate(dataplane::Reducer& reducer) {
  constexpr size_t kCount = 1 << 20;  // 4 MiB of float32
  std::vector<float> a(kCount, 1.0f), b(kCount, 2.0f);
  reducer.Sum(common::DataType::kFloat32, a.data(), b.data(), kCount);  // warm up
  const auto start = std::chrono::steady_clock::now();
  int rounds = 0;
  std::chrono::duration<double> elapsed{};
  do {
    reducer.Sum(common::DataType::kFloat32, a.data(), b.data(), kCount);
    ++rounds;
    elapsed = std::chrono::steady_clock::now() - start;
  } while (elapsed.count() < 0.03);
  return rounds * kCount * sizeof(float) / elapsed.count();
}

absl::StatusOr<std::unique_ptr<DataPlaneRunner>> DataPlaneRunner::Create(
    const Options& options, prometheus::Registry& registry, const common::Clock* clock) {
  std::unique_ptr<DataPlaneRunner> r(new DataPlaneRunner());
  r->reducer_ = std::make_unique<dataplane::CpuReducer>(options.reducer_threads);

  const TransportChoice choice =
      ChooseDataPlaneTransport(options.transport, std::getenv("UCX_TLS"));
  r->transport_kind_ = choice.transport;
  // The workers' congestion control is resolved before the transport starts, so that a name it
  // cannot set stops the runner before it listens.
  std::string worker_congestion;
  if (choice.transport == DataPlaneTransport::kTcp) {
    if (options.tcp_worker_congestion_control == kAutoWorkerCongestion) {
      const std::string base = options.tcp_congestion_control.empty()
                                   ? dataplane::HostTcpCongestionControl()
                                   : options.tcp_congestion_control;
      if (!absl::StartsWith(base, "bbr")) {
        // No minimum-RTT probe to keep the workers' connections out of.
      } else if (absl::Status usable =
                     dataplane::CheckTcpCongestionControl(dataplane::kWorkerCongestionControl);
                 usable.ok()) {
        worker_congestion = dataplane::kWorkerCongestionControl;
      } else {
        Log()->info("data plane: the connections among workers keep congestion control {}: {}",
                    base, usable.message());
      }
    } else if (!options.tcp_worker_congestion_control.empty()) {
      if (absl::Status usable =
              dataplane::CheckTcpCongestionControl(options.tcp_worker_congestion_control);
          !usable.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the connections among workers (--tcp-congestion-workers): ", usable.message()));
      }
      worker_congestion = options.tcp_worker_congestion_control;
    }
  }
  absl::StatusOr<std::unique_ptr<dataplane::Transport>> transport;
  std::function<dataplane::TransportListenerStats()> listener_stats;
  if (choice.transport == DataPlaneTransport::kTcp) {
    dataplane::TcpTransportOptions tcp;
    tcp.listen_host = options.listen_host;
    tcp.port = options.port;
    tcp.notsent_lowat_bytes = options.tcp_notsent_lowat_bytes;
    tcp.congestion_control = options.tcp_congestion_control;
    absl::StatusOr<std::unique_ptr<dataplane::TcpTransport>> created =
        dataplane::TcpTransport::Create(tcp);
    if (created.ok()) {
      Log()->info("data plane: TCP congestion control {}", tcp.congestion_control.empty()
                                                               ? "of the host (its default)"
                                                               : tcp.congestion_control);
      const dataplane::TcpTransport* raw = created->get();  // Owned by transport_ from here.
      listener_stats = [raw] {
        return dataplane::TransportListenerStats{
            .rejected_connections = raw->rejected_connections(),
            .protocol_errors = raw->protocol_errors()};
      };
      transport = *std::move(created);
    } else {
      transport = created.status();
    }
  } else {
    dataplane::UcxTransportOptions ucx;
    ucx.listen_host = options.listen_host;
    ucx.port = options.port;
    absl::StatusOr<std::unique_ptr<dataplane::UcxTransport>> created =
        dataplane::UcxTransport::Create(ucx);
    if (created.ok()) {
      transport = *std::move(created);
    } else {
      transport = created.status();
    }
  }
  const char* name = DataPlaneTransportName(choice.transport);
  if (!transport.ok()) {
    return absl::Status(transport.status().code(),
                        absl::StrCat("starting the ", name, " data plane on ", options.listen_host,
                                     ": ", transport.status().message()));
  }
  Log()->info("data plane: {} transport on {} ({})", name, (*transport)->Address(), choice.reason);
  if (choice.transport != DataPlaneTransport::kTcp && !options.tcp_congestion_control.empty()) {
    Log()->warn(
        "data plane: TCP congestion control {} is for the tcp transport; the {} transport "
        "keeps the host's",
        options.tcp_congestion_control, name);
  }
  if (!worker_congestion.empty()) {
    Log()->info(
        "data plane: TCP congestion control {} among the workers of jobs without spare servers",
        worker_congestion);
  }
  if (choice.transport != DataPlaneTransport::kTcp &&
      options.tcp_worker_congestion_control != kAutoWorkerCongestion &&
      !options.tcp_worker_congestion_control.empty()) {
    Log()->warn(
        "data plane: TCP congestion control {} among workers is for the tcp transport; the {} "
        "transport keeps the host's",
        options.tcp_worker_congestion_control, name);
  }
  std::unique_ptr<dataplane::Transport> inner;
  if (options.paced_bytes_per_s > 0) {
    inner = std::make_unique<dataplane::PacedTransport>(*std::move(transport),
                                                        options.paced_bytes_per_s);
  } else {
    inner = *std::move(transport);
  }
  if (options.bundling.max_record_bytes > 0) {
    inner = std::make_unique<dataplane::BundlingTransport>(std::move(inner), options.bundling);
  }
  auto counting = std::make_unique<dataplane::CountingTransport>(std::move(inner));
  r->counting_ = counting.get();
  // Outermost: every message is signed with its job's secret and checked on arrival, so a peer
  // that cannot prove membership of the job never reaches a sum.
  auto auth = std::make_unique<dataplane::AuthenticatingTransport>(std::move(counting), clock);
  r->auth_ = auth.get();
  r->transport_ = std::move(auth);
  r->transport_stats_collector_ = std::make_shared<dataplane::TransportStatsCollector>(
      [listener_stats = std::move(listener_stats), auth = r->auth_] {
        dataplane::TransportListenerStats stats =
            listener_stats ? listener_stats() : dataplane::TransportListenerStats{};
        stats.unauthenticated_messages = auth->stats().bad_mac.load();
        stats.unknown_job_messages = auth->stats().park_dropped.load();
        stats.old_incarnation_messages = auth->stats().old_instance.load();
        return stats;
      });
  r->node_ =
      std::make_unique<dataplane::DataPlaneNode>(r->transport_.get(), r->reducer_.get(), clock);
  r->metrics_ = std::make_unique<dataplane::DataPlaneMetrics>(registry);
  r->node_->SetMetrics(r->metrics_.get(), clock);
  r->node_->push_pull().worker().SetRetainBudget(options.peer_recovery_bytes);
  r->node_->engine().SetEarlyMessageLimit(options.early_message_bytes);
  r->node_->push_pull().worker().SetServerBacklog(options.push_backlog_bytes);
  r->node_->push_pull().worker().SetSpareServerUnsentLimit(options.push_spare_unsent_bytes);
  r->node_->SetWorkerCongestionControl(worker_congestion);
  r->stats_collector_ = std::make_shared<dataplane::DataPlaneStatsCollector>(r->node_.get());
  return r;
}

DataPlaneRunner::~DataPlaneRunner() { Shutdown(); }

std::string DataPlaneRunner::address() const { return transport_->Address(); }

void DataPlaneRunner::SetCostModel(double alpha_seconds, double nic_bytes_per_s,
                                   double sum_bytes_per_s) {
  node_->SetCostModel(dataplane::CostModel{
      .alpha_seconds = alpha_seconds,
      .beta_seconds_per_byte = 1 / nic_bytes_per_s,
      .gamma_seconds_per_byte = sum_bytes_per_s > 0 ? 1 / sum_bytes_per_s : 1 / 10e9});
}

absl::Status DataPlaneRunner::SetSelectorCalibration(std::string_view json) {
  absl::StatusOr<dataplane::MeasuredThresholds> measured =
      dataplane::ParseSelectorCalibration(json);
  if (!measured.ok()) return absl::InvalidArgumentError(measured.status().message());
  node_->SetMeasuredThresholds(*measured);
  return absl::OkStatus();
}

void DataPlaneRunner::SetInstance(uint64_t agent_instance) {
  auth_->SetInstance(dataplane::InstanceTag(agent_instance));
}

void DataPlaneRunner::SetJob(const dataplane::JobView& view, dataplane::Algorithm algorithm) {
  // The secret first: the node may send as soon as it has the job, and messages that waited
  // for the secret go to the node, which parks what it has no plan for yet.
  if (absl::Status s =
          auth_->SetJobSecret(view.job_hash(), view.secret, view.node_instances, view.plan_version);
      !s.ok()) {
    Log()->error("job {} plan v{}: {}; its data-plane messages will be refused", view.job_id,
                 view.plan_version, s.message());
  }
  {
    std::lock_guard lock(jobs_mu_);
    job_ids_[view.job_hash()] = view.job_id;
  }
  node_->SetJob(view, algorithm);
}

void DataPlaneRunner::RemoveJob(const std::string& job_id) {
  node_->RemoveJob(job_id);
  auth_->RemoveJob(common::StableHash64(job_id));
  std::lock_guard lock(jobs_mu_);
  job_ids_.erase(common::StableHash64(job_id));
}

absl::Status DataPlaneRunner::Start(const std::string& job_id, dataplane::Operation op) {
  return node_->Start(job_id, std::move(op));
}

void DataPlaneRunner::StagedInputAdvanced(const std::string& job_id, const std::string& tensor,
                                          uint64_t iteration) {
  node_->StagedInputAdvanced(job_id, tensor, iteration);
}

void DataPlaneRunner::Abort(const std::string& job_id, const std::string& tensor,
                            uint64_t iteration, const absl::Status& reason) {
  node_->Abort(job_id, tensor, iteration, reason);
}

void DataPlaneRunner::Tick() {
  node_->ExpireStale();
  node_->UpdatePendingMetrics();
}

std::map<std::string, JobObservation> DataPlaneRunner::TakeObservations() {
  std::map<std::string, JobObservation> out;
  for (const auto& [job_id, o] : node_->TakeObservations()) {
    out[job_id] = JobObservation{.bytes = o.bytes,
                                 .seconds = o.seconds,
                                 .collectives = o.collectives,
                                 .busy_seconds = o.busy_seconds,
                                 .iterations = o.iterations,
                                 .iteration_seconds = o.iteration_seconds,
                                 .iteration_max_seconds = o.iteration_max_seconds,
                                 .iteration_busy_seconds = o.iteration_busy_seconds};
  }
  const std::map<uint64_t, dataplane::AuthenticatingTransport::JobBytes> bytes =
      auth_->TakeJobBytes();
  std::lock_guard lock(jobs_mu_);
  for (const auto& [job_hash, b] : bytes) {
    auto id = job_ids_.find(job_hash);
    if (id == job_ids_.end()) continue;  // removed meanwhile
    JobObservation& o = out[id->second];
    o.wire_bytes_sent = b.sent;
    o.wire_bytes_received = b.received;
  }
  return out;
}

void DataPlaneRunner::SetPlanMissingCallback(std::function<void()> callback) {
  node_->SetPlanMissingCallback(std::move(callback));
}

void DataPlaneRunner::Shutdown() {
  if (transport_) transport_->Shutdown();
}

}  // namespace tributary::agent
