#include "dataplane/transport/ucx/ucx_transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/thread_name.h"
#include "dataplane/transport/send_queue.h"
#include "dataplane/transport/socket_address.h"
#include "dataplane/transport/ucx/ucx_status.h"

namespace tributary::dataplane {
namespace {

using Clock = std::chrono::steady_clock;

// Data messages: AM header = [uint64 per-endpoint sequence number][user header], data = payload.
constexpr uint16_t kDataAmId = 0;
// Sent once on every new outgoing endpoint; its completion shows the connection is established.
constexpr uint16_t kHelloAmId = 1;
constexpr size_t kSeqBytes = sizeof(uint64_t);
// Bound on waiting for endpoint closes while shutting down.
constexpr std::chrono::milliseconds kTeardownTimeout{2000};
// Progress calls in a row before the loop looks at its queue again: a peer that keeps the worker
// busy (a flood of messages) must not starve the sends queued by other threads or a Shutdown.
constexpr int kProgressBurst = 64;

// UCX settings the transport changes from UCX's defaults unless the environment sets them
// (as UCX_<name> or the transport-specific variable).
struct ConfigDefault {
  const char* name;
  const char* value;
  const char* specific_env;
};
constexpr ConfigDefault kConfigDefaults[] = {
    // An agent restarting on its fixed port must not wait for TIME_WAIT sockets to expire.
    {"CM_REUSEADDR", "y", "UCX_TCP_CM_REUSEADDR"},
    // UCX 1.13's TCP PUT-zcopy rendezvous can hit an internal assertion
    // (tcp_ep.c: `ep->flags & UCT_TCP_EP_FLAG_PUT_TX_WAITING_ACK`) and abort the process when a
    // peer resets mid-transfer; rendezvous then uses active-message fragments instead.
    // (UCX 1.13 matches keys modified through ucp_config_modify against the unprefixed names of
    // the transport's fields, hence "PUT_ENABLE", not "TCP_PUT_ENABLE".)
    {"PUT_ENABLE", "n", "UCX_TCP_PUT_ENABLE"},
};

// Over TCP alone (UCX_TLS=tcp), rendezvous has no zero-copy to offer: it adds a request/reply
// round trip per message and then moves the data as active-message fragments anyway. Sending
// every message eagerly instead made push/pull with 4 spare hosts 1.4x faster at 16 MiB and
// 1.1x at 64 MiB on the emulated cluster (bench/suite). With RDMA transports UCX's own
// threshold stays.
constexpr ConfigDefault kTcpOnlyDefaults[] = {{"RNDV_THRESH", "inf", "UCX_RNDV_THRESH"}};

bool TcpOnly() {
  const char* tls = std::getenv("UCX_TLS");
  return tls != nullptr && std::string_view(tls) == "tcp";
}

constexpr auto Log = common::ComponentLog<"transport">;

absl::Status ErrnoStatus(absl::string_view call) {
  return absl::InternalError(absl::StrCat(call, ": ", std::strerror(errno)));
}

}  // namespace

// All state below the "progress thread only" line is touched only by the progress thread (or by
// Start/Teardown on it), so it needs no lock.
class UcxTransport::Impl {
 public:
  explicit Impl(UcxTransportOptions options) : options_(std::move(options)) {}

  ~Impl() {
    Shutdown();
    if (epoll_fd_ >= 0) close(epoll_fd_);
    if (event_fd_ >= 0) close(event_fd_);
  }

  // Starts the progress thread, which creates the UCX objects; returns their creation status.
  absl::Status Start() {
    std::promise<absl::Status> started;
    std::future<absl::Status> result = started.get_future();
    thread_ = std::thread([this, &started] { Run(started); });
    absl::Status status = result.get();
    if (!status.ok()) thread_.join();
    return status;
  }

  const std::string& Address() const { return address_; }

  void SetReceiveHandler(ReceiveHandler handler) { handler_.Set(std::move(handler)); }

