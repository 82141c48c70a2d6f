#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "common/logging.h"
#include "common/metrics/metrics.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/ostream_sink.h"

namespace tributary::common {
namespace {

TEST(JsonLogTest, EveryLineIsOneEscapedJsonObject) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  sink->set_formatter(MakeJsonFormatter());
  spdlog::logger logger("json-test", sink);
  logger.set_level(spdlog::level::debug);
  const std::string nasty = "quote \" backslash \\ newline \n tab \t bell \x07 end";
  logger.info("push of chunk {} failed: {}", 3, nasty);
  logger.debug("plain");
  std::istringstream lines(out.str());
  std::string line;
  std::vector<nlohmann::json> parsed;
  while (std::getline(lines, line)) parsed.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(parsed.size(), 2u);  // the embedded newline did not split the record
  EXPECT_EQ(parsed[0]["level"], "info");
  EXPECT_EQ(parsed[0]["logger"], "json-test");
  EXPECT_EQ(parsed[0]["msg"], "push of chunk 3 failed: " + nasty);
  EXPECT_TRUE(parsed[0]["ts"].is_string());
  EXPECT_EQ(parsed[1]["level"], "debug");
}

TEST(JsonLogTest, InvalidUtf8DoesNotThrow) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  sink->set_formatter(MakeJsonFormatter());
  spdlog::logger logger("json-utf8", sink);
  logger.warn("bad \xff\xfe bytes");
  EXPECT_NO_THROW({
    const auto parsed = nlohmann::json::parse(out.str());
    EXPECT_TRUE(parsed.is_object());
  });
}

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
