// Controller durability end to end: real controller and agent processes on loopback, the
// controller SIGKILLed while training processes run all-reduces and started again on the same
// address with the same --state-db.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/cluster/local_cluster.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace tributary {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kWorkers = 2;
constexpr int kSpares = 1;
constexpr uint32_t kProcsPerNode = 1;

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class ControllerRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/controller-restart-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    cluster_.reset();
    std::error_code ec;
    if (std::getenv("TRIBUTARY_KEEP_RUN_DIR") == nullptr) fs::remove_all(dir_, ec);
  }

  void StartCluster() {
    client::LocalClusterOptions o;
    o.bin_dir = TRIBUTARY_BIN_DIR;
    o.run_dir = dir_ + "/run";
    o.workers = kWorkers;
    o.spares = kSpares;
    o.sum_gbps = 4;  // declared: plans do not depend on a start-up measurement
    // No node is declared dead while the test runs on a loaded machine.
    o.heartbeat_timeout = std::chrono::seconds(30);
    o.state_db = dir_ + "/controller.db";
    o.log_level = "info";  // the controller's restore lines are checked
    auto c = client::LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
  }

  grpc::Status CreateJob(const std::string& id, tributary::v1::Job* job) {
    tributary::v1::CreateJobRequest req;
    req.set_job_id(id);
    for (const std::string& w : cluster_->worker_node_ids())
      req.mutable_spec()->add_worker_nodes(w);
    req.mutable_spec()->set_procs_per_node(kProcsPerNode);
    req.mutable_spec()->set_partition_bytes(64 << 10);
    req.mutable_spec()->set_credit_bytes(256 << 10);
    req.mutable_spec()->set_algorithm(tributary::v1::ALGORITHM_PUSH_PULL);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return cluster_->controller().CreateJob(&ctx, req, job);
  }

  grpc::Status GetJob(const std::string& id, tributary::v1::Job* job) {
    tributary::v1::GetJobRequest req;
    req.set_job_id(id);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return cluster_->controller().GetJob(&ctx, req, job);
  }

  // Starts one test worker per worker node running `iterations` exact all-reduces of 3 tensors.
  std::vector<std::pair<pid_t, std::string>> SpawnWorkers(const std::string& job, int iterations) {
    std::vector<std::pair<pid_t, std::string>> procs;
    for (int node = 0; node < kWorkers; ++node) {
      const std::string log = absl::StrCat(dir_, "/", job, "-", iterations, "-", node, ".log");
      auto pid = client::SpawnProcess(
          {std::string(TRIBUTARY_BIN_DIR) + "/tributary_test_worker", "--agent",
           cluster_->agent_address(node), "--job", job, "--local-rank", "0", "--local-size",
           std::to_string(kProcsPerNode), "--scenario", "iterations", "--iterations",
           std::to_string(iterations)},
          log);
      EXPECT_TRUE(pid.ok()) << pid.status();
      if (pid.ok()) procs.emplace_back(*pid, log);
    }
    return procs;
  }

  // Waits for the workers; every one must pass, and all must end with the same digest.
  static void ExpectExact(const std::vector<std::pair<pid_t, std::string>>& procs) {
    std::set<std::string> digests;
    const std::regex re("digest=([0-9a-f]+)");
    for (const auto& [pid, log] : procs) {
      const int code = client::WaitProcess(pid, std::chrono::seconds(120));
      const std::string out = ReadFile(log);
      EXPECT_EQ(code, 0) << log << ":\n" << out;
      std::smatch m;
      if (std::regex_search(out, m, re)) digests.insert(m[1]);
    }
    EXPECT_EQ(digests.size(), 1u) << "workers ended with different results";
  }

  std::string dir_;
  std::unique_ptr<client::LocalCluster> cluster_;
};

