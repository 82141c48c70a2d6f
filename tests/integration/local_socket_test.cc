// The agent's gRPC Unix socket checks each connection's peer (SO_PEERCRED) before gRPC serves
// it (agent/buffer_socket.h, GrpcUnixListener): with the socket file open to everyone (mode
// 0666), a training process of another uid gets PERMISSION_DENIED naming what is allowed, and
// one allowed by --socket-allow-uid trains. Real processes: a controller, one agent, and the test
// worker run as uid 65534 (nobody). Needs root (to run a process as another uid).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "client/cluster/local_cluster.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "tributary/v1/controller.grpc.pb.h"

namespace tributary {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr uid_t kNobody = 65534;

struct Outcome {
  int exit_code = -1;
  std::string output;
};

// Runs the test worker (3 iterations of exact all-reduces, one process on one node) as uid/gid
// 65534 against `agent`.
Outcome RunWorkerAsNobody(const std::string& agent, const std::string& job,
                          const std::string& log) {
  const std::string bin = std::string(TRIBUTARY_BIN_DIR) + "/tributary_test_worker";
  std::vector<std::string> args = {
      bin, "--agent",    agent,        "--job",        job, "--local-rank", "0", "--local-size",
      "1", "--scenario", "iterations", "--iterations", "3"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    // Only async-signal-safe calls until exec.
    const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0) _exit(90);
    if (setresgid(kNobody, kNobody, kNobody) != 0 || setresuid(kNobody, kNobody, kNobody) != 0) {
      _exit(91);
    }
    execv(argv[0], argv.data());
    _exit(92);
  }
  int status = 0;
  waitpid(child, &status, 0);  // bounded: the worker's join timeout is 20 s
  Outcome o;
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::stringstream text;
  text << std::ifstream(log).rdbuf();
  o.output = text.str();
  return o;
}

class LocalSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run a process as another uid";
    char dir[] = "/tmp/tributary-socket-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    run_dir_ = dir;
    // The stranger must reach the socket files: only their own mode and SO_PEERCRED decide.
    ASSERT_EQ(chmod(run_dir_.c_str(), 0755), 0);
  }
  void TearDown() override {
    cluster_.reset();
    if (!run_dir_.empty()) fs::remove_all(run_dir_);
  }

  // One worker node whose agent has `agent_args`, and job "j" on it.
  void Start(std::vector<std::string> agent_args) {
    client::LocalClusterOptions o;
    o.bin_dir = TRIBUTARY_BIN_DIR;
    o.run_dir = run_dir_;
    o.workers = 1;
    o.sum_gbps = 4;
    o.agent_args = std::move(agent_args);
    auto c = client::LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
    v1::CreateJobRequest req;
    req.set_job_id("j");
    req.mutable_spec()->add_worker_nodes(cluster_->node_id(0));
    req.mutable_spec()->set_procs_per_node(1);
    v1::Job job;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Status s = cluster_->controller().CreateJob(&context, req, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  std::string run_dir_;
  std::unique_ptr<client::LocalCluster> cluster_;
};

TEST_F(LocalSocketTest, AnotherUidGetsPermissionDeniedEvenThroughASocketOpenToEveryone) {
  Start({"--socket-mode", "0666"});
  ASSERT_EQ(fs::status(cluster_->agent_address(0).substr(5)).permissions() & fs::perms::all,
            fs::perms(0666));
  Outcome o = RunWorkerAsNobody(cluster_->agent_address(0), "j", run_dir_ + "/nobody.log");
  EXPECT_EQ(o.exit_code, 1) << o.output;
  EXPECT_THAT(o.output, HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(o.output, HasSubstr("may not use this agent"));
  EXPECT_THAT(o.output, HasSubstr("--socket-allow-uid"));
  // The agent says whom it refused, and keeps serving its own uid.
  std::stringstream log;
  log << std::ifstream(run_dir_ + "/" + cluster_->node_id(0) + ".log").rdbuf();
  EXPECT_THAT(log.str(), HasSubstr("uid 65534"));
}

TEST_F(LocalSocketTest, AnAllowedUidTrains) {
  Start({"--socket-mode", "0666", "--socket-allow-uid", "65534"});
  Outcome o = RunWorkerAsNobody(cluster_->agent_address(0), "j", run_dir_ + "/nobody.log");
  EXPECT_EQ(o.exit_code, 0) << o.output;
}

}  // namespace
}  // namespace tributary
