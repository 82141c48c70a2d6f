// The UCX data-plane transport: tensor bytes between agents as UCX active messages.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "dataplane/transport/transport.h"

namespace tributary::dataplane {

struct UcxTransportOptions {
  // Numeric IP (or resolvable name) to listen on; also the host part of Address(), so it must be
  // an address peers can dial (not 0.0.0.0).
  std::string listen_host = "127.0.0.1";
  // TCP port of the listener; 0 picks an ephemeral port (see Address()).
  uint16_t port = 0;
  // How long an outgoing connection may take to be established before its sends fail with
  // UNAVAILABLE.
  std::chrono::milliseconds connect_timeout{5000};
};

// A Transport over UCX (ucp): one context, one worker (UCS_THREAD_MODE_SINGLE), one listener.
//
// Ownership: owns the UCX objects and one progress thread; the worker and every endpoint are
// created, used and destroyed only on that thread. Outgoing endpoints are created on first Send
// to an address and cached per address; an endpoint that fails (peer died, connect timeout) is
// dropped, so a later Send reconnects.
//
// Threading: Send may be called from any thread, including from a receive handler or a send
// completion (then it does not block and does not wait for the progress thread). Receive handlers
// and completions run on the progress thread. The progress thread sleeps in epoll_wait on the
// worker's event fd and an eventfd (new sends, shutdown): an idle transport uses no CPU.
//
// Ordering: messages to one peer address are delivered in Send order (per sending thread), across
// eager and rendezvous sizes, as long as the endpoint lives; a reconnect starts a new stream.
class UcxTransport final : public Transport {
 public:
  // Creates the UCX context, worker and listener and starts the progress thread. Fails with
  // INVALID_ARGUMENT for a bad listen_host, UNAVAILABLE when the port cannot be bound, or the
  // UCX error of the failing call.
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(const UcxTransportOptions& options);

  // Calls Shutdown(). Must not run on the progress thread (i.e. inside a handler or completion).
  ~UcxTransport() override;

  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  // "host:port" with the port actually bound ("[v6addr]:port" for IPv6).
  std::string Address() const override;
  void SetReceiveHandler(ReceiveHandler handler) override;
  // `peer_address` must be "ipv4:port" or "[ipv6]:port" with a numeric host; anything else
  // completes with INVALID_ARGUMENT, as does a header over kMaxHeaderBytes. A peer that cannot be
  // reached completes with UNAVAILABLE within connect_timeout.
  void Send(const std::string& peer_address, std::span<const std::byte> header,
            std::span<const std::byte> payload, SendCallback done) override;
  // Joins the progress thread, so it should not be called from a receive handler or completion;
  // there it only requests the stop, and a later call from another thread (or the destructor)
  // finishes it.
  void Shutdown() override;

 private:
  class Impl;
  explicit UcxTransport(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace tributary::dataplane
