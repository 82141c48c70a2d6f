// tributary-controller: node registry, jobs and plans over gRPC; jobs durable with --state-db.
#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <csignal>
#include <random>
#include <thread>

#include "CLI/CLI.hpp"
#include "common/allocator.h"
#include "common/logging.h"
#include "common/metrics/metrics.h"
#include "common/process_flags.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/tls.h"
#include "common/rpc/tls_flags.h"
#include "controller/authz.h"
#include "controller/cluster_state.h"
#include "controller/controller_service.h"
#include "controller/state_store.h"

namespace {
std::mutex g_mu;
std::condition_variable g_cv;
bool g_stop = false;
void OnSignal(int) {
  g_stop = true;  // read under g_mu by the waiting thread after notify; a benign race for exit
  g_cv.notify_all();
}
}  // namespace

int main(int argc, char** argv) {
  tributary::common::DisableMutexDeadlockDetection();
  CLI::App app{"Tributary controller: node registry, jobs and plans"};
  std::string listen = "127.0.0.1:7070";
  tributary::common::ProcessFlags process_flags{.metrics_listen = "0.0.0.0:9464"};
  std::string port_file;
  int heartbeat_ms = 500, heartbeat_timeout_ms = 3000, restore_grace_ms = 10000;
  int replan_debounce_ms = 10;
  int idle_connection_s = 600;
  int job_stats_window_ms = 30000;
  double max_heartbeats_per_s = 10000;
  std::string state_db;
  app.add_option("--listen", listen, "gRPC listen address (host:port; port 0 picks one)");
  app.add_option("--port-file", port_file, "Write the bound port to this file once serving");
  app.add_option("--heartbeat-ms", heartbeat_ms, "Heartbeat interval agents are told to use");
  app.add_option("--heartbeat-timeout-ms", heartbeat_timeout_ms,
                 "A node without a heartbeat for this long is dead");
  app.add_option("--state-db", state_db,
                 "SQLite file holding jobs and plans across restarts (created when missing); "
                 "without it jobs live in memory only");
  app.add_option("--restore-grace-ms", restore_grace_ms,
                 "Restored jobs keep their plan this long waiting for their nodes to register");
  tributary::common::TlsConfig tls;
  tributary::common::AddTlsFlags(app, tls, /*client=*/false);
  tributary::controller::AuthzOptions authz_options;
  app.add_option("--tls-admin", authz_options.admins,
                 "mTLS: identity (client certificate CN or DNS SAN) allowed to create and delete "
                 "jobs; repeat for several")
      ->group("TLS");
  app.add_option("--tls-fleet-identity", authz_options.fleet,
                 "mTLS: identity that may act for any node (agents sharing one certificate, e.g. "
                 "a DaemonSet's Secret); without it an agent's certificate must name its node id "
                 "and hostname")
      ->group("TLS");
  app.add_option("--replan-debounce-ms", replan_debounce_ms,
                 "Node deaths and returns within this window cost one re-plan per affected job")
      ->check(CLI::Range(0, 60000));
  app.add_option("--idle-connection-s", idle_connection_s,
                 "A client connection without an open call for this long is closed")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  app.add_option("--max-heartbeats-per-s", max_heartbeats_per_s,
                 "Agents are told a longer heartbeat interval when the cluster would exceed this")
      ->check(CLI::PositiveNumber);
  app.add_option("--job-stats-window-ms", job_stats_window_ms,
                 "GetJobStats and the per-job metrics cover the agents' reports of this window; "
                 "a node that stops reporting a job drops out after it")
      ->check(CLI::Range(1000, 3600000));
  tributary::common::AddProcessFlags(app, process_flags);
  CLI11_PARSE(app, argc, argv);
  tributary::common::InitLogging(process_flags.log_level, process_flags.log_format);
  auto log = tributary::common::Logger("controller");

  authz_options.tls = tls.enabled();
  if (!authz_options.tls && (!authz_options.admins.empty() || !authz_options.fleet.empty())) {
    log->critical(
        "cannot start: --tls-admin and --tls-fleet-identity need mTLS (--tls-cert, "
        "--tls-key, --tls-ca)");
    return 2;
  }
  auto credentials = tributary::common::MakeServerCredentials(tls, "controller", listen);
  if (!credentials.ok()) {
    log->critical("cannot start: {}", credentials.status().message());
    return 2;
  }
  const tributary::controller::Authorizer authz(authz_options);

  tributary::controller::ClusterState::Options options;
  options.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
  options.heartbeat_timeout = std::chrono::milliseconds(heartbeat_timeout_ms);
  options.restore_grace = std::chrono::milliseconds(restore_grace_ms);
  options.replan_debounce = std::chrono::milliseconds(replan_debounce_ms);
  options.max_heartbeats_per_s = max_heartbeats_per_s;
  options.job_stats_window = std::chrono::milliseconds(job_stats_window_ms);
  std::unique_ptr<tributary::controller::StateStore> store;
  if (!state_db.empty()) {
    auto opened = tributary::controller::StateStore::Open(state_db);
    if (!opened.ok()) {
      log->critical("cannot start: {}", opened.status().message());
      return 2;
    }
    store = *std::move(opened);
  }
  auto registry = std::make_shared<prometheus::Registry>();
  tributary::controller::ClusterState state(tributary::common::SystemClock::Get(), options,
                                            std::random_device{}() << 20, registry.get(),
                                            store.get());
  absl::StatusOr<size_t> restored = state.Restore();
  if (!restored.ok()) {
    log->critical("cannot start: {}", restored.status().message());
    return 2;
  }
  // Before anything says the controller is up (the metrics and --port-file): a SIGTERM sent as
  // soon as the port file appeared killed it by the default action, skipping the orderly
  // shutdown (ControllerRestartTest.CorruptStateDatabaseIsAClearStartupError got 143 in CI).
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  tributary::controller::ControllerService service(&state, registry.get(), &authz);
  std::shared_ptr<prometheus::Collectable> state_collector = state.collector();
  auto process = std::make_shared<tributary::common::metrics::ProcessCollector>();
  std::unique_ptr<tributary::common::metrics::MetricsServer> metrics;
  if (!process_flags.metrics_listen.empty()) {
    auto server = tributary::common::metrics::MetricsServer::Start(
        process_flags.metrics_listen, process_flags.metrics_port_file,
        {registry, state_collector, process});
    if (!server.ok()) {
      log->critical("{}", server.status().message());
      return 1;
    }
    metrics = *std::move(server);
    log->info("metrics on {} (port {})", process_flags.metrics_listen, metrics->port());
  }

  tributary::common::EnableHealthAndReflection();
  grpc::ServerBuilder builder;
  int port = 0;
  // gRPC sets SO_REUSEPORT by default: a second controller would bind the same port and both
  // would report serving, each with half of the agents. One controller per port.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Requests are small (the largest, a registration, carries a topology of a few KiB): anything
  // over 4 MiB is RESOURCE_EXHAUSTED before it is parsed.
  builder.SetMaxReceiveMessageSize(4 << 20);
  // No keepalive or BDP pings: each arms a timer per connection, and Debian's gRPC (built without
  // NDEBUG) keeps every timer in a hash table it walks on each add and remove, which cost a fifth
  // of the CPU at 10,000 agents (README.md, "Scale"). Liveness is the heartbeats' business; a dead
  // node's watch stream is ended (ClusterState), and a connection without streams closes after
  // --idle-connection-s (a timer only on idle connections).
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, INT_MAX);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, idle_connection_s * 1000);
  builder.AddListeningPort(listen, *credentials, &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    log->critical("cannot listen on {} (another controller on that port?)", listen);
    return 1;
  }
  tributary::common::SetServing(server.get(), "tributary.v1.Controller");
  log->info("controller on {}", tributary::common::AllocatorName());
  if (store) {
    log->info(
        "controller serving on {} (port {}); state in {} (SQLite, WAL, synchronous=FULL): "
        "{} jobs restored",
        listen, port, state_db, *restored);
  } else {
    log->info(
        "controller serving on {} (port {}); state in memory only (no --state-db): jobs are "
        "lost when the controller stops",
        listen, port);
  }
  if (!port_file.empty()) {
    std::FILE* f = std::fopen(port_file.c_str(), "w");
    if (f) {
      std::fprintf(f, "%d\n", port);
      std::fclose(f);
    }
  }

  {
    std::unique_lock lock(g_mu);
    while (!g_stop) {
      // CheckLiveness costs only the nodes that expire and the jobs that are due: it runs when the
      // next one is due, or a few ms later for what other threads marked meanwhile.
      const auto tick = std::chrono::milliseconds(
          std::min(heartbeat_ms / 2, std::max(replan_debounce_ms / 4, 5)) + 1);
      g_cv.wait_until(lock, std::min(state.NextCheck(), std::chrono::steady_clock::now() + tick));
      state.CheckLiveness();
    }
  }
  log->info("controller shutting down");
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
