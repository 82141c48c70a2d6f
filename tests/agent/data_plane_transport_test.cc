// The agent's --transport choice, and DataPlaneRunner on each transport: a real message through
// the runner's stack, and the listener's rejection counters as metrics.
#include "agent/data_plane_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "agent/data_plane_runner.h"
#include "common/clock.h"
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

double Sample(prometheus::Collectable& collectable, const std::string& name) {
  for (const prometheus::MetricFamily& family : collectable.Collect()) {
    if (family.name == name && !family.metric.empty()) return family.metric[0].counter.value;
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

}  // namespace
}  // namespace tributary::agent
