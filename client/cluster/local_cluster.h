// A controller and agents as real processes on this machine, on loopback: for demos, benchmarks
// and integration tests.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rpc/tls.h"
#include "tributary/v1/controller.grpc.pb.h"

namespace tributary::client {

struct LocalClusterOptions {
  // Folder holding tributary-controller and tributary-agent.
  std::string bin_dir;
  // Folder for sockets and logs; empty = a new folder under /tmp, removed on Stop.
  std::string run_dir;
  int workers = 4;
  int spares = 0;
  // Declared NIC bandwidth of every node, Gbit/s (one value for all, or one per node: workers
  // first, then spares).
  std::vector<double> nic_gbps = {10};
  // Declared summation rate, GB/s (0 = each agent measures its own).
  double sum_gbps = 0;
  // Agents pace their data-plane egress to their NIC speed (see PacedTransport).
  bool emulate_nic = false;
  // The agents' --transport (auto, tcp, ucx); empty: their default (auto).
  std::string transport;
  // Worker agents report this topology file instead of discovering this machine's.
  std::string worker_topology_file;
  int reducer_threads = 1;
  std::string log_level = "warn";
  std::chrono::milliseconds start_timeout{20000};
  std::chrono::milliseconds heartbeat{200};
  // A node silent for this long is dead (and its jobs re-planned).
  std::chrono::milliseconds heartbeat_timeout{1200};
  // Serve Prometheus /metrics from every process on an ephemeral loopback port (see
  // metrics_address); off: the processes serve none (their fixed default ports would collide).
  bool metrics = false;
  // The controller's --state-db (jobs survive RestartController); empty: state in memory.
  std::string state_db;
  // mTLS on every gRPC link to the controller: a folder holding ca.crt (the CA everyone
  // trusts), controller.crt/.key (naming 127.0.0.1), one <node id>.crt/.key per agent (naming
  // the node id and this machine's hostname) and admin.crt/.key (this object's own client,
  // which is the controller's --tls-admin). Empty: plaintext, as before.
  std::string tls_dir;
  // The controller's --tls-admin: the identity admin.crt names.
  std::string tls_admin = "admin";
  // Every process's --tls-reload-seconds.
  int tls_reload_seconds = 10;
  // More flags for every agent (e.g. --socket-mode 0666).
  std::vector<std::string> agent_args;
};

// Owns the processes: Stop (or the destructor) ends them, SIGTERM first, SIGKILL after a
// deadline. Children also die with this process (PR_SET_PDEATHSIG).
class LocalCluster {
 public:
  // Starts the controller, then the agents, and waits (bounded by start_timeout) until every
  // agent has registered.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();

  void Stop();

  std::string controller_address() const { return controller_address_; }
  // The local-service address of node `i` (workers first, then spares).
  std::string agent_address(int i) const;
  std::string node_id(int i) const;
  std::vector<std::string> worker_node_ids() const;
  int num_nodes() const { return options_.workers + options_.spares; }
  const std::string& run_dir() const { return options_.run_dir; }
  tributary::v1::Controller::Stub& controller() { return *stub_; }
  // The TLS files of a client with identity `name` in options.tls_dir (NAME.crt/.key, the CA;
  // "admin" is the admin); an empty config without tls_dir.
  common::TlsConfig client_tls(const std::string& name = "admin") const;
  // "127.0.0.1:PORT" of the /metrics listener of node i's agent / of the controller; empty
  // unless options.metrics.
  std::string metrics_address(int node) const;
  std::string controller_metrics_address() const { return controller_metrics_address_; }

  // Failure injection for tests: SIGSTOP / SIGCONT / SIGKILL of node i's agent.
  void FreezeNode(int i);
  void ThawNode(int i);
  void KillNode(int i);
  // Kills node i's agent (if it runs) and starts it again with the same arguments (same node id
  // and socket; a new data-plane port, a new agent instance); logs to <node>.<n>.log. Does not
  // wait for it to register. Its metrics address (metrics_address) is then stale.
  absl::Status RestartNode(int i);

  // Failure injection: SIGKILL of the controller (waits for it to be gone). Agents and training
  // processes keep running.
  void KillController();
  // Starts the controller again on the same address with the same flags (and --state-db), and
  // waits (bounded by `timeout`) until it serves. The agents find it by themselves.
  absl::Status RestartController(std::chrono::milliseconds timeout);

  // Waits until the controller sees `alive` nodes alive (bounded by `timeout`).
  absl::Status WaitForAliveNodes(int alive, std::chrono::milliseconds timeout);

 private:
  explicit LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {}
  // Spawns the controller listening on `listen` and waits until it writes its port.
  absl::Status StartController(const std::string& listen,
                               std::chrono::steady_clock::time_point deadline);

  LocalClusterOptions options_;
  bool own_run_dir_ = false;
  pid_t controller_pid_ = -1;
  std::vector<pid_t> agent_pids_;
  std::vector<std::vector<std::string>> agent_argv_;  // to restart them
  std::vector<int> agent_restarts_;
  std::string controller_address_;
  std::string controller_metrics_address_;
  std::vector<std::string> metrics_addresses_;
  std::unique_ptr<tributary::v1::Controller::Stub> stub_;
};

// Starts `argv` with stdout and stderr appended to `log_path`; the child gets SIGTERM when this
// process dies. Returns the pid.
absl::StatusOr<pid_t> SpawnProcess(const std::vector<std::string>& argv,
                                   const std::string& log_path);
// Waits for `pid` to exit up to `timeout`; then SIGKILLs it. Returns its exit status
// (128 + signal for a signalled process).
int WaitProcess(pid_t pid, std::chrono::milliseconds timeout);

}  // namespace tributary::client
