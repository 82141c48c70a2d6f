// The data plane's message transport: tensor bytes between agents, nothing else.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>

#include "absl/status/status.h"

namespace tributary::dataplane {

// A reliable, ordered-per-peer, message-oriented transport between data-plane endpoints.
// A message is a small header (<= kMaxHeaderBytes) plus a payload of any size.
//
// Threading: each transport owns one progress thread. Receive handlers and send completions run
// on it, so they must be short and must never block; they may call Send (which then does not
// block either). Send may be called from any thread.
class Transport {
 public:
  static constexpr size_t kMaxHeaderBytes = 256;

  // Called for every incoming message. `header` and `payload` are valid only during the call.
  // `from` is the transport-level identity of the sender when known (may be empty); protocol
  // layers must identify peers from their own header fields, not from this.
  using ReceiveHandler =
      std::function<void(std::span<const std::byte> header, std::span<const std::byte> payload)>;
  // Runs exactly once per Send, with OK once the payload may be reused, or with UNAVAILABLE /
  // CANCELLED / INVALID_ARGUMENT naming the peer and the reason.
  using SendCallback = std::function<void(absl::Status)>;

  virtual ~Transport() = default;

  // The address other endpoints pass to Send to reach this one ("host:port" for network
  // transports).
  virtual std::string Address() const = 0;

  // Installs the handler for incoming messages. Call once, before peers start sending.
  virtual void SetReceiveHandler(ReceiveHandler handler) = 0;

  // Sends `header` (copied before return) and `payload` (borrowed: it must stay valid and
  // unchanged until `done` runs) to the endpoint at `peer_address`, connecting on first use.
  virtual void Send(const std::string& peer_address, std::span<const std::byte> header,
                    std::span<const std::byte> payload, SendCallback done) = 0;

  // How many bytes the connection to `peer_address` may hold unsent in the kernel before it
  // takes more (TCP_NOTSENT_LOWAT on TcpTransport): with a small limit a send completes when its
  // bytes are about to leave, so a sender that paces its own flows (push/pull's per-server
  // backlog) sees each one's progress on the wire. Applies to the connection now and to later
  // ones; 0 returns the peer to the transport's default. A hint: the default ignores it
  // (transports without a kernel send queue), wrappers pass it on.
  virtual void SetPeerUnsentLimit(const std::string& peer_address, uint32_t bytes) {
    (void)peer_address;
    (void)bytes;
  }

  // The congestion control of the connection to `peer_address` (TCP_CONGESTION on TcpTransport,
  // e.g. "cubic"): applies to the connection now and to later ones; empty returns the peer to the
  // transport's default. A name the host cannot set is dropped with a warning (the connection
  // runs the default). A hint: the default ignores it (transports without kernel congestion
  // control), wrappers pass it on.
  virtual void SetPeerCongestionControl(const std::string& peer_address, const std::string& name) {
    (void)peer_address;
    (void)name;
  }

  // Stops the progress thread. Pending sends complete with CANCELLED; no handler runs after
  // Shutdown returns. Idempotent.
  virtual void Shutdown() = 0;
};

}  // namespace tributary::dataplane
