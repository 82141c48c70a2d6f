#include "dataplane/transport/tcp/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "dataplane/transport/send_queue.h"
#include "dataplane/transport/socket_address.h"
#include "dataplane/transport/tcp/tcp_wire.h"

namespace tributary::dataplane {
namespace {

using Clock = std::chrono::steady_clock;
using tcp::FrameHeader;
using tcp::kAckBytes;
using tcp::kFrameHeaderBytes;
using tcp::kHelloFixedBytes;
using tcp::kMaxAddressBytes;

constexpr auto Log = common::ComponentLog<"transport">;

// epoll user data of the two fixed descriptors; connections get ids from kFirstConnectionId on.
constexpr uint64_t kWakeId = 0;
constexpr uint64_t kListenerId = 1;
constexpr uint64_t kFirstConnectionId = 2;

// Each accepted connection reads through a buffer of this size. A frame that fits in it is
// assembled there and handed to the handler straight from it; a larger frame's payload gets a
// buffer of its own, and is read straight into it while at least kDirectReadBytes are still to
// come.
constexpr size_t kReadBufferBytes = 256 << 10;
constexpr size_t kDirectReadBytes = 64 << 10;
// While a frame is partly received, the socket's SO_RCVLOWAT asks the kernel to report the
// connection readable only once the rest of the frame (at most this much) has arrived: one
// wake-up per frame instead of one per few segments (a 64 KiB chunk arriving in 9000-byte
// segments at a fraction of a link woke the progress thread about four times). Kept small: where
// the mark needs a larger receive buffer than the socket has, Linux grows the buffer and clamps
// the advertised window to the mark.
constexpr size_t kMaxReceiveLowWaterBytes = 128 << 10;
// Connections accepted per readable event of the listener.
constexpr int kAcceptBudget = 256;
// iovecs per sendmsg (IOV_MAX is 1024 on Linux).
constexpr int kMaxIov = 512;
// When accept fails for lack of descriptors or memory, the listener rests this long (epoll is
// level-triggered: without the pause the loop would spin on the pending connection).
constexpr std::chrono::milliseconds kAcceptPause{100};
// Warnings about connections (hostile input) per window, then a count of the suppressed ones.
constexpr int kWarningsPerWindow = 20;
constexpr std::chrono::seconds kWarningWindow{10};

std::string ErrnoText(int error) { return std::strerror(error); }

absl::Status ErrnoStatus(absl::string_view call, int error) {
  return absl::InternalError(absl::StrCat(call, ": ", ErrnoText(error)));
}

void SetNoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// TCP_USER_TIMEOUT and keepalive for `timeout` (see TcpTransportOptions::peer_timeout): probes
// after a third of it idle, then every sixth of it (whole seconds, at least one each); the
// connection fails once `timeout` passed without an answer (for an idle one, at the first
// unanswered probe past it: with TCP_USER_TIMEOUT set, Linux ignores TCP_KEEPCNT, which is set
// for kernels that do not). 0 leaves the kernel's defaults.
void SetPeerTimeout(int fd, std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) return;
  const int user_timeout = static_cast<int>(std::min<int64_t>(timeout.count(), INT32_MAX));
  const int seconds = static_cast<int>(std::min<int64_t>(timeout.count() / 1000, 32767));
  const int idle = std::max(1, seconds / 3);
  const int interval = std::max(1, seconds / 6);
  const int count = std::max(1, (seconds - idle) / interval);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

// TCP_NOTSENT_LOWAT: the socket takes no more bytes while this many are still unsent. 0 is the
// system's default (net.ipv4.tcp_notsent_lowat: a send buffer of up to tcp_wmem's 4 MiB), also on
// a socket that had a limit before.
void SetNotSentLowat(int fd, uint32_t bytes) {
  const int value = static_cast<int>(std::min<uint32_t>(bytes, INT32_MAX));
  setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &value, sizeof(value));
}

// TCP_CONGESTION on `fd`: empty when the socket reads back `name`, else why not.
std::string SetCongestionControl(int fd, const std::string& name) {
  if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(),
                 static_cast<socklen_t>(name.size())) != 0) {
    return absl::StrCat("setting it failed: ", ErrnoText(errno));
  }
  char set[kTcpCongestionNameMax] = {};
  socklen_t length = sizeof(set);
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, set, &length) != 0) {
    return absl::StrCat("reading it back failed: ", ErrnoText(errno));
  }
  std::string got(set, strnlen(set, std::min<size_t>(length, sizeof(set))));
  return got == name ? "" : absl::StrCat("the socket reads back '", got, "'");
}

// A /proc/sys/net/ipv4 list of congestion controls, or "unknown".
std::string ReadCongestionControlList(const char* file) {
  std::ifstream in(absl::StrCat("/proc/sys/net/ipv4/", file));
  std::string list;
  if (!std::getline(in, list) || list.empty()) return "unknown";
  return list;
}

}  // namespace

absl::Status CheckTcpCongestionControl(const std::string& name) {
  if (name.empty() || name.size() >= kTcpCongestionNameMax ||
      name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("TCP congestion control '", name,
                                                   "': a name of 1 to ", kTcpCongestionNameMax - 1,
                                                   " characters, without NUL"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus("socket", errno);
  const int result =
      setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(), static_cast<socklen_t>(name.size()));
  const int error = errno;
  close(fd);
  if (result == 0) return absl::OkStatus();
  std::string why = ErrnoText(error);
  if (error == EPERM) {
    why = absl::StrCat("not in net.ipv4.tcp_allowed_congestion_control (",
                       ReadCongestionControlList("tcp_allowed_congestion_control"),
                       "), which binds without CAP_NET_ADMIN");
  } else if (error == ENOENT) {
    why = absl::StrCat("this kernel does not have it (net.ipv4.tcp_available_congestion_control: ",
                       ReadCongestionControlList("tcp_available_congestion_control"), ")");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("TCP congestion control '", name, "' cannot be used: ", why));
}

std::string HostTcpCongestionControl() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  char name[kTcpCongestionNameMax] = {};
  socklen_t length = sizeof(name);
  const int result = getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &length);
  close(fd);
  if (result != 0) return "";
  return std::string(name, strnlen(name, std::min<size_t>(length, sizeof(name))));
}

// Everything below "progress thread only" is touched by the progress thread alone (and by
// Teardown on it), so it needs no lock.
class TcpTransport::Impl {
 public:
  explicit Impl(TcpTransportOptions options) : options_(std::move(options)) {}

