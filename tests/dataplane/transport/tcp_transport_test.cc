// TcpTransport beyond the Transport contract (transport_contract_test.cc runs that for TCP and
// UCX alike): its options and limits, connection reuse, and hostile bytes over real sockets:
// after each, a real message between two transports still arrives intact and the counters say
// what was rejected.
#include "dataplane/transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "dataplane/transport/tcp/tcp_wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/dataplane/transport/transport_test_util.h"

namespace tributary::dataplane {
namespace {

using namespace transport_testing;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// A blocking client socket for hostile input; every read has a deadline (SO_RCVTIMEO).
class RawClient {
 public:
  explicit RawClient(const std::string& address) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = Loopback(PortOf(address));
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    timeval timeout{.tv_sec = 5, .tv_usec = 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~RawClient() {
    if (fd_ >= 0) close(fd_);
  }
  bool connected() const { return connected_; }
  int fd() const { return fd_; }

  bool Write(std::span<const std::byte> bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }
  // Ends the stream (the server sees EOF) but keeps reading possible.
  void EndOutput() { shutdown(fd_, SHUT_WR); }

  // Reads exactly `size` bytes; empty on EOF, error or the 5 s deadline.
  std::vector<std::byte> Read(size_t size) {
    std::vector<std::byte> bytes(size);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = recv(fd_, bytes.data() + done, size - done, 0);
      if (n <= 0) return {};
      done += static_cast<size_t>(n);
    }
    return bytes;
  }

  // Sends a valid handshake and checks the reply.
  bool Handshake(const std::string& claimed = "127.0.0.1:9") {
    if (!Write(tcp::EncodeHello(claimed))) return false;
    const std::vector<std::byte> ack = Read(tcp::kAckBytes);
    return !ack.empty() && tcp::ParseAck(ack).ok();
  }

  // True once the server closed the connection (EOF or reset) within the 5 s deadline.
  bool WaitClosed() {
    std::byte scratch[4096];
    while (true) {
      const ssize_t n = recv(fd_, scratch, sizeof(scratch), 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET || errno == EPIPE;
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

std::vector<std::byte> Frame(uint32_t header_length, uint64_t payload_length, uint64_t sequence) {
  std::vector<std::byte> bytes(tcp::kFrameHeaderBytes);
  tcp::EncodeFrameHeader(
      {.header_length = header_length, .payload_length = payload_length, .sequence = sequence},
      bytes.data());
  return bytes;
}

std::vector<std::byte> Concat(std::initializer_list<std::vector<std::byte>> parts) {
  std::vector<std::byte> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

std::unique_ptr<TcpTransport> Make(TcpTransportOptions options = {}) {
  absl::StatusOr<std::unique_ptr<TcpTransport>> transport = TcpTransport::Create(options);
  EXPECT_TRUE(transport.ok()) << transport.status();
  return transport.ok() ? *std::move(transport) : nullptr;
}

// "ip:port" of an IPv4 socket address.
std::string AddressText(const sockaddr_in& address) {
  char host[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &address.sin_addr, host, sizeof(host));
  return absl::StrCat(host, ":", ntohs(address.sin_port));
}

// This process's connected IPv4 sockets: descriptor, local and remote "ip:port".
struct OpenSocket {
  int fd;
  std::string local, remote;
};
std::vector<OpenSocket> OpenSockets() {
  std::vector<OpenSocket> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    sockaddr_in local{}, remote{};
    socklen_t local_length = sizeof(local), remote_length = sizeof(remote);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0 ||
        getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &remote_length) != 0 ||
        remote.sin_family != AF_INET) {
      continue;
    }
    found.push_back({fd, AddressText(local), AddressText(remote)});
  }
  return found;
}

// This process's socket connected to `peer` ("127.0.0.1:port"), found by its remote address
// among the open descriptors; -1 when there is none.
int ConnectionTo(const std::string& peer) {
  for (const OpenSocket& s : OpenSockets()) {
    if (s.remote == peer) return s.fd;
  }
  return -1;
}

// TCP_NOTSENT_LOWAT of this process's socket connected to `peer`; -1 when there is none.
int NotSentLowatOfConnectionTo(const std::string& peer) {
  const int fd = ConnectionTo(peer);
  int value = -1;
  socklen_t size = sizeof(value);
  if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &value, &size) != 0) return -1;
  return value;
}

// TCP_CONGESTION of this process's socket connected to `peer`; empty when there is none.
std::string CongestionControlOfConnectionTo(const std::string& peer) {
  const int fd = ConnectionTo(peer);
  char name[kTcpCongestionNameMax] = {};
  socklen_t size = sizeof(name);
  if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &size) != 0) return "";
  return std::string(name, strnlen(name, sizeof(name)));
}

// The host's default congestion control (net.ipv4.tcp_congestion_control).
std::string HostCongestionControl() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_congestion_control");
  std::string name;
  std::getline(in, name);
  return name;
}

// --- Options, limits and connection reuse. ---

TEST(TcpTransportTest, BusyPortFailsCreateAsUnavailable) {
  auto first = Make();
  ASSERT_NE(first, nullptr);
  TcpTransportOptions options;
  options.port = PortOf(first->Address());
  absl::StatusOr<std::unique_ptr<TcpTransport>> second = TcpTransport::Create(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr(std::to_string(options.port)));
}

// Threads of this process named `name` (/proc/self/task/*/comm: what top -H and perf show).
int ThreadsNamed(const std::string& name) {
  int count = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(task.path() / "comm");
    std::string comm;
    if (std::getline(in, comm) && comm == name) ++count;
  }
  return count;
}

