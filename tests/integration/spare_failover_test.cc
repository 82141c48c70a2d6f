// A lost summation server costs at most a slower iteration: real controller and agent processes
// (3 worker nodes, 2 spares, one training process per worker node) run a loop of exact-sum
// all-reduces while a spare is killed, or frozen past the deadline and resumed. Every iteration
// must succeed on every rank with every element exact (the client retries on the new plan), and
// the slowest iteration stays within 2 x the op deadline + the re-plan time.
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cluster/local_cluster.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace tributary {
namespace {

constexpr int kFailoverWorkers = 3;
constexpr int kFailoverSpares = 2;
constexpr uint32_t kFailoverOpTimeoutMs = 5000;
constexpr auto kHeartbeatTimeout = std::chrono::milliseconds(1500);

struct Worker {
  pid_t pid;
  std::string log;
};

class SpareFailoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    client::LocalClusterOptions o;
    o.bin_dir = TRIBUTARY_BIN_DIR;
    o.workers = kFailoverWorkers;
    o.spares = kFailoverSpares;
    o.sum_gbps = 4;  // declared: plans do not depend on a start-up measurement
    o.heartbeat = std::chrono::milliseconds(200);
    o.heartbeat_timeout = kHeartbeatTimeout;  // a silent spare is re-planned away promptly
    auto c = client::LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
    fifo_ = absl::StrCat(cluster_->run_dir(), "/signal");
    go_fifo_ = absl::StrCat(cluster_->run_dir(), "/go");
    ASSERT_EQ(mkfifo(fifo_.c_str(), 0600), 0);
    ASSERT_EQ(mkfifo(go_fifo_.c_str(), 0600), 0);
    // Opened before any writer, non-blocking: the worker's open for writing does not wait.
    fd_ = open(fifo_.c_str(), O_RDONLY | O_NONBLOCK);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override {
    if (fd_ >= 0) close(fd_);
    cluster_.reset();
  }

  void CreateJob(const std::string& id) {
    tributary::v1::CreateJobRequest req;
    req.set_job_id(id);
    for (int w = 0; w < kFailoverWorkers; ++w) {
      req.mutable_spec()->add_worker_nodes(cluster_->worker_node_ids()[w]);
    }
    req.mutable_spec()->set_procs_per_node(1);
    req.mutable_spec()->set_partition_bytes(64 << 10);  // many chunks, on every server
    req.mutable_spec()->set_credit_bytes(256 << 10);
    req.mutable_spec()->set_op_timeout_ms(kFailoverOpTimeoutMs);
    req.mutable_spec()->set_algorithm(tributary::v1::ALGORITHM_PUSH_PULL);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    tributary::v1::Job job;
    grpc::Status s = cluster_->controller().CreateJob(&ctx, req, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(job.plan().servers_size(),
              kFailoverWorkers + kFailoverSpares);  // both spares own shares
  }

  std::vector<Worker> StartWorkers(const std::string& job, int iterations,
                                   const std::vector<int>& signal_at) {
    std::vector<Worker> workers;
    for (int node = 0; node < kFailoverWorkers; ++node) {
      std::vector<std::string> argv = {std::string(TRIBUTARY_BIN_DIR) + "/tributary_test_worker",
                                       "--agent",
                                       cluster_->agent_address(node),
                                       "--job",
                                       job,
                                       "--local-rank",
                                       "0",
                                       "--local-size",
                                       "1",
                                       "--scenario",
                                       "failover",
                                       "--iterations",
                                       std::to_string(iterations),
                                       "--signal-fifo",
                                       fifo_,
                                       "--go-fifo",
                                       go_fifo_,
                                       "--signal-at"};
      for (int k : signal_at) argv.push_back(std::to_string(k));
      const std::string log = absl::StrCat(cluster_->run_dir(), "/", job, "-", node, ".log");
      auto pid = client::SpawnProcess(argv, log);
      EXPECT_TRUE(pid.ok()) << pid.status();
      if (pid.ok()) workers.push_back({*pid, log});
    }
    return workers;
  }

  // Waits (bounded) for every rank's next signal: each has finished the iteration before one
  // named in --signal-at; ranks 1 and 2 go on into it (it cannot complete without rank 0), rank 0
  // waits for Go.
  ::testing::AssertionResult AwaitSignal() {
    for (int r = 0; r < kFailoverWorkers; ++r) {
      if (::testing::AssertionResult one = AwaitOneSignal(); !one) return one;
    }
    return ::testing::AssertionSuccess();
  }
  ::testing::AssertionResult AwaitOneSignal() {
    pollfd p{fd_, POLLIN, 0};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                            deadline - std::chrono::steady_clock::now())
                                            .count());
      if (poll(&p, 1, std::max(left, 1)) <= 0) continue;
      char b;
      if (read(fd_, &b, 1) == 1) return ::testing::AssertionSuccess();
      // POLLHUP before the writer opened, or it closed: wait for data or the deadline.
      if (p.revents & POLLHUP) {
        p.revents = 0;
        usleep(10000);  // no writer holds the FIFO: poll would return at once
      }
    }
    return ::testing::AssertionFailure() << "a rank never signalled";
  }

  // Lets rank 0 submit its iteration.
  ::testing::AssertionResult Go() {
    const int fd = open(go_fifo_.c_str(), O_WRONLY);  // until rank 0 opens it to read
    if (fd < 0) return ::testing::AssertionFailure() << "open " << go_fifo_;
    const char b = 1;
    const bool ok = write(fd, &b, 1) == 1;
    close(fd);
    return ok ? ::testing::AssertionSuccess() : ::testing::AssertionFailure() << "write go";
  }

  // Waits for every worker; each must pass. Returns the slowest iteration (ms) over all ranks.
  double FinishWorkers(const std::vector<Worker>& workers,
                       std::chrono::seconds timeout = std::chrono::seconds(180)) {
    double slowest = 0;
    uint32_t retries = 0;
    for (const Worker& w : workers) {
      const int code = client::WaitProcess(w.pid, timeout);
      std::ifstream f(w.log);
      std::stringstream ss;
      ss << f.rdbuf();
      const std::string out = ss.str();
      EXPECT_EQ(code, 0) << out;
      std::smatch m;
      if (std::regex_search(out, m,
                            std::regex("slowest_iteration_ms=([0-9]+) at=([0-9-]+) "
                                       "retries=([0-9]+)"))) {
        slowest = std::max(slowest, std::stod(m[1]));
        retries += std::stoul(m[3]);
        std::printf("%s: slowest iteration %s ms (iteration %s), %s retries\n", w.log.c_str(),
                    m[1].str().c_str(), m[2].str().c_str(), m[3].str().c_str());
      } else {
        ADD_FAILURE() << "no summary in\n" << out;
      }
    }
    std::printf("slowest iteration over all ranks: %.0f ms; retries: %u\n", slowest, retries);
    EXPECT_GT(retries, 0u) << "the fault was injected mid-loop: some collective must have retried";
    return slowest;
  }

  // 2 x the op deadline + the re-plan time (the controller declares the node dead after the
  // heartbeat timeout; agents fetch the plan at their next heartbeat; 2 s of slack for a loaded
  // machine).
  static double BoundMs() {
    return 2.0 * kFailoverOpTimeoutMs + kHeartbeatTimeout.count() + 2 * 200 + 2000;
  }

  std::unique_ptr<client::LocalCluster> cluster_;
  std::string fifo_, go_fifo_;
  int fd_ = -1;
};

