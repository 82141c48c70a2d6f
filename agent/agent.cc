#include "agent/agent.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "agent/plan_view.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/metrics/metrics.h"
#include "common/rpc/grpc_status.h"
#include "controller/planner/topology/topology_discovery.h"
#include "controller/planner/topology/topology_parsers.h"
#include "dataplane/transport/paced/paced_transport.h"
#include "dataplane/transport/ucx/ucx_transport.h"

namespace tributary::agent {
namespace {

std::shared_ptr<spdlog::logger> Log() {
  static auto logger = common::Logger("agent");
  return logger;
}

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

absl::StatusOr<std::unique_ptr<Agent>> Agent::Start(const AgentOptions& in) {
  std::unique_ptr<Agent> agent(new Agent(in));
  AgentOptions& options = agent->options_;
  agent->inventory_ = DiscoverNode();
  {
    absl::StatusOr<tributary::v1::Topology> topology =
        options.topology_file.empty()
            ? controller::topology::DiscoverLocalTopology()
            : controller::topology::LoadTopologyFile(options.topology_file);
    if (!topology.ok()) {
      if (!options.topology_file.empty()) return topology.status();  // the user asked for it
      Log()->warn("topology discovery failed, reporting none: {}", topology.status());
    } else {
      *agent->inventory_.mutable_topology() = *std::move(topology);
      agent->inventory_.set_gpu_count(agent->inventory_.topology().gpus_size());
    }
  }
  if (options.node_id.empty()) options.node_id = agent->inventory_.hostname();
  agent->reducer_ = std::make_unique<dataplane::CpuReducer>(options.reducer_threads);

  dataplane::UcxTransportOptions ucx;
  ucx.listen_host = options.data_plane_host;
  ucx.port = options.data_plane_port;
  absl::StatusOr<std::unique_ptr<dataplane::UcxTransport>> transport =
      dataplane::UcxTransport::Create(ucx);
  if (!transport.ok()) {
    return absl::Status(transport.status().code(),
                        absl::StrCat("starting the UCX data plane on ", options.data_plane_host,
                                     ": ", transport.status().message()));
  }
  if (options.emulate_nic) {
    if (options.nic_bytes_per_s <= 0) {
      return absl::InvalidArgumentError("emulating a NIC needs its speed (--nic-gbps)");
    }
    agent->transport_ =
        std::make_unique<dataplane::PacedTransport>(*std::move(transport), options.nic_bytes_per_s);
  } else {
    agent->transport_ = *std::move(transport);
  }
  auto counting = std::make_unique<dataplane::CountingTransport>(std::move(agent->transport_));
  agent->counting_ = counting.get();
  agent->transport_ = std::move(counting);
  agent->collectives_ = std::make_unique<dataplane::DataPlaneNode>(
      agent->transport_.get(), agent->reducer_.get(), common::SystemClock::Get());
  if (!options.registry) options.registry = std::make_shared<prometheus::Registry>();
  agent->metrics_ = std::make_unique<dataplane::DataPlaneMetrics>(*options.registry);
  agent->collectives_->SetMetrics(agent->metrics_.get(), common::SystemClock::Get());
  agent->stats_collector_ =
      std::make_shared<dataplane::DataPlaneStatsCollector>(agent->collectives_.get());

  tributary::v1::NodeInventory& inv = agent->inventory_;
  inv.set_data_plane_address(agent->transport_->Address());
  if (options.nic_bytes_per_s > 0) inv.set_nic_bytes_per_s(options.nic_bytes_per_s);
  if (inv.nic_bytes_per_s() <= 0) {
    Log()->warn("no NIC speed found in sysfs; declaring 10 Gbit/s (set --nic-gbps)");
    inv.set_nic_bytes_per_s(10e9 / 8);
  }
  inv.set_sum_bytes_per_s(options.sum_bytes_per_s > 0 ? options.sum_bytes_per_s
                                                      : MeasureSumRate(*agent->reducer_));
  inv.set_offers_summation(options.offers_summation);
  if (!options.selector_calibration_file.empty()) {
    std::ifstream in(options.selector_calibration_file);
    if (!in) {
      return absl::NotFoundError(
          absl::StrCat("--selector-calibration: cannot read ", options.selector_calibration_file));
    }
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<dataplane::MeasuredThresholds> measured =
        dataplane::ParseSelectorCalibration(text.str());
    if (!measured.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.selector_calibration_file, ": ", measured.status().message()));
    }
    agent->collectives_->SetMeasuredThresholds(*measured);
  }
  agent->collectives_->SetCostModel(dataplane::CostModel{
      .alpha_seconds = options.selector_alpha_seconds,
      .beta_seconds_per_byte = 1 / inv.nic_bytes_per_s(),
      .gamma_seconds_per_byte = inv.sum_bytes_per_s() > 0 ? 1 / inv.sum_bytes_per_s() : 1 / 10e9});

  agent->local_ =
      std::make_unique<LocalService>(agent->collectives_.get(), common::SystemClock::Get());
  common::EnableHealthAndReflection();
  grpc::ServerBuilder builder;
  int port = -1;
  if (options.local_address.rfind("unix:", 0) == 0) {
    std::error_code ec;
    std::filesystem::remove(options.local_address.substr(5), ec);  // a stale socket file
  }
  builder.AddListeningPort(options.local_address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(agent->local_.get());
  agent->server_ = builder.BuildAndStart();
  if (!agent->server_) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve local processes on ", options.local_address));
  }
  common::SetServing(agent->server_.get(), "tributary.v1.Agent");