TEST(TcpTransportTest, ProgressThreadIsNamed) {
  const int before = ThreadsNamed("trib-tcp");
  auto transport = Make();
  ASSERT_NE(transport, nullptr);
  EXPECT_EQ(ThreadsNamed("trib-tcp"), before + 1);
  transport->Shutdown();
  EXPECT_EQ(ThreadsNamed("trib-tcp"), before);
}

TEST(TcpTransportTest, BadOptionsAreInvalidArgument) {
  TcpTransportOptions options;
  options.listen_host = "no such host.invalid";
  EXPECT_EQ(TcpTransport::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.max_half_open_connections = 0;
  EXPECT_EQ(TcpTransport::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.read_budget_bytes = 0;
  EXPECT_EQ(TcpTransport::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.peer_timeout = std::chrono::milliseconds(-1);
  const absl::Status negative = TcpTransport::Create(options).status();
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.message(), HasSubstr("peer_timeout"));
}

// The descriptors of this process's TCP connections accepted on `listener`'s port.
std::vector<int> ConnectionsAcceptedOn(const std::string& listener) {
  std::vector<int> found;
  for (const OpenSocket& s : OpenSockets()) {
    if (s.local == listener) found.push_back(s.fd);
  }
  return found;
}

struct PeerTimeoutOptions {
  int user_timeout_ms = -1;
  int keepalive = -1;
  int idle_s = -1;
  int interval_s = -1;
  int count = -1;
};

PeerTimeoutOptions PeerTimeoutOf(int fd) {
  PeerTimeoutOptions got;
  socklen_t size = sizeof(int);
  getsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &got.user_timeout_ms, &size);
  size = sizeof(int);
  getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &got.keepalive, &size);
  size = sizeof(int);
  getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &got.idle_s, &size);
  size = sizeof(int);
  getsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &got.interval_s, &size);
  size = sizeof(int);
  getsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &got.count, &size);
  return got;
}

// The peer-timeout options of both ends of a connection between two transports made with
// `options`, after one message: {outgoing, accepted}; empty, with a failure, when they are not
// found.
std::vector<PeerTimeoutOptions> PeerTimeoutsOfBothEnds(const TcpTransportOptions& options) {
  auto a = Make(options);
  auto b = Make(options);
  if (!a || !b) return {};
  Inbox b_inbox;
  StopOnExit stop{a.get(), b.get()};
  b->SetReceiveHandler(b_inbox.Handler());
  EXPECT_TRUE(SendAndWait(*a, b->Address(), Bytes("a"), Pattern(100, 1)).ok());
  EXPECT_TRUE(b_inbox.WaitFor(1));
  const int outgoing = ConnectionTo(b->Address());
  const std::vector<int> accepted = ConnectionsAcceptedOn(b->Address());
  EXPECT_GE(outgoing, 0);
  EXPECT_EQ(accepted.size(), 1u);
  if (outgoing < 0 || accepted.size() != 1) return {};
  return {PeerTimeoutOf(outgoing), PeerTimeoutOf(accepted[0])};
}

// Both ends of a connection carry the peer timeout: TCP_USER_TIMEOUT, and keepalive probes after
// a third of it idle, every sixth, failing at the timeout.
TEST(TcpTransportTest, ConnectionsCarryThePeerTimeout) {
  TcpTransportOptions options;
  options.peer_timeout = std::chrono::milliseconds(30000);
  const std::vector<PeerTimeoutOptions> ends = PeerTimeoutsOfBothEnds(options);
  ASSERT_EQ(ends.size(), 2u);
  for (size_t end = 0; end < ends.size(); ++end) {
    EXPECT_EQ(ends[end].user_timeout_ms, 30000) << "end " << end;
    EXPECT_EQ(ends[end].keepalive, 1) << "end " << end;
    EXPECT_EQ(ends[end].idle_s, 10) << "end " << end;
    EXPECT_EQ(ends[end].interval_s, 5) << "end " << end;
    EXPECT_EQ(ends[end].count, 4) << "end " << end;
  }
}

// peer_timeout 0 leaves the kernel's defaults: no user timeout, no keepalive, at either end.
TEST(TcpTransportTest, PeerTimeoutZeroLeavesTheKernelDefaults) {
  TcpTransportOptions options;
  options.peer_timeout = std::chrono::milliseconds(0);
  const std::vector<PeerTimeoutOptions> ends = PeerTimeoutsOfBothEnds(options);
  ASSERT_EQ(ends.size(), 2u);
  for (size_t end = 0; end < ends.size(); ++end) {
    EXPECT_EQ(ends[end].user_timeout_ms, 0) << "end " << end;
    EXPECT_EQ(ends[end].keepalive, 0) << "end " << end;
  }
}