TEST_F(SpareFailoverTest, KilledSpareCostsAtMostASlowerIteration) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("kill"));
  std::vector<Worker> workers = StartWorkers("kill", 40, {5});
  ASSERT_TRUE(AwaitSignal());
  cluster_->KillNode(kFailoverWorkers);  // spare-0, mid-iteration
  ASSERT_TRUE(Go());
  const double slowest = FinishWorkers(workers);
  std::printf("bound: %.0f ms\n", BoundMs());
  EXPECT_LT(slowest, BoundMs());
}

TEST_F(SpareFailoverTest, FrozenSpareResumedAfterTheDeadlineServesNoStaleSum) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("freeze"));
  std::vector<Worker> workers = StartWorkers("freeze", 150, {5, 15});
  ASSERT_TRUE(AwaitSignal());
  const auto frozen_at = std::chrono::steady_clock::now();
  cluster_->FreezeNode(kFailoverWorkers + 1);  // spare-1 stops (SIGSTOP), mid-iteration
  ASSERT_TRUE(Go());
  // Iteration 15 starts only after the re-plan without it. The fault lasts past the op
  // deadline of the iteration it hit; then the spare resumes, holding pushes and sums of the
  // old plan, while the loop goes on (and the controller may take it back: another re-plan).
  if (::testing::AssertionResult signalled = AwaitSignal(); !signalled) {
    ADD_FAILURE() << signalled.message();
    cluster_->ThawNode(kFailoverWorkers + 1);
    FinishWorkers(workers, std::chrono::seconds(1));  // their output says why
    return;
  }
  std::this_thread::sleep_until(frozen_at + std::chrono::milliseconds(kFailoverOpTimeoutMs + 1000));
  cluster_->ThawNode(kFailoverWorkers + 1);
  ASSERT_TRUE(Go());
  const double slowest = FinishWorkers(workers);  // every element of every iteration exact
  std::printf("bound: %.0f ms\n", BoundMs());
  EXPECT_LT(slowest, BoundMs());
}

}  // namespace
}  // namespace tributary
