// mTLS for Tributary's gRPC links: --tls-cert, --tls-key and --tls-ca turned into gRPC's own TLS
// credentials (grpc::experimental::TlsServerCredentials / TlsCredentials over a
// FileWatcherCertificateProvider, so that replaced files are picked up without a restart), and
// the identities a verified peer certificate names.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace tributary::common {

// The PEM files of one process. All three empty: plaintext (insecure). Otherwise all three
// are required.
struct TlsConfig {
  std::string cert;  // this process's certificate chain (PEM)
  std::string key;   // its private key (PEM)
  std::string ca;    // the CA bundle peers' certificates must chain to (PEM)
  // Clients only: the name the server's certificate must carry (DNS or IP SAN); empty: the
  // host part of the target address.
  std::string server_name;
  // How often the files are re-read, seconds (gRPC's FileWatcherCertificateProvider); new
  // handshakes use the new certificate once read. At least 1.
  int reload_seconds = 10;

  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// Checks the files before anything serves: all three or none given; each readable; the
// certificate, the key and the CA bundle parse as PEM; the key belongs to the certificate; the
// certificate chains to the CA. INVALID_ARGUMENT naming the flag and the file otherwise.
absl::Status ValidateTlsConfig(const TlsConfig& config);

// Server credentials: with TLS, the server presents `cert`, requires a client certificate and
// verifies it against `ca` (a peer without one, or with one from another CA, fails the
// handshake). Without TLS, insecure credentials, and `component`'s logger warns once that
// anyone who reaches `listen` is trusted.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsConfig& config, const std::string& component, const std::string& listen);

// Channel credentials for dialing a server: with TLS, the channel presents `cert` and verifies
// the server's certificate against `ca` and its name (server_name, else the target's host).
// Without TLS, insecure credentials.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsConfig& config);

// Adds what the channel needs besides its credentials (the server-name override) to `args`.
void ApplyTlsChannelArgs(const TlsConfig& config, grpc::ChannelArguments* args);

// The largest reply a channel of MakeChannel accepts, unless `args` set another: gRPC's default
// (4 MiB) is below a plan of ~4,000 multi-GPU workers (GetJob, CreateJob's answer).
inline constexpr int kMaxReplyBytes = 256 << 20;

// A channel to `target` with MakeChannelCredentials and ApplyTlsChannelArgs (and `args`), whose
// replies may be up to kMaxReplyBytes.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const TlsConfig& config,
                                                           grpc::ChannelArguments args = {});

// The names a verified peer certificate carries: its subject's common name and every DNS (and
// IP) subject alternative name, without duplicates. Empty for a plaintext peer or one whose
// certificate was not verified.
std::vector<std::string> PeerIdentities(const grpc::AuthContext& context);

}  // namespace tributary::common