// A peer that completed the handshake and then stopped reading (a stuck process; a host that is
// gone looks the same to the sender once its bytes go unacknowledged): the send that cannot
// leave fails with UNAVAILABLE naming the peer once the peer timeout passes, instead of holding
// its payload while the kernel probes the closed window for good; the next send reconnects.
TEST(TcpTransportTest, PeerThatStopsReadingFailsTheSendAtThePeerTimeout) {
  TcpTransportOptions options;
  options.peer_timeout = std::chrono::milliseconds(300);
  auto a = Make(options);
  ASSERT_NE(a, nullptr);
  BlackHole stuck;
  Completions completions;
  StopOnExit stop{a.get()};
  // More than the two kernels' buffers hold (send buffer, receive buffer): it cannot complete.
  const std::vector<std::byte> payload = Pattern(64 << 20, 3);
  const auto start = Clock::now();
  a->Send(stuck.address(), Bytes("h"), payload, completions.Callback());
  const int fd = accept(stuck.fd(), nullptr, nullptr);
  ASSERT_GE(fd, 0);
  const std::vector<std::byte> ack = tcp::EncodeAck();
  ASSERT_EQ(send(fd, ack.data(), ack.size(), MSG_NOSIGNAL), static_cast<ssize_t>(ack.size()));
  // Never read: the window closes, the kernel probes it, and the peer timeout ends it.
  ASSERT_TRUE(completions.WaitFor(1, std::chrono::seconds(20)));
  const absl::Status status = completions.Statuses()[0];
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr(stuck.address()));
  EXPECT_THAT(status.message(), HasSubstr("peer timeout of 300 ms"));
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(300));
  close(fd);
}

TEST(TcpTransportTest, OneConnectionPerDirectionIsReused) {
  auto a = Make();
  auto b = Make();
  ASSERT_TRUE(a && b);
  Inbox a_inbox, b_inbox;
  StopOnExit stop{a.get(), b.get()};
  a->SetReceiveHandler(a_inbox.Handler());
  b->SetReceiveHandler(b_inbox.Handler());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(SendAndWait(*a, b->Address(), Bytes("a"), Pattern(100 << i, i)).ok());
    ASSERT_TRUE(SendAndWait(*b, a->Address(), Bytes("b"), Pattern(100 << i, i)).ok());
  }
  ASSERT_TRUE(a_inbox.WaitFor(5));
  ASSERT_TRUE(b_inbox.WaitFor(5));
  EXPECT_EQ(a->protocol_errors() + b->protocol_errors(), 0u);
  EXPECT_EQ(a->rejected_connections() + b->rejected_connections(), 0u);
  EXPECT_EQ(a->accepted_connections(), 1u);
  EXPECT_EQ(b->accepted_connections(), 1u);
}

TEST(TcpTransportTest, SixtyFourMebibyteMessageArrivesIntact) {
  auto a = Make();
  auto b = Make();
  ASSERT_TRUE(a && b);
  std::promise<bool> intact;
  const std::vector<std::byte> payload = Pattern(64 << 20, 64);
  b->SetReceiveHandler([&](std::span<const std::byte> header, std::span<const std::byte> data) {
    intact.set_value(Text(header) == "big" &&
                     std::equal(data.begin(), data.end(), payload.begin(), payload.end()));
  });
  StopOnExit stop{a.get(), b.get()};
  ASSERT_TRUE(SendAndWait(*a, b->Address(), Bytes("big"), payload).ok());
  std::future<bool> result = intact.get_future();
  ASSERT_EQ(result.wait_for(kWait), std::future_status::ready);
  EXPECT_TRUE(result.get());
}

// With TCP_NOTSENT_LOWAT (notsent_lowat_bytes) the socket takes at most that much unsent at a
// time: a large message and many small ones still arrive intact and in order, each send
// completing once.
TEST(TcpTransportTest, NotSentLowatKeepsMessagesIntactAndInOrder) {
  TcpTransportOptions options;
  options.notsent_lowat_bytes = 16 << 10;
  auto a = Make(options);
  auto b = Make();
  ASSERT_TRUE(a && b);
  Inbox inbox;
  b->SetReceiveHandler(inbox.Handler());
  StopOnExit stop{a.get(), b.get()};
  std::vector<std::vector<std::byte>> payloads;
  for (int i = 0; i < 20; ++i) payloads.push_back(Pattern(i == 0 ? 8 << 20 : 1000 * i, i));
  std::vector<std::promise<absl::Status>> done(payloads.size());
  for (size_t i = 0; i < payloads.size(); ++i) {
    a->Send(b->Address(), Bytes(std::to_string(i)), payloads[i],
            [&done, i](absl::Status s) { done[i].set_value(s); });
  }
  for (auto& d : done) {
    std::future<absl::Status> f = d.get_future();
    ASSERT_EQ(f.wait_for(kWait), std::future_status::ready);
    EXPECT_TRUE(f.get().ok());
  }
  ASSERT_TRUE(inbox.WaitFor(payloads.size()));
  const std::vector<Message> got = inbox.Take();
  ASSERT_EQ(got.size(), payloads.size());
  for (size_t i = 0; i < payloads.size(); ++i) {
    EXPECT_EQ(Text(got[i].header), std::to_string(i));
    EXPECT_TRUE(got[i].payload == payloads[i]) << "message " << i;
  }
}

