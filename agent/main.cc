// tributary-agent: one per node. Runs the summation and communication services and serves the
// node's training processes.
#include <grp.h>

#include <csignal>
#include <cstdlib>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "agent/mirror_stager.h"
#include "common/logging.h"
#include "common/metrics/metrics.h"
#include "common/process_flags.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/tls_flags.h"
#include "common/trace.h"

namespace {
volatile std::sig_atomic_t g_stop = 0;

absl::Status ParseSocketAccess(const std::string& group, const std::string& mode,
                               const std::vector<uid_t>& uids,
                               tributary::agent::SocketAccess* access) {
  char* end = nullptr;
  const unsigned long bits = std::strtoul(mode.c_str(), &end, 8);
  if (mode.empty() || *end != '\0' || bits > 0777 || (bits & 0600) != 0600) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--socket-mode '", mode, "' must be octal, at most 0777, with owner read and write"));
  }
  access->mode = static_cast<mode_t>(bits);
  if (!group.empty()) {
    gid_t gid = 0;
    if (const struct group* g = getgrnam(group.c_str()); g != nullptr) {
      access->group = g->gr_gid;
    } else if (absl::SimpleAtoi(group, &gid)) {
      access->group = gid;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--socket-group '", group, "' is neither a group name nor a gid"));
    }
  }
  access->allowed_uids = uids;
  return absl::OkStatus();
}

void OnSignal(int) { g_stop = 1; }
}  // namespace