  void Send(const std::string& peer_address, std::span<const std::byte> header,
            std::span<const std::byte> payload, SendCallback done) {
    auto op = std::make_unique<SendOp>();
    op->impl = this;
    op->address = peer_address;
    op->payload = payload;
    op->done = std::move(done);
    if (absl::StatusOr<SocketAddress> parsed = CheckSendTarget(peer_address, header);
        !parsed.ok()) {
      op->status = parsed.status();
    } else {
      op->sockaddr = *parsed;
      op->header.resize(kSeqBytes + header.size());
      if (!header.empty()) std::memcpy(op->header.data() + kSeqBytes, header.data(), header.size());
    }

    if (std::unique_ptr<SendOp> refused = sends_.Hand(std::move(op), [this] { Wake(); })) {
      Finish(std::move(refused), SendCancelled(peer_address));  // No progress thread is left.
    }
  }

  void Shutdown() {
    sends_.RequestStop();
    Wake();
    if (sends_.OnProgressThread()) {
      Log()->warn(
          "ucx transport {}: shutdown called on its progress thread; it stops after the "
          "current callback",
          address_);
      return;
    }
    std::lock_guard lock(join_mu_);
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Peer;

  // One Send: owned by the queue, then (while UCX holds it) by in_flight_.
  struct SendOp {
    Impl* impl = nullptr;
    std::string address;
    SocketAddress sockaddr;
    std::vector<std::byte> header;  // [seq][user header]
    std::span<const std::byte> payload;
    SendCallback done;
    absl::Status status;  // Non-OK: fails without being posted.
    std::shared_ptr<Peer> peer;
    bool hello = false;
  };

  // An outgoing endpoint, cached per peer address while it is healthy.
  struct Peer : std::enable_shared_from_this<Peer> {
    Impl* impl = nullptr;
    std::string address;
    ucp_ep_h ep = nullptr;
    bool connected = false;
    bool failed = false;
    std::string failure;  // Why the endpoint was dropped.
    Clock::time_point connect_deadline;
    uint64_t next_seq = 0;
    int sends_in_flight = 0;  // Data sends handed to UCX and not completed.
  };

  // A message waiting for its turn (or for its rendezvous data).
  struct Delivery {
    std::vector<std::byte> header;
    std::unique_ptr<std::byte[]> payload;
    size_t length = 0;
    bool ready = false;
  };

  // An accepted (incoming) endpoint: delivers its messages in sequence order.
  struct Conn {
    Impl* impl = nullptr;
    uint64_t id = 0;
    ucp_ep_h ep = nullptr;
    std::string remote;
    bool closing = false;
    uint64_t next_seq = 0;
    std::map<uint64_t, std::unique_ptr<Delivery>> pending;
  };

  // A rendezvous receive handed to UCX; owns the temporary payload buffer until delivery.
  struct RndvRecv {
    Impl* impl = nullptr;
    uint64_t conn_id = 0;  // 0: unordered delivery of `header`.
    uint64_t seq = 0;
    std::vector<std::byte> header;
    std::unique_ptr<std::byte[]> buffer;
    size_t length = 0;
  };

  // An endpoint being closed; keeps the error-callback argument alive until the close finishes.
  struct Closing {
    ucp_ep_h ep = nullptr;
    void* request = nullptr;
    std::shared_ptr<Peer> peer;
    std::unique_ptr<Conn> conn;
  };

  static void Finish(std::unique_ptr<SendOp> op, absl::Status status) {
    if (op->done) op->done(std::move(status));
  }

  void Wake() {
    if (event_fd_ < 0) return;
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(event_fd_, &one, sizeof(one));
  }

  // --- Progress thread only below. ---

  void Run(std::promise<absl::Status>& started) {
    common::SetCurrentThreadName("trib-ucx");
    sends_.SetProgressThread();
    absl::Status status = Init();
    if (!status.ok()) {
      Teardown();
      started.set_value(status);
      return;
    }
    started.set_value(absl::OkStatus());
    Loop();
    Teardown();
  }

  absl::Status Init() {
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    ucp_config_t* config = nullptr;
    RETURN_IF_ERROR(ucx::ToStatus(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read"));
    std::vector<ConfigDefault> defaults(std::begin(kConfigDefaults), std::end(kConfigDefaults));
    if (TcpOnly())
      defaults.insert(defaults.end(), std::begin(kTcpOnlyDefaults), std::end(kTcpOnlyDefaults));
    for (const ConfigDefault& setting : defaults) {
      if (std::getenv(absl::StrCat("UCX_", setting.name).c_str()) != nullptr ||
          std::getenv(setting.specific_env) != nullptr) {
        continue;  // The environment decides.
      }
      const ucs_status_t modified = ucp_config_modify(config, setting.name, setting.value);
      if (modified != UCS_OK) {
        Log()->debug("ucx transport: cannot set {}={}: {}", setting.name, setting.value,
                     ucs_status_string(modified));
      }
    }
    const ucs_status_t initialized = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    RETURN_IF_ERROR(ucx::ToStatus(initialized, "ucp_init"));

    ucp_worker_params_t worker_params{};
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
    RETURN_IF_ERROR(
        ucx::ToStatus(ucp_worker_create(context_, &worker_params, &worker_), "ucp_worker_create"));

    ucp_worker_attr_t worker_attr{};
    worker_attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
    RETURN_IF_ERROR(ucx::ToStatus(ucp_worker_query(worker_, &worker_attr), "ucp_worker_query"));
    if (worker_attr.max_am_header < kSeqBytes + kMaxHeaderBytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("ucx worker supports active-message headers of ", worker_attr.max_am_header,
                       " bytes, need ", kSeqBytes + kMaxHeaderBytes));
    }

    for (const auto& [id, cb] :
         {std::pair{kDataAmId, &Impl::OnAmData}, std::pair{kHelloAmId, &Impl::OnAmHello}}) {
      ucp_am_handler_param_t handler{};
      handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                           UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
      handler.id = id;
      handler.flags = UCP_AM_FLAG_WHOLE_MSG;
      handler.cb = cb;
      handler.arg = this;
      RETURN_IF_ERROR(ucx::ToStatus(ucp_worker_set_am_recv_handler(worker_, &handler),
                                    "ucp_worker_set_am_recv_handler"));
    }

    int worker_fd = -1;
    RETURN_IF_ERROR(ucx::ToStatus(ucp_worker_get_efd(worker_, &worker_fd), "ucp_worker_get_efd"));
    event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (event_fd_ < 0) return ErrnoStatus("eventfd");
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0) return ErrnoStatus("epoll_create1");
    for (int fd : {worker_fd, event_fd_}) {
      epoll_event event{};
      event.events = EPOLLIN;
      event.data.fd = fd;
      if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) return ErrnoStatus("epoll_ctl");
    }

    ASSIGN_OR_RETURN(SocketAddress listen_address,
                     ResolveListenAddress(options_.listen_host, options_.port));
    ucp_listener_params_t listener_params{};
    listener_params.field_mask =
        UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    listener_params.sockaddr.addr = listen_address.get();
    listener_params.sockaddr.addrlen = listen_address.length;
    listener_params.conn_handler.cb = &Impl::OnConnRequest;
    listener_params.conn_handler.arg = this;
    ucs_status_t status = ucp_listener_create(worker_, &listener_params, &listener_);
    if (status != UCS_OK) {
      absl::Status error = ucx::ToStatus(status, "ucp_listener_create");
      // UCS_ERR_BUSY here means the address is in use: the caller may retry or pick another port.
      const absl::StatusCode code =
          status == UCS_ERR_BUSY ? absl::StatusCode::kUnavailable : error.code();
      return absl::Status(code, absl::StrCat("cannot listen on ", options_.listen_host, ":",
                                             options_.port, ": ", error.message()));
    }
    ucp_listener_attr_t listener_attr{};
    listener_attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    RETURN_IF_ERROR(
        ucx::ToStatus(ucp_listener_query(listener_, &listener_attr), "ucp_listener_query"));
    address_ = FormatAddress(reinterpret_cast<const sockaddr*>(&listener_attr.sockaddr));
    Log()->debug("ucx transport listening on {}", address_);
    return absl::OkStatus();
  }

