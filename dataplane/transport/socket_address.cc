#include "dataplane/transport/socket_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <charconv>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tributary::dataplane {

absl::StatusOr<SocketAddress> ParsePeerAddress(const std::string& address) {
  auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("bad peer address \"", address, "\": ", why,
                                                   " (want ipv4:port or [ipv6]:port)"));
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return invalid("no host:port");
  const std::string port_text = address.substr(colon + 1);
  uint32_t port = 0;
  const auto [end, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || end != port_text.data() + port_text.size() ||
      port == 0 || port > 65535) {
    return invalid("port must be a number in 1..65535");
  }
  const std::string host = address.substr(0, colon);
  SocketAddress result;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&result.storage);
    if (inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &in6->sin6_addr) != 1) {
      return invalid("host is not a numeric IPv6 address");
    }
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    result.length = sizeof(sockaddr_in6);
  } else {
    auto* in4 = reinterpret_cast<sockaddr_in*>(&result.storage);
    if (inet_pton(AF_INET, host.c_str(), &in4->sin_addr) != 1) {
      return invalid("host is not a numeric IPv4 address");
    }
    in4->sin_family = AF_INET;
    in4->sin_port = htons(static_cast<uint16_t>(port));
    result.length = sizeof(sockaddr_in);
  }
  return result;
}

std::string FormatAddress(const sockaddr* address) {
  char host[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    const auto* in4 = reinterpret_cast<const sockaddr_in*>(address);
    inet_ntop(AF_INET, &in4->sin_addr, host, sizeof(host));
    return absl::StrCat(host, ":", ntohs(in4->sin_port));
  }
  if (address->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(address);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(in6->sin6_port));
  }
  return "";
}

absl::StatusOr<SocketAddress> ResolveListenAddress(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* info = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &info);
  if (rc != 0 || info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve listen host \"", host, "\": ", gai_strerror(rc)));
  }
  SocketAddress result;
  std::memcpy(&result.storage, info->ai_addr, info->ai_addrlen);
  result.length = info->ai_addrlen;
  freeaddrinfo(info);
  if (result.storage.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&result.storage)->sin_port = htons(port);
  } else if (result.storage.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&result.storage)->sin6_port = htons(port);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("listen host \"", host, "\" is neither IPv4 nor IPv6"));
  }
  return result;
}

}  // namespace tributary::dataplane