  ~Impl() {
    Shutdown();
    for (int fd : {listen_fd_, epoll_fd_, event_fd_}) {
      if (fd >= 0) close(fd);
    }
  }

  // Binds and listens on the caller's thread (errors come back directly), then starts the
  // progress thread.
  absl::Status Start() {
    if (options_.max_half_open_connections == 0) {
      return absl::InvalidArgumentError("max_half_open_connections must be at least 1");
    }
    if (options_.read_budget_bytes == 0) {
      return absl::InvalidArgumentError("read_budget_bytes must be at least 1");
    }
    if (options_.peer_timeout.count() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer_timeout must be 0 (the kernel's defaults) or positive, not ",
                       options_.peer_timeout.count(), " ms"));
    }
    if (!options_.congestion_control.empty()) {
      if (absl::Status usable = CheckTcpCongestionControl(options_.congestion_control);
          !usable.ok()) {
        return usable;
      }
    }
    absl::StatusOr<SocketAddress> listen_address =
        ResolveListenAddress(options_.listen_host, options_.port);
    if (!listen_address.ok()) return listen_address.status();
    const std::string where = absl::StrCat(options_.listen_host, ":", options_.port);
    listen_fd_ =
        socket(listen_address->storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) return ErrnoStatus("socket", errno);
    // An agent restarting on its fixed port must not wait for TIME_WAIT sockets to expire; Linux
    // still refuses the bind while another socket listens on the port.
    const int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(listen_fd_, listen_address->get(), listen_address->length) != 0) {
      const int error = errno;
      const std::string message = absl::StrCat("cannot listen on ", where, ": ", ErrnoText(error));
      if (error == EADDRINUSE || error == EADDRNOTAVAIL || error == EACCES) {
        return absl::UnavailableError(message);
      }
      return absl::InternalError(message);
    }
    if (listen(listen_fd_, SOMAXCONN) != 0) return ErrnoStatus("listen", errno);
    SocketAddress bound;
    bound.length = sizeof(bound.storage);
    if (getsockname(listen_fd_, bound.get(), &bound.length) != 0) {
      return ErrnoStatus("getsockname", errno);
    }
    address_ = FormatAddress(bound.get());
    hello_ = tcp::EncodeHello(address_);
    // The host's (this network namespace's) default, which a new socket runs: what a connection
    // returns to when SetPeerCongestionControl takes its own away.
    host_congestion_control_ = HostTcpCongestionControl();

    event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (event_fd_ < 0) return ErrnoStatus("eventfd", errno);
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0) return ErrnoStatus("epoll_create1", errno);
    for (auto [fd, id] : {std::pair{event_fd_, kWakeId}, std::pair{listen_fd_, kListenerId}}) {
      epoll_event event{};
      event.events = EPOLLIN;
      event.data.u64 = id;
      if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) {
        return ErrnoStatus("epoll_ctl", errno);
      }
    }
    Log()->debug("tcp transport listening on {}", address_);
    thread_ = std::thread([this] { Run(); });
    common::SetThreadName(thread_, "trib-tcp");
    return absl::OkStatus();
  }

  const std::string& Address() const { return address_; }

  void SetReceiveHandler(ReceiveHandler handler) { handler_.Set(std::move(handler)); }

  void Send(const std::string& peer_address, std::span<const std::byte> header,
            std::span<const std::byte> payload, SendCallback done) {
    auto op = std::make_unique<SendOp>();
    op->address = peer_address;
    op->payload = payload;
    op->done = std::move(done);
    absl::StatusOr<SocketAddress> parsed = CheckSendTarget(peer_address, header);
    if (!parsed.ok()) {
      op->status = parsed.status();
    } else if (payload.size() > options_.max_payload_bytes) {
      op->status = absl::InvalidArgumentError(absl::StrCat(
          "send to ", peer_address, ": payload of ", payload.size(),
          " bytes exceeds the transport's limit of ", options_.max_payload_bytes, " bytes"));
    } else {
      op->sockaddr = *parsed;
      op->header_length = static_cast<uint32_t>(header.size());
      if (!header.empty()) {
        std::memcpy(op->frame + kFrameHeaderBytes, header.data(), header.size());
      }
    }

    if (std::unique_ptr<SendOp> refused = sends_.Hand(std::move(op), [this] { Wake(); })) {
      Finish(std::move(refused), SendCancelled(peer_address));  // No progress thread is left.
    }
  }

  void SetPeerUnsentLimit(const std::string& peer_address, uint32_t bytes) {
    {
      std::lock_guard lock(peer_settings_mu_);
      pending_limits_[peer_address] = bytes;
      peer_settings_changed_.store(true, std::memory_order_release);
    }
    Wake();
  }

  void SetPeerCongestionControl(const std::string& peer_address, const std::string& name) {
    {
      std::lock_guard lock(peer_settings_mu_);
      pending_congestion_[peer_address] = name;
      peer_settings_changed_.store(true, std::memory_order_release);
    }
    Wake();
  }

  void Shutdown() {
    sends_.RequestStop();
    Wake();
    if (sends_.OnProgressThread()) {
      Log()->warn(
          "tcp transport {}: shutdown called on its progress thread; it stops after the "
          "current callback",
          address_);
      return;
    }
    std::lock_guard lock(join_mu_);
    if (thread_.joinable()) thread_.join();
  }

  uint64_t rejected_connections() const { return rejected_.load(); }
  uint64_t protocol_errors() const { return protocol_errors_.load(); }
  uint64_t accepted_connections() const { return accepted_.load(); }
  uint64_t peer_unsent_limits_applied() const { return limits_applied_.load(); }
  uint64_t congestion_controls_applied() const { return congestion_controls_applied_.load(); }
  uint64_t peer_congestion_controls_applied() const { return peer_congestion_applied_.load(); }

 private:
  // One Send: the frame (frame header + copied user header) and the borrowed payload.
  struct SendOp {
    std::string address;
    SocketAddress sockaddr;
    uint32_t header_length = 0;
    std::byte frame[kFrameHeaderBytes + kMaxHeaderBytes];
    std::span<const std::byte> payload;
    SendCallback done;
    absl::Status status;  // Non-OK: fails without being posted.

    size_t frame_size() const { return kFrameHeaderBytes + header_length; }
    size_t total() const { return frame_size() + payload.size(); }
  };

  // An outgoing connection, cached per peer address while healthy.
  struct Peer {
    enum class State { kConnecting, kAwaitingAck, kConnected };
    uint64_t id = 0;
    std::string address;
    int fd = -1;
    State state = State::kConnecting;
    Clock::time_point connect_deadline;
    size_t hello_sent = 0;
    std::byte ack[kAckBytes];
    size_t ack_received = 0;
    std::deque<std::unique_ptr<SendOp>> queue;  // Wire order; the front may be partly written.
    size_t front_written = 0;
    uint64_t next_sequence = 0;
    bool want_out = false;  // EPOLLOUT registered.
  };

  // An accepted connection: a handshake, then frames it hands to the receive handler.
  struct Inbound {
    uint64_t id = 0;
    int fd = -1;
    std::string remote;        // The socket's remote address.
    std::string peer_address;  // The listening address its handshake named.
    bool handshaken = false;
    Clock::time_point handshake_deadline;
    std::byte hello[kHelloFixedBytes + kMaxAddressBytes];
    size_t hello_received = 0;
    size_t hello_needed = kHelloFixedBytes;
    // After the handshake: buffered reads.
    std::unique_ptr<std::byte[]> buffer;
    size_t begin = 0;
    size_t end = 0;
    uint64_t next_sequence = 0;
    // Frame header + header + payload of the frame at `begin` whose bytes are still arriving in
    // the buffer (0: none, or not parsed yet).
    size_t buffered_frame_bytes = 0;
    // The socket's SO_RCVLOWAT as last set (1 is the kernel's default).
    size_t low_water = 1;
    // A frame too large for the buffer whose bytes are still arriving.
    bool in_frame = false;
    FrameHeader frame;
    std::byte header[kMaxHeaderBytes];
    size_t header_received = 0;
    std::unique_ptr<std::byte[]> payload;
    uint64_t payload_received = 0;

    std::string Name() const {
      return peer_address.empty() ? remote : absl::StrCat(remote, " (", peer_address, ")");
    }
  };

  static void Finish(std::unique_ptr<SendOp> op, absl::Status status) {
    if (op->done) op->done(std::move(status));
  }

  void Wake() {
    if (event_fd_ < 0) return;
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(event_fd_, &one, sizeof(one));
  }

  // Logs a warning about a connection, at most kWarningsPerWindow per window.
  template <typename... Args>
  void Warn(spdlog::format_string_t<Args...> format, Args&&... args) {
    const Clock::time_point now = Clock::now();
    if (now - warning_window_start_ >= kWarningWindow) {
      if (warnings_suppressed_ > 0) {
        Log()->warn("tcp transport {}: {} more connection warnings suppressed", address_,
                    warnings_suppressed_);
      }
      warning_window_start_ = now;
      warnings_in_window_ = 0;
      warnings_suppressed_ = 0;
    }
    if (warnings_in_window_ < kWarningsPerWindow) {
      ++warnings_in_window_;
      Log()->warn(format, std::forward<Args>(args)...);
    } else {
      ++warnings_suppressed_;
    }
  }

  // --- Progress thread only below. ---

  void Run() {
    sends_.SetProgressThread();
    Loop();
    Teardown();
    sends_.ClearProgressThread();
  }

  void Loop() {
    epoll_event events[128];
    while (true) {
      DrainQueue();
      RunLocalWork();
      if (stopping_) return;
      ExpireDeadlines(Clock::now());
      RunLocalWork();
      const int timeout = sends_.local_empty() ? NextTimeoutMs(Clock::now()) : 0;
      const int n = epoll_wait(epoll_fd_, events, 128, timeout);
      if (n < 0 && errno != EINTR) {
        Log()->error("tcp transport {}: epoll_wait: {}", address_, ErrnoText(errno));
      }
      for (int i = 0; i < n; ++i) Dispatch(events[i]);
    }
  }

  void Dispatch(const epoll_event& event) {
    const uint64_t id = event.data.u64;
    if (id == kWakeId) {
      uint64_t count;
      [[maybe_unused]] ssize_t r = read(event_fd_, &count, sizeof(count));
      return;
    }
    if (id == kListenerId) {
      AcceptAll();
      return;
    }
    if (auto it = inbound_.find(id); it != inbound_.end()) {
      ReadInbound(*it->second);
      return;
    }
    if (auto it = peer_by_id_.find(id); it != peer_by_id_.end()) {
      OnPeerEvent(*it->second, event.events);
    }
    // Otherwise the connection was closed earlier in this batch.
  }

  // Takes the sends queued by other threads and posts them; notices a stop request.
  void DrainQueue() {
    for (auto& op : sends_.Take(&stopping_)) Post(std::move(op));
    ApplyPeerSettings();  // Also when no send came: the open connections get theirs.
    FlushDirty();
  }

  // The limits SetPeerUnsentLimit and the congestion controls SetPeerCongestionControl asked for
  // since the last call, on the connections open now (GetOrConnect sets them on new ones). One
  // atomic load when there are none.
  void ApplyPeerSettings() {
    if (!peer_settings_changed_.load(std::memory_order_acquire)) return;
    std::unordered_map<std::string, uint32_t> pending;
    std::unordered_map<std::string, std::string> congestion;
    {
      std::lock_guard lock(peer_settings_mu_);
      peer_settings_changed_.store(false, std::memory_order_relaxed);
      pending.swap(pending_limits_);
      congestion.swap(pending_congestion_);
    }
    for (const auto& [address, name] : congestion) {
      if (name.empty()) {
        peer_congestion_.erase(address);
      } else {
        peer_congestion_[address] = name;
      }
      if (auto it = peers_.find(address); it != peers_.end()) {
        ApplyCongestionControl(address, it->second->fd, /*at_connect=*/false);
      }
    }
    for (const auto& [address, bytes] : pending) {
      if (bytes > 0) {
        unsent_limits_[address] = bytes;
      } else {
        unsent_limits_.erase(address);
      }
      if (auto it = peers_.find(address); it != peers_.end()) {
        SetNotSentLowat(it->second->fd, UnsentLimitFor(address));
        ++limits_applied_;
      }
    }
  }

  // Sets the congestion control the connection to `address` (socket `fd`) runs: its
  // SetPeerCongestionControl, else the options', else the host's. A new socket (`at_connect`)
  // runs the host's already; a live one keeps what it runs unless told, so going back to the
  // default names it. A per-peer name the socket refuses is warned about and dropped, and the
  // connection gets the default. Counted in peer_congestion_controls_applied() when a per-peer
  // request (a return to the default included) took, in congestion_controls_applied() when a new
  // socket took the options'.
  void ApplyCongestionControl(const std::string& address, int fd, bool at_connect) {
    bool returning = false;
    if (auto it = peer_congestion_.find(address); it != peer_congestion_.end()) {
      const std::string failed = SetCongestionControl(fd, it->second);
      if (failed.empty()) {
        ++peer_congestion_applied_;
        return;
      }
      Log()->warn(
          "tcp transport {}: the connection to {} does not run congestion control {}: {}; it "
          "runs the default",
          address_, address, it->second, failed);
      peer_congestion_.erase(it);
    } else {
      returning = !at_connect;
    }
    const std::string& name = options_.congestion_control.empty() ? host_congestion_control_
                                                                  : options_.congestion_control;
    if (name.empty() || (at_connect && options_.congestion_control.empty())) return;
    if (const std::string failed = SetCongestionControl(fd, name); !failed.empty()) {
      Log()->warn("tcp transport {}: the connection to {} does not run congestion control {}: {}",
                  address_, address, name, failed);
      return;
    }
    if (returning) {
      ++peer_congestion_applied_;
    } else if (at_connect) {
      ++congestion_controls_applied_;
    }
  }

  // The connection to `address`'s TCP_NOTSENT_LOWAT: its SetPeerUnsentLimit, else the options'.
  uint32_t UnsentLimitFor(const std::string& address) const {
    auto it = unsent_limits_.find(address);
    return it != unsent_limits_.end() ? it->second : options_.notsent_lowat_bytes;
  }

  // Sends from handlers and completions, then the writes they made due.
  void RunLocalWork() {
    while (std::unique_ptr<SendOp> op = sends_.PopLocal()) {
      Post(std::move(op));
    }
    FlushDirty();
  }

  void Post(std::unique_ptr<SendOp> op) {
    // A limit set before this send was made is in place before it goes, whichever thread made
    // it (sends made on this thread do not pass DrainQueue).
    ApplyPeerSettings();
    if (!op->status.ok()) {
      absl::Status status = op->status;
      Finish(std::move(op), std::move(status));
      return;
    }
    if (stopping_) {
      absl::Status cancelled = SendCancelled(op->address);
      Finish(std::move(op), std::move(cancelled));
      return;
    }
    absl::StatusOr<Peer*> peer = GetOrConnect(*op);
    if (!peer.ok()) {
      Finish(std::move(op), peer.status());
      return;
    }
    tcp::EncodeFrameHeader(FrameHeader{.header_length = op->header_length,
                                       .payload_length = op->payload.size(),
                                       .sequence = (*peer)->next_sequence++},
                           op->frame);
    (*peer)->queue.push_back(std::move(op));
    dirty_.insert((*peer)->id);
  }

  // Writes what the peers that got new sends can take now, in one sendmsg per peer and turn.
  void FlushDirty() {
    while (!dirty_.empty()) {
      std::unordered_set<uint64_t> dirty;
      dirty.swap(dirty_);
      for (uint64_t id : dirty) {
        auto it = peer_by_id_.find(id);
        if (it != peer_by_id_.end() && !it->second->want_out) Flush(*it->second);
      }
      // Completions run by Flush may have queued sends from this thread.
      while (std::unique_ptr<SendOp> op = sends_.PopLocal()) {
        Post(std::move(op));
      }
    }
  }

  absl::StatusOr<Peer*> GetOrConnect(const SendOp& op) {
    if (auto it = peers_.find(op.address); it != peers_.end()) return it->second.get();
    auto unavailable = [&](absl::string_view why) {
      Log()->warn("tcp transport {}: cannot connect to {}: {}", address_, op.address, why);
      return absl::UnavailableError(absl::StrCat("send to ", op.address, " failed: ", why));
    };
    const int fd =
        socket(op.sockaddr.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return unavailable(absl::StrCat("socket: ", ErrnoText(errno)));
    SetNoDelay(fd);
    SetPeerTimeout(fd, options_.peer_timeout);
    SetNotSentLowat(fd, UnsentLimitFor(op.address));
    if (unsent_limits_.contains(op.address)) ++limits_applied_;
    ApplyCongestionControl(op.address, fd, /*at_connect=*/true);
    if (connect(fd, op.sockaddr.get(), op.sockaddr.length) != 0 && errno != EINPROGRESS) {
      const int error = errno;
      close(fd);
      return unavailable(absl::StrCat("connect failed: ", ErrnoText(error)));
    }
    auto peer = std::make_unique<Peer>();
    peer->id = next_id_++;
    peer->address = op.address;
    peer->fd = fd;
    peer->connect_deadline = Clock::now() + options_.connect_timeout;
    // Connect completion shows as writability (or an error).
    epoll_event event{};
    event.events = EPOLLOUT;
    event.data.u64 = peer->id;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) {
      const int error = errno;
      close(fd);
      return unavailable(absl::StrCat("epoll_ctl: ", ErrnoText(error)));
    }
    peer->want_out = true;
    Peer* raw = peer.get();
    peer_by_id_[raw->id] = raw;
    peers_.emplace(op.address, std::move(peer));
    return raw;
  }

  void SetEvents(int fd, uint64_t id, uint32_t events) {
    epoll_event event{};
    event.events = events;
    event.data.u64 = id;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &event);
  }

  void SetWantOut(Peer& peer, bool want) {
    if (peer.want_out == want) return;
    peer.want_out = want;
    SetEvents(peer.fd, peer.id, EPOLLIN | (want ? EPOLLOUT : 0u));
  }

  void OnPeerEvent(Peer& peer, uint32_t events) {
    if (peer.state == Peer::State::kConnecting) {
      int error = 0;
      socklen_t length = sizeof(error);
      if (getsockopt(peer.fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
      if (error != 0) {
        FailPeer(peer, absl::StrCat("connect failed: ", ErrnoText(error)));
        return;
      }
      if ((events & EPOLLOUT) == 0) return;
      peer.state = Peer::State::kAwaitingAck;
      peer.want_out = false;
      SetEvents(peer.fd, peer.id, EPOLLIN);
      Flush(peer);  // The hello.
      return;
    }
    if ((events & (EPOLLIN | EPOLLERR | EPOLLHUP)) != 0 && !ReadPeer(peer)) return;
    if ((events & EPOLLOUT) != 0) Flush(peer);
  }

  // Reads what a listener sends on an outgoing connection: the ack, then nothing but EOF.
  // Returns false when the peer failed (and is gone).
  bool ReadPeer(Peer& peer) {
    if (peer.state == Peer::State::kAwaitingAck) {
      const ssize_t n =
          recv(peer.fd, peer.ack + peer.ack_received, kAckBytes - peer.ack_received, 0);
      if (n == 0) {
        FailPeer(peer, "connection closed by the peer during the handshake");
        return false;
      }
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return true;
        FailPeer(peer, absl::StrCat("connection failed: ", ConnectionError(errno)));
        return false;
      }
      peer.ack_received += static_cast<size_t>(n);
      if (peer.ack_received < kAckBytes) return true;
      if (absl::Status ack = tcp::ParseAck(peer.ack); !ack.ok()) {
        ++protocol_errors_;
        FailPeer(peer, std::string(ack.message()), /*violation=*/true);
        return false;
      }
      peer.state = Peer::State::kConnected;
      Log()->debug("tcp transport {}: connected to {}", address_, peer.address);
      return Flush(peer);
    }
    std::byte scratch[64];
    const ssize_t n = recv(peer.fd, scratch, sizeof(scratch), 0);
    if (n == 0) {
      FailPeer(peer, "connection closed by the peer");
      return false;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return true;
      FailPeer(peer, absl::StrCat("connection failed: ", ConnectionError(errno)));
      return false;
    }
    ++protocol_errors_;
    FailPeer(peer, "the peer sent bytes on a send-only connection", /*violation=*/true);
    return false;
  }

  // Writes the hello (while awaiting the ack) or the queued frames (once connected) until the
  // queue is empty or the socket is full. Completes fully written sends with OK. Returns false
  // when the peer failed (and is gone).
  bool Flush(Peer& peer) {
    std::vector<std::unique_ptr<SendOp>> written;
    bool alive = true;
    while (true) {
      iovec iov[kMaxIov];
      int count = 0;
      size_t requested = 0;
      auto add = [&](const void* data, size_t size) {
        if (size == 0) return;
        iov[count].iov_base = const_cast<void*>(data);
        iov[count].iov_len = size;
        ++count;
        requested += size;
      };
      const bool hello_left = peer.hello_sent < hello_.size();
      if (hello_left) add(hello_.data() + peer.hello_sent, hello_.size() - peer.hello_sent);
      if (peer.state == Peer::State::kConnected) {
        size_t skip = peer.front_written;
        for (const auto& op : peer.queue) {
          if (count + 2 > kMaxIov) break;
          const size_t frame = op->frame_size();
          if (skip < frame) {
            add(op->frame + skip, frame - skip);
            add(op->payload.data(), op->payload.size());
          } else {
            add(op->payload.data() + (skip - frame), op->payload.size() - (skip - frame));
          }
          skip = 0;
        }
      }
      if (count == 0) break;
      msghdr message{};
      message.msg_iov = iov;
      message.msg_iovlen = static_cast<size_t>(count);
      const ssize_t n = sendmsg(peer.fd, &message, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          SetWantOut(peer, true);
          break;
        }
        FailPeer(peer, absl::StrCat("send failed: ", ConnectionError(errno)));
        alive = false;
        break;
      }
      size_t left = static_cast<size_t>(n);
      if (hello_left) {
        const size_t hello_part = std::min(left, hello_.size() - peer.hello_sent);
        peer.hello_sent += hello_part;
        left -= hello_part;
      }
      while (left > 0) {
        SendOp& front = *peer.queue.front();
        const size_t remaining = front.total() - peer.front_written;
        if (left < remaining) {
          peer.front_written += left;
          break;
        }
        left -= remaining;
        peer.front_written = 0;
        written.push_back(std::move(peer.queue.front()));
        peer.queue.pop_front();
      }
      if (static_cast<size_t>(n) < requested) {  // The socket is full.
        SetWantOut(peer, true);
        break;
      }
    }
    if (alive && peer.hello_sent == hello_.size() &&
        (peer.queue.empty() || peer.state != Peer::State::kConnected)) {
      SetWantOut(peer, false);
    }
    for (auto& op : written) Finish(std::move(op), absl::OkStatus());
    return alive;
  }

  // Closes an outgoing connection and drops it from the cache; its pending sends fail with
  // UNAVAILABLE naming the peer and `reason` (CANCELLED while shutting down). The next Send to
  // the address reconnects.
  void FailPeer(Peer& peer, std::string reason, bool violation = false) {
    std::deque<std::unique_ptr<SendOp>> pending;
    pending.swap(peer.queue);
    const std::string address = peer.address;
    if (!stopping_) {
      if (violation) {
        Warn("tcp transport {}: closing connection to {}: {}", address_, address, reason);
      } else if (!pending.empty() || peer.state != Peer::State::kConnected) {
        Log()->warn("tcp transport {}: connection to {} failed with {} sends pending: {}", address_,
                    address, pending.size(), reason);
      } else {
        // An idle connection closing (e.g. the peer shut down) fails no send: not a warning.
        Log()->info("tcp transport {}: connection to {} closed: {}", address_, address, reason);
      }
    }
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, peer.fd, nullptr);
    close(peer.fd);
    peer_by_id_.erase(peer.id);
    dirty_.erase(peer.id);
    peers_.erase(address);  // Destroys `peer`.
    for (auto& op : pending) {
      absl::Status status =
          stopping_
              ? SendCancelled(address)
              : absl::UnavailableError(absl::StrCat("send to ", address, " failed: ", reason));
      Finish(std::move(op), std::move(status));
    }
  }

  void AcceptAll() {
    for (int accepted = 0; accepted < kAcceptBudget; ++accepted) {
      sockaddr_storage remote{};
      socklen_t length = sizeof(remote);
      const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&remote), &length,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        const int error = errno;
        if (error == EAGAIN || error == EWOULDBLOCK) return;
        if (error == EINTR || error == ECONNABORTED) continue;
        Warn("tcp transport {}: accept: {}; not accepting for {} ms", address_, ErrnoText(error),
             kAcceptPause.count());
        SetEvents(listen_fd_, kListenerId, 0);
        accept_paused_until_ = Clock::now() + kAcceptPause;
        return;
      }
      auto conn = std::make_unique<Inbound>();
      conn->id = next_id_++;
      conn->fd = fd;
      conn->remote = FormatAddress(reinterpret_cast<const sockaddr*>(&remote));
      conn->handshake_deadline = Clock::now() + options_.handshake_timeout;
      SetNoDelay(fd);
      SetPeerTimeout(fd, options_.peer_timeout);
      epoll_event event{};
      event.events = EPOLLIN;
      event.data.u64 = conn->id;
      if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) {
        Warn("tcp transport {}: cannot watch connection from {}: {}", address_, conn->remote,
             ErrnoText(errno));
        close(fd);
        continue;
      }
      const uint64_t id = conn->id;
      half_open_.insert(id);
      Inbound& added = *inbound_.emplace(id, std::move(conn)).first->second;
      // A peer's hello usually arrives with the connection: read it now, so that it does not
      // count against the half-open cap.
      ReadInbound(added);
      while (half_open_.size() > options_.max_half_open_connections) {
        Reject(*inbound_.at(*half_open_.begin()),
               absl::StrCat("more than ", options_.max_half_open_connections,
                            " connections without a completed handshake; closing the oldest"));
      }
    }
  }

  void CloseInbound(Inbound& conn) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, conn.fd, nullptr);
    close(conn.fd);
    half_open_.erase(conn.id);
    inbound_.erase(conn.id);  // Destroys `conn`.
  }

  // Closes a connection that did not complete its handshake.
  void Reject(Inbound& conn, absl::string_view reason, bool warn = true) {
    ++rejected_;
    if (warn) {
      Warn("tcp transport {}: rejected connection from {}: {}", address_, conn.remote, reason);
    } else {
      Log()->debug("tcp transport {}: connection from {} closed before its handshake", address_,
                   conn.remote);
    }
    CloseInbound(conn);
  }

  // Closes a connection that broke the framing.
  void ProtocolError(Inbound& conn, absl::string_view reason) {
    ++protocol_errors_;
    Warn("tcp transport {}: closing connection from {}: {}", address_, conn.Name(), reason);
    CloseInbound(conn);
  }

  // Reads from an accepted connection until it would block or has used its budget; hands
  // complete frames to the handler. Closes the connection on EOF, errors and violations.
  void ReadInbound(Inbound& conn) {
    size_t budget = options_.read_budget_bytes;
    while (budget > 0) {
      if (!conn.handshaken) {
        const ssize_t n = recv(conn.fd, conn.hello + conn.hello_received,
                               conn.hello_needed - conn.hello_received, 0);
        if (n <= 0) {
          if (WouldBlock(n)) return;
          const bool silent = n == 0 && conn.hello_received == 0;
          Reject(conn,
                 n == 0
                     ? absl::StrCat("closed after ", conn.hello_received, " bytes of the handshake")
                     : absl::StrCat("receive failed: ", ErrnoText(errno)),
                 /*warn=*/!silent);
          return;
        }
        conn.hello_received += static_cast<size_t>(n);
        if (!HandshakeStep(conn)) return;
        continue;
      }
      const size_t payload_left =
          conn.in_frame ? conn.frame.payload_length - conn.payload_received : 0;
      if (conn.in_frame && conn.header_received == conn.frame.header_length &&
          conn.begin == conn.end && payload_left >= kDirectReadBytes) {
        const size_t wanted = static_cast<size_t>(std::min<uint64_t>(payload_left, budget));
        const ssize_t n = recv(conn.fd, conn.payload.get() + conn.payload_received, wanted, 0);
        if (WouldBlock(n)) break;
        if (!Received(conn, n)) return;
        conn.payload_received += static_cast<uint64_t>(n);
        budget -= std::min(budget, static_cast<size_t>(n));
        if (conn.payload_received == conn.frame.payload_length) DeliverPartial(conn);
        if (static_cast<size_t>(n) < wanted) break;  // Drained (see below).
        continue;
      }
      if (conn.begin == conn.end) {
        conn.begin = conn.end = 0;
      } else if (conn.end == kReadBufferBytes ||
                 conn.begin + conn.buffered_frame_bytes > kReadBufferBytes) {
        // The rest of the frame at `begin` would not fit behind it.
        std::memmove(conn.buffer.get(), conn.buffer.get() + conn.begin, conn.end - conn.begin);
        conn.end -= conn.begin;
        conn.begin = 0;
      }
      const size_t wanted = kReadBufferBytes - conn.end;
      const ssize_t n = recv(conn.fd, conn.buffer.get() + conn.end, wanted, 0);
      if (WouldBlock(n)) break;
      if (!Received(conn, n)) return;
      conn.end += static_cast<size_t>(n);
      budget -= std::min(budget, static_cast<size_t>(n));
      if (!ParseBuffered(conn)) return;
      // A short read took everything queued: stop here rather than pay a recv that finds the
      // socket empty (one per wake-up; epoll is level-triggered and reports what comes later).
      if (static_cast<size_t>(n) < wanted) break;
    }
    // The socket would block or the budget ran out: either way the mark must follow what was
    // read since it was set (on the budget with bytes still queued too: a frame whose rest fell
    // below an old mark would never be reported readable again once the socket drained).
    SetLowWater(conn);
  }

  // Why a connection failed, from its errno; a timeout names the peer timeout that set it.
  std::string ConnectionError(int error) const {
    if (error == ETIMEDOUT && options_.peer_timeout.count() > 0) {
      return absl::StrCat("no answer from the peer within the peer timeout of ",
                          options_.peer_timeout.count(), " ms (", ErrnoText(error), ")");
    }
    return ErrnoText(error);
  }

  static bool WouldBlock(ssize_t n) {
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
  }

  // Bytes still to come of the frame being received (0 between frames).
  static uint64_t FrameBytesMissing(const Inbound& conn) {
    if (conn.in_frame) {
      return (conn.frame.header_length - conn.header_received) +
             (conn.frame.payload_length - conn.payload_received);
    }
    const size_t buffered = conn.end - conn.begin;
    return conn.buffered_frame_bytes > buffered ? conn.buffered_frame_bytes - buffered : 0;
  }

  // Before the loop leaves a connection: its SO_RCVLOWAT is the rest of the frame being received,
  // at most kMaxReceiveLowWaterBytes (the kernel caps it further at half the largest receive
  // buffer and still reports EOF and errors at once), or 1 between frames. A failure leaves the
  // old mark, which only costs wake-ups.
  void SetLowWater(Inbound& conn) {
    const size_t mark = static_cast<size_t>(
        std::clamp<uint64_t>(FrameBytesMissing(conn), 1, uint64_t{kMaxReceiveLowWaterBytes}));
    if (mark == conn.low_water) return;
    const int value = static_cast<int>(mark);
    if (setsockopt(conn.fd, SOL_SOCKET, SO_RCVLOWAT, &value, sizeof(value)) == 0) {
      conn.low_water = mark;
    }
  }

  // Classifies a recv result on a handshaken connection that is not WouldBlock; false when the
  // connection was closed (EOF or an error).
  bool Received(Inbound& conn, ssize_t n) {
    if (n > 0) return true;
    if (n < 0) {
      Log()->info("tcp transport {}: connection from {} failed: {}{}", address_, conn.Name(),
                  ConnectionError(errno), conn.in_frame ? " (a partial frame is dropped)" : "");
      CloseInbound(conn);
      return false;
    }
    if (conn.in_frame || conn.begin != conn.end) {
      ProtocolError(conn, "frame truncated by the end of the connection");
      return false;
    }
    Log()->debug("tcp transport {}: connection from {} closed", address_, conn.Name());
    CloseInbound(conn);
    return false;
  }

  // Validates what arrived of the hello; completes the handshake when all of it did. Returns
  // false when the connection was closed.
  bool HandshakeStep(Inbound& conn) {
    if (conn.hello_received < conn.hello_needed) return true;
    if (conn.hello_needed == kHelloFixedBytes) {
      absl::StatusOr<size_t> length = tcp::ParseHelloFixed(std::span(conn.hello, kHelloFixedBytes));
      if (!length.ok()) {
        Reject(conn, length.status().message());
        return false;
      }
      conn.hello_needed = kHelloFixedBytes + *length;
      return true;
    }
    absl::StatusOr<std::string> address = tcp::ParseHelloAddress(
        std::span(conn.hello + kHelloFixedBytes, conn.hello_needed - kHelloFixedBytes));
    if (!address.ok()) {
      Reject(conn, address.status().message());
      return false;
    }
    const std::vector<std::byte> ack = tcp::EncodeAck();
    // The socket's send buffer is empty, so the ack goes in one piece or the connection is bad.
    if (send(conn.fd, ack.data(), ack.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(ack.size())) {
      Reject(conn, absl::StrCat("cannot send the handshake reply: ", ErrnoText(errno)));
      return false;
    }
    conn.peer_address = *std::move(address);
    conn.handshaken = true;
    half_open_.erase(conn.id);
    conn.buffer = std::make_unique_for_overwrite<std::byte[]>(kReadBufferBytes);
    ++accepted_;
    Log()->debug("tcp transport {}: accepted connection from {}", address_, conn.Name());
    return true;
  }

  // Hands every complete frame in the read buffer to the handler; leaves an incomplete one that
  // fits in the buffer where it is, and moves the bytes of a larger one into its own buffers.
  // Returns false when the connection was closed.
  bool ParseBuffered(Inbound& conn) {
    while (true) {
      std::byte* data = conn.buffer.get();
      if (!conn.in_frame) {
        if (conn.end - conn.begin < kFrameHeaderBytes) return true;
        absl::StatusOr<FrameHeader> frame =
            tcp::ParseFrameHeader(std::span(data + conn.begin, kFrameHeaderBytes),
                                  options_.max_payload_bytes, conn.next_sequence);
        if (!frame.ok()) {
          ProtocolError(conn, frame.status().message());
          return false;
        }
        const uint64_t size = frame->header_length + frame->payload_length;
        if (conn.end - conn.begin >= kFrameHeaderBytes + size) {  // All here: no copy.
          const std::byte* start = data + conn.begin + kFrameHeaderBytes;
          conn.begin += kFrameHeaderBytes + size;
          conn.buffered_frame_bytes = 0;
          ++conn.next_sequence;
          Deliver(std::span(start, frame->header_length),
                  std::span(start + frame->header_length, frame->payload_length));
          continue;
        }
        if (kFrameHeaderBytes + size <= kReadBufferBytes) {
          // It fits in the buffer: leave it there (its frame header is parsed again when more
          // bytes came) until all of it arrived.
          conn.buffered_frame_bytes = kFrameHeaderBytes + size;
          return true;
        }
        conn.begin += kFrameHeaderBytes;
        ++conn.next_sequence;
        conn.buffered_frame_bytes = 0;
        // Pages of a large buffer are only committed as the payload arrives.
        std::byte* payload =
            new (std::nothrow) std::byte[std::max<uint64_t>(frame->payload_length, 1)];
        if (payload == nullptr) {
          ProtocolError(conn, absl::StrCat("cannot allocate ", frame->payload_length,
                                           " bytes for a frame's payload"));
          return false;
        }
        conn.payload.reset(payload);
        conn.in_frame = true;
        conn.frame = *frame;
        conn.header_received = 0;
        conn.payload_received = 0;
      }
      const size_t header_part =
          std::min(conn.end - conn.begin, conn.frame.header_length - conn.header_received);
      std::memcpy(conn.header + conn.header_received, data + conn.begin, header_part);
      conn.header_received += header_part;
      conn.begin += header_part;
      const size_t payload_part = static_cast<size_t>(std::min<uint64_t>(
          conn.end - conn.begin, conn.frame.payload_length - conn.payload_received));
      if (payload_part > 0) {
        std::memcpy(conn.payload.get() + conn.payload_received, data + conn.begin, payload_part);
      }
      conn.payload_received += payload_part;
      conn.begin += payload_part;
      if (conn.header_received < conn.frame.header_length ||
          conn.payload_received < conn.frame.payload_length) {
        return true;  // The buffer is used up.
      }
      DeliverPartial(conn);
    }
  }

  // Delivers the frame assembled in the connection's own buffers.
  void DeliverPartial(Inbound& conn) {
    std::unique_ptr<std::byte[]> payload = std::move(conn.payload);
    conn.in_frame = false;
    Deliver(std::span(conn.header, conn.frame.header_length),
            std::span(payload.get(), conn.frame.payload_length));
  }

  void Deliver(std::span<const std::byte> header, std::span<const std::byte> payload) {
    std::shared_ptr<const ReceiveHandler> handler;
    { handler = handler_.Get(); }
    if (handler == nullptr || !*handler) {
      Log()->warn("tcp transport {}: no receive handler; dropping a {}-byte message", address_,
                  payload.size());
      return;
    }
    (*handler)(header, payload);
  }

  void ExpireDeadlines(Clock::time_point now) {
    if (accept_paused_until_ && now >= *accept_paused_until_) {
      accept_paused_until_.reset();
      SetEvents(listen_fd_, kListenerId, EPOLLIN);
    }
    // Ids grow with accept time and the timeout is fixed, so the oldest expires first.
    while (!half_open_.empty()) {
      Inbound& oldest = *inbound_.at(*half_open_.begin());
      if (now < oldest.handshake_deadline) break;
      Reject(oldest,
             absl::StrCat("handshake not completed within ", options_.handshake_timeout.count(),
                          " ms (", oldest.hello_received, " bytes received)"));
    }
    std::vector<Peer*> expired;
    for (auto& [address, peer] : peers_) {
      if (peer->state != Peer::State::kConnected && now >= peer->connect_deadline) {
        expired.push_back(peer.get());
      }
    }
    for (Peer* peer : expired) {
      FailPeer(*peer,
               absl::StrCat("connect timed out after ", options_.connect_timeout.count(), " ms"));
    }
  }

  int NextTimeoutMs(Clock::time_point now) const {
    std::optional<Clock::time_point> next = accept_paused_until_;
    auto consider = [&](Clock::time_point t) {
      if (!next || t < *next) next = t;
    };
    if (!half_open_.empty()) consider(inbound_.at(*half_open_.begin())->handshake_deadline);
    for (const auto& [address, peer] : peers_) {
      if (peer->state != Peer::State::kConnected) consider(peer->connect_deadline);
    }
    if (!next) return -1;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - now).count();
    return static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
  }

  // Fails what is pending with CANCELLED and closes every socket.
  void Teardown() {
    stopping_ = true;
    for (auto& op : sends_.Close()) Post(std::move(op));
    std::vector<Peer*> peers;
    for (auto& [address, peer] : peers_) peers.push_back(peer.get());
    for (Peer* peer : peers) FailPeer(*peer, "transport shut down");
    std::vector<Inbound*> conns;
    for (auto& [id, conn] : inbound_) conns.push_back(conn.get());
    for (Inbound* conn : conns) CloseInbound(*conn);
    // Completions above may have sent again from this thread: those are cancelled too.
    while (std::unique_ptr<SendOp> op = sends_.PopLocal()) {
      Post(std::move(op));
    }
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
    close(listen_fd_);
    listen_fd_ = -1;
  }

  const TcpTransportOptions options_;
  std::string address_;                  // Written before the thread starts, constant after.
  std::vector<std::byte> hello_;         // Likewise.
  std::string host_congestion_control_;  // Likewise; empty when it could not be read.
  std::thread thread_;
  int listen_fd_ = -1;
  int event_fd_ = -1;
  int epoll_fd_ = -1;
  std::mutex join_mu_;

  SendQueue<SendOp> sends_;
  ReceiveHandlerSlot handler_;

  std::atomic<uint64_t> rejected_ = 0;
  std::atomic<uint64_t> protocol_errors_ = 0;
  std::atomic<uint64_t> accepted_ = 0;
  std::atomic<uint64_t> limits_applied_ = 0;
  std::atomic<uint64_t> congestion_controls_applied_ = 0;
  std::atomic<uint64_t> peer_congestion_applied_ = 0;

  std::mutex peer_settings_mu_;
  std::unordered_map<std::string, uint32_t> pending_limits_;  // SetPeerUnsentLimit's, not applied
  // SetPeerCongestionControl's, not applied.
  std::unordered_map<std::string, std::string> pending_congestion_;
  std::atomic<bool> peer_settings_changed_ = false;

  // --- Progress thread only. ---
  std::unordered_map<std::string, uint32_t> unsent_limits_;  // by peer; none: the options' value
  std::unordered_map<std::string, std::string> peer_congestion_;  // by peer; none: the options'
  bool stopping_ = false;
  uint64_t next_id_ = kFirstConnectionId;
  std::unordered_map<std::string, std::unique_ptr<Peer>> peers_;
  std::unordered_map<uint64_t, Peer*> peer_by_id_;
  std::unordered_set<uint64_t> dirty_;  // Peers with sends posted since the last flush.
  std::unordered_map<uint64_t, std::unique_ptr<Inbound>> inbound_;
  std::set<uint64_t> half_open_;  // Accepted, handshake not complete; ordered by accept time.
  std::optional<Clock::time_point> accept_paused_until_;
  Clock::time_point warning_window_start_;
  int warnings_in_window_ = 0;
  uint64_t warnings_suppressed_ = 0;
};

