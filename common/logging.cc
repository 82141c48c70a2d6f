#include "common/logging.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <string>

#include "nlohmann/json.hpp"
#include "spdlog/formatter.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace tributary::common {
namespace {

std::mutex& Mu() {
  static std::mutex mu;
  return mu;
}

spdlog::level::level_enum& Level() {
  static spdlog::level::level_enum level = [] {
    for (const char* var : {"TRIBUTARY_LOG_LEVEL", "SPDLOG_LEVEL"}) {
      if (const char* v = std::getenv(var); v != nullptr && *v != '\0') {
        return spdlog::level::from_str(v);
      }
    }
    return spdlog::level::info;
  }();
  return level;
}

bool& Json() {
  static bool json = [] {
    const char* v = std::getenv("TRIBUTARY_LOG_FORMAT");
    return v != nullptr && std::string(v) == "json";
  }();
  return json;
}

constexpr const char* kTextPattern = "%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%n] %v";

class JsonFormatter : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto t = msg.time;
    const std::time_t secs = std::chrono::system_clock::to_time_t(t);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() % 1000;
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char ts[64];
    std::snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>(ms));
    const auto level = spdlog::level::to_string_view(msg.level);
    nlohmann::ordered_json j;  // keys in this order: ts, level, logger, msg
    j["ts"] = ts;
    j["level"] = std::string(level.data(), level.size());
    j["logger"] = std::string(msg.logger_name.data(), msg.logger_name.size());
    j["msg"] = std::string(msg.payload.data(), msg.payload.size());
    // Invalid UTF-8 in a message is replaced, never thrown on.
    const std::string line =
        j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    dest.append(line.data(), line.data() + line.size());
    dest.push_back('\n');
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

void ApplyFormat(spdlog::logger& logger) {
  if (Json()) {
    logger.set_formatter(std::make_unique<JsonFormatter>());
  } else {
    logger.set_pattern(kTextPattern);
  }
}

}  // namespace

std::unique_ptr<spdlog::formatter> MakeJsonFormatter() { return std::make_unique<JsonFormatter>(); }

std::shared_ptr<spdlog::logger> Logger(const std::string& component) {
  std::lock_guard lock(Mu());
  if (auto existing = spdlog::get(component)) return existing;
  auto logger = spdlog::stderr_color_mt(component);
  logger->set_level(Level());
  ApplyFormat(*logger);
  return logger;
}

void InitLogging(const std::string& level) {
  std::lock_guard lock(Mu());
  if (!level.empty()) Level() = spdlog::level::from_str(level);
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->set_level(Level()); });
}

void InitLogging(const std::string& level, const std::string& format) {
  {
    std::lock_guard lock(Mu());
    if (!format.empty()) Json() = format == "json";
    spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { ApplyFormat(*l); });
  }
  InitLogging(level);
}

void CheckFailed(const char* condition, const char* file, int line) {
  std::fprintf(stderr, "check failed at %s:%d: %s\n", file, line, condition);
  std::abort();
}

}  // namespace tributary::common
