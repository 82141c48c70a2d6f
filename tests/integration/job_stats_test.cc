// GetJobStats end to end: a controller and two worker agents as real processes, their data-plane
// egress paced to a known NIC rate (--emulate-nic, PacedTransport), training processes running
// ring all-reduces of one 8 MiB tensor; the achieved bandwidth the controller reports is checked
// against the rate the pacing imposes, and `tributary job-stats` prints it.
//
// The expected value, derived from what each node actually moved: a ring all-reduce is bound by
// every node's egress (all send at once, loopback is otherwise as fast as memcpy), so a node is
// busy for about sent / B seconds and its achieved bandwidth, (sent + received) / busy, is
// (sent + received) / (sent / B) -- about 2B, since a ring node receives what it sends. Anything
// else in the busy time (the local gather, the sums, scheduling on a loaded machine) makes it
// lower, never higher: the check allows Tolerance() below and 10 % above.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/cluster/local_cluster.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace tributary {
namespace {

using ::testing::HasSubstr;

constexpr int kStatsWorkers = 2;
constexpr double kNicGbps = 0.4;  // 50 MB/s: an 8 MiB ring all-reduce takes ~170 ms
constexpr double kNicBytesPerS = kNicGbps * 1e9 / 8;
constexpr int kWarmup = 2;
constexpr int kIterations = 12;
constexpr size_t kStatsCount = size_t{1} << 21;  // floats: 8 MiB
// Below the expected value: 25 % here, because other work on the machine stretches the busy
// time (on the shared 2-core machine, with a build running, runs came out 1-8 % below; idle,
// about 1 %). The 10 % is checked by bench/job_stats_check.sh, which runs this test with
// TRIBUTARY_JOB_STATS_TOLERANCE=0.10 several times and prints the figures as a table. Above:
// 10 % (nothing beats the pacing).
double Tolerance() {
  const char* env = std::getenv("TRIBUTARY_JOB_STATS_TOLERANCE");
  return env != nullptr ? std::atof(env) : 0.25;
}

std::string ReadLog(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class JobStatsIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    client::LocalClusterOptions o;
    o.bin_dir = TRIBUTARY_BIN_DIR;
    o.workers = kStatsWorkers;
    o.spares = 0;
    o.nic_gbps = {kNicGbps};
    o.emulate_nic = true;
    o.sum_gbps = 4;
    o.heartbeat = std::chrono::milliseconds(100);
    o.heartbeat_timeout = std::chrono::seconds(30);
    auto c = client::LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
  }

  absl::StatusOr<tributary::v1::JobStats> GetJobStats(const std::string& job) {
    tributary::v1::GetJobStatsRequest req;
    req.set_job_id(job);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    tributary::v1::JobStats stats;
    grpc::Status s = cluster_->controller().GetJobStats(&ctx, req, &stats);
    if (!s.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    }
    return stats;
  }

  struct NodeTotals {
    uint64_t sent = 0, received = 0;
    double busy = 0;
  };
  struct Totals {
    tributary::v1::JobStats stats;
    std::map<std::string, NodeTotals> by_node;
  };

