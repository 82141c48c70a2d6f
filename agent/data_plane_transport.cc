#include "agent/data_plane_transport.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tributary::agent {
namespace {

// UCX_TLS entries that carry no RDMA: TCP, its connection manager, loopback and shared memory.
bool IsTcpFamily(absl::string_view tl) {
  for (absl::string_view name :
       {"tcp", "sockcm", "tcp_sockcm", "self", "sm", "shm", "posix", "sysv", "cma"}) {
    if (tl == name) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<DataPlaneTransport> ParseDataPlaneTransport(std::string_view name) {
  if (name == "auto") return DataPlaneTransport::kAuto;
  if (name == "tcp") return DataPlaneTransport::kTcp;
  if (name == "ucx") return DataPlaneTransport::kUcx;
  return absl::InvalidArgumentError(absl::StrCat("unknown data-plane transport \"",
                                                 absl::string_view(name.data(), name.size()),
                                                 "\" (want auto, tcp or ucx)"));
}

const char* DataPlaneTransportName(DataPlaneTransport transport) {
  switch (transport) {
    case DataPlaneTransport::kAuto:
      return "auto";
    case DataPlaneTransport::kTcp:
      return "tcp";
    case DataPlaneTransport::kUcx:
      return "ucx";
  }
  return "?";
}

TransportChoice ChooseDataPlaneTransport(DataPlaneTransport requested, const char* ucx_tls) {
  if (requested != DataPlaneTransport::kAuto) {
    return {requested, absl::StrCat("--transport ", DataPlaneTransportName(requested))};
  }
  if (ucx_tls == nullptr || std::string_view(ucx_tls).empty()) {
    return {DataPlaneTransport::kTcp, "--transport auto and UCX_TLS unset"};
  }
  const std::string tls = absl::AsciiStrToLower(ucx_tls);
  // "^x,y" excludes transports, so it allows RDMA ones; "all" allows everything.
  bool tcp_only = tls.front() != '^';
  for (absl::string_view tl : absl::StrSplit(tls, ',', absl::SkipWhitespace())) {
    tcp_only &= IsTcpFamily(absl::StripAsciiWhitespace(tl));
  }
  if (tcp_only) {
    return {DataPlaneTransport::kTcp,
            absl::StrCat("--transport auto and UCX_TLS=", ucx_tls, " names only TCP-family ones")};
  }
  return {DataPlaneTransport::kUcx,
          absl::StrCat("--transport auto and UCX_TLS=", ucx_tls, " allows RDMA transports")};
}

}  // namespace tributary::agent
