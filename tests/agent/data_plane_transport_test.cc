// The agent's --transport choice, and DataPlaneRunner on each transport: a real message through
// the runner's stack, and the listener's rejection counters as metrics.
#include "agent/data_plane_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "agent/data_plane_runner.h"
#include "common/clock.h"
#include "dataplane/schedule/chunk_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace tributary::agent {
namespace {

using ::testing::HasSubstr;

TEST(DataPlaneTransportTest, ParsesTheFlagValues) {
  EXPECT_EQ(*ParseDataPlaneTransport("auto"), DataPlaneTransport::kAuto);
  EXPECT_EQ(*ParseDataPlaneTransport("tcp"), DataPlaneTransport::kTcp);
  EXPECT_EQ(*ParseDataPlaneTransport("ucx"), DataPlaneTransport::kUcx);
  for (const char* bad : {"", "TCP", "rdma", "tcp "}) {
    absl::StatusOr<DataPlaneTransport> parsed = ParseDataPlaneTransport(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(DataPlaneTransportTest, AutoPicksTcpUnlessUcxTlsAllowsRdma) {
  struct Case {
    const char* ucx_tls;
    DataPlaneTransport expected;
  };
  const std::vector<Case> cases = {
      {nullptr, DataPlaneTransport::kTcp},
      {"", DataPlaneTransport::kTcp},
      {"tcp", DataPlaneTransport::kTcp},
      {"TCP", DataPlaneTransport::kTcp},
      {"tcp,self,sm", DataPlaneTransport::kTcp},
      {"sm, self ,tcp,sockcm,posix,sysv,cma", DataPlaneTransport::kTcp},
      {"rc", DataPlaneTransport::kUcx},
      {"tcp,rc_x", DataPlaneTransport::kUcx},
      {"ud,sm,self", DataPlaneTransport::kUcx},
      {"all", DataPlaneTransport::kUcx},
      {"^rc", DataPlaneTransport::kUcx},   // everything but rc: still RDMA (ud, dc)
      {"^tcp", DataPlaneTransport::kUcx},  // everything but tcp
      {"cuda_copy,tcp", DataPlaneTransport::kUcx},
  };
  for (const Case& c : cases) {
    const TransportChoice choice = ChooseDataPlaneTransport(DataPlaneTransport::kAuto, c.ucx_tls);
    EXPECT_EQ(choice.transport, c.expected) << (c.ucx_tls ? c.ucx_tls : "(unset)");
    EXPECT_THAT(choice.reason, HasSubstr("auto"));
  }
  // An explicit choice stands whatever UCX_TLS says.
  EXPECT_EQ(ChooseDataPlaneTransport(DataPlaneTransport::kUcx, "tcp").transport,
            DataPlaneTransport::kUcx);
  EXPECT_EQ(ChooseDataPlaneTransport(DataPlaneTransport::kTcp, "rc").transport,
            DataPlaneTransport::kTcp);
}

// The value of counter or gauge `name` (-1: not there).
double Sample(prometheus::Collectable& collectable, const std::string& name) {
  for (const prometheus::MetricFamily& family : collectable.Collect()) {
    if (family.name == name && !family.metric.empty()) {
      return family.type == prometheus::MetricType::Gauge ? family.metric[0].gauge.value
                                                          : family.metric[0].counter.value;
    }
  }
  return -1;
}

// 16 bytes of 0xff on the runner's data-plane port (issue 13): counted, and the runner lives on.
TEST(DataPlaneRunnerTransportTest, TcpRunnerCountsHostileConnectionsAsMetrics) {
  prometheus::Registry registry;
  DataPlaneRunner::Options options;
  options.transport = DataPlaneTransport::kTcp;
  options.reducer_threads = 1;
  absl::StatusOr<std::unique_ptr<DataPlaneRunner>> runner =
      DataPlaneRunner::Create(options, registry, common::SystemClock::Get());
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ((*runner)->transport(), DataPlaneTransport::kTcp);
  auto collector = (*runner)->transport_stats_collector();
  ASSERT_NE(collector, nullptr);
  EXPECT_EQ(Sample(*collector, "tributary_dataplane_rejected_connections_total"), 0);
  EXPECT_EQ(Sample(*collector, "tributary_dataplane_protocol_errors_total"), 0);

  const std::string address = (*runner)->address();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1))));
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval timeout{.tv_sec = 5, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const std::vector<std::byte> ff(16, std::byte{0xff});
  ASSERT_EQ(send(fd, ff.data(), ff.size(), MSG_NOSIGNAL), 16);
  std::byte scratch[16];
  const ssize_t n = recv(fd, scratch, sizeof(scratch), 0);  // The runner closes it (deadline 5 s).
  EXPECT_TRUE(n == 0 || (n < 0 && errno == ECONNRESET)) << n << " " << std::strerror(errno);
  close(fd);
  EXPECT_EQ(Sample(*collector, "tributary_dataplane_rejected_connections_total"), 1);
  (*runner)->Shutdown();
}

// --tcp-congestion: a congestion control the agent cannot set stops it at start, naming it.
TEST(DataPlaneRunnerTransportTest, ACongestionControlThatCannotBeSetFailsTheRunner) {
  prometheus::Registry registry;
  DataPlaneRunner::Options options;
  options.transport = DataPlaneTransport::kTcp;
  options.reducer_threads = 1;
  options.tcp_congestion_control = "nosuchcc";
  absl::StatusOr<std::unique_ptr<DataPlaneRunner>> runner =
      DataPlaneRunner::Create(options, registry, common::SystemClock::Get());
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kInvalidArgument) << runner.status();
  EXPECT_THAT(std::string(runner.status().message()), ::testing::HasSubstr("nosuchcc"));
}

