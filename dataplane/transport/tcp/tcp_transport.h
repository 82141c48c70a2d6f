// The hardened TCP data-plane transport: tensor bytes between agents as length-prefixed frames
// over plain TCP sockets, every byte from the network validated before it is trusted.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dataplane/transport/transport.h"

namespace tributary::dataplane {

// TcpTransportOptions::notsent_lowat_bytes by default: off. 128 KiB made push/pull's per-server
// backlog bind sooner (ResNet-50 with 4 spares at 125 Mbit/s 1.45x Gloo's ring instead of 1.37x)
// but slowed the ring when the 2-core machine's scheduler left a socket with 8 ms of data
// waiting (64 MiB k = 0: 7.8 s against 7.0 s); 1 MiB was between the two
// (bench/results/push_backlog_125mbit_s24/). Push/pull sets it on the connections to spare
// summation servers alone (SetPeerUnsentLimit), which the ring never uses.
inline constexpr uint32_t kDefaultNotSentLowat = 0;

// TcpTransportOptions::congestion_control by default: the host's (empty). The data plane's
// connections live as long as the agents and carry back-to-back collectives, and BBR (the
// default of many hosts, this one's included) drops such a connection's window to 4 segments for
// at least 200 ms every 10 s to re-measure its minimum RTT (PROBE_RTT). A ring moves at its
// slowest connection's pace, so each probe stalls every rank: at 125 Mbit/s, 16 MiB all-reduces
// on Tributary's ring took either the model's 1.63 s or 1.78 s, run by run, under BBR, and
// 1.62-1.65 s in every run under cubic. But cubic fills the shaped links' queues, and push/pull's
// 56 flows through them came out uneven: with four spares a 64 MiB all-reduce was 1.26-1.43x
// Gloo's ring with spreads of 10-15 % against 1.41x and 1.2-1.3 % under BBR
// (bench/results/congestion_control_ring_s33/). So the host's choice stays the default of every
// connection, and the agent sets cubic per connection where only ring-family collectives run
// (kWorkerCongestionControl, SetPeerCongestionControl).
inline constexpr const char* kDefaultCongestionControl = "";

// The congestion control the agent sets on the connections among the workers of a job whose
// collectives run among its workers alone (DataPlaneNode::SetWorkerCongestionControl; the agent's
// --tcp-congestion-workers auto) in place of BBR, where this process may set it. Cubic has no
// minimum-RTT probe: with it Tributary's ring ran every 16 MiB all-reduce at the model's pace,
// 1.00-1.02x Gloo's ring, where BBR left it at 0.97-0.98x (BENCHMARKS.md, sessions 33 and 34).
// The connections push/pull or spare servers use keep the transport's default.
inline constexpr const char* kWorkerCongestionControl = "cubic";

// Bytes of a congestion control's name with its NUL, at most (Linux's TCP_CA_NAME_MAX).
inline constexpr size_t kTcpCongestionNameMax = 16;

// OK when this process may set `name` as a TCP socket's congestion control (TCP_CONGESTION):
// the kernel has it and, without CAP_NET_ADMIN, net.ipv4.tcp_allowed_congestion_control lists
// it. Otherwise INVALID_ARGUMENT naming the algorithm, why, and what the kernel offers.
absl::Status CheckTcpCongestionControl(const std::string& name);

// The congestion control a new TCP socket of this process runs: the host's (this network
// namespace's net.ipv4.tcp_congestion_control); empty when it cannot be read.
std::string HostTcpCongestionControl();

struct TcpTransportOptions {
  // Numeric IP (or resolvable name) to listen on; also the host part of Address(), so it must be
  // an address peers can dial (not 0.0.0.0).
  std::string listen_host = "127.0.0.1";
  // TCP port of the listener; 0 picks an ephemeral port (see Address()).
  uint16_t port = 0;
  // How long an outgoing connection may take (TCP connect plus the handshake's reply) before its
  // sends fail with UNAVAILABLE.
  std::chrono::milliseconds connect_timeout{5000};
  // How long an accepted connection may take to send its complete handshake before it is closed.
  std::chrono::milliseconds handshake_timeout{5000};
  // How long a connection may go without an answer from its peer's kernel before it fails: sent
  // bytes unacknowledged, a receive window closed, or keepalive probes unanswered on an idle
  // connection (TCP_USER_TIMEOUT and SO_KEEPALIVE, on outgoing and accepted connections). A peer
  // host that is gone, or a peer that stopped reading, then fails the sends queued to it with
  // UNAVAILABLE and releases their payloads, instead of holding them for the kernel's default
  // retransmission limit (net.ipv4.tcp_retries2: about 15 minutes) or for good (a closed window
  // fails at the timeout from Linux 5.11 on). Keepalive counts whole seconds: an idle
  // connection fails at its first unanswered probe past the timeout, not before 2 s. 0 leaves
  // the kernel's defaults; negative is INVALID_ARGUMENT.
  std::chrono::milliseconds peer_timeout{30000};
  // The largest payload a frame may announce, in bytes; larger sends fail with INVALID_ARGUMENT,
  // larger incoming frames close their connection.
  uint64_t max_payload_bytes = uint64_t{1} << 30;
  // Accepted connections that have not completed the handshake, at most; one more closes the
  // oldest of them.
  size_t max_half_open_connections = 64;
  // Bytes read from one connection per readable event before the loop serves the others (epoll
  // is level-triggered, so the rest is reported again); at least 1.
  size_t read_budget_bytes = 8 << 20;
  // Outgoing connections take no more bytes while this many are still unsent in the kernel
  // (TCP_NOTSENT_LOWAT), so that a send's completion means its bytes are about to leave, not
  // that they joined up to 4 MiB queued in the socket: the sender then sees each connection's
  // real progress (push/pull's per-server backlog, PushPullWorker::SetServerBacklog). 0: the
  // kernel's default.
  uint32_t notsent_lowat_bytes = kDefaultNotSentLowat;
  // The congestion control of outgoing connections (TCP_CONGESTION, set before connect; the
  // sender's algorithm is the one that paces a flow). Empty (the default): the host's
  // (net.ipv4.tcp_congestion_control). Create fails with INVALID_ARGUMENT when it cannot be set
  // (CheckTcpCongestionControl).
  std::string congestion_control = kDefaultCongestionControl;
};

// A Transport over TCP: one listening socket, one outgoing connection per peer address (cached),
// incoming connections that only receive. Same contract as UcxTransport (see ../transport.h and
// README.md): Send from any thread; header copied, payload borrowed until `done`; each completion
// exactly once; order per sender; UNAVAILABLE naming the peer on connect timeout or peer death;
// CANCELLED for what is pending at Shutdown, after which no callback runs.
//
// Hostile input: any byte sequence on the listening port or on an accepted connection is
// validated (handshake magic, version and address; frame magic, lengths and sequence) and a
// violation closes only that connection, counts it (rejected_connections(), protocol_errors())
// and logs a warning naming the remote address (rate-limited). Nothing the network sends can
// crash the process or stall other connections.
//
// Threading: one progress thread sleeps in epoll_wait on the listener, the sockets and an eventfd
// (new sends, shutdown); an idle transport uses no CPU. Every socket is non-blocking and touched
// only by that thread.
class TcpTransport final : public Transport {
 public:
  // Binds the listener (SO_REUSEADDR, so a restart on a fixed port does not wait for TIME_WAIT)
  // and starts the progress thread. INVALID_ARGUMENT for a bad listen_host or options,
  // UNAVAILABLE when the port is in use.
  static absl::StatusOr<std::unique_ptr<TcpTransport>> Create(const TcpTransportOptions& options);

