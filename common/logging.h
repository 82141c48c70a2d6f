// One named spdlog logger per component; level from a flag or the environment.
#pragma once

#include <memory>
#include <string>

#include "spdlog/spdlog.h"

namespace tributary::common {

// Returns the logger named `component` ("controller", "agent", "dataplane", ...), creating it
// on first use with the process-wide level and format.
std::shared_ptr<spdlog::logger> Logger(const std::string& component);

// Sets the level of every logger. `level` is one of trace, debug, info, warn, error, critical,
// off; empty means: TRIBUTARY_LOG_LEVEL, else SPDLOG_LEVEL, else info.
void InitLogging(const std::string& level);

}  // namespace tributary::common
