// The flags every Tributary server process takes for its logs and its /metrics endpoint, so that
// the controller and the agent name and document them once. Header-only; needs CLI11, which
// only the executables link.
#pragma once

#include <string>

#include "CLI/CLI.hpp"

namespace tributary::common {

struct ProcessFlags {
  std::string log_level;       // empty: TRIBUTARY_LOG_LEVEL, else SPDLOG_LEVEL, else info
  std::string log_format;      // text | json; empty: TRIBUTARY_LOG_FORMAT, else text
  std::string metrics_listen;  // HOST:PORT of the /metrics listener; port 0 picks one; empty: off
  std::string metrics_port_file;  // where to write the bound metrics port (empty: nowhere)
};

// Adds --log-level, --log-format, --metrics-listen and --metrics-port-file to `app`, bound to
// `flags` (whose metrics_listen holds the process's default).
inline void AddProcessFlags(CLI::App& app, ProcessFlags& flags) {
  app.add_option("--log-level", flags.log_level,
                 "trace|debug|info|warn|error (or TRIBUTARY_LOG_LEVEL)");
  app.add_option("--log-format", flags.log_format, "text|json (or TRIBUTARY_LOG_FORMAT)");
  app.add_option("--metrics-listen", flags.metrics_listen,
                 "Prometheus /metrics listener HOST:PORT (port 0 picks one; empty: off)")
      ->capture_default_str();
  app.add_option("--metrics-port-file", flags.metrics_port_file,
                 "Write the bound metrics port to this file");
}

}  // namespace tributary::common
