#include "common/trace.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tributary::common {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/" + name + "-" + std::to_string(::getpid()) + ".json";
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

TEST(Trace, OffByDefaultAndRecordingCallsAreHarmless) {
  EXPECT_FALSE(Trace::enabled());
  const auto t = std::chrono::steady_clock::now();
  Trace::Span("track", "nothing", t, t);
  Trace::Async("nothing", 1, t, t);
  Trace::Counter("nothing", t, 1);
  EXPECT_TRUE(Trace::Stop().ok());
}

TEST(Trace, WritesChromeTraceEventsThatAStrictJsonReaderAccepts) {
  const std::string path = TempPath("trace");
  ASSERT_TRUE(Trace::Start(path, "test process").ok());
  EXPECT_TRUE(Trace::enabled());
  EXPECT_THAT(Trace::Start(path, "again").message(), HasSubstr("already"));
  const auto t0 = std::chrono::steady_clock::time_point(std::chrono::microseconds(1000));
  const auto t1 = t0 + std::chrono::microseconds(250);
  Trace::Span("push s1", "chunk 3", t0, t1, {{"bytes", 4096}});
  Trace::Span("push s1", "chunk 4", t1, t1 + std::chrono::microseconds(5));
  Trace::Async("tensor \"w\"", 42, t0, t1, {{"bytes", 8}});
  Trace::Counter("in flight", t1, 7);
  ASSERT_TRUE(Trace::Stop().ok());
  EXPECT_FALSE(Trace::enabled());

  const nlohmann::json events = ReadJson(path);
  ASSERT_TRUE(events.is_array());
  int spans = 0, begins = 0, ends = 0, counters = 0, thread_names = 0;
  for (const auto& e : events) {
    const std::string ph = e.at("ph");
    if (ph == "X") {
      ++spans;
      EXPECT_EQ(e.at("tid"), 1);  // both spans on the one track
      if (e.at("name") == "chunk 3") {
        EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), 1000.0);
        EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), 250.0);
        EXPECT_EQ(e.at("args").at("bytes"), 4096);
      }
    } else if (ph == "b") {
      ++begins;
      EXPECT_EQ(e.at("name"), "tensor \"w\"");
      EXPECT_EQ(e.at("id"), "0x2a");
    } else if (ph == "e") {
      ++ends;
    } else if (ph == "C") {
      ++counters;
      EXPECT_EQ(e.at("args").at("value"), 7);
    } else if (ph == "M" && e.at("name") == "thread_name") {
      ++thread_names;
      EXPECT_EQ(e.at("args").at("name"), "push s1");
    } else if (ph == "M" && e.at("name") == "process_name") {
      EXPECT_EQ(e.at("args").at("name"), "test process");
    }
  }
  EXPECT_EQ(spans, 2);
  EXPECT_EQ(begins, 1);
  EXPECT_EQ(ends, 1);
  EXPECT_EQ(counters, 1);
  EXPECT_EQ(thread_names, 1);
  std::remove(path.c_str());
}

TEST(Trace, KeepsAtMostMaxEventsAndCountsTheRest) {
  const std::string path = TempPath("trace-max");
  const uint64_t dropped_before = Trace::dropped();
  ASSERT_TRUE(Trace::Start(path, "p", /*max_events=*/3).ok());
  const auto t = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) Trace::Span("t", "s", t, t);
  ASSERT_TRUE(Trace::Stop().ok());
  EXPECT_EQ(Trace::dropped() - dropped_before, 7u);
  int spans = 0;
  for (const auto& e : ReadJson(path)) spans += e.at("ph") == "X";
  EXPECT_EQ(spans, 3);
  std::remove(path.c_str());
}

TEST(Trace, AFileThatCannotBeCreatedIsAClearError) {
  absl::Status s = Trace::Start("/nonexistent-dir/trace.json", "p");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("/nonexistent-dir/trace.json"));
  EXPECT_FALSE(Trace::enabled());
}

}  // namespace
}  // namespace tributary::common
