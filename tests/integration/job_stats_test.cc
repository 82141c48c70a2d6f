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
// lower, never higher, so the check is one-sided-tight: within kTolerance below and 10 % above.
#include <fstream>
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

constexpr int kWorkers = 2;
constexpr double kNicGbps = 0.4;  // 50 MB/s: an 8 MiB ring all-reduce takes ~170 ms
constexpr double kNicBytesPerS = kNicGbps * 1e9 / 8;
constexpr int kIterations = 8;
constexpr size_t kCount = size_t{1} << 21;  // floats: 8 MiB
// Below the expected value: the 10 % the issue asks for on an idle machine; on this shared
// 2-core machine other engineers' builds can stretch the busy time (bench/job_stats_check.sh
// prints the figure on its own). Above: 10 % (nothing can beat the pacing).
constexpr double kTolerance = 0.10;

std::string ReadFile(const std::string& path) {
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
    o.workers = kWorkers;
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
    req.mutable_spec()->set_model_bytes(kCount * 4);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    tributary::v1::Job created;
    grpc::Status s = cluster_->controller().CreateJob(&ctx, req, &created);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(GetJobStats("no-such-job").status().code(), absl::StatusCode::kNotFound);

  std::vector<std::pair<pid_t, std::string>> procs;
  for (int node = 0; node < kWorkers; ++node) {
    const std::string log = absl::StrCat(cluster_->run_dir(), "/worker-", node, ".log");
    auto pid =
        client::SpawnProcess({std::string(TRIBUTARY_BIN_DIR) + "/tributary_test_worker", "--agent",
                              cluster_->agent_address(node), "--job", job, "--local-rank", "0",
                              "--local-size", "1", "--scenario", "bandwidth", "--iterations",
                              std::to_string(kIterations), "--count", std::to_string(kCount)},
                             log);
    ASSERT_TRUE(pid.ok()) << pid.status();
    procs.emplace_back(*pid, log);
  }
  for (const auto& [pid, log] : procs) {
    EXPECT_EQ(client::WaitProcess(pid, std::chrono::seconds(60)), 0) << ReadFile(log);
  }

  // The agents report within a heartbeat or two: wait (bounded) until both nodes' reports of
  // every collective are in.
  absl::StatusOr<tributary::v1::JobStats> stats;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (true) {
    stats = GetJobStats(job);
    ASSERT_TRUE(stats.ok()) << stats.status();
    if (stats->collectives() == kWorkers * kIterations ||
        std::chrono::steady_clock::now() > deadline)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // polling another process
  }
  ASSERT_EQ(stats->collectives(), static_cast<uint64_t>(kWorkers * kIterations))
      << stats->DebugString();
  ASSERT_EQ(stats->reporting_nodes(), static_cast<uint32_t>(kWorkers));
  EXPECT_EQ(stats->iterations(), static_cast<uint64_t>(kWorkers * (kIterations - 1)));

  uint64_t sent = 0, received = 0;
  double busy = 0;
  for (const auto& n : stats->nodes()) {
    EXPECT_TRUE(n.worker());
    // A ring node moves 2 (n-1)/n of the tensor each way per all-reduce (plus headers).
    const double tensor = static_cast<double>(kCount) * 4;
    EXPECT_GE(n.wire_bytes_sent(), kIterations * tensor * (kWorkers - 1) / kWorkers * 2);
    EXPECT_LE(n.wire_bytes_sent(), kIterations * tensor * (kWorkers - 1) / kWorkers * 2 * 1.01);
    const double expected = static_cast<double>(n.wire_bytes_sent() + n.wire_bytes_received()) /
                            (static_cast<double>(n.wire_bytes_sent()) / kNicBytesPerS);
    std::printf(
        "node %s: sent %llu received %llu busy %.3f s achieved %.1f MB/s expected %.1f "
        "MB/s (%.1f %%), comm fraction %.3f, iteration %.3f s\n",
        n.node_id().c_str(), static_cast<unsigned long long>(n.wire_bytes_sent()),
        static_cast<unsigned long long>(n.wire_bytes_received()), n.busy_seconds(),
        n.achieved_bytes_per_s() / 1e6, expected / 1e6,
        100 * (n.achieved_bytes_per_s() / expected - 1), n.comm_fraction(),
        n.mean_iteration_seconds());
    EXPECT_GE(n.achieved_bytes_per_s(), expected * (1 - kTolerance)) << n.node_id();
    EXPECT_LE(n.achieved_bytes_per_s(), expected * 1.10) << n.node_id();
    sent += n.wire_bytes_sent();
    received += n.wire_bytes_received();
    busy += n.busy_seconds();
  }
  const double expected = static_cast<double>(sent + received) / (sent / kNicBytesPerS);
  std::printf("job: achieved %.1f MB/s per worker, expected %.1f MB/s; observed/predicted %.3f\n",
              stats->achieved_bytes_per_s() / 1e6, expected / 1e6, stats->observed_to_predicted());
  EXPECT_GE(stats->achieved_bytes_per_s(), expected * (1 - kTolerance));
  EXPECT_LE(stats->achieved_bytes_per_s(), expected * 1.10);
  // The plan predicts ring time 2(n-1)/(nB) per byte = 1/B for n = 2: what the pacing imposes.
  EXPECT_NEAR(stats->predicted_seconds_per_byte(), 1 / kNicBytesPerS, 1e-6 / kNicBytesPerS);
  EXPECT_GE(stats->observed_to_predicted(), 0.9);
  EXPECT_LE(stats->observed_to_predicted(), 1 / (1 - kTolerance));
  // The processes do nothing but all-reduce (and check): most of an iteration is communication.
  EXPECT_GT(stats->comm_fraction(), 0.5);
  EXPECT_LE(stats->comm_fraction(), 1.0);

  // The CLI prints the same figure.
  const std::string log = cluster_->run_dir() + "/job-stats.log";
  auto pid = client::SpawnProcess({std::string(TRIBUTARY_BIN_DIR) + "/tributary", "--controller",
                                   cluster_->controller_address(), "job-stats", job},
                                  log);
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_EQ(client::WaitProcess(*pid, std::chrono::seconds(20)), 0) << ReadFile(log);
  const std::string out = ReadFile(log);
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
  EXPECT_THAT(ReadFile(missing_log), HasSubstr("not found"));
}

}  // namespace
}  // namespace tributary