  // Calls Shutdown(). Must not run on the progress thread (i.e. inside a handler or completion).
  ~TcpTransport() override;

  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  // "host:port" with the port actually bound ("[v6addr]:port" for IPv6).
  std::string Address() const override;
  void SetReceiveHandler(ReceiveHandler handler) override;
  // `peer_address` must be "ipv4:port" or "[ipv6]:port" with a numeric host; anything else
  // completes with INVALID_ARGUMENT, as does a header over kMaxHeaderBytes or a payload over
  // max_payload_bytes. A peer that cannot be reached completes with UNAVAILABLE within
  // connect_timeout. OK means every byte was handed to the kernel, not that the peer got it.
  void Send(const std::string& peer_address, std::span<const std::byte> header,
            std::span<const std::byte> payload, SendCallback done) override;
  // TCP_NOTSENT_LOWAT of the connection to `peer_address` (0: notsent_lowat_bytes again), set
  // on the progress thread before it posts any send made after this call.
  void SetPeerUnsentLimit(const std::string& peer_address, uint32_t bytes) override;
  // TCP_CONGESTION of the connection to `peer_address` (empty: options.congestion_control again,
  // or the host's default when that is empty), set on the progress thread before it posts any
  // send made after this call, on the open connection and on later ones. A name the socket
  // refuses is dropped with a warning, and the connection runs the default (check names with
  // CheckTcpCongestionControl).
  void SetPeerCongestionControl(const std::string& peer_address, const std::string& name) override;
  // Joins the progress thread, so it should not be called from a receive handler or completion;
  // there it only requests the stop, and a later call from another thread (or the destructor)
  // finishes it.
  void Shutdown() override;

  // Accepted connections closed before completing the handshake: bad handshake bytes, handshake
  // deadline passed, evicted over max_half_open_connections, or closed by the remote end early.
  uint64_t rejected_connections() const;
  // Connections closed for a violation after the handshake: bad frame magic or version, a length
  // over a limit, a wrong sequence number, a frame truncated by EOF, unexpected bytes on an
  // outgoing connection, or a bad handshake reply.
  uint64_t protocol_errors() const;
  // Accepted connections that completed the handshake.
  uint64_t accepted_connections() const;
  // Outgoing connections whose TCP_NOTSENT_LOWAT was set from a SetPeerUnsentLimit, at connect
  // or later.
  uint64_t peer_unsent_limits_applied() const;
  // Outgoing connections that run options.congestion_control (set and read back), at connect.
  uint64_t congestion_controls_applied() const;
  // Outgoing connections whose congestion control was set from a SetPeerCongestionControl (a
  // return to the default included), at connect or later.
  uint64_t peer_congestion_controls_applied() const;

 private:
  class Impl;
  explicit TcpTransport(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace tributary::dataplane