// SetPeerUnsentLimit sets TCP_NOTSENT_LOWAT on the connection to that peer only: on the open
// one (before any send made after the call), on one opened later, and back to the options'
// value with 0; the connections to other peers keep the options' value.
TEST(TcpTransportTest, PeerUnsentLimitsApplyToThatPeersConnectionOnly) {
  TcpTransportOptions options;
  options.notsent_lowat_bytes = 64 << 10;
  auto a = Make(options);
  auto b = Make();
  auto c = Make();
  auto d = Make();
  ASSERT_TRUE(a && b && c && d);
  Inbox inbox;
  for (TcpTransport* t : {b.get(), c.get(), d.get()}) t->SetReceiveHandler(inbox.Handler());
  StopOnExit stop{a.get(), b.get(), c.get(), d.get()};
  const std::vector<std::byte> payload = Pattern(1000, 1);
  ASSERT_TRUE(SendAndWait(*a, b->Address(), Bytes("1"), payload).ok());
  EXPECT_EQ(NotSentLowatOfConnectionTo(b->Address()), 64 << 10);

  a->SetPeerUnsentLimit(b->Address(), 16 << 10);
  a->SetPeerUnsentLimit(c->Address(), 32 << 10);
  ASSERT_TRUE(SendAndWait(*a, b->Address(), Bytes("2"), payload).ok());
  EXPECT_EQ(NotSentLowatOfConnectionTo(b->Address()), 16 << 10);
  ASSERT_TRUE(SendAndWait(*a, c->Address(), Bytes("3"), payload).ok());
  EXPECT_EQ(NotSentLowatOfConnectionTo(c->Address()), 32 << 10);
  ASSERT_TRUE(SendAndWait(*a, d->Address(), Bytes("4"), payload).ok());
  EXPECT_EQ(NotSentLowatOfConnectionTo(d->Address()), 64 << 10);
  EXPECT_EQ(a->peer_unsent_limits_applied(), 2u);

  a->SetPeerUnsentLimit(b->Address(), 0);
  ASSERT_TRUE(SendAndWait(*a, b->Address(), Bytes("5"), payload).ok());
  EXPECT_EQ(NotSentLowatOfConnectionTo(b->Address()), 64 << 10);
  EXPECT_EQ(a->peer_unsent_limits_applied(), 3u);
  ASSERT_TRUE(inbox.WaitFor(5));
  for (const Message& m : inbox.Take()) EXPECT_TRUE(m.payload == payload);
}

// The connections a transport opens run options.congestion_control (empty, the default: the
// host's); the connections it accepts are not its to pace.
TEST(TcpTransportTest, CongestionControlIsSetOnTheConnectionsItOpens) {
  TcpTransportOptions reno;
  reno.congestion_control = "reno";  // in every kernel, and allowed to everyone
  auto a = Make(reno);
  auto b = Make();
  auto c = Make(reno);
  ASSERT_TRUE(a && b && c);
  Inbox inbox;
  for (TcpTransport* t : {a.get(), b.get(), c.get()}) t->SetReceiveHandler(inbox.Handler());
  StopOnExit stop{a.get(), b.get(), c.get()};
  const std::vector<std::byte> payload = Pattern(1 << 20, 3);
  ASSERT_TRUE(SendAndWait(*a, b->Address(), Bytes("a"), payload).ok());
  ASSERT_TRUE(SendAndWait(*b, c->Address(), Bytes("b"), payload).ok());
  ASSERT_TRUE(SendAndWait(*c, a->Address(), Bytes("c"), payload).ok());
  EXPECT_EQ(CongestionControlOfConnectionTo(b->Address()), "reno");
  EXPECT_EQ(CongestionControlOfConnectionTo(c->Address()), HostCongestionControl());
  EXPECT_EQ(CongestionControlOfConnectionTo(a->Address()), "reno");
  EXPECT_EQ(a->congestion_controls_applied(), 1u);
  EXPECT_EQ(b->congestion_controls_applied(), 0u);
  EXPECT_EQ(c->congestion_controls_applied(), 1u);
  ASSERT_TRUE(inbox.WaitFor(3));
  for (const Message& m : inbox.Take()) EXPECT_TRUE(m.payload == payload);
}

// SetPeerCongestionControl sets TCP_CONGESTION on the connection to that peer only: on the open
// one (before any send made after the call), on one opened later, and back to the host's with an
// empty name; the connections to other peers keep the host's.
TEST(TcpTransportTest, PeerCongestionControlAppliesToThatPeersConnectionOnly) {
  if (HostCongestionControl() == "reno")
    GTEST_SKIP() << "the host runs reno: nothing to tell apart";
  auto a = Make();
  auto b = Make();
  auto c = Make();
  auto d = Make();
  ASSERT_TRUE(a && b && c && d);
  Inbox inbox;
  for (TcpTransport* t : {b.get(), c.get(), d.get()}) t->SetReceiveHandler(inbox.Handler());
  StopOnExit stop{a.get(), b.get(), c.get(), d.get()};
  const std::vector<std::byte> payload = Pattern(1000, 1);
  ASSERT_TRUE(SendAndWait(*a, b->Address(), Bytes("1"), payload).ok());
  EXPECT_EQ(HostTcpCongestionControl(), HostCongestionControl());
  EXPECT_EQ(CongestionControlOfConnectionTo(b->Address()), HostCongestionControl());

  a->SetPeerCongestionControl(b->Address(), "reno");  // in every kernel, allowed to everyone
  a->SetPeerCongestionControl(c->Address(), "reno");
  ASSERT_TRUE(SendAndWait(*a, b->Address(), Bytes("2"), payload).ok());
  EXPECT_EQ(CongestionControlOfConnectionTo(b->Address()), "reno");
  ASSERT_TRUE(SendAndWait(*a, c->Address(), Bytes("3"), payload).ok());
  EXPECT_EQ(CongestionControlOfConnectionTo(c->Address()), "reno");
  ASSERT_TRUE(SendAndWait(*a, d->Address(), Bytes("4"), payload).ok());
  EXPECT_EQ(CongestionControlOfConnectionTo(d->Address()), HostCongestionControl());
  EXPECT_EQ(a->peer_congestion_controls_applied(), 2u);
  EXPECT_EQ(a->congestion_controls_applied(), 0u);

  a->SetPeerCongestionControl(b->Address(), "");
  ASSERT_TRUE(SendAndWait(*a, b->Address(), Bytes("5"), payload).ok());
  EXPECT_EQ(CongestionControlOfConnectionTo(b->Address()), HostCongestionControl());
  EXPECT_EQ(a->peer_congestion_controls_applied(), 3u);

  // A name the kernel lacks is dropped: the open connection and a new one run the default, and
  // the transport keeps serving.
  auto e = Make();
  ASSERT_NE(e, nullptr);
  e->SetReceiveHandler(inbox.Handler());
  StopOnExit stop_e{e.get()};
  a->SetPeerCongestionControl(c->Address(), "nosuchcc");
  a->SetPeerCongestionControl(e->Address(), "nosuchcc");
  ASSERT_TRUE(SendAndWait(*a, c->Address(), Bytes("6"), payload).ok());
  EXPECT_EQ(CongestionControlOfConnectionTo(c->Address()), HostCongestionControl());
  ASSERT_TRUE(SendAndWait(*a, e->Address(), Bytes("7"), payload).ok());
  EXPECT_EQ(CongestionControlOfConnectionTo(e->Address()), HostCongestionControl());
  EXPECT_EQ(a->peer_congestion_controls_applied(), 3u);
  ASSERT_TRUE(inbox.WaitFor(7));
  for (const Message& m : inbox.Take()) EXPECT_TRUE(m.payload == payload);
}

