#include "client/launcher/launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "client/cluster/local_cluster.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "tributary/v1/controller.grpc.pb.h"

namespace tributary::client::launcher {
namespace {

// A TCP port on 127.0.0.1 that was free a moment ago (torchrun's way of picking MASTER_PORT).
absl::StatusOr<int> FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int e = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("bind 127.0.0.1:0: ", std::strerror(e)));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

absl::Status Validate(const LaunchOptions& o) {
  if (o.command.empty()) return absl::InvalidArgumentError("give the command to run after --");
  if (o.np < 1 || o.procs_per_node < 1) {
    return absl::InvalidArgumentError("--np and --procs-per-node must be at least 1");
  }
  if (o.np % o.procs_per_node != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--np ", o.np, " is not a multiple of --procs-per-node ", o.procs_per_node));
  }
  if (o.spares < 0) return absl::InvalidArgumentError("--spares must be at least 0");
  const size_t nodes = static_cast<size_t>(o.np / o.procs_per_node);
  if (!o.controller.empty() && (o.workers.size() != nodes || o.agents.size() != nodes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "with --controller, give --workers and --agents for each of the ", nodes,
        " worker nodes (np / procs-per-node); got ", o.workers.size(), " and ", o.agents.size()));
  }
  return absl::OkStatus();
}

}  // namespace

RankLaunch RankEnvironment(int rank, const LaunchOptions& options, const std::string& job,
                           const std::string& controller, const std::string& agent_address,
                           int master_port) {
  const int local_rank = rank % options.procs_per_node;
  RankLaunch launch;
  launch.rank = rank;
  auto& env = launch.env;
  env["TRIBUTARY_AGENT_ADDRESS"] = agent_address;
  env["TRIBUTARY_JOB"] = job;
  env["TRIBUTARY_CONTROLLER"] = controller;
  env["TRIBUTARY_RANK"] = std::to_string(rank);
  env["TRIBUTARY_WORLD_SIZE"] = std::to_string(options.np);
  env["TRIBUTARY_LOCAL_RANK"] = std::to_string(local_rank);
  env["TRIBUTARY_LOCAL_SIZE"] = std::to_string(options.procs_per_node);
  env["RANK"] = std::to_string(rank);
  env["WORLD_SIZE"] = std::to_string(options.np);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["LOCAL_WORLD_SIZE"] = std::to_string(options.procs_per_node);
  env["TRIBUTARY_MODE"] = options.async_mode ? "async" : "sync";
  if (options.async_mode) env["TRIBUTARY_STALENESS"] = std::to_string(options.staleness);
  env["MASTER_ADDR"] = "127.0.0.1";
  env["MASTER_PORT"] = std::to_string(master_port);
  // As torchrun does: several CPU-bound processes per machine each get one OpenMP thread unless
  // the user chose otherwise.
  if (std::getenv("OMP_NUM_THREADS") == nullptr) env["OMP_NUM_THREADS"] = "1";
  return launch;
}

absl::StatusOr<int> Launch(const LaunchOptions& options) {
  RETURN_IF_ERROR(Validate(options));
  const int nodes = options.np / options.procs_per_node;
  // Loopback defaults for UCX (the agents and anything the ranks start inherit them).
  setenv("UCX_NET_DEVICES", "lo", 0);
  setenv("UCX_TLS", "tcp", 0);
  setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);

  std::unique_ptr<LocalCluster> cluster;
  std::unique_ptr<v1::Controller::Stub> own_stub;
  v1::Controller::Stub* stub = nullptr;
  std::string controller = options.controller;
  std::vector<std::string> workers = options.workers;
  std::vector<std::string> agents = options.agents;
  if (controller.empty()) {
    LocalClusterOptions cluster_options;
    cluster_options.bin_dir = options.bin_dir;
    cluster_options.run_dir = options.run_dir;
    cluster_options.workers = nodes;
    cluster_options.spares = options.spares;
    cluster_options.nic_gbps = {options.nic_gbps};
    cluster_options.log_level = options.log_level;
    cluster_options.tls_dir = options.tls_dir;
    ASSIGN_OR_RETURN(cluster, LocalCluster::Start(cluster_options));
    stub = &cluster->controller();
    controller = cluster->controller_address();
    workers = cluster->worker_node_ids();
    agents.clear();
    for (int i = 0; i < nodes; ++i) agents.push_back(cluster->agent_address(i));
  } else {
    ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                     common::MakeChannel(controller, options.tls));
    own_stub = v1::Controller::NewStub(channel);
    stub = own_stub.get();
  }

  const std::string job =
      options.job.empty() ? absl::StrCat("tributary-run-", getpid()) : options.job;
  v1::CreateJobRequest request;
  request.set_job_id(job);
  v1::JobSpec& spec = *request.mutable_spec();
  for (const std::string& w : workers) spec.add_worker_nodes(w);
  spec.set_procs_per_node(static_cast<uint32_t>(options.procs_per_node));
  spec.set_max_spare_nodes(static_cast<uint32_t>(options.spares));
  spec.set_algorithm(options.algorithm);
  spec.set_op_timeout_ms(options.timeout_ms);
  if (options.partition_bytes) spec.set_partition_bytes(*options.partition_bytes);
  if (options.async_mode) {
    spec.set_mode(v1::JOB_MODE_ASYNC);
    spec.set_staleness(options.staleness);
    if (options.delta_scale != 0) spec.set_delta_scale(options.delta_scale);
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::Job created;
    RETURN_IF_ERROR(FromGrpc(stub->CreateJob(&ctx, request, &created),
                             absl::StrCat("creating job ", job, " at ", controller)));
  }

  ASSIGN_OR_RETURN(const int master_port, FreeLoopbackPort());
  std::vector<RankLaunch> ranks;
  for (int rank = 0; rank < options.np; ++rank) {
    ranks.push_back(RankEnvironment(rank, options, job, controller,
                                    agents[rank / options.procs_per_node], master_port));
  }
  RunRanksOptions run_options;
  run_options.command = options.command;
  run_options.stop_grace = options.stop_grace;
  absl::StatusOr<int> result = RunRanks(ranks, run_options);

  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::DeleteJobRequest del;
    del.set_job_id(job);
    v1::DeleteJobResponse resp;
    grpc::Status s = stub->DeleteJob(&ctx, del, &resp);
    if (!s.ok()) {
      std::cerr << "tributary-run: deleting job " << job << ": " << s.error_message() << "\n";
    }
  }
  if (cluster) cluster->Stop();
  return result;
}

}  // namespace tributary::client::launcher