// --tcp-congestion-workers with a name the agent cannot set stops it at start, naming the flag;
// the default (auto) starts whether or not this process may set cubic.
TEST(DataPlaneRunnerTransportTest, AWorkerCongestionControlThatCannotBeSetFailsTheRunner) {
  prometheus::Registry registry;
  DataPlaneRunner::Options options;
  options.transport = DataPlaneTransport::kTcp;
  options.reducer_threads = 1;
  options.tcp_worker_congestion_control = "nosuchcc";
  absl::StatusOr<std::unique_ptr<DataPlaneRunner>> runner =
      DataPlaneRunner::Create(options, registry, common::SystemClock::Get());
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kInvalidArgument) << runner.status();
  EXPECT_THAT(std::string(runner.status().message()), ::testing::HasSubstr("nosuchcc"));
  EXPECT_THAT(std::string(runner.status().message()),
              ::testing::HasSubstr("--tcp-congestion-workers"));

  options.tcp_worker_congestion_control = kAutoWorkerCongestion;
  runner = DataPlaneRunner::Create(options, registry, common::SystemClock::Get());
  ASSERT_TRUE(runner.ok()) << runner.status();
  (*runner)->Shutdown();
}

TEST(DataPlaneRunnerTransportTest, UcxRunnerExportsZeroCounters) {
  setenv("UCX_NET_DEVICES", "lo", 0);
  setenv("UCX_TLS", "tcp", 0);
  prometheus::Registry registry;
  DataPlaneRunner::Options options;
  options.transport = DataPlaneTransport::kUcx;
  options.reducer_threads = 1;
  absl::StatusOr<std::unique_ptr<DataPlaneRunner>> runner =
      DataPlaneRunner::Create(options, registry, common::SystemClock::Get());
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ((*runner)->transport(), DataPlaneTransport::kUcx);
  EXPECT_EQ(Sample(*(*runner)->transport_stats_collector(),
                   "tributary_dataplane_rejected_connections_total"),
            0);
  (*runner)->Shutdown();
}

// --peer-recovery-mib: a worker keeps the sums of a push/pull collective for its peers within
// its budget only (0: none); the results are exact either way.
TEST(DataPlaneRunnerTransportTest, ThePeerRecoveryBudgetBoundsTheSumsAWorkerKeeps) {
  prometheus::Registry registry;
  std::vector<std::unique_ptr<DataPlaneRunner>> runners;
  dataplane::JobView view;
  view.job_id = "budget";
  view.plan_version = 1;
  view.procs_per_node = 1;
  view.partition_bytes = 1024;
  view.tune_partition = false;
  view.credit_bytes = 1 << 20;
  view.op_timeout = std::chrono::seconds(20);
  view.secret = "0123456789abcdef0123456789abcdef";
  for (uint64_t budget : {uint64_t{0}, uint64_t{4} << 30, uint64_t{4} << 30}) {
    DataPlaneRunner::Options options;
    options.transport = DataPlaneTransport::kTcp;
    options.reducer_threads = 1;
    options.peer_recovery_bytes = budget;
    absl::StatusOr<std::unique_ptr<DataPlaneRunner>> runner =
        DataPlaneRunner::Create(options, registry, common::SystemClock::Get());
    ASSERT_TRUE(runner.ok()) << runner.status();
    runners.push_back(*std::move(runner));
  }
  // Runners 0 and 1 are the workers, runner 2 the summation server (not a worker: only then
  // do workers keep sums).
  view.worker_addresses = {runners[0]->address(), runners[1]->address()};
  view.server_addresses = {runners[2]->address()};
  view.server_weights = {dataplane::ChunkMap::kWeightTotal};
  for (int i = 0; i < 3; ++i) {
    view.my_worker_rank = i < 2 ? i : -1;
    view.my_server_index = i == 2 ? 0 : -1;
    runners[i]->SetJob(view, dataplane::Algorithm::kPushPull);
  }
  constexpr uint64_t kCount = 1000;
  std::vector<std::vector<float>> data(2, std::vector<float>(kCount));
  std::vector<std::future<absl::Status>> done;
  for (int w = 0; w < 2; ++w) {
    for (uint64_t e = 0; e < kCount; ++e) data[w][e] = static_cast<float>((w + 1) * (e % 7));
    auto promise = std::make_shared<std::promise<absl::Status>>();
    done.push_back(promise->get_future());
    dataplane::Operation op;
    op.tensor_name = "t";
    op.dtype = common::DataType::kFloat32;
    op.count = kCount;
    op.buffers = {reinterpret_cast<std::byte*>(data[w].data())};
    op.done = [promise](absl::Status s) { promise->set_value(std::move(s)); };
    ASSERT_TRUE(runners[w]->Start("budget", std::move(op)).ok());
  }
  int wrong = 0;
  for (int w = 0; w < 2; ++w) {
    ASSERT_EQ(done[w].wait_for(std::chrono::seconds(20)), std::future_status::ready);
    EXPECT_TRUE(done[w].get().ok());
    for (uint64_t e = 0; e < kCount; ++e) wrong += data[w][e] != static_cast<float>(3 * (e % 7));
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(Sample(*runners[0]->stats_collector(), "tributary_dataplane_retained_bytes"), 0);
  EXPECT_EQ(Sample(*runners[1]->stats_collector(), "tributary_dataplane_retained_bytes"),
            kCount * 4);
  for (auto& r : runners) r->Shutdown();
}

}  // namespace
}  // namespace tributary::agent