// With options.congestion_control set, a peer's own algorithm goes back to the options' (not the
// host's) when taken away, and a refused name leaves its new connection on the options'.
TEST(TcpTransportTest, PeerCongestionControlReturnsToTheOptions) {
  const std::string host = HostCongestionControl();
  if (host == "reno") GTEST_SKIP() << "the host runs reno: nothing to tell apart";
  TcpTransportOptions reno;
  reno.congestion_control = "reno";
  auto a = Make(reno);
  auto b = Make();
  auto c = Make();
  ASSERT_TRUE(a && b && c);
  Inbox inbox;
  for (TcpTransport* t : {b.get(), c.get()}) t->SetReceiveHandler(inbox.Handler());
  StopOnExit stop{a.get(), b.get(), c.get()};
  const std::vector<std::byte> payload = Pattern(1000, 2);
  a->SetPeerCongestionControl(b->Address(), host);  // the host's default: allowed to everyone
  a->SetPeerCongestionControl(c->Address(), "nosuchcc");
  ASSERT_TRUE(SendAndWait(*a, b->Address(), Bytes("1"), payload).ok());
  ASSERT_TRUE(SendAndWait(*a, c->Address(), Bytes("2"), payload).ok());
  EXPECT_EQ(CongestionControlOfConnectionTo(b->Address()), host);
  EXPECT_EQ(CongestionControlOfConnectionTo(c->Address()), "reno");
  EXPECT_EQ(a->peer_congestion_controls_applied(), 1u);
  EXPECT_EQ(a->congestion_controls_applied(), 1u);  // c's, at connect

  a->SetPeerCongestionControl(b->Address(), "");
  ASSERT_TRUE(SendAndWait(*a, b->Address(), Bytes("3"), payload).ok());
  EXPECT_EQ(CongestionControlOfConnectionTo(b->Address()), "reno");
  EXPECT_EQ(a->peer_congestion_controls_applied(), 2u);
  ASSERT_TRUE(inbox.WaitFor(3));
  for (const Message& m : inbox.Take()) EXPECT_TRUE(m.payload == payload);
}

// A congestion control the kernel lacks fails Create with a message naming it and what the
// kernel has; so does a name too long to be one.
TEST(TcpTransportTest, UnknownCongestionControlIsInvalidArgument) {
  TcpTransportOptions options;
  options.congestion_control = "nosuchcc";
  absl::Status status = TcpTransport::Create(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("'nosuchcc' cannot be used"));
  EXPECT_EQ(CheckTcpCongestionControl("nosuchcc").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckTcpCongestionControl(std::string(kTcpCongestionNameMax, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckTcpCongestionControl(std::string("reno\0x", 6)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckTcpCongestionControl("reno").ok());
}

TEST(TcpTransportTest, PayloadOverTheLimitIsInvalidArgument) {
  TcpTransportOptions options;
  options.max_payload_bytes = 1000;
  auto a = Make(options);
  auto b = Make(options);
  ASSERT_TRUE(a && b);
  Inbox inbox;
  StopOnExit stop{a.get(), b.get()};
  b->SetReceiveHandler(inbox.Handler());
  absl::Status status = SendAndWait(*a, b->Address(), Bytes("h"), Pattern(1001, 1));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("1000"));
  ASSERT_TRUE(SendAndWait(*a, b->Address(), Bytes("h"), Pattern(1000, 1)).ok());
  ASSERT_TRUE(inbox.WaitFor(1));
  EXPECT_TRUE(inbox.Take()[0].payload == Pattern(1000, 1));
}

TEST(TcpTransportTest, ListenerThatRepliesGarbageFailsTheSendAndCountsIt) {
  auto a = Make();
  ASSERT_NE(a, nullptr);
  BlackHole evil;
  Completions completions;
  StopOnExit stop{a.get()};
  const std::vector<std::byte> payload = Pattern(10, 1);
  a->Send(evil.address(), Bytes("h"), payload, completions.Callback());
  const int fd = accept(evil.fd(), nullptr, nullptr);
  ASSERT_GE(fd, 0);
  const std::vector<std::byte> garbage(tcp::kAckBytes, std::byte{0xff});
  ASSERT_EQ(send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL), 10);
  ASSERT_TRUE(completions.WaitFor(1));
  const absl::Status status = completions.Statuses()[0];
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr(evil.address()));
  EXPECT_THAT(status.message(), HasSubstr("handshake reply"));
  EXPECT_EQ(a->protocol_errors(), 1u);
  close(fd);
}