int main(int argc, char** argv) {
  tributary::common::DisableMutexDeadlockDetection();
  CLI::App app{"Tributary agent: summation and communication services of one node"};
  tributary::agent::AgentOptions options;
  double nic_gbps = 0, sum_gbps = 0;
  bool no_summation = false;
  tributary::common::ProcessFlags process_flags{.metrics_listen = "0.0.0.0:9465"};
  app.add_option("--node-id", options.node_id, "Node identity (default: hostname)");
  app.add_option("--controller", options.controller_address, "Controller address host:port");
  app.add_option("--data-plane-host", options.data_plane_host,
                 "IP address of this node's data-plane listener (peers dial it)");
  app.add_option("--data-plane-port", options.data_plane_port,
                 "Data-plane listener port (0 = any)");
  std::string transport = "auto";
  app.add_option("--transport", transport,
                 "Data-plane transport: tcp (hardened against hostile bytes), ucx, or auto (tcp "
                 "unless UCX_TLS allows RDMA transports)")
      ->check(CLI::IsMember({"auto", "tcp", "ucx"}))
      ->capture_default_str();
  app.add_option("--listen", options.local_address,
                 "Address for local training processes (unix:PATH or host:port)");
  app.add_option("--nic-gbps", nic_gbps,
                 "Declared NIC bandwidth, Gbit/s per direction "
                 "(default: from sysfs)");
  app.add_option("--sum-gbps", sum_gbps, "Declared summation rate, GByte/s (default: measured)");
  app.add_option("--topology-file", options.topology_file,
                 "Report this topology (NCCL XML, nvidia-smi topo -m, JSON, YAML) instead of "
                 "discovering one");
  app.add_flag("--no-summation", no_summation,
               "Do not serve as a summation server for jobs this node is not a worker of");
  app.add_flag("--emulate-nic", options.emulate_nic,
               "Pace data-plane egress to --nic-gbps (local clusters on loopback)");
  double selector_alpha_us = tributary::agent::kDefaultSelectorAlphaSeconds * 1e6;
  app.add_option("--selector-alpha-us", selector_alpha_us,
                 "Per-message cost in the automatic algorithm choice's model, microseconds "
                 "(default: fitted by bench/suite/run.py)")
      ->capture_default_str();
  app.add_option("--selector-calibration", options.selector_calibration_file,
                 "selector_calibration.json from bench/suite/run.py: measured thresholds for the "
                 "automatic algorithm choice instead of the cost model's");
  std::string trace_path;
  app.add_option(
      "--trace", trace_path,
      "Write a Chrome trace (chrome://tracing, ui.perfetto.dev) of the data plane's "
      "chunks to this file: per summation server, the wait for credit, the send, the "
      "wait for the sum; on servers, each sum and each result sent. \"{node}\" in the path "
      "becomes the node id");
  app.add_option("--bundle-bytes", options.bundle_record_bytes,
                 "Fusion on the wire: messages up to this many bytes to a peer that is still "
                 "receiving an earlier one travel together in one message (0 = off)")
      ->capture_default_str();
  app.add_option("--reducer-threads", options.reducer_threads, "Summation threads (0 = all)");
  uint64_t peer_recovery_mib = options.peer_recovery_bytes >> 20;
  app.add_option("--peer-recovery-mib", peer_recovery_mib,
                 "Memory for the push/pull sums a worker keeps so that a peer that lost a "
                 "summation server can complete from it (up to twice each tensor's size while it "
                 "fits; tensors past it have no peer copy); 0 = keep none")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 24));
  uint64_t buffer_pool_mib = options.buffer_pool_bytes >> 20;
  app.add_option("--buffer-pool-mib", buffer_pool_mib,
                 "Memory for free fused buffers and copies of sums kept for the next "
                 "collectives, whose pages are then already mapped; 0 = keep none")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 24));
  uint64_t early_message_mib = options.early_message_bytes >> 20;
  app.add_option("--early-message-mib", early_message_mib,
                 "Memory for data-plane messages of collectives this node has not started yet "
                 "(a peer ahead of it); a message past it fails its collective on every rank "
                 "with RESOURCE_EXHAUSTED. Raise it when ranks start collectives of large "
                 "tensors far apart")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 24));
  uint64_t push_backlog_kib = options.push_backlog_bytes >> 10;
  app.add_option("--push-backlog-kib", push_backlog_kib,
                 "Push/pull: unsent pushes per summation server at most; when the next chunk's "
                 "server is at it, the job's later chunks wait, so that the flows TCP favours "
                 "cannot run ahead of the slowest (0 = off; binds early on the connections to "
                 "spare servers, --push-spare-lowat-kib)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 30));
  uint32_t push_spare_lowat_kib = options.push_spare_unsent_bytes >> 10;
  app.add_option("--push-spare-lowat-kib", push_spare_lowat_kib,
                 "Push/pull with --push-backlog-kib: unsent bytes the socket of a connection to "
                 "a spare summation server (not a worker of the job) holds at most "
                 "(TCP_NOTSENT_LOWAT), so that the backlog binds on bytes about to leave; the "
                 "connections among workers keep --tcp-notsent-lowat-kib (0 = that too)")
      ->capture_default_str()
      ->check(CLI::Range(uint32_t{0}, uint32_t{1} << 20));
  uint32_t tcp_notsent_lowat_kib = options.tcp_notsent_lowat_bytes >> 10;
  app.add_option("--tcp-notsent-lowat-kib", tcp_notsent_lowat_kib,
                 "TCP data plane: unsent bytes a connection's socket holds at most "
                 "(TCP_NOTSENT_LOWAT), so that a send completes when its bytes are about to "
                 "leave (0 = the kernel's default; on every connection, where 128-1024 can slow "
                 "the ring when the CPU is short; --push-spare-lowat-kib sets the connections to "
                 "spare summation servers)")
      ->capture_default_str()
      ->check(CLI::Range(uint32_t{0}, uint32_t{1} << 20));
  std::string tcp_congestion = "system";
  app.add_option("--tcp-congestion", tcp_congestion,
                 "TCP data plane: congestion control of the connections this agent opens "
                 "(TCP_CONGESTION; system = the host's default). cubic keeps a ring's long-lived "
                 "connections out of BBR's minimum-RTT probe, which stalls them every 10 s, but "
                 "made push/pull with spare servers uneven (BENCHMARKS.md, session 33); with "
                 "the tcp transport, a name the agent cannot set stops it at start (ucx keeps "
                 "the host's, with a warning)")
      ->capture_default_str();
  std::string tcp_congestion_workers = "auto";
  app.add_option("--tcp-congestion-workers", tcp_congestion_workers,
                 "TCP data plane: congestion control of the connections among the workers of "
                 "jobs whose collectives all run among them (no spare servers, not push/pull, "
                 "not asynchronous), whose ring, halving-doubling and recursive doubling wait "
                 "for their slowest connection (auto = cubic in place "
                 "of BBR, whose minimum-RTT probe stalls them every 10 s, where the agent may set "
                 "it; system = --tcp-congestion's; a name the agent cannot set stops it at "
                 "start). Connections that push/pull or spare servers use keep "
                 "--tcp-congestion's")
      ->capture_default_str();
  uint64_t staging_chunk_kib = tributary::agent::kDefaultMirrorStagingChunk >> 10;
  app.add_option("--staging-chunk-kib", staging_chunk_kib,
                 "GPU tensors larger than this are copied to and from host memory in chunks of "
                 "this size while the collective runs (0 = whole, before and after it)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 30));
  int64_t ring_spin_us = options.ring_spin.count();
  app.add_option("--ring-spin-us", ring_spin_us,
                 "A control ring's thread polls for up to this many microseconds before sleeping "
                 "on its doorbell, when its recent idle spells were shorter (0 = never)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{10000}));
  std::string socket_group, socket_mode = "0660";
  std::vector<uid_t> socket_uids;
  app.add_option("--socket-group", socket_group,
                 "Group (name or gid) that owns the local sockets; its members may use the agent");
  app.add_option("--socket-mode", socket_mode, "Mode of the local sockets (octal)")
      ->capture_default_str();
  app.add_option("--socket-allow-uid", socket_uids,
                 "Further uids that may use the agent (root and the agent's own uid always may)");
  // mTLS on the link to the controller only; the local sockets are guarded by mode and peer uid.
  tributary::common::AddTlsFlags(app, options.controller_tls, /*client=*/true);
  tributary::common::AddProcessFlags(app, process_flags);
  CLI11_PARSE(app, argc, argv);
  tributary::common::InitLogging(process_flags.log_level, process_flags.log_format);
  if (absl::Status s = tributary::common::ValidateTlsConfig(options.controller_tls); !s.ok()) {
    tributary::common::Logger("agent")->critical("cannot start: {}", s.message());
    return 2;
  }
  if (absl::Status s =
          ParseSocketAccess(socket_group, socket_mode, socket_uids, &options.socket_access);
      !s.ok()) {
    tributary::common::Logger("agent")->critical("{}", s.message());
    return 2;
  }
  tributary::agent::SetMirrorStagingChunkBytes(staging_chunk_kib << 10);
  options.ring_spin = std::chrono::microseconds(ring_spin_us);
  options.peer_recovery_bytes = peer_recovery_mib << 20;
  options.early_message_bytes = early_message_mib << 20;
  options.buffer_pool_bytes = buffer_pool_mib << 20;
  options.push_backlog_bytes = push_backlog_kib << 10;
  options.tcp_notsent_lowat_bytes = tcp_notsent_lowat_kib << 10;
  options.tcp_congestion_control = tcp_congestion == "system" ? "" : tcp_congestion;
  options.tcp_worker_congestion_control =
      tcp_congestion_workers == "system" ? "" : tcp_congestion_workers;
  options.push_spare_unsent_bytes = push_spare_lowat_kib << 10;
  options.nic_bytes_per_s = nic_gbps * 1e9 / 8;
  options.sum_bytes_per_s = sum_gbps * 1e9;
  options.offers_summation = !no_summation;
  options.selector_alpha_seconds = selector_alpha_us * 1e-6;
  options.data_plane_transport = *tributary::agent::ParseDataPlaneTransport(transport);
  // UCX must never wander onto the machine's real NICs unless told to.
  setenv("UCX_NET_DEVICES", "lo", 0);
  setenv("UCX_TLS", "tcp", 0);

  if (!trace_path.empty()) {
    if (size_t at = trace_path.find("{node}"); at != std::string::npos) {
      trace_path.replace(at, 6, options.node_id);
    }
    if (absl::Status s = tributary::common::Trace::Start(
            trace_path, "tributary-agent " + (options.node_id.empty() ? "" : options.node_id));
        !s.ok()) {
      tributary::common::Logger("agent")->critical("--trace: {}", s.message());
      return 1;
    }
  }
  // Before the agent's socket and metrics say it is up: a SIGTERM right after that must stop it
  // in order, not by the default action.
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  auto agent = tributary::agent::Agent::Start(options);
  if (!agent.ok()) {
    tributary::common::Logger("agent")->critical("{}", agent.status().message());
    return 1;
  }
  // Lives as long as the exposer, which holds it weakly.
  auto process = std::make_shared<tributary::common::metrics::ProcessCollector>();
  std::unique_ptr<tributary::common::metrics::MetricsServer> metrics;
  if (!process_flags.metrics_listen.empty()) {
    std::vector<std::weak_ptr<prometheus::Collectable>> collectables = (*agent)->collectables();
    collectables.push_back(process);
    auto server = tributary::common::metrics::MetricsServer::Start(
        process_flags.metrics_listen, process_flags.metrics_port_file, collectables);
    if (!server.ok()) {
      tributary::common::Logger("agent")->critical("{}", server.status().message());
      (*agent)->Stop();
      return 1;
    }
    metrics = *std::move(server);
    tributary::common::Logger("agent")->info("metrics on {} (port {})",
                                             process_flags.metrics_listen, metrics->port());
  }
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  (*agent)->Stop();
  if (absl::Status s = tributary::common::Trace::Stop(); !s.ok()) {
    tributary::common::Logger("agent")->error("--trace: {}", s.message());
  }
  return 0;
}
