#include "common/metrics/metrics.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"

namespace tributary::common {
namespace {

TEST(ProcessCollectorTest, ReportsSaneValues) {
  std::thread sleeper([] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); });
  volatile double x = 0;
  for (int i = 0; i < 2000000; ++i) x = x + i;  // some CPU time
  metrics::ProcessCollector collector;
  const auto f = collector.Collect();
  sleeper.join();
  const auto* cpu = metrics::FindSample(f, "tributary_process_cpu_seconds_total");
  const auto* rss = metrics::FindSample(f, "tributary_process_resident_memory_bytes");
  const auto* threads = metrics::FindSample(f, "tributary_process_threads");
  const auto* start = metrics::FindSample(f, "tributary_process_start_time_seconds");
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(rss, nullptr);
  ASSERT_NE(threads, nullptr);
  ASSERT_NE(start, nullptr);
  EXPECT_GE(cpu->counter.value, 0);
  EXPECT_LT(cpu->counter.value, 3600);
  EXPECT_GT(rss->gauge.value, 1 << 20);
  EXPECT_LT(rss->gauge.value, 64.0 * (1ull << 30));
  EXPECT_GE(threads->gauge.value, 2);  // this one and the sleeper
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_GT(start->gauge.value, now - 3600);
  EXPECT_LE(start->gauge.value, now + 5);
}

TEST(MetricsServerTest, ServesOnAnEphemeralPortAndWritesIt) {
  auto registry = std::make_shared<prometheus::Registry>();
  metrics::CounterFamily(*registry, "tributary_test_things_total", "things").Add({}).Increment(3);
  const std::string file = ::testing::TempDir() + "/metrics.port." + std::to_string(getpid());
  auto server = metrics::MetricsServer::Start("127.0.0.1:0", file, {registry});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->port(), 0);
  std::ifstream f(file);
  int port = 0;
  f >> port;
  EXPECT_EQ(port, (*server)->port());
}

}  // namespace
}  // namespace tributary::common