  void Loop() {
    epoll_event events[2];
    while (true) {
      bool worked = DrainQueue();
      if (stopping_) return;
      for (int burst = 0; burst < kProgressBurst; ++burst) {
        const unsigned progressed = ucp_worker_progress(worker_);
        const bool local = RunLocalWork();
        if (progressed == 0 && !local) break;
        worked = true;
      }
      worked |= CloseFailedEndpoints();
      worked |= ExpireConnects(Clock::now());
      ReapClosing();
      if (worked) continue;

      const ucs_status_t armed = ucp_worker_arm(worker_);
      if (armed == UCS_ERR_BUSY) continue;
      if (armed != UCS_OK) {
        Log()->error("ucx transport {}: ucp_worker_arm: {}", address_, ucs_status_string(armed));
      }
      const int n = epoll_wait(epoll_fd_, events, 2, NextTimeoutMs());
      if (n < 0 && errno != EINTR) {
        Log()->error("ucx transport {}: epoll_wait: {}", address_, std::strerror(errno));
      }
      for (int i = 0; i < n; ++i) {
        if (events[i].data.fd == event_fd_) {
          uint64_t count;
          [[maybe_unused]] ssize_t r = read(event_fd_, &count, sizeof(count));
        }
      }
    }
  }

  // Takes the sends queued by other threads and posts them; notices a stop request.
  bool DrainQueue() {
    std::vector<std::unique_ptr<SendOp>> ops = sends_.Take(&stopping_);
    for (auto& op : ops) Post(std::move(op));
    return !ops.empty();
  }

