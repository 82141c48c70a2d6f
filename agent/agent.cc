#include "agent/agent.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "agent/data_plane_runner.h"
#include "agent/grpc_controller_client.h"
#include "agent/node_discovery.h"
#include "agent/plan_view.h"
#include "agent/tensor_fusion.h"
#include "common/allocator.h"
#include "common/buffer_pool.h"
#include "common/buffer_socket_protocol.h"
#include "common/logging.h"
#include "common/metrics/metrics.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/tls.h"
#include "common/status_macros.h"
#include "common/thread_name.h"
#include "topology/topology_discovery.h"
#include "topology/topology_file.h"

namespace tributary::agent {
namespace {

constexpr auto Log = common::ComponentLog<"agent">;

// The process's buffer pool (common/buffer_pool.h) as metrics.
std::shared_ptr<prometheus::Collectable> BufferPoolCollector(const common::BufferPool& pool) {
  return std::make_shared<common::metrics::FunctionCollector>([&pool] {
    const common::BufferPool::Stats s = pool.stats();
    struct Row {
      const char* name;
      const char* help;
      prometheus::MetricType type;
      uint64_t value;
    };
    constexpr auto kCounter = prometheus::MetricType::Counter;
    const Row rows[] = {
        {"tributary_agent_buffer_pool_kept_bytes",
         "Free fused buffers and sum copies kept for the next collectives.",
         prometheus::MetricType::Gauge, s.kept_bytes},
        {"tributary_agent_buffer_pool_reused_total", "Buffers handed out again from the pool.",
         kCounter, s.reused},
        {"tributary_agent_buffer_pool_allocated_total",
         "Buffers allocated because none of their size class was kept.", kCounter, s.allocated},
        {"tributary_agent_buffer_pool_freed_total",
         "Kept buffers freed to stay within --buffer-pool-mib.", kCounter, s.freed},
    };
    std::vector<prometheus::MetricFamily> out;
    for (const Row& r : rows) {
      out.push_back(common::metrics::MakeFamily(r.name, r.help, r.type));
      common::metrics::AddSample(out.back(), static_cast<double>(r.value));
    }
    return out;
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<Agent>> Agent::Start(const AgentOptions& in) {
  AgentOptions options = in;
  tributary::v1::NodeInventory inv = DiscoverNode();
  {
    absl::StatusOr<tributary::v1::Topology> topology =
        options.topology_file.empty() ? topology::DiscoverLocalTopology()
                                      : topology::LoadTopologyFile(options.topology_file);
    if (!topology.ok()) {
      if (!options.topology_file.empty()) return topology.status();  // the user asked for it
      Log()->warn("topology discovery failed, reporting none: {}", topology.status());
    } else {
      *inv.mutable_topology() = *std::move(topology);
      inv.set_gpu_count(inv.topology().gpus_size());
    }
  }
  if (options.node_id.empty()) options.node_id = inv.hostname();
  if (options.emulate_nic && options.nic_bytes_per_s <= 0) {
    return absl::InvalidArgumentError("emulating a NIC needs its speed (--nic-gbps)");
  }
  if (!options.registry) options.registry = std::make_shared<prometheus::Registry>();

  DataPlaneRunner::Options data_plane;
  data_plane.listen_host = options.data_plane_host;
  data_plane.port = options.data_plane_port;
  data_plane.transport = options.data_plane_transport;
  data_plane.paced_bytes_per_s = options.emulate_nic ? options.nic_bytes_per_s : 0;
  data_plane.reducer_threads = options.reducer_threads;
  data_plane.bundling.max_record_bytes = options.bundle_record_bytes;
  data_plane.peer_recovery_bytes = options.peer_recovery_bytes;
  data_plane.early_message_bytes = options.early_message_bytes;
  data_plane.push_backlog_bytes = options.push_backlog_bytes;
  data_plane.push_spare_unsent_bytes = options.push_spare_unsent_bytes;
  data_plane.tcp_notsent_lowat_bytes = options.tcp_notsent_lowat_bytes;
  data_plane.tcp_congestion_control = options.tcp_congestion_control;
  data_plane.tcp_worker_congestion_control = options.tcp_worker_congestion_control;
  ASSIGN_OR_RETURN(
      std::unique_ptr<DataPlaneRunner> runner,
      DataPlaneRunner::Create(data_plane, *options.registry, common::SystemClock::Get()));

  inv.set_data_plane_address(runner->address());
  if (options.nic_bytes_per_s > 0) inv.set_nic_bytes_per_s(options.nic_bytes_per_s);
  if (inv.nic_bytes_per_s() <= 0) {
    Log()->warn("no NIC speed found in sysfs; declaring 10 Gbit/s (set --nic-gbps)");
    inv.set_nic_bytes_per_s(10e9 / 8);
  }
  inv.set_sum_bytes_per_s(options.sum_bytes_per_s > 0 ? options.sum_bytes_per_s
                                                      : MeasureSumRate(runner->reducer()));
  inv.set_offers_summation(options.offers_summation);
  if (!options.selector_calibration_file.empty()) {
    std::ifstream file(options.selector_calibration_file);
    if (!file) {
      return absl::NotFoundError(
          absl::StrCat("--selector-calibration: cannot read ", options.selector_calibration_file));
    }
    std::stringstream text;
    text << file.rdbuf();
    absl::Status calibrated = runner->SetSelectorCalibration(text.str());
    if (!calibrated.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.selector_calibration_file, ": ", calibrated.message()));
    }
  }
  // Every node of a job must pick the same algorithm for a tensor, so the model takes only
  // declared rates: a summation rate measured at start-up differs from node to node (and run to
  // run), and nodes on either side of a crossover would disagree ("ranks disagree"). Without
  // --sum-gbps the model's 10 GB/s. The NIC here is only a fallback: a plan carries the slowest
  // NIC of its job's nodes (JobPlan.selector_nic_bytes_per_s), which every node of the job uses.
  // --selector-alpha-us, --sum-gbps and --selector-calibration must be the same on every agent.
  runner->SetCostModel(options.selector_alpha_seconds, inv.nic_bytes_per_s(),
                       options.sum_bytes_per_s);
  // This agent process's incarnation: in its registrations (a restarted agent is told from a
  // reconnecting one) and stamped into its data-plane messages (fenced once a plan names another).
  uint64_t agent_instance = 0;
  std::random_device random;
  while (agent_instance == 0) agent_instance = (uint64_t{random()} << 32) | random();
  runner->SetInstance(agent_instance);

  GrpcControllerClient::Options copts;
  copts.controller_address = options.controller_address;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      common::MakeChannelCredentials(options.controller_tls);
  if (!credentials.ok()) return credentials.status();
  copts.credentials = *std::move(credentials);
  common::ApplyTlsChannelArgs(options.controller_tls, &copts.channel_args);
  if (!options.controller_tls.enabled()) {
    Log()->warn(
        "TLS is off (no --tls-cert/--tls-key/--tls-ca): the link to the controller {} is "
        "plaintext and unauthenticated; use this only on a trusted local network",
        options.controller_address);
  }
  copts.node_id = options.node_id;
  copts.inventory = inv;
  copts.agent_instance = agent_instance;

  Parts parts;
  parts.node_id = options.node_id;
  parts.inventory = inv;
  parts.collectables.push_back(runner->stats_collector());
  parts.collectables.push_back(runner->transport_stats_collector());
  // Small all-reduces of the jobs whose plan asks for it run fused (tensor_fusion.h).
  auto fusing = std::make_unique<FusingRunner>(std::move(runner), common::SystemClock::Get());
  parts.collectables.push_back(fusing->stats_collector());
  common::BufferPool::Process().SetKeepBytes(options.buffer_pool_bytes);
  parts.collectables.push_back(BufferPoolCollector(common::BufferPool::Process()));
  parts.runner = std::move(fusing);
  parts.controller = std::make_unique<GrpcControllerClient>(std::move(copts));
  parts.clock = common::SystemClock::Get();
  parts.registry = options.registry;
  auto load = std::make_shared<LoadMonitor>();
  parts.host_load = [load](double elapsed) { return load->Sample(elapsed); };
  parts.tick = options.tick;
  // Serve local processes before the controller can hand out plans that name this node.
  std::unique_ptr<Agent> agent(new Agent(std::move(parts)));
  ControlRings::Options rings;
  rings.spin = options.ring_spin;
  RETURN_IF_ERROR(agent->ServeLocal(options.local_address, options.socket_access, rings));
  agent->StartLoops();
  Log()->info("agent {} up: data plane {}, local service {}, nic {:.0f} MB/s, sum {:.0f} MB/s, {}",
              options.node_id, inv.data_plane_address(), options.local_address,
              inv.nic_bytes_per_s() / 1e6, inv.sum_bytes_per_s() / 1e6, common::AllocatorName());
  return agent;
}

std::unique_ptr<Agent> Agent::Assemble(Parts parts) {
  std::unique_ptr<Agent> agent(new Agent(std::move(parts)));
  agent->StartLoops();
  return agent;
}

Agent::Agent(Parts parts)
    : node_id_(std::move(parts.node_id)),
      inventory_(std::move(parts.inventory)),
      clock_(parts.clock),
      registry_(parts.registry ? std::move(parts.registry)
                               : std::make_shared<prometheus::Registry>()),
      collectables_(std::move(parts.collectables)),
      host_load_(std::move(parts.host_load)),
      tick_(parts.tick),
      runner_(std::move(parts.runner)),
      local_(std::make_unique<LocalService>(runner_.get(), clock_)),
      controller_(std::move(parts.controller)) {
  control_collector_ =
      std::make_shared<common::metrics::FunctionCollector>([this] { return CollectControl(); });
}

void Agent::StartLoops() {
  runner_->SetPlanMissingCallback([this] { controller_->RequestRefresh(); });
  // A replaced process: tell the controller now, not at the next heartbeat.
  local_->SetMembershipChangeCallback([this] { controller_->RequestRefresh(); });
  controller_->Start(
      [this](const std::vector<tributary::v1::JobPlan>& plans) { ApplyPlans(plans); },
      [this](double elapsed) { return SampleLoad(elapsed); });
  if (tick_ > std::chrono::milliseconds(0)) tick_thread_ = std::thread([this] { TickLoop(); });
}

Agent::~Agent() { Stop(); }

absl::Status Agent::ServeLocal(const std::string& address, const SocketAccess& access,
                               ControlRings::Options rings) {
  common::EnableHealthAndReflection();
  const bool unix_socket = address.rfind("unix:", 0) == 0;
  const std::string path = unix_socket ? address.substr(5) : std::string();
  if (unix_socket) {
    RETURN_IF_ERROR(ClaimSocketPath(path));
    RETURN_IF_ERROR(ClaimSocketPath(common::buffer_socket::PathFor(path)));
  }
  rings_ = std::make_unique<ControlRings>(local_.get(), rings);
  grpc_service_ = std::make_unique<LocalGrpcService>(local_.get(), rings_.get());
  grpc::ServerBuilder builder;
  int port = -1;
  // One agent per address: never share a port with another process (SO_REUSEPORT).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Local requests are small (no tensor bytes travel over gRPC): 1 MiB is plenty.
  builder.SetMaxReceiveMessageSize(1 << 20);
  // A Unix socket is accepted by GrpcUnixListener, which checks each connection's peer first.
  if (!unix_socket) builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(grpc_service_.get());
  server_ = builder.BuildAndStart();
  if (!server_) {
    return absl::UnavailableError(absl::StrCat("cannot serve local processes on ", address));
  }
  if (unix_socket) {
    ASSIGN_OR_RETURN(refuse_server_, RefusingServer::Start(RefusalMessage(access)));
    ASSIGN_OR_RETURN(grpc_listener_, GrpcUnixListener::Start(path, access, server_.get(),
                                                             refuse_server_->server()));
    ASSIGN_OR_RETURN(
        buffer_socket_,
        BufferSocketServer::Start(
            common::buffer_socket::PathFor(path), access,
            [service = local_.get()](const common::PeerCredentials& peer,
                                     const std::string& session_id, uint64_t size_bytes,
                                     common::UniqueFd fd) {
              return service->RegisterBuffer(peer, session_id, size_bytes, std::move(fd));
            },
            [service = local_.get()](const std::string& session_id, uint64_t buffer_id) {
              tributary::v1::UnregisterBufferRequest req;
              req.set_session_id(session_id);
              req.set_buffer_id(buffer_id);
              const absl::Status released = service->UnregisterBuffer(req);
              if (!released.ok()) {
                Log()->warn("releasing buffer {} of session {}: {}", buffer_id, session_id,
                            released.ToString());
              }
            }));
  }
  common::SetServing(server_.get(), "tributary.v1.Agent");
  return absl::OkStatus();
}

tributary::v1::NodeLoad Agent::SampleLoad(double elapsed) {
  tributary::v1::NodeLoad load = host_load_ ? host_load_(elapsed) : tributary::v1::NodeLoad();
  const uint64_t sent = runner_->bytes_sent();
  const uint64_t received = runner_->bytes_received();
  if (elapsed > 0) {
    load.set_dataplane_tx_bytes_per_s(static_cast<double>(sent - last_dataplane_sent_) / elapsed);
    load.set_dataplane_rx_bytes_per_s(static_cast<double>(received - last_dataplane_received_) /
                                      elapsed);
  }
  last_dataplane_sent_ = sent;
  last_dataplane_received_ = received;
  for (const PendingMembershipChange& p : local_->PendingMembershipChanges()) {
    tributary::v1::MembershipChange* change = load.add_membership_changes();
    change->set_job_id(p.job_id);
    change->set_generation(p.generation);
    change->set_local_rank(p.local_rank);
  }
  for (const auto& [job_id, o] : runner_->TakeObservations()) {
    tributary::v1::JobObservation* j = load.add_jobs();
    j->set_job_id(job_id);
    j->set_bytes(o.bytes);
    j->set_seconds(o.seconds);
    j->set_wire_bytes_sent(o.wire_bytes_sent);
    j->set_wire_bytes_received(o.wire_bytes_received);
    j->set_collectives(o.collectives);
    j->set_busy_seconds(o.busy_seconds);
    j->set_iterations(o.iterations);
    j->set_iteration_seconds(o.iteration_seconds);
    j->set_iteration_max_seconds(o.iteration_max_seconds);
    j->set_iteration_busy_seconds(o.iteration_busy_seconds);
  }
  return load;
}

std::vector<std::weak_ptr<prometheus::Collectable>> Agent::collectables() const {
  std::vector<std::weak_ptr<prometheus::Collectable>> out = {registry_};
  for (const auto& c : collectables_) out.push_back(c);
  out.push_back(control_collector_);
  return out;
}

std::map<std::string, uint64_t> Agent::applied_plans() const {
  std::lock_guard lock(plans_mu_);
  return applied_;
}

std::vector<prometheus::MetricFamily> Agent::CollectControl() {
  using common::metrics::AddSample;
  using common::metrics::MakeFamily;
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  out.push_back(MakeFamily("tributary_agent_registered",
                           "1 while registered with the controller, else 0.", MetricType::Gauge));
  AddSample(out.back(), controller_->registered() ? 1 : 0);
  out.push_back(MakeFamily("tributary_agent_heartbeats_sent_total", "Heartbeats answered OK.",
                           MetricType::Counter));
  AddSample(out.back(), controller_->heartbeats_sent());
  out.push_back(MakeFamily("tributary_agent_heartbeats_failed_total", "Heartbeats that failed.",
                           MetricType::Counter));
  AddSample(out.back(), controller_->heartbeats_failed());
  out.push_back(MakeFamily("tributary_agent_local_sessions",
                           "Training processes connected to this agent.", MetricType::Gauge));
  AddSample(out.back(), local_->num_sessions());
  out.push_back(MakeFamily("tributary_agent_retried_operations_total",
                           "Submissions that ran an iteration again after it failed as retriable "
                           "(a plan change or a lost summation server); each is a client retry.",
                           MetricType::Counter));
  AddSample(out.back(), local_->resubmissions());
  out.push_back(MakeFamily("tributary_agent_membership_changes_total",
                           "Times a job's membership generation moved on this node (a training "
                           "process replaced, an elastic job's workers changed): its processes "
                           "had to resync.",
                           MetricType::Counter));
  AddSample(out.back(), local_->generation_changes());
  out.push_back(MakeFamily("tributary_agent_resyncs_total",
                           "Sessions that resynced to a new membership generation.",
                           MetricType::Counter));
  AddSample(out.back(), local_->resyncs());
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
  controller_->Stop();
  local_->Shutdown();
  if (rings_) rings_->Shutdown();  // after the sessions ended: their rings are stopping
  if (grpc_listener_) grpc_listener_->Stop();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (refuse_server_) refuse_server_->Shutdown();
  if (buffer_socket_) buffer_socket_->Stop();
  runner_->Shutdown();
  Log()->info("agent {} stopped", node_id_);
}

void Agent::ApplyPlans(const std::vector<tributary::v1::JobPlan>& plans) {
  std::lock_guard lock(plans_mu_);
  std::vector<LocalJob> local_jobs;
  std::map<std::string, uint64_t> now;
  for (const auto& plan : plans) {
    absl::StatusOr<dataplane::JobView> view = ToJobView(plan, node_id_);
    absl::StatusOr<dataplane::Algorithm> algorithm = ToAlgorithm(plan.algorithm());
    if (!view.ok() || !algorithm.ok()) {
      Log()->error("ignoring plan v{} of job {}: {}", plan.version(), plan.job_id(),
                   (view.ok() ? algorithm.status() : view.status()).message());
      continue;
    }
    now[plan.job_id()] = plan.version();
    if (applied_[plan.job_id()] != plan.version()) {
      runner_->SetJob(*view, *algorithm);
      Log()->info("job {} plan v{}: worker rank {}, server index {} of {}", plan.job_id(),
                  plan.version(), view->my_worker_rank, view->my_server_index,
                  view->server_addresses.size());
    }
    if (view->my_worker_rank >= 0) {
      LocalJob local{plan.job_id(),
                     plan.version(),
                     static_cast<uint32_t>(view->my_worker_rank),
                     static_cast<uint32_t>(view->worker_addresses.size()),
                     view->procs_per_node,
                     view->op_timeout,
                     {},
                     plan.generation(),
                     nullptr};
      for (const auto& w : plan.workers()) {
        if (w.down())
          local.down_workers.push_back(absl::StrCat(w.node_id(), " (rank ", w.rank(), ")"));
      }
      for (const auto& intra : plan.intra_node()) {
        if (intra.node_id() == node_id_ || intra.node_id().empty()) {
          local.intra_node = std::make_shared<const tributary::v1::IntraNodePlan>(intra);
        }
      }
      local_jobs.push_back(std::move(local));
    }
  }
  for (const auto& [job_id, version] : applied_) {
    if (!now.contains(job_id)) {
      runner_->RemoveJob(job_id);
      Log()->info("job {} no longer involves this node", job_id);
    }
  }
  applied_ = std::move(now);
  local_->SetJobs(local_jobs);
}

void Agent::Tick() {
  runner_->Tick();
  local_->Tick();
}

void Agent::TickLoop() {
  common::SetCurrentThreadName("trib-tick");
  std::unique_lock lock(tick_mu_);
  while (!stopping_) {
    tick_cv_.wait_for(lock, tick_, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    Tick();
    lock.lock();
  }
}

}  // namespace tributary::agent