// --- Hostile input on the listening port, over real sockets. ---

class TcpHostileInputTest : public ::testing::Test {
 protected:
  void Start(TcpTransportOptions options = {}) {
    target_ = Make(options);
    sender_ = Make();
    ASSERT_TRUE(target_ && sender_);
    target_->SetReceiveHandler(inbox_.Handler());
  }

  void TearDown() override {
    if (sender_) sender_->Shutdown();
    if (target_) target_->Shutdown();
  }

  // A real message from another transport still arrives intact.
  void ExpectHealthy() {
    const std::vector<std::byte> payload = Pattern(100 << 10, ++healthy_checks_);
    const std::vector<std::byte> header = Bytes("healthy " + std::to_string(healthy_checks_));
    ASSERT_TRUE(SendAndWait(*sender_, target_->Address(), header, payload).ok());
    ASSERT_TRUE(inbox_.WaitFor(1));
    std::vector<Message> messages = inbox_.Take();
    ASSERT_EQ(messages.size(), 1u);
    EXPECT_EQ(Text(messages[0].header), Text(header));
    EXPECT_TRUE(messages[0].payload == payload);
  }

  // Sends `bytes` on a fresh connection (after a valid handshake when asked), ends the stream
  // and waits for the target to close the connection.
  void SendAndExpectClosed(std::span<const std::byte> bytes, bool handshake = false) {
    RawClient client(target_->Address());
    ASSERT_TRUE(client.connected());
    if (handshake) {
      ASSERT_TRUE(client.Handshake());
    }
    client.Write(bytes);  // The target may close before it has read everything.
    client.EndOutput();
    ASSERT_TRUE(client.WaitClosed()) << "the target did not close the connection";
  }

  // Frames below, at and above the size that fits the receive buffer (256 KiB with the frame
  // header), written in pieces of every size from 1 byte to 64 KiB (fixed seed), so that the
  // target sees frames cut anywhere: in the frame header, in the header, in the payload, across
  // the end of its buffer. Every frame must arrive whole, in order, exactly once.
  void SendFramesInPiecesAndExpectThemWhole() {
    RawClient client(target_->Address());
    ASSERT_TRUE(client.connected());
    const int one = 1;
    setsockopt(client.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ASSERT_TRUE(client.Handshake());
    const uint64_t fits = (256 << 10) - tcp::kFrameHeaderBytes - 2;  // 2-byte headers below.
    // The last frame is large: its rest is read straight into its own buffer, so with a tiny
    // budget most of its wake-ups end on the budget with bytes still queued.
    const std::vector<uint64_t> sizes = {0,    5,      9000, 65536,    100000, 100000,   100000,
                                         fits, 300000, 7,    fits - 1, 65536,  fits + 1, 1 << 20};
    std::vector<std::byte> stream;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::string header = "f" + std::to_string(i % 10);
      stream = Concat({stream, Frame(2, sizes[i], i), Bytes(header), Pattern(sizes[i], i + 1)});
    }
    std::mt19937 random(1234);
    for (size_t done = 0; done < stream.size();) {
      // Mostly small pieces at first (1..16 bytes), then up to 64 KiB.
      const size_t most = done < 4096 ? 16 : 65536;
      const size_t piece = std::min<size_t>(stream.size() - done,
                                            std::uniform_int_distribution<size_t>(1, most)(random));
      ASSERT_TRUE(client.Write(std::span(stream).subspan(done, piece)));
      done += piece;
    }
    ASSERT_TRUE(inbox_.WaitFor(sizes.size()));
    std::vector<Message> messages = inbox_.Take();
    ASSERT_EQ(messages.size(), sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      SCOPED_TRACE(i);
      EXPECT_EQ(Text(messages[i].header), "f" + std::to_string(i % 10));
      EXPECT_TRUE(messages[i].payload == Pattern(sizes[i], i + 1));
    }
    client.EndOutput();
    ASSERT_TRUE(client.WaitClosed());
    EXPECT_EQ(target_->protocol_errors(), 0u);
    ExpectHealthy();
  }

  std::unique_ptr<TcpTransport> target_;
  std::unique_ptr<TcpTransport> sender_;
  Inbox inbox_;
  uint32_t healthy_checks_ = 0;
};

TEST_F(TcpHostileInputTest, SixteenBytesOfFfAreRejected) {
  Start();
  RawClient client(target_->Address());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.Write(std::vector<std::byte>(16, std::byte{0xff})));
  // No EndOutput: the target must close on the bad magic alone.
  ASSERT_TRUE(client.WaitClosed());
  EXPECT_EQ(target_->rejected_connections(), 1u);
  EXPECT_EQ(target_->protocol_errors(), 0u);
  ExpectHealthy();
}