  Agent* self = agent.get();
  ControllerClient::Options copts;
  copts.controller_address = options.controller_address;
  copts.node_id = options.node_id;
  copts.inventory = inv;
  agent->controller_ = std::make_unique<ControllerClient>(
      copts, [self](const std::vector<tributary::v1::JobPlan>& plans) { self->ApplyPlans(plans); },
      [self](double elapsed) {
        tributary::v1::NodeLoad load = self->load_.Sample(elapsed);
        const uint64_t sent = self->counting_->bytes_sent();
        const uint64_t received = self->counting_->bytes_received();
        if (elapsed > 0) {
          load.set_dataplane_tx_bytes_per_s(static_cast<double>(sent - self->last_dataplane_sent_) /
                                            elapsed);
          load.set_dataplane_rx_bytes_per_s(
              static_cast<double>(received - self->last_dataplane_received_) / elapsed);
        }
        self->last_dataplane_sent_ = sent;
        self->last_dataplane_received_ = received;
        for (const auto& [job_id, o] : self->collectives_->TakeObservations()) {
          tributary::v1::JobObservation* j = load.add_jobs();
          j->set_job_id(job_id);
          j->set_bytes(o.bytes);
          j->set_seconds(o.seconds);
        }
        return load;
      });
  agent->control_collector_ = std::make_shared<common::metrics::FunctionCollector>(
      [self] { return self->CollectControl(); });
  agent->collectives_->SetPlanMissingCallback([self] { self->controller_->RequestRefresh(); });
  agent->controller_->Start();
  agent->tick_thread_ = std::thread([self] { self->TickLoop(); });
  Log()->info("agent {} up: data plane {}, local service {}, nic {:.0f} MB/s, sum {:.0f} MB/s",
              options.node_id, inv.data_plane_address(), options.local_address,
              inv.nic_bytes_per_s() / 1e6, inv.sum_bytes_per_s() / 1e6);
  return agent;
}

Agent::~Agent() { Stop(); }

std::vector<std::weak_ptr<prometheus::Collectable>> Agent::collectables() const {
  return {options_.registry, stats_collector_, control_collector_};
}

std::vector<prometheus::MetricFamily> Agent::CollectControl() {
  using common::metrics::AddSample;
  using common::metrics::MakeFamily;
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  out.push_back(MakeFamily("tributary_agent_registered",
                           "1 while registered with the controller, else 0.", MetricType::Gauge));
  AddSample(out.back(), controller_ && controller_->registered() ? 1 : 0);
  out.push_back(MakeFamily("tributary_agent_heartbeats_sent_total", "Heartbeats answered OK.",
                           MetricType::Counter));
  AddSample(out.back(), controller_ ? controller_->heartbeats_sent() : 0);
  out.push_back(MakeFamily("tributary_agent_heartbeats_failed_total", "Heartbeats that failed.",
                           MetricType::Counter));
  AddSample(out.back(), controller_ ? controller_->heartbeats_failed() : 0);
  out.push_back(MakeFamily("tributary_agent_local_sessions",
                           "Training processes connected to this agent.", MetricType::Gauge));
  AddSample(out.back(), local_ ? local_->num_sessions() : 0);
  out.push_back(MakeFamily("tributary_agent_plan_version",
                           "Version of the job's plan this agent applied.", MetricType::Gauge));
  {
    std::lock_guard lock(plans_mu_);
    for (const auto& [job_id, version] : applied_) {
      AddSample(out.back(), static_cast<double>(version), {{"job", job_id}});
    }
  }
  return out;
}

void Agent::Stop() {
  {
    std::lock_guard lock(tick_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  tick_cv_.notify_all();
  if (tick_thread_.joinable()) tick_thread_.join();
  if (controller_) controller_->Stop();
  if (local_) local_->Shutdown();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (transport_) transport_->Shutdown();
  Log()->info("agent {} stopped", options_.node_id);
}

void Agent::ApplyPlans(const std::vector<tributary::v1::JobPlan>& plans) {
  std::lock_guard lock(plans_mu_);
  std::vector<LocalJob> local_jobs;
  std::map<std::string, uint64_t> now;
  for (const auto& plan : plans) {
    absl::StatusOr<dataplane::JobView> view = ToJobView(plan, options_.node_id);
    if (!view.ok()) {
      Log()->error("ignoring plan: {}", view.status().message());
      continue;
    }
    now[plan.job_id()] = plan.version();
    if (applied_[plan.job_id()] != plan.version()) {
      collectives_->SetJob(*view, static_cast<dataplane::Algorithm>(plan.algorithm()));
      Log()->info("job {} plan v{}: worker rank {}, server index {} of {}", plan.job_id(),
                  plan.version(), view->my_worker_rank, view->my_server_index,
                  view->server_addresses.size());
    }
    if (view->my_worker_rank >= 0) {
      local_jobs.push_back(LocalJob{plan.job_id(), plan.version(),
                                    static_cast<uint32_t>(view->my_worker_rank),
                                    static_cast<uint32_t>(view->worker_addresses.size()),
                                    view->procs_per_node, view->op_timeout});
    }
  }
  for (const auto& [job_id, version] : applied_) {
    if (!now.contains(job_id)) {
      collectives_->RemoveJob(job_id);
      Log()->info("job {} no longer involves this node", job_id);
    }
  }
  applied_ = std::move(now);
  local_->SetJobs(local_jobs);
}

void Agent::TickLoop() {
  std::unique_lock lock(tick_mu_);
  while (!stopping_) {
    tick_cv_.wait_for(lock, options_.tick, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    collectives_->ExpireStale();
    local_->Tick();
    collectives_->UpdatePendingMetrics();
    lock.lock();
  }
}

}  // namespace tributary::agent
