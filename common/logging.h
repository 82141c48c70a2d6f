// One named spdlog logger per component; level from a flag or the environment.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

#if !defined(ABSL_USES_STD_STRING_VIEW)
// Debian's Abseil has its own string_view type; let spdlog/fmt print it (and Status) directly.
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  auto format(absl::string_view s, fmt::format_context& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};
#endif

template <>
struct fmt::formatter<absl::Status> : fmt::formatter<fmt::string_view> {
  auto format(const absl::Status& s, fmt::format_context& ctx) const {
    const std::string text = s.ToString();
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(text), ctx);
  }
};

namespace tributary::common {

// Returns the logger named `component` ("controller", "agent", "dataplane", ...), creating it
// on first use with the process-wide level and format.
std::shared_ptr<spdlog::logger> Logger(const std::string& component);

// A component name usable as a template argument: ComponentLog<"agent">.
template <size_t N>
struct ComponentName {
  constexpr ComponentName(const char (&name)[N]) {  // NOLINT: implicit by design
    for (size_t i = 0; i < N; ++i) value[i] = name[i];
  }
  char value[N];
};

// The logger of one component, created on first use (not during static initialisation, so
// InitLogging's level and format apply) and then cached. A file names its component once:
//   constexpr auto Log = common::ComponentLog<"agent">;   ...   Log()->info("...");
template <ComponentName kName>
const std::shared_ptr<spdlog::logger>& ComponentLog() {
  static const std::shared_ptr<spdlog::logger> logger = Logger(kName.value);
  return logger;
}

// Sets the level of every logger. `level` is one of trace, debug, info, warn, error, critical,
// off; empty means: TRIBUTARY_LOG_LEVEL, else SPDLOG_LEVEL, else info.
void InitLogging(const std::string& level);
// As above, and sets the format of every logger: "text" (the default) or "json" (one JSON object
// per line: ts, level, logger, msg); empty means TRIBUTARY_LOG_FORMAT, else text.
void InitLogging(const std::string& level, const std::string& format);

// spdlog formatter writing one JSON object per line: {"ts":"...","level":"...","logger":"...",
// "msg":"..."} with the message escaped (quotes, backslashes, control characters).
std::unique_ptr<spdlog::formatter> MakeJsonFormatter();

}  // namespace tributary::common