TEST_F(ControllerRestartTest, JobSurvivesAKilledControllerAndCollectivesDoNotNotice) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  tributary::v1::Job created;
  grpc::Status s = CreateJob("durable", &created);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(created.plan().workers_size(), kWorkers);

  // All-reduces run (hundreds of iterations, every element checked) while the controller is
  // killed and restarted: the data plane never waits on the controller.
  auto running = SpawnWorkers("durable", 400);
  cluster_->KillController();
  for (const auto& [pid, log] : running) {
    EXPECT_EQ(waitpid(pid, nullptr, WNOHANG), 0) << "a worker ended before the controller died";
  }
  absl::Status restarted = cluster_->RestartController(std::chrono::seconds(20));
  ASSERT_TRUE(restarted.ok()) << restarted;
  const auto back_from = std::chrono::steady_clock::now();
  absl::Status back = cluster_->WaitForAliveNodes(kWorkers + kSpares, std::chrono::seconds(5));
  EXPECT_TRUE(back.ok()) << back << "; logs in " << dir_;
  const double back_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - back_from).count();
  std::printf("all %d nodes re-registered %.2f s after the restart\n", kWorkers + kSpares, back_s);

  tributary::v1::Job restored;
  s = GetJob("durable", &restored);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_GE(restored.plan().version(), created.plan().version());
  EXPECT_EQ(restored.plan().workers_size(), kWorkers);
  // Every node of its plan is back: the job runs again (bounded wait for the last heartbeat).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (restored.state() != tributary::v1::JOB_STATE_RUNNING &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling the controller
    ASSERT_TRUE(GetJob("durable", &restored).ok());
  }
  EXPECT_EQ(restored.state(), tributary::v1::JOB_STATE_RUNNING) << restored.message();
  ExpectExact(running);
  EXPECT_THAT(ReadFile(dir_ + "/run/controller.log"), HasSubstr("1 jobs restored"));

  // The restarted controller's next plan change works: a new job with a later epoch, which runs
  // exactly; then the restored job runs again; then a delete.
  tributary::v1::Job second;
  s = CreateJob("second", &second);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_GT(second.plan().version(), restored.plan().version());
  ExpectExact(SpawnWorkers("second", 3));
  ExpectExact(SpawnWorkers("durable", 3));
  {
    tributary::v1::DeleteJobRequest req;
    req.set_job_id("second");
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    tributary::v1::DeleteJobResponse resp;
    s = cluster_->controller().DeleteJob(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(GetJob("second", &second).error_code(), grpc::StatusCode::NOT_FOUND);

  // And that delete is durable too: one more restart restores only the first job.
  cluster_->KillController();
  restarted = cluster_->RestartController(std::chrono::seconds(20));
  ASSERT_TRUE(restarted.ok()) << restarted;
  EXPECT_TRUE(GetJob("durable", &restored).ok());
  EXPECT_EQ(GetJob("second", &second).error_code(), grpc::StatusCode::NOT_FOUND);
}

// A state database that is not one stops the controller at start with the file's name and what
// to do, and without touching the file; no --state-db says so in the start line.
TEST_F(ControllerRestartTest, CorruptStateDatabaseIsAClearStartupError) {
  const std::string db = dir_ + "/garbage.db";
  std::string garbage(4096, 'x');
  {
    std::ofstream f(db, std::ios::binary);
    f << garbage;
  }
  const std::string log = dir_ + "/corrupt.log";
  auto pid =
      client::SpawnProcess({std::string(TRIBUTARY_BIN_DIR) + "/tributary-controller", "--listen",
                            "127.0.0.1:0", "--metrics-listen", "", "--state-db", db},
                           log);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(client::WaitProcess(*pid, std::chrono::seconds(30)), 2);
  EXPECT_THAT(ReadFile(log),
              AllOf(HasSubstr(db), HasSubstr("not an SQLite database"), HasSubstr("move it away")));
  EXPECT_EQ(ReadFile(db), garbage);

  const std::string port_file = dir_ + "/memory.port";
  const std::string memory_log = dir_ + "/memory.log";
  auto memory =
      client::SpawnProcess({std::string(TRIBUTARY_BIN_DIR) + "/tributary-controller", "--listen",
                            "127.0.0.1:0", "--metrics-listen", "", "--port-file", port_file},
                           memory_log);
  ASSERT_TRUE(memory.ok()) << memory.status();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!fs::exists(port_file) || fs::file_size(port_file) == 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << ReadFile(memory_log);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling for the port file
  }
  kill(*memory, SIGTERM);
  EXPECT_EQ(client::WaitProcess(*memory, std::chrono::seconds(10)), 0);
  EXPECT_THAT(ReadFile(memory_log), HasSubstr("state in memory only (no --state-db)"));
}

}  // namespace
}  // namespace tributary