  // Polls GetJobStats (bounded) until it counts `want` collectives; the totals per node.
  Totals WaitForCollectives(const std::string& job, uint64_t want) {
    Totals totals;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (true) {
      absl::StatusOr<tributary::v1::JobStats> stats = GetJobStats(job);
      EXPECT_TRUE(stats.ok()) << stats.status();
      if (!stats.ok()) return totals;
      totals.stats = *stats;
      if (stats->collectives() >= want || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polling another process
    }
    EXPECT_EQ(totals.stats.collectives(), want) << totals.stats.DebugString();
    for (const auto& n : totals.stats.nodes()) {
      EXPECT_TRUE(n.worker()) << n.node_id();
      totals.by_node[n.node_id()] = {n.wire_bytes_sent(), n.wire_bytes_received(),
                                     n.busy_seconds()};
    }
    return totals;
  }

  std::unique_ptr<client::LocalCluster> cluster_;
};

TEST_F(JobStatsIntegrationTest, AchievedBandwidthMatchesThePacedNicAndTheCliPrintsIt) {
  const std::string job = "stats";
  {
    tributary::v1::CreateJobRequest req;
    req.set_job_id(job);
    for (const std::string& w : cluster_->worker_node_ids())
      req.mutable_spec()->add_worker_nodes(w);
    req.mutable_spec()->set_procs_per_node(1);
    req.mutable_spec()->set_algorithm(tributary::v1::ALGORITHM_RING);
    req.mutable_spec()->set_model_bytes(kStatsCount * 4);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    tributary::v1::Job created;
    grpc::Status s = cluster_->controller().CreateJob(&ctx, req, &created);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(GetJobStats("no-such-job").status().code(), absl::StatusCode::kNotFound);

  // A warm-up (data-plane connections, the processes' skew at start -- both in a node's busy
  // time: an operation is in flight from this node's start to its completion, waiting for the
  // peer included), then every process waits on its fifo until the test has the controller's
  // totals, and the measured iterations start at once. The figures checked are the difference
  // of the totals (both within the controller's 30 s window).
  std::vector<std::string> fifos;
  std::vector<std::pair<pid_t, std::string>> procs;
  for (int node = 0; node < kStatsWorkers; ++node) {
    fifos.push_back(absl::StrCat(cluster_->run_dir(), "/go-", node));
    ASSERT_EQ(mkfifo(fifos.back().c_str(), 0600), 0) << std::strerror(errno);
    const std::string log = absl::StrCat(cluster_->run_dir(), "/worker-", node, ".log");
    auto pid =
        client::SpawnProcess({std::string(TRIBUTARY_BIN_DIR) + "/tributary_test_worker", "--agent",
                              cluster_->agent_address(node), "--job", job, "--local-rank", "0",
                              "--local-size", "1", "--scenario", "bandwidth", "--warmup",
                              std::to_string(kWarmup), "--iterations", std::to_string(kIterations),
                              "--count", std::to_string(kStatsCount), "--go-fifo", fifos.back()},
                             log);
    ASSERT_TRUE(pid.ok()) << pid.status();
    procs.emplace_back(*pid, log);
  }
  const Totals warm = WaitForCollectives(job, kStatsWorkers * kWarmup);
  for (const std::string& fifo : fifos) {
    // Non-blocking: a worker that is not waiting on it (it died) is an error, not a hang.
    const int fd = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    EXPECT_GE(fd, 0) << fifo << ": " << std::strerror(errno);
    if (fd >= 0) {
      EXPECT_EQ(write(fd, "g", 1), 1);
      close(fd);
    }
  }
  for (const auto& [pid, log] : procs) {
    EXPECT_EQ(client::WaitProcess(pid, std::chrono::seconds(60)), 0) << ReadLog(log);
  }
  const Totals all = WaitForCollectives(job, kStatsWorkers * (kWarmup + kIterations));
  ASSERT_EQ(warm.by_node.size(), static_cast<size_t>(kStatsWorkers));
  ASSERT_EQ(all.by_node.size(), static_cast<size_t>(kStatsWorkers));
  const tributary::v1::JobStats& stats = all.stats;
  uint64_t sent = 0, received = 0;
  double busy = 0;
  for (const auto& [node, t] : all.by_node) {
    const NodeTotals& w = warm.by_node.at(node);
    const uint64_t node_sent = t.sent - w.sent, node_received = t.received - w.received;
    const double node_busy = t.busy - w.busy;
    // A ring node sends 2 (n-1)/n of the tensor per all-reduce (plus headers).
    const double ring_bytes = kIterations * static_cast<double>(kStatsCount) * 4 * 2 *
                              (kStatsWorkers - 1) / kStatsWorkers;
    EXPECT_GE(node_sent, ring_bytes);
    EXPECT_LE(node_sent, ring_bytes * 1.01);
    const double achieved = static_cast<double>(node_sent + node_received) / node_busy;
    const double expected = static_cast<double>(node_sent + node_received) /
                            (static_cast<double>(node_sent) / kNicBytesPerS);
    std::printf(
        "node %s: sent %llu received %llu busy %.3f s achieved %.1f MB/s expected %.1f "
        "MB/s (%+.1f %%)\n",
        node.c_str(), static_cast<unsigned long long>(node_sent),
        static_cast<unsigned long long>(node_received), node_busy, achieved / 1e6, expected / 1e6,
        100 * (achieved / expected - 1));
    EXPECT_GE(achieved, expected * (1 - Tolerance())) << node;
    EXPECT_LE(achieved, expected * 1.10) << node;
    sent += node_sent;
    received += node_received;
    busy += node_busy;
  }
  const double achieved = static_cast<double>(sent + received) / busy;
  const double expected = static_cast<double>(sent + received) / (sent / kNicBytesPerS);
  std::printf(
      "job (measured run): achieved %.1f MB/s per worker, expected %.1f MB/s (%+.1f %%); "
      "whole window: achieved %.1f MB/s, observed/predicted %.3f, comm fraction %.3f\n",
      achieved / 1e6, expected / 1e6, 100 * (achieved / expected - 1),
      stats.achieved_bytes_per_s() / 1e6, stats.observed_to_predicted(), stats.comm_fraction());
  EXPECT_GE(achieved, expected * (1 - Tolerance()));
  EXPECT_LE(achieved, expected * 1.10);
  // GetJobStats' own figure over the window is the same quotient, warm-up included: lower.
  EXPECT_GT(stats.achieved_bytes_per_s(), 0);
  EXPECT_LE(stats.achieved_bytes_per_s(), expected * 1.10);
  // The plan predicts ring time 2(n-1)/(nB) per byte = 1/B for n = 2: what the pacing imposes.
  EXPECT_NEAR(stats.predicted_seconds_per_byte(), 1 / kNicBytesPerS, 1e-6 / kNicBytesPerS);
  EXPECT_GE(stats.observed_to_predicted(), 0.9);
  // Iterations: from one "bandwidth.grad" to the next (one of them spans the pause after the
  // warm-up). The processes do little else than all-reduce.
  EXPECT_EQ(stats.iterations(), static_cast<uint64_t>(kStatsWorkers * (kWarmup + kIterations - 1)));
  EXPECT_GT(stats.comm_fraction(), 0.0);
  EXPECT_LE(stats.comm_fraction(), 1.0);
  EXPECT_GE(stats.mean_iteration_seconds(), 0.9 * kStatsCount * 4 / kNicBytesPerS);

  // The CLI prints the same figure.
  const std::string log = cluster_->run_dir() + "/job-stats.log";
  auto pid = client::SpawnProcess({std::string(TRIBUTARY_BIN_DIR) + "/tributary", "--controller",
                                   cluster_->controller_address(), "job-stats", job},
                                  log);
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_EQ(client::WaitProcess(*pid, std::chrono::seconds(20)), 0) << ReadLog(log);
  const std::string out = ReadLog(log);
  std::printf("%s", out.c_str());
  EXPECT_THAT(out, HasSubstr(absl::StrCat("job ", job, ": plan v")));
  EXPECT_THAT(out, HasSubstr("achieved bandwidth per worker"));
  EXPECT_THAT(out, HasSubstr(" MB/s"));
  EXPECT_THAT(out, HasSubstr("<- current"));
  // An unknown job: NOT_FOUND, said plainly, and a failing exit code.
  const std::string missing_log = cluster_->run_dir() + "/job-stats-missing.log";
  pid = client::SpawnProcess({std::string(TRIBUTARY_BIN_DIR) + "/tributary", "--controller",
                              cluster_->controller_address(), "job-stats", "no-such-job"},
                             missing_log);
  ASSERT_TRUE(pid.ok());
  EXPECT_NE(client::WaitProcess(*pid, std::chrono::seconds(20)), 0);
  EXPECT_THAT(ReadLog(missing_log), HasSubstr("not found"));
}

}  // namespace
}  // namespace tributary