  // Work deferred out of UCX callbacks: accepting connections and sends from handlers.
  bool RunLocalWork() {
    bool worked = false;
    while (!pending_accepts_.empty()) {
      ucp_conn_request_h request = pending_accepts_.front();
      pending_accepts_.pop_front();
      Accept(request);
      worked = true;
    }
    while (std::unique_ptr<SendOp> op = sends_.PopLocal()) {
      Post(std::move(op));
      worked = true;
    }
    return worked;
  }

  void Post(std::unique_ptr<SendOp> op) {
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
    absl::StatusOr<std::shared_ptr<Peer>> peer = GetOrConnect(op->address, op->sockaddr);
    if (!peer.ok()) {
      Finish(std::move(op), peer.status());
      return;
    }
    op->peer = *std::move(peer);
    const uint64_t seq = op->peer->next_seq++;
    std::memcpy(op->header.data(), &seq, kSeqBytes);

    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY;  // The receiver orders messages per reply endpoint.
    param.cb.send = &Impl::OnSendDone;
    param.user_data = op.get();
    ucs_status_ptr_t request =
        ucp_am_send_nbx(op->peer->ep, kDataAmId, op->header.data(), op->header.size(),
                        op->payload.data(), op->payload.size(), &param);
    if (request == nullptr) {
      Finish(std::move(op), absl::OkStatus());
    } else if (UCS_PTR_IS_ERR(request)) {
      CompleteSend(std::move(op), UCS_PTR_STATUS(request));
    } else {
      ++op->peer->sends_in_flight;
      in_flight_.insert(op.release());
    }
  }

  static void OnSendDone(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<SendOp*>(user_data);
    Impl* impl = op->impl;
    ucp_request_free(request);
    impl->in_flight_.erase(op);
    // Counted down after completion, so a failure it causes is logged with this send in flight.
    const std::shared_ptr<Peer> peer = op->peer;
    const bool hello = op->hello;
    impl->CompleteSend(std::unique_ptr<SendOp>(op), status);
    if (!hello) --peer->sends_in_flight;
  }

  void CompleteSend(std::unique_ptr<SendOp> op, ucs_status_t status) {
    Peer* peer = op->peer.get();
    if (op->hello) {
      if (status == UCS_OK && !peer->failed) {
        peer->connected = true;
        Log()->debug("ucx transport {}: connected to {}", address_, peer->address);
      } else if (status != UCS_OK) {
        FailPeer(*peer, absl::StrCat("connect failed: ", ucs_status_string(status)));
      }
      return;
    }
    if (status == UCS_OK) {
      Finish(std::move(op), absl::OkStatus());
      return;
    }
    if (stopping_) {
      absl::Status cancelled = SendCancelled(op->address);
      Finish(std::move(op), std::move(cancelled));
      return;
    }
    // A failed send leaves a gap in the sequence; the endpoint must not carry more messages.
    FailPeer(*peer, absl::StrCat("send failed: ", ucs_status_string(status)));
    absl::Status error =
        absl::UnavailableError(absl::StrCat("send to ", op->address, " failed: ", peer->failure));
    Log()->debug("{}", std::string(error.message()));
    Finish(std::move(op), std::move(error));
  }

