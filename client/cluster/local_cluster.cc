#include "client/cluster/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace tributary::client {
namespace {

namespace fs = std::filesystem;

}  // namespace

absl::StatusOr<pid_t> SpawnProcess(const std::vector<std::string>& argv,
                                   const std::string& log_path) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

namespace {

// --tls-cert/--tls-key/--tls-ca/--tls-reload-seconds for the process identified as `name`.
std::vector<std::string> TlsArgs(const common::TlsConfig& tls, int reload_seconds) {
  if (!tls.enabled()) return {};
  return {"--tls-cert",
          tls.cert,
          "--tls-key",
          tls.key,
          "--tls-ca",
          tls.ca,
          "--tls-reload-seconds",
          std::to_string(reload_seconds)};
}

}  // namespace

common::TlsConfig LocalCluster::client_tls(const std::string& name) const {
  common::TlsConfig tls;
  if (options_.tls_dir.empty()) return tls;
  tls.cert = absl::StrCat(options_.tls_dir, "/", name, ".crt");
  tls.key = absl::StrCat(options_.tls_dir, "/", name, ".key");
  tls.ca = absl::StrCat(options_.tls_dir, "/ca.crt");
  tls.reload_seconds = options_.tls_reload_seconds;
  return tls;
}

int WaitProcess(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (true) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0) return -1;
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling a child's exit
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(const LocalClusterOptions& in) {
  std::unique_ptr<LocalCluster> c(new LocalCluster(in));
  LocalClusterOptions& o = c->options_;
  if (o.workers < 1 || o.spares < 0 || o.workers + o.spares > 64) {
    return absl::InvalidArgumentError("a local cluster needs 1 to 64 nodes, at least 1 worker");
  }
  if (o.nic_gbps.size() != 1 && o.nic_gbps.size() != static_cast<size_t>(o.workers + o.spares)) {
    return absl::InvalidArgumentError("give one NIC speed, or one per node");
  }
  if (o.run_dir.empty()) {
    char tmpl[] = "/tmp/tributary-cluster-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
    o.run_dir = tmpl;
    c->own_run_dir_ = true;
  }
  fs::create_directories(o.run_dir);
  setenv("UCX_NET_DEVICES", "lo", 0);
  setenv("UCX_TLS", "tcp", 0);
  setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);

  const auto deadline = std::chrono::steady_clock::now() + o.start_timeout;
  if (absl::Status s = c->StartController("127.0.0.1:0", deadline); !s.ok()) return s;
  // --metrics-listen for the process named `name`, and where it writes its port.
  auto metrics_args = [&o](const std::string& name) -> std::vector<std::string> {
    if (!o.metrics) return {"--metrics-listen", ""};
    const std::string file = absl::StrCat(o.run_dir, "/", name, ".metrics.port");
    fs::remove(file);
    return {"--metrics-listen", "127.0.0.1:0", "--metrics-port-file", file};
  };

  for (int i = 0; i < c->num_nodes(); ++i) {
    const double gbps = o.nic_gbps.size() == 1 ? o.nic_gbps[0] : o.nic_gbps[i];
    std::vector<std::string> argv = {o.bin_dir + "/tributary-agent",
                                     "--node-id",
                                     c->node_id(i),
                                     "--controller",
                                     c->controller_address_,
                                     "--listen",
                                     c->agent_address(i),
                                     "--nic-gbps",
                                     absl::StrCat(gbps),
                                     "--reducer-threads",
                                     std::to_string(o.reducer_threads),
                                     "--log-level",
                                     o.log_level};
    if (o.emulate_nic) argv.push_back("--emulate-nic");
    for (std::string& a : TlsArgs(c->client_tls(c->node_id(i)), o.tls_reload_seconds)) {
      argv.push_back(std::move(a));
    }
    if (!o.transport.empty()) {
      argv.push_back("--transport");
      argv.push_back(o.transport);
    }
    for (std::string& a : metrics_args(c->node_id(i))) argv.push_back(std::move(a));
    if (i < o.workers && !o.worker_topology_file.empty()) {
      argv.push_back("--topology-file");
      argv.push_back(o.worker_topology_file);
    }
    if (o.sum_gbps > 0) {
      argv.push_back("--sum-gbps");
      argv.push_back(absl::StrCat(o.sum_gbps));
    }
    argv.insert(argv.end(), o.agent_args.begin(), o.agent_args.end());
    auto apid = SpawnProcess(argv, absl::StrCat(o.run_dir, "/", c->node_id(i), ".log"));
    if (!apid.ok()) return apid.status();
    c->agent_pids_.push_back(*apid);
    c->agent_argv_.push_back(std::move(argv));
    c->agent_restarts_.push_back(0);
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (absl::Status s = c->WaitForAliveNodes(c->num_nodes(), left); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(s.message(), "; logs in ", o.run_dir));
  }
  if (o.metrics) {
    // Every process wrote its metrics port before serving anything else; wait bounded anyway.
    auto read_port = [&](const std::string& name) -> absl::StatusOr<std::string> {
      const std::string file = absl::StrCat(o.run_dir, "/", name, ".metrics.port");
      while (true) {
        int p = 0;
        std::ifstream f(file);
        if (f >> p && p > 0) return absl::StrCat("127.0.0.1:", p);
        if (std::chrono::steady_clock::now() > deadline) {
          return absl::DeadlineExceededError(
              absl::StrCat("no metrics port from ", name, "; logs in ", o.run_dir));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    };
    absl::StatusOr<std::string> a = read_port("controller");
    if (!a.ok()) return a.status();
    c->controller_metrics_address_ = *a;
    for (int i = 0; i < c->num_nodes(); ++i) {
      absl::StatusOr<std::string> m = read_port(c->node_id(i));
      if (!m.ok()) return m.status();
      c->metrics_addresses_.push_back(*m);
    }
  }
  return c;
}

absl::Status LocalCluster::StartController(const std::string& listen,
                                           std::chrono::steady_clock::time_point deadline) {
  const LocalClusterOptions& o = options_;
  const std::string port_file = o.run_dir + "/controller.port";
  fs::remove(port_file);
  std::vector<std::string> argv = {o.bin_dir + "/tributary-controller",
                                   "--listen",
                                   listen,
                                   "--port-file",
                                   port_file,
                                   "--log-level",
                                   o.log_level,
                                   "--heartbeat-ms",
                                   std::to_string(o.heartbeat.count()),
                                   "--heartbeat-timeout-ms",
                                   std::to_string(o.heartbeat_timeout.count())};
  if (o.metrics) {
    const std::string file = o.run_dir + "/controller.metrics.port";
    fs::remove(file);
    for (const std::string& a : {std::string("--metrics-listen"), std::string("127.0.0.1:0"),
                                 std::string("--metrics-port-file"), file}) {
      argv.push_back(a);
    }
  } else {
    argv.push_back("--metrics-listen");
    argv.push_back("");
  }
  if (!o.state_db.empty()) {
    argv.push_back("--state-db");
    argv.push_back(o.state_db);
  }
  for (std::string& a : TlsArgs(client_tls("controller"), o.tls_reload_seconds)) {
    argv.push_back(std::move(a));
  }
  if (!o.tls_dir.empty()) {
    argv.push_back("--tls-admin");
    argv.push_back(o.tls_admin);
  }
  auto pid = SpawnProcess(argv, o.run_dir + "/controller.log");
  if (!pid.ok()) return pid.status();
  controller_pid_ = *pid;
  int port = 0;
  while (port == 0) {
    std::ifstream f(port_file);
    if (!(f >> port)) port = 0;
    if (port != 0) break;
    int status = 0;
    if (waitpid(controller_pid_, &status, WNOHANG) == controller_pid_) {
      controller_pid_ = -1;
      return absl::FailedPreconditionError(
          absl::StrCat("controller exited at start; see ", o.run_dir, "/controller.log"));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("controller did not start; see ", o.run_dir, "/controller.log"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling for the port file
  }
  controller_address_ = absl::StrCat("127.0.0.1:", port);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      common::MakeChannel(controller_address_, client_tls("admin"));
  if (!channel.ok()) return channel.status();
  stub_ = tributary::v1::Controller::NewStub(*channel);
  return absl::OkStatus();
}

void LocalCluster::KillController() {
  if (controller_pid_ <= 0) return;
  kill(controller_pid_, SIGKILL);
  WaitProcess(controller_pid_, std::chrono::seconds(5));
  controller_pid_ = -1;
}

absl::Status LocalCluster::RestartController(std::chrono::milliseconds timeout) {
  if (controller_pid_ > 0) {
    return absl::FailedPreconditionError("the controller is running; KillController first");
  }
  if (controller_address_.empty()) return absl::FailedPreconditionError("no cluster started");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (absl::Status s = StartController(controller_address_, deadline); !s.ok()) return s;
  if (!options_.metrics) return absl::OkStatus();
  const std::string file = options_.run_dir + "/controller.metrics.port";
  while (true) {  // written before the controller serves gRPC; bounded anyway
    int p = 0;
    std::ifstream f(file);
    if (f >> p && p > 0) {
      controller_metrics_address_ = absl::StrCat("127.0.0.1:", p);
      return absl::OkStatus();
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no metrics port from the restarted controller; logs in ", options_.run_dir));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string LocalCluster::metrics_address(int node) const {
  if (node < 0 || node >= static_cast<int>(metrics_addresses_.size())) return "";
  return metrics_addresses_[node];
}

absl::Status LocalCluster::WaitForAliveNodes(int alive, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int seen = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    tributary::v1::ListNodesResponse resp;
    if (stub_->ListNodes(&ctx, {}, &resp).ok()) {
      seen = 0;
      for (const auto& n : resp.nodes()) seen += n.state() == tributary::v1::NODE_STATE_ALIVE;
      if (seen == alive) return absl::OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("only ", seen, " of ", alive, " agents alive after ", timeout.count(), " ms"));
}

LocalCluster::~LocalCluster() { Stop(); }

void LocalCluster::Stop() {
  for (pid_t pid : agent_pids_) {
    if (pid <= 0) continue;  // a restart that failed to spawn
    kill(pid, SIGCONT);
    kill(pid, SIGTERM);
  }
  for (pid_t pid : agent_pids_) {
    if (pid > 0) WaitProcess(pid, std::chrono::seconds(5));
  }
  agent_pids_.clear();
  if (controller_pid_ > 0) {
    kill(controller_pid_, SIGTERM);
    WaitProcess(controller_pid_, std::chrono::seconds(5));
    controller_pid_ = -1;
  }
  if (own_run_dir_ && std::getenv("TRIBUTARY_KEEP_RUN_DIR") == nullptr) {
    std::error_code ec;
    fs::remove_all(options_.run_dir, ec);
    own_run_dir_ = false;
  }
}

std::string LocalCluster::agent_address(int i) const {
  return absl::StrCat("unix:", options_.run_dir, "/", node_id(i), ".sock");
}

std::string LocalCluster::node_id(int i) const {
  return i < options_.workers ? absl::StrCat("worker-", i)
                              : absl::StrCat("spare-", i - options_.workers);
}

std::vector<std::string> LocalCluster::worker_node_ids() const {
  std::vector<std::string> ids;
  for (int i = 0; i < options_.workers; ++i) ids.push_back(node_id(i));
  return ids;
}

void LocalCluster::FreezeNode(int i) { kill(agent_pids_.at(i), SIGSTOP); }
void LocalCluster::ThawNode(int i) { kill(agent_pids_.at(i), SIGCONT); }
void LocalCluster::KillNode(int i) { kill(agent_pids_.at(i), SIGKILL); }

absl::Status LocalCluster::RestartNode(int i) {
  pid_t& pid = agent_pids_.at(i);
  if (pid > 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
  std::vector<std::string> argv = agent_argv_.at(i);
  for (size_t a = 0; a + 1 < argv.size(); ++a) {
    if (argv[a] == "--controller") argv[a + 1] = controller_address_;  // it may have restarted
  }
  ASSIGN_OR_RETURN(pid, SpawnProcess(argv, absl::StrCat(options_.run_dir, "/", node_id(i), ".",
                                                        ++agent_restarts_.at(i), ".log")));
  return absl::OkStatus();
}

}  // namespace tributary::client