TEST_F(TcpHostileInputTest, ZerosTextAndBadHandshakesAreRejected) {
  Start();
  std::vector<std::vector<std::byte>> inputs = {
      std::vector<std::byte>(4096, std::byte{0}),
      Bytes("GET / HTTP/1.1\r\nHost: agent\r\n\r\n"),
      Bytes("SSH-2.0-OpenSSH_9.2\r\n"),
  };
  std::vector<std::byte> wrong_version = tcp::EncodeHello("127.0.0.1:9");
  wrong_version[8] = std::byte{2};
  inputs.push_back(wrong_version);
  std::vector<std::byte> long_address = tcp::EncodeHello("127.0.0.1:9");
  long_address[10] = std::byte{0xff};  // Announces 255 bytes of address.
  inputs.push_back(long_address);
  inputs.push_back(tcp::EncodeHello("localhost:80"));  // Not numeric.
  inputs.push_back(tcp::EncodeHello("127.0.0.1:0"));
  std::vector<std::byte> control = tcp::EncodeHello("127.0.0.1:99");
  control.back() = std::byte{0};  // A NUL inside the address.
  inputs.push_back(control);
  const std::vector<std::byte> hello = tcp::EncodeHello("127.0.0.1:9");
  inputs.push_back({hello.begin(), hello.begin() + 6});  // Truncated handshake.
  for (size_t i = 0; i < inputs.size(); ++i) {
    SCOPED_TRACE(i);
    SendAndExpectClosed(inputs[i]);
    EXPECT_EQ(target_->rejected_connections(), i + 1);
    ExpectHealthy();
  }
  EXPECT_EQ(target_->protocol_errors(), 0u);
  EXPECT_EQ(target_->accepted_connections(), 1u);  // The sender's, reused by every check.
}

TEST_F(TcpHostileInputTest, FramesAfterAValidHandshakeAreValidated) {
  Start();
  const std::vector<std::byte> empty_frame = Frame(0, 0, 0);
  std::vector<std::byte> bad_version = empty_frame;
  bad_version[3] = std::byte{9};
  const std::vector<std::vector<std::byte>> inputs = {
      Bytes("garbage after a valid handshake"),
      Frame(0, uint64_t{1} << 40, 0),               // 2^40 bytes announced
      Frame(Transport::kMaxHeaderBytes + 1, 0, 0),  // header over the limit
      Frame(0, 0, 5),                               // wrong sequence
      bad_version,
      {empty_frame.begin(), empty_frame.begin() + 10},                   // truncated frame header
      Concat({Frame(4, 1000, 0), Bytes("head"), Pattern(500, 1)}),       // truncated payload
      Concat({Frame(4, 1 << 20, 0), Bytes("head"), Pattern(70000, 1)}),  // truncated, direct read
      Concat({Frame(2, 0, 0), Bytes("ok"), Frame(0, 0, 0)}),             // sequence repeated
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    SCOPED_TRACE(i);
    SendAndExpectClosed(inputs[i], /*handshake=*/true);
    EXPECT_EQ(target_->protocol_errors(), i + 1);
    if (i + 1 == inputs.size()) {
      // The valid frame before the violation was delivered, and only it.
      ASSERT_TRUE(inbox_.WaitFor(1));
      std::vector<Message> messages = inbox_.Take();
      ASSERT_EQ(messages.size(), 1u);
      EXPECT_EQ(Text(messages[0].header), "ok");
    }
    ExpectHealthy();  // Also: nothing else reached the handler.
  }
  EXPECT_EQ(target_->rejected_connections(), 0u);
}

TEST_F(TcpHostileInputTest, ValidFramesFromARawClientAreDelivered) {
  // The positive control for the tests above: the raw encoder speaks the protocol.
  Start();
  RawClient client(target_->Address());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.Handshake());
  const std::vector<std::byte> payload = Pattern(300000, 7);
  ASSERT_TRUE(client.Write(Concat({Frame(3, 5, 0), Bytes("one"), Pattern(5, 1),
                                   Frame(3, payload.size(), 1), Bytes("two"), payload})));
  ASSERT_TRUE(inbox_.WaitFor(2));
  std::vector<Message> messages = inbox_.Take();
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(Text(messages[0].header), "one");
  EXPECT_TRUE(messages[0].payload == Pattern(5, 1));
  EXPECT_EQ(Text(messages[1].header), "two");
  EXPECT_TRUE(messages[1].payload == payload);
  client.EndOutput();
  ASSERT_TRUE(client.WaitClosed());
  EXPECT_EQ(target_->protocol_errors(), 0u);
  EXPECT_EQ(target_->rejected_connections(), 0u);
}

TEST_F(TcpHostileInputTest, FramesArrivingInPiecesAreAssembledIntact) {
  Start();
  SendFramesInPiecesAndExpectThemWhole();
}

TEST_F(TcpHostileInputTest, FramesArrivingInPiecesAreAssembledIntactWithATinyReadBudget) {
  // Most wake-ups now end on the budget rather than on an empty socket: the receive low-water
  // mark must still follow the frame (a stale mark above a frame's rest stalled it for good).
  TcpTransportOptions options;
  options.read_budget_bytes = 3000;
  Start(options);
  SendFramesInPiecesAndExpectThemWhole();
  // Large frames written whole: the writer outruns the reader, whose wake-ups read 3000 bytes
  // each with the rest already queued.
  RawClient client(target_->Address());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.Handshake());
  for (uint64_t i = 0; i < 8; ++i) {
    const std::vector<std::byte> payload = Pattern((1 << 20) + i * 40000, 100 + i);
    ASSERT_TRUE(client.Write(
        Concat({Frame(2, payload.size(), i), Bytes("L" + std::to_string(i)), payload})));
    ASSERT_TRUE(inbox_.WaitFor(1)) << "frame " << i << " did not arrive";
    std::vector<Message> messages = inbox_.Take();
    ASSERT_EQ(messages.size(), 1u);
    EXPECT_EQ(Text(messages[0].header), "L" + std::to_string(i));
    EXPECT_TRUE(messages[0].payload == payload);
  }
}

