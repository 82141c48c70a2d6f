// tributary-run: starts (or joins) a cluster, creates a job and runs its training processes.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/launcher/rank_runner.h"
#include "common/rpc/tls.h"
#include "tributary/v1/controller.pb.h"

namespace tributary::client::launcher {

struct LaunchOptions {
  // Training processes in all, and per worker node (np must be a multiple of it).
  int np = 1;
  int procs_per_node = 1;
  // Spare nodes (summation servers only) of the local cluster, and the most the job may use.
  int spares = 0;
  // Empty: start a local cluster (controller + np / procs_per_node worker agents + spares, on
  // loopback) and stop it at the end. Otherwise the controller's gRPC address, and `workers`
  // (node ids in node-rank order) and `agents` (the gRPC address of each worker's agent, as
  // this machine reaches it) name the nodes the job runs on.
  std::string controller;
  std::vector<std::string> workers;
  std::vector<std::string> agents;
  // mTLS to that controller (an admin's certificate: the launcher creates and deletes the
  // job); empty: plaintext.
  common::TlsConfig tls;
  // Local cluster: run it with mTLS from this folder (LocalClusterOptions::tls_dir: ca.crt,
  // controller.*, one <node id>.* per worker "worker-I" and spare "spare-I", admin.*);
  // empty: plaintext.
  std::string tls_dir;
  // Job id; empty: "tributary-run-<pid>".
  std::string job;
  v1::Algorithm algorithm = v1::ALGORITHM_AUTO;
  // Deadline of one collective, ms (0: the controller's default).
  uint32_t timeout_ms = 0;
  std::optional<uint64_t> partition_bytes;
  // The job's mode: asynchronous parameter-server training with this staleness bound (-1
  // unbounded) and delta scale (0: the job's default, 1). Ranks see TRIBUTARY_MODE and, when
  // async, TRIBUTARY_STALENESS.
  bool async_mode = false;
  int32_t staleness = -1;
  double delta_scale = 0;
  // Local cluster: folder of tributary-controller / tributary-agent, run folder (empty: a
  // temporary one, removed at the end), NIC speed declared per node, agents' log level.
  std::string bin_dir;
  std::string run_dir;
  double nic_gbps = 10;
  std::string log_level = "warn";
  // Grace between SIGTERM and SIGKILL when the ranks are stopped.
  std::chrono::milliseconds stop_grace{5000};
  // The training command.
  std::vector<std::string> command;
};

// The environment of global rank `rank` (documented in client/README.md, "tributary-run"):
// TRIBUTARY_* for tributary.torch and the c10d backend, and torchrun's RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
RankLaunch RankEnvironment(int rank, const LaunchOptions& options, const std::string& job,
                           const std::string& controller, const std::string& agent_address,
                           int master_port);

// Runs the whole launch; returns the exit status for the launcher (see RunRanks), or an error
// when the cluster or the job could not be set up (nothing was started then, or it was
// stopped again).
absl::StatusOr<int> Launch(const LaunchOptions& options);

}  // namespace tributary::client::launcher