  absl::StatusOr<std::shared_ptr<Peer>> GetOrConnect(const std::string& address,
                                                     const SocketAddress& sockaddr) {
    if (auto it = peers_.find(address); it != peers_.end()) return it->second;
    auto peer = std::make_shared<Peer>();
    peer->impl = this;
    peer->address = address;
    peer->connect_deadline = Clock::now() + options_.connect_timeout;

    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = sockaddr.get();
    params.sockaddr.addrlen = sockaddr.length;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &Impl::OnPeerError;
    params.err_handler.arg = peer.get();
    const ucs_status_t status = ucp_ep_create(worker_, &params, &peer->ep);
    if (status != UCS_OK) {
      absl::Status error = ucx::ToStatus(status, "ucp_ep_create");
      Log()->warn("ucx transport {}: cannot connect to {}: {}", address_, address,
                  std::string(error.message()));
      return absl::UnavailableError(
          absl::StrCat("send to ", address, " failed: ", error.message()));
    }
    peers_.emplace(address, peer);

    auto hello = std::make_unique<SendOp>();
    hello->impl = this;
    hello->address = address;
    hello->peer = peer;
    hello->hello = true;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &Impl::OnSendDone;
    param.user_data = hello.get();
    ucs_status_ptr_t request =
        ucp_am_send_nbx(peer->ep, kHelloAmId, nullptr, 0, nullptr, 0, &param);
    if (request == nullptr) {
      peer->connected = true;
    } else if (UCS_PTR_IS_ERR(request)) {
      CompleteSend(std::move(hello), UCS_PTR_STATUS(request));
    } else {
      in_flight_.insert(hello.release());
    }
    return peer;
  }

  static void OnPeerError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* peer = static_cast<Peer*>(arg);
    peer->impl->FailPeer(*peer, absl::StrCat("endpoint error: ", ucs_status_string(status)));
  }

  // Drops the peer's endpoint from the cache and schedules its close; pending sends on it then
  // complete with UNAVAILABLE naming `reason`. Idempotent.
  void FailPeer(Peer& peer, std::string reason) {
    if (peer.failed) return;
    std::shared_ptr<Peer> keep = peer.shared_from_this();  // The cache may hold the last reference.
    peer.failed = true;
    peer.failure = std::move(reason);
    if (!stopping_ && (peer.sends_in_flight > 0 || !peer.connected)) {
      Log()->warn("ucx transport {}: connection to {} failed with {} sends in flight: {}", address_,
                  peer.address, peer.sends_in_flight, peer.failure);
    } else if (!stopping_) {
      // An idle connection closing (e.g. the peer shut down) fails no send: not a warning.
      Log()->info("ucx transport {}: connection to {} closed: {}", address_, peer.address,
                  peer.failure);
    }
    if (auto it = peers_.find(peer.address); it != peers_.end() && it->second.get() == &peer) {
      peers_.erase(it);
    }
    to_close_.push_back(
        Closing{.ep = peer.ep, .request = nullptr, .peer = std::move(keep), .conn = nullptr});
  }

  bool ExpireConnects(Clock::time_point now) {
    std::vector<Peer*> expired;
    for (auto& [address, peer] : peers_) {
      if (!peer->connected && now >= peer->connect_deadline) expired.push_back(peer.get());
    }
    for (Peer* peer : expired) {
      FailPeer(*peer,
               absl::StrCat("connect timed out after ", options_.connect_timeout.count(), " ms"));
    }
    return !expired.empty();
  }

  int NextTimeoutMs() const {
    std::optional<Clock::time_point> next;
    for (const auto& [address, peer] : peers_) {
      if (!peer->connected && (!next || peer->connect_deadline < *next)) {
        next = peer->connect_deadline;
      }
    }
    if (!next) return -1;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
  }

  static void OnConnRequest(ucp_conn_request_h request, void* arg) {
    // Endpoints are created outside UCX callbacks (RunLocalWork).
    static_cast<Impl*>(arg)->pending_accepts_.push_back(request);
  }