TEST_F(TcpHostileInputTest, SlowHandshakeIsClosedAtItsDeadline) {
  TcpTransportOptions options;
  options.handshake_timeout = 200ms;
  Start(options);
  const Clock::time_point start = Clock::now();
  RawClient client(target_->Address());
  ASSERT_TRUE(client.connected());
  const std::vector<std::byte> hello = tcp::EncodeHello("127.0.0.1:9");
  ASSERT_TRUE(client.Write(std::span(hello).first(5)));
  ASSERT_TRUE(client.WaitClosed());  // Never finishes the handshake; waits on the target.
  EXPECT_GE(Clock::now() - start, 200ms);
  EXPECT_EQ(target_->rejected_connections(), 1u);
  ExpectHealthy();
}

TEST_F(TcpHostileInputTest, HundredsOfHeldConnectionsDoNotLockOutPeers) {
  TcpTransportOptions options;
  options.max_half_open_connections = 16;
  options.handshake_timeout = 60s;  // Only the cap closes connections here.
  Start(options);
  constexpr int kHeld = 300;
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < kHeld; ++i) {
    held.push_back(std::make_unique<RawClient>(target_->Address()));
    ASSERT_TRUE(held.back()->connected()) << i;
  }
  // The target keeps the newest 16 and closes the others: wait (poll, with a deadline) until
  // the clients see those closes.
  const Clock::time_point deadline = Clock::now() + kWait;
  int closed = 0;
  while (closed < kHeld - 16 && Clock::now() < deadline) {
    std::vector<pollfd> fds;
    for (const auto& client : held)
      fds.push_back({.fd = client->fd(), .events = POLLIN, .revents = 0});
    ASSERT_GE(poll(fds.data(), fds.size(), 100), 0);
    closed = 0;
    for (const pollfd& fd : fds) closed += (fd.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
  }
  EXPECT_EQ(closed, kHeld - 16);
  EXPECT_EQ(target_->rejected_connections(), static_cast<uint64_t>(kHeld - 16));
  ExpectHealthy();
  EXPECT_EQ(target_->protocol_errors(), 0u);
}

TEST_F(TcpHostileInputTest, RandomBytesWithAndWithoutAValidHandshake) {
  Start();
  std::mt19937_64 random(20261123);
  constexpr int kStrings = 3000;
  uint64_t expect_rejected = 0;
  uint64_t expect_errors = 0;
  for (int i = 0; i < kStrings; ++i) {
    SCOPED_TRACE(i);
    const bool handshake = random() % 2 == 0;
    // Mostly short strings; some longer than the read buffer's first chunk.
    const size_t length = 1 + (random() % 8 == 0 ? random() % 8192 : random() % 64);
    std::vector<std::byte> bytes(length);
    for (std::byte& b : bytes) b = std::byte(random() & 0xff);
    // Keep a few strings close to valid: a correct frame magic and version in front.
    if (handshake && length >= 4 && random() % 4 == 0) {
      const std::vector<std::byte> frame = Frame(0, 0, 0);
      std::copy(frame.begin(), frame.begin() + 4, bytes.begin());
    }
    SendAndExpectClosed(bytes, handshake);
    if (::testing::Test::HasFatalFailure()) return;
    (handshake ? expect_errors : expect_rejected) += 1;
    if (i % 500 == 499) ExpectHealthy();
  }
  EXPECT_EQ(target_->rejected_connections(), expect_rejected);
  EXPECT_EQ(target_->protocol_errors(), expect_errors);
  EXPECT_EQ(target_->accepted_connections(), expect_errors + 1);  // + the sender's
  ExpectHealthy();
}

// The decoders alone: random headers never pass unless they are valid.
TEST(TcpWireTest, RandomFrameHeadersAndHellosAreRejected) {
  std::mt19937_64 random(7);
  for (int i = 0; i < 100000; ++i) {
    std::byte bytes[tcp::kHelloFixedBytes + tcp::kMaxAddressBytes];
    for (std::byte& b : bytes) b = std::byte(random() & 0xff);
    EXPECT_FALSE(tcp::ParseFrameHeader(std::span(bytes, tcp::kFrameHeaderBytes), 1 << 30, 0).ok());
    EXPECT_FALSE(tcp::ParseHelloFixed(std::span(bytes, tcp::kHelloFixedBytes)).ok());
    EXPECT_FALSE(tcp::ParseHelloAddress(std::span(bytes, 1 + random() % 64)).ok());
  }
  const std::vector<std::byte> frame = Frame(7, 99, 3);
  absl::StatusOr<tcp::FrameHeader> parsed = tcp::ParseFrameHeader(frame, 99, 3);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->header_length, 7u);
  EXPECT_EQ(parsed->payload_length, 99u);
  EXPECT_FALSE(tcp::ParseFrameHeader(frame, 98, 3).ok());
  EXPECT_FALSE(tcp::ParseFrameHeader(frame, 99, 4).ok());
}

}  // namespace
}  // namespace tributary::dataplane
