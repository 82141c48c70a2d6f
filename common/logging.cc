#include "common/logging.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

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

}  // namespace

std::shared_ptr<spdlog::logger> Logger(const std::string& component) {
  std::lock_guard lock(Mu());
  if (auto existing = spdlog::get(component)) return existing;
  auto logger = spdlog::stderr_color_mt(component);
  logger->set_level(Level());
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%n] %v");
  return logger;
}

void InitLogging(const std::string& level) {
  std::lock_guard lock(Mu());
  if (!level.empty()) Level() = spdlog::level::from_str(level);
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->set_level(Level()); });
}

void CheckFailed(const char* condition, const char* file, int line) {
  std::fprintf(stderr, "check failed at %s:%d: %s\n", file, line, condition);
  std::abort();
}

}  // namespace tributary::common
