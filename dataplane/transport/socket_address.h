// Socket addresses of the network transports (TCP and UCX): numeric "ip:port" text <-> sockaddr.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tributary::dataplane {

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;

  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* get() { return reinterpret_cast<sockaddr*>(&storage); }
};

// Parses "a.b.c.d:port" or "[v6]:port" with a numeric host and a port in 1..65535; anything else
// (host names included) is INVALID_ARGUMENT, without any lookup.
absl::StatusOr<SocketAddress> ParsePeerAddress(const std::string& address);

// "ip:port" or "[ip]:port"; empty for a family other than IPv4 and IPv6.
std::string FormatAddress(const sockaddr* address);

// The address to listen on: `host` (numeric, or a name resolved with getaddrinfo) and `port`.
// INVALID_ARGUMENT when it does not resolve.
absl::StatusOr<SocketAddress> ResolveListenAddress(const std::string& host, uint16_t port);

}  // namespace tributary::dataplane
