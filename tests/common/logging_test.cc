#include "common/logging.h"

#include <sstream>

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

}  // namespace
}  // namespace tributary::common