absl::StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::Create(
    const TcpTransportOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  if (absl::Status started = impl->Start(); !started.ok()) return started;
  return std::unique_ptr<TcpTransport>(new TcpTransport(std::move(impl)));
}

TcpTransport::TcpTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpTransport::~TcpTransport() { Shutdown(); }

std::string TcpTransport::Address() const { return impl_->Address(); }

void TcpTransport::SetReceiveHandler(ReceiveHandler handler) {
  impl_->SetReceiveHandler(std::move(handler));
}

void TcpTransport::Send(const std::string& peer_address, std::span<const std::byte> header,
                        std::span<const std::byte> payload, SendCallback done) {
  impl_->Send(peer_address, header, payload, std::move(done));
}

void TcpTransport::Shutdown() { impl_->Shutdown(); }

uint64_t TcpTransport::rejected_connections() const { return impl_->rejected_connections(); }
uint64_t TcpTransport::protocol_errors() const { return impl_->protocol_errors(); }
uint64_t TcpTransport::accepted_connections() const { return impl_->accepted_connections(); }
uint64_t TcpTransport::peer_unsent_limits_applied() const {
  return impl_->peer_unsent_limits_applied();
}

uint64_t TcpTransport::congestion_controls_applied() const {
  return impl_->congestion_controls_applied();
}

uint64_t TcpTransport::peer_congestion_controls_applied() const {
  return impl_->peer_congestion_controls_applied();
}

void TcpTransport::SetPeerCongestionControl(const std::string& peer_address,
                                            const std::string& name) {
  impl_->SetPeerCongestionControl(peer_address, name);
}

void TcpTransport::SetPeerUnsentLimit(const std::string& peer_address, uint32_t bytes) {
  impl_->SetPeerUnsentLimit(peer_address, bytes);
}

}  // namespace tributary::dataplane