  void Accept(ucp_conn_request_h request) {
    if (stopping_) {
      if (listener_ != nullptr) ucp_listener_reject(listener_, request);
      return;
    }
    auto conn = std::make_unique<Conn>();
    conn->impl = this;
    conn->id = next_conn_id_++;
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(request, &attr) == UCS_OK) {
      conn->remote = FormatAddress(reinterpret_cast<const sockaddr*>(&attr.client_address));
    }
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.conn_request = request;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &Impl::OnConnError;
    params.err_handler.arg = conn.get();
    const ucs_status_t status = ucp_ep_create(worker_, &params, &conn->ep);
    if (status != UCS_OK) {
      Log()->warn("ucx transport {}: cannot accept connection from {}: {}", address_, conn->remote,
                  ucs_status_string(status));
      return;
    }
    Log()->debug("ucx transport {}: accepted connection from {}", address_, conn->remote);
    conn_by_ep_[conn->ep] = conn.get();
    const uint64_t id = conn->id;
    conns_.emplace(id, std::move(conn));
  }

  static void OnConnError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* conn = static_cast<Conn*>(arg);
    Log()->debug("ucx transport {}: connection from {} closed: {}", conn->impl->address_,
                 conn->remote, ucs_status_string(status));
    conn->impl->CloseConn(*conn);
  }

  void CloseConn(Conn& conn) {
    if (conn.closing) return;
    conn.closing = true;
    if (!conn.pending.empty() && !stopping_) {
      Log()->warn("ucx transport {}: dropping {} undelivered messages from {}", address_,
                  conn.pending.size(), conn.remote);
    }
    conn.pending.clear();
    conn_by_ep_.erase(conn.ep);
    auto it = conns_.find(conn.id);
    std::unique_ptr<Conn> owned = std::move(it->second);
    conns_.erase(it);
    to_close_.push_back(
        Closing{.ep = owned->ep, .request = nullptr, .peer = nullptr, .conn = std::move(owned)});
  }

  // Force-closes the endpoints scheduled by error callbacks; their pending requests complete.
  bool CloseFailedEndpoints() {
    if (to_close_.empty()) return false;
    std::vector<Closing> batch;
    batch.swap(to_close_);
    for (Closing& closing : batch) {
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t request = ucp_ep_close_nbx(closing.ep, &param);
      if (UCS_PTR_IS_PTR(request)) {
        closing.request = request;
        closing_.push_back(std::move(closing));
      }
    }
    return true;
  }

  void ReapClosing() {
    std::erase_if(closing_, [](Closing& closing) {
      if (ucp_request_check_status(closing.request) == UCS_INPROGRESS) return false;
      ucp_request_free(closing.request);
      return true;
    });
  }

  static ucs_status_t OnAmHello(void*, const void*, size_t, void*, size_t,
                                const ucp_am_recv_param_t*) {
    return UCS_OK;
  }

  static ucs_status_t OnAmData(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param) {
    return static_cast<Impl*>(arg)->HandleAm(header, header_length, data, length, param);
  }

  ucs_status_t HandleAm(const void* header, size_t header_length, void* data, size_t length,
                        const ucp_am_recv_param_t* param) {
    const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (stopping_) return UCS_OK;  // Drops the message (a rendezvous one is not fetched).
    if (header_length < kSeqBytes) {
      Log()->warn("ucx transport {}: dropping message with a {}-byte header", address_,
                  header_length);
      return UCS_OK;
    }
    uint64_t seq;
    std::memcpy(&seq, header, kSeqBytes);
    std::span<const std::byte> user_header(static_cast<const std::byte*>(header) + kSeqBytes,
                                           header_length - kSeqBytes);
    Conn* conn = nullptr;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0) {
      if (auto it = conn_by_ep_.find(param->reply_ep); it != conn_by_ep_.end()) conn = it->second;
    }
    if (conn == nullptr) {
      // No stream to order against: deliver as it comes.
      if (!rndv) {
        Deliver(user_header, {static_cast<const std::byte*>(data), length});
        return UCS_OK;
      }
      return StartRndv(0, seq, user_header, data, length);
    }
    if (seq < conn->next_seq || conn->pending.contains(seq)) {
      Log()->warn("ucx transport {}: dropping duplicate message {} from {}", address_, seq,
                  conn->remote);
      return UCS_OK;
    }
    if (!rndv && seq == conn->next_seq) {
      ++conn->next_seq;
      Deliver(user_header, {static_cast<const std::byte*>(data), length});
      DeliverReady(*conn);
      return UCS_OK;
    }
    // Behind an unfinished rendezvous message, or a rendezvous message itself: hold it.
    auto delivery = std::make_unique<Delivery>();
    delivery->header.assign(user_header.begin(), user_header.end());
    if (!rndv) {
      delivery->payload = std::make_unique_for_overwrite<std::byte[]>(length);
      if (length > 0) std::memcpy(delivery->payload.get(), data, length);
      delivery->length = length;
      delivery->ready = true;
      conn->pending.emplace(seq, std::move(delivery));
      return UCS_OK;
    }
    conn->pending.emplace(seq, std::move(delivery));
    return StartRndv(conn->id, seq, {}, data, length);
  }

  ucs_status_t StartRndv(uint64_t conn_id, uint64_t seq, std::span<const std::byte> header,
                         void* data_desc, size_t length) {
    auto recv = std::make_unique<RndvRecv>();
    recv->impl = this;
    recv->conn_id = conn_id;
    recv->seq = seq;
    recv->header.assign(header.begin(), header.end());
    recv->buffer = std::make_unique_for_overwrite<std::byte[]>(length);
    recv->length = length;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.recv_am = &Impl::OnRndvDone;
    param.user_data = recv.get();
    ucs_status_ptr_t request =
        ucp_am_recv_data_nbx(worker_, data_desc, recv->buffer.get(), length, &param);
    if (request == nullptr) {
      FinishRndv(std::move(recv), UCS_OK);
    } else if (UCS_PTR_IS_ERR(request)) {
      FinishRndv(std::move(recv), UCS_PTR_STATUS(request));
    } else {
      rndv_in_flight_.insert(recv.release());
    }
    // UCX owns the descriptor once ucp_am_recv_data_nbx was called.
    return UCS_INPROGRESS;
  }

  static void OnRndvDone(void* request, ucs_status_t status, size_t length, void* user_data) {
    auto* recv = static_cast<RndvRecv*>(user_data);
    ucp_request_free(request);
    recv->impl->rndv_in_flight_.erase(recv);
    recv->impl->FinishRndv(std::unique_ptr<RndvRecv>(recv), status);
  }

  void FinishRndv(std::unique_ptr<RndvRecv> recv, ucs_status_t status) {
    if (stopping_) return;
    auto it = conns_.find(recv->conn_id);
    if (status != UCS_OK) {
      Log()->warn("ucx transport {}: receive of a {}-byte message failed: {}", address_,
                  recv->length, ucs_status_string(status));
      // The stream has a hole now; it cannot deliver in order any more.
      if (it != conns_.end()) CloseConn(*it->second);
      return;
    }
    if (recv->conn_id == 0) {
      Deliver(recv->header, {recv->buffer.get(), recv->length});
      return;
    }
    if (it == conns_.end()) return;  // The connection died meanwhile.
    Conn& conn = *it->second;
    auto pending = conn.pending.find(recv->seq);
    if (pending == conn.pending.end()) return;
    pending->second->payload = std::move(recv->buffer);
    pending->second->length = recv->length;
    pending->second->ready = true;
    DeliverReady(conn);
  }

  void DeliverReady(Conn& conn) {
    while (!conn.pending.empty()) {
      auto first = conn.pending.begin();
      if (first->first != conn.next_seq || !first->second->ready) return;
      std::unique_ptr<Delivery> delivery = std::move(first->second);
      conn.pending.erase(first);
      ++conn.next_seq;
      Deliver(delivery->header, {delivery->payload.get(), delivery->length});
    }
  }

  void Deliver(std::span<const std::byte> header, std::span<const std::byte> payload) {
    std::shared_ptr<const ReceiveHandler> handler;
    { handler = handler_.Get(); }
    if (handler == nullptr || !*handler) {
      Log()->warn("ucx transport {}: no receive handler; dropping a {}-byte message", address_,
                  payload.size());
      return;
    }
    (*handler)(header, payload);
  }

  // Stops accepting work, fails what is pending with CANCELLED, and releases the UCX objects.
  void Teardown() {
    stopping_ = true;
    for (auto& op : sends_.Close()) Post(std::move(op));
    RunLocalWork();  // Rejects pending accepts, cancels local sends.
    if (listener_ != nullptr) {
      ucp_listener_destroy(listener_);
      listener_ = nullptr;
    }
    std::vector<Peer*> peers;
    for (auto& [address, peer] : peers_) peers.push_back(peer.get());
    for (Peer* peer : peers) FailPeer(*peer, "transport shut down");
    std::vector<Conn*> conns;
    for (auto& [id, conn] : conns_) conns.push_back(conn.get());
    for (Conn* conn : conns) CloseConn(*conn);

    if (worker_ != nullptr) {
      CloseFailedEndpoints();
      const Clock::time_point deadline = Clock::now() + kTeardownTimeout;
      while ((!closing_.empty() || !in_flight_.empty()) && Clock::now() < deadline) {
        const unsigned progressed = ucp_worker_progress(worker_);
        RunLocalWork();
        CloseFailedEndpoints();
        ReapClosing();
        if (progressed != 0) continue;
        if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
        epoll_event events[2];
        const int n = epoll_wait(epoll_fd_, events, 2, 10);
        for (int i = 0; i < n; ++i) {
          if (events[i].data.fd == event_fd_) {
            uint64_t count;
            [[maybe_unused]] ssize_t r = read(event_fd_, &count, sizeof(count));
          }
        }
      }
      if (!closing_.empty() || !in_flight_.empty()) {
        Log()->warn("ucx transport {}: {} endpoint closes and {} sends unfinished at shutdown",
                    address_, closing_.size(), in_flight_.size());
      }
      for (Closing& closing : closing_) ucp_request_free(closing.request);
      closing_.clear();
      ucp_worker_destroy(worker_);
      worker_ = nullptr;
    }
    // Whatever UCX did not complete is ours to finish now; the worker can no longer call back.
    std::vector<SendOp*> leftovers(in_flight_.begin(), in_flight_.end());
    in_flight_.clear();
    for (SendOp* op : leftovers) {
      std::unique_ptr<SendOp> owned(op);
      if (owned->hello) continue;
      absl::Status cancelled = SendCancelled(owned->address);
      Finish(std::move(owned), std::move(cancelled));
    }
    for (RndvRecv* recv : rndv_in_flight_) delete recv;
    rndv_in_flight_.clear();
    RunLocalWork();
    to_close_.clear();
    peers_.clear();
    if (context_ != nullptr) {
      ucp_cleanup(context_);
      context_ = nullptr;
    }
    sends_.ClearProgressThread();
  }

  const UcxTransportOptions options_;
  std::string address_;  // Written before Start returns, constant after.
  std::thread thread_;
  int event_fd_ = -1;  // Created before Start returns; closed by the destructor.
  int epoll_fd_ = -1;
  std::mutex join_mu_;

  SendQueue<SendOp> sends_;
  ReceiveHandlerSlot handler_;

  // --- Progress thread only. ---
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  bool stopping_ = false;
  std::deque<ucp_conn_request_h> pending_accepts_;
  std::unordered_map<std::string, std::shared_ptr<Peer>> peers_;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::unordered_map<ucp_ep_h, Conn*> conn_by_ep_;
  uint64_t next_conn_id_ = 1;
  std::vector<Closing> to_close_;
  std::vector<Closing> closing_;
  std::unordered_set<SendOp*> in_flight_;
  std::unordered_set<RndvRecv*> rndv_in_flight_;
};

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(
    const UcxTransportOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(impl)));
}

UcxTransport::UcxTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

UcxTransport::~UcxTransport() { Shutdown(); }

std::string UcxTransport::Address() const { return impl_->Address(); }

void UcxTransport::SetReceiveHandler(ReceiveHandler handler) {
  impl_->SetReceiveHandler(std::move(handler));
}

void UcxTransport::Send(const std::string& peer_address, std::span<const std::byte> header,
                        std::span<const std::byte> payload, SendCallback done) {
  impl_->Send(peer_address, header, payload, std::move(done));
}

void UcxTransport::Shutdown() { impl_->Shutdown(); }

}  // namespace tributary::dataplane
