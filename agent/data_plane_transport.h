// The agent's choice of data-plane transport (--transport auto|tcp|ucx).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tributary::agent {

// DataPlaneRunner::Options::tcp_worker_congestion_control: dataplane::kWorkerCongestionControl in
// place of BBR, where this process may set it.
inline constexpr const char* kAutoWorkerCongestion = "auto";

// Which transport carries the data plane (the agent's --transport).
enum class DataPlaneTransport {
  // TCP when UCX_TLS is unset or names only TCP-family transports (tcp, sockcm, self and the
  // shared-memory ones), UCX otherwise (RDMA): UCX's TCP stack aborts the process on hostile
  // bytes, the TCP transport validates them.
  kAuto,
  kTcp,  // dataplane::TcpTransport
  kUcx,  // dataplane::UcxTransport
};

// "auto", "tcp" or "ucx"; INVALID_ARGUMENT otherwise.
absl::StatusOr<DataPlaneTransport> ParseDataPlaneTransport(std::string_view name);
const char* DataPlaneTransportName(DataPlaneTransport transport);

// What kAuto becomes for this UCX_TLS value (null: unset), with the reason in words; kTcp and
// kUcx stay. Pure, for tests.
struct TransportChoice {
  DataPlaneTransport transport;
  std::string reason;
};
TransportChoice ChooseDataPlaneTransport(DataPlaneTransport requested, const char* ucx_tls);

}  // namespace tributary::agent
