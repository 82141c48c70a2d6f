// tributary-controller: node registry, jobs and plans over gRPC.
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <random>
#include <thread>

#include "CLI/CLI.hpp"
#include "common/logging.h"
#include "common/metrics/metrics.h"
#include "common/process_flags.h"
#include "common/rpc/grpc_status.h"
#include "controller/cluster_state.h"
#include "controller/controller_service.h"

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
  CLI::App app{"Tributary controller: node registry, jobs and plans"};
  std::string listen = "127.0.0.1:7070";
  tributary::common::ProcessFlags process_flags{.metrics_listen = "0.0.0.0:9464"};
  std::string port_file;
  int heartbeat_ms = 500, heartbeat_timeout_ms = 3000;
  app.add_option("--listen", listen, "gRPC listen address (host:port; port 0 picks one)");
  app.add_option("--port-file", port_file, "Write the bound port to this file once serving");
  app.add_option("--heartbeat-ms", heartbeat_ms, "Heartbeat interval agents are told to use");
  app.add_option("--heartbeat-timeout-ms", heartbeat_timeout_ms,
                 "A node without a heartbeat for this long is dead");
  tributary::common::AddProcessFlags(app, process_flags);
  CLI11_PARSE(app, argc, argv);
  tributary::common::InitLogging(process_flags.log_level, process_flags.log_format);
  auto log = tributary::common::Logger("controller");

  tributary::controller::ClusterState::Options options;
  options.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
  options.heartbeat_timeout = std::chrono::milliseconds(heartbeat_timeout_ms);
  auto registry = std::make_shared<prometheus::Registry>();
  tributary::controller::ClusterState state(tributary::common::SystemClock::Get(), options,
                                            std::random_device{}() << 20, registry.get());
  tributary::controller::ControllerService service(&state, registry.get());
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
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    log->critical("cannot listen on {}", listen);
    return 1;
  }
  tributary::common::SetServing(server.get(), "tributary.v1.Controller");
  log->info("controller serving on {} (port {})", listen, port);
  if (!port_file.empty()) {
    std::FILE* f = std::fopen(port_file.c_str(), "w");
    if (f) {
      std::fprintf(f, "%d\n", port);
      std::fclose(f);
    }
  }

  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  {
    std::unique_lock lock(g_mu);
    while (!g_stop) {
      g_cv.wait_for(lock, std::chrono::milliseconds(heartbeat_ms / 2 + 1));
      state.CheckLiveness();
    }
  }
  log->info("controller shutting down");
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
