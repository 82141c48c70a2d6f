// The TLS flags of every Tributary process that speaks gRPC to the controller, named and
// documented once. Header-only; needs CLI11, which only the executables link.
#pragma once

#include "CLI/CLI.hpp"
#include "common/rpc/tls.h"

namespace tributary::common {

// Adds --tls-cert, --tls-key, --tls-ca and --tls-reload-seconds to `app`, bound to `config`;
// with `client`, also --tls-server-name (for processes that dial the controller).
inline void AddTlsFlags(CLI::App& app, TlsConfig& config, bool client) {
  app.add_option("--tls-cert", config.cert,
                 "mTLS: this process's certificate (PEM); with --tls-key and --tls-ca. Without "
                 "the three, gRPC is plaintext and unauthenticated")
      ->group("TLS");
  app.add_option("--tls-key", config.key, "mTLS: the private key of --tls-cert (PEM)")
      ->group("TLS");
  app.add_option("--tls-ca", config.ca,
                 "mTLS: CA bundle (PEM) the peer's certificate must chain to")
      ->group("TLS");
  app.add_option("--tls-reload-seconds", config.reload_seconds,
                 "mTLS: re-read the three files this often; new connections use what was read")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400))
      ->group("TLS");
  if (client) {
    app.add_option("--tls-server-name", config.server_name,
                   "mTLS: name the controller's certificate must carry (default: the host of "
                   "the controller address)")
        ->group("TLS");
  }
}

}  // namespace tributary::common
