#include "agent/buffer_socket.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/buffer_socket_protocol.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/thread_name.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_posix.h"
#include "grpcpp/support/server_callback.h"

namespace tributary::agent {
namespace {

namespace protocol = common::buffer_socket;
constexpr auto Log = common::ComponentLog<"agent">;

absl::Status Errno(std::string_view what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat(std::string(what), " '", path, "': ", std::strerror(errno)));
}

absl::StatusOr<sockaddr_un> UnixAddress(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' must have 1 to ",
                                                   sizeof(address.sun_path) - 1, " bytes"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  return address;
}

// Not OK when the answer could not be sent (the client shut the connection).
absl::Status Respond(int fd, absl::Status status, uint64_t buffer_id) {
  protocol::Response response;
  response.code = static_cast<int32_t>(status.code());
  response.buffer_id = buffer_id;
  const std::string message(status.message());
  std::memcpy(response.message, message.data(),
              std::min(message.size(), sizeof(response.message) - 1));
  return common::SendWithFd(fd, {reinterpret_cast<const std::byte*>(&response), sizeof(response)},
                            -1);
}

// After a failed accept (errno set): out of descriptors, the connection stays pending and poll
// would report it at once again, so say so and wait (for the stop eventfd `wake`, at most
// 100 ms) instead of spinning. True when the wait ended by a stop.
bool StoppedDuringAcceptPause(int wake, std::string_view what, const std::string& path) {
  if (errno != EMFILE && errno != ENFILE) return false;
  Log()->warn("{} '{}': accept: {}", what, path, std::strerror(errno));
  pollfd stop = {wake, POLLIN, 0};
  return poll(&stop, 1, 100) > 0;
}

}  // namespace

static std::string AllowedPeers(const SocketAccess& access) {
  return absl::StrCat("allowed are root, uid ", geteuid(),
                      access.group ? absl::StrCat(", group ", *access.group) : std::string(),
                      access.allowed_uids.empty()
                          ? std::string()
                          : absl::StrCat(", uids ", absl::StrJoin(access.allowed_uids, ",")),
                      " (agent flags --socket-group / --socket-allow-uid)");
}

absl::Status CheckPeer(const SocketAccess& access, const common::PeerCredentials& peer) {
  if (peer.uid == 0 || peer.uid == geteuid()) return absl::OkStatus();
  if (access.group && peer.gid == *access.group) return absl::OkStatus();
  if (std::find(access.allowed_uids.begin(), access.allowed_uids.end(), peer.uid) !=
      access.allowed_uids.end()) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("uid ", peer.uid, " (gid ", peer.gid, ", pid ", peer.pid,
                   ") may not use this agent: ", AllowedPeers(access)));
}

std::string RefusalMessage(const SocketAccess& access) {
  return absl::StrCat("your uid may not use this agent: ", AllowedPeers(access));
}

absl::Status ClaimSocketPath(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return Errno("stat", path);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", path, "' exists and is not a socket; not deleting it (choose another path)"));
  }
  ASSIGN_OR_RETURN(sockaddr_un address, UnixAddress(path));
  for (int type : {SOCK_STREAM, SOCK_SEQPACKET}) {
    // Non-blocking: a listener whose backlog is full (a stuck process) answers EAGAIN at once
    // instead of blocking the agent's start; it is alive, so the path is not ours.
    common::UniqueFd probe(socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!probe.valid()) return Errno("socket", path);
    if (connect(probe.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 ||
        errno == EAGAIN) {
      return absl::AlreadyExistsError(absl::StrCat(
          "another process is serving '", path, "' (another agent on this node?); not taking it"));
    }
    if (errno != ECONNREFUSED && errno != EPROTOTYPE) return Errno("connect", path);
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) return Errno("unlink stale socket", path);
  Log()->info("removed the stale socket '{}' (nobody was listening)", path);
  return absl::OkStatus();
}

absl::Status ApplySocketAccess(const std::string& path, const SocketAccess& access) {
  if (access.group && chown(path.c_str(), static_cast<uid_t>(-1), *access.group) != 0) {
    return Errno("chown", path);
  }
  if (chmod(path.c_str(), access.mode) != 0) return Errno("chmod", path);
  return absl::OkStatus();
}

namespace {

// Claims `path` and listens on it (socket `type`), bound with no access for others until
// `access` is applied.
absl::StatusOr<common::UniqueFd> ListenUnix(const std::string& path, int type, int backlog,
                                            const SocketAccess& access) {
  ASSIGN_OR_RETURN(sockaddr_un address, UnixAddress(path));
  RETURN_IF_ERROR(ClaimSocketPath(path));
  common::UniqueFd listener(socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!listener.valid()) return Errno("socket", path);
  const mode_t old_mask = umask(0177);
  const int bound = bind(listener.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address));
  umask(old_mask);
  if (bound != 0) return Errno("bind", path);
  RETURN_IF_ERROR(ApplySocketAccess(path, access));
  if (listen(listener.get(), backlog) != 0) return Errno("listen", path);
  return listener;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BufferSocketServer>> BufferSocketServer::Start(
    const std::string& path, SocketAccess access, Handler handler, Release release) {
  ASSIGN_OR_RETURN(common::UniqueFd listener, ListenUnix(path, SOCK_SEQPACKET, 64, access));
  common::UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return Errno("eventfd", path);
  std::unique_ptr<BufferSocketServer> server(
      new BufferSocketServer(path, std::move(access), std::move(handler), std::move(release),
                             std::move(listener), std::move(wake)));
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

BufferSocketServer::BufferSocketServer(std::string path, SocketAccess access, Handler handler,
                                       Release release, common::UniqueFd listener,
                                       common::UniqueFd wake)
    : path_(std::move(path)),
      access_(std::move(access)),
      handler_(std::move(handler)),
      release_(std::move(release)),
      listener_(std::move(listener)),
      wake_(std::move(wake)) {}

BufferSocketServer::~BufferSocketServer() { Stop(); }

void BufferSocketServer::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    for (Connection& c : connections_) shutdown(c.fd.get(), SHUT_RDWR);
  }
  const uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
  if (acceptor_.joinable()) acceptor_.join();
  for (Connection& c : connections_) {
    if (c.thread.joinable()) c.thread.join();
  }
  connections_.clear();
  listener_.Reset();
  unlink(path_.c_str());
}

void BufferSocketServer::ReapLocked() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->done.load()) {
      it->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void BufferSocketServer::AcceptLoop() {
  common::SetCurrentThreadName("trib-buf-accept");
  while (true) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      Log()->error("buffer socket '{}': poll: {}", path_, std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    common::UniqueFd fd(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (StoppedDuringAcceptPause(wake_.get(), "buffer socket", path_)) return;
      continue;
    }
    std::lock_guard lock(mu_);
    if (stopped_) return;
    ReapLocked();
    if (connections_.size() >= kMaxConnections) {
      refused_++;
      (void)Respond(
          fd.get(),
          absl::ResourceExhaustedError(absl::StrCat("the agent serves at most ", kMaxConnections,
                                                    " buffer-socket connections")),
          0);
      continue;
    }
    Connection& c = connections_.emplace_back();
    c.fd = std::move(fd);
    c.thread = std::thread([this, &c] { Serve(&c); });
  }
}

void BufferSocketServer::Serve(Connection* connection) {
  common::SetCurrentThreadName("trib-buffers");
  const int fd = connection->fd.get();
  absl::StatusOr<common::PeerCredentials> peer = common::GetPeerCredentials(fd);
  absl::Status allowed = peer.ok() ? CheckPeer(access_, *peer) : peer.status();
  while (true) {
    protocol::Request request;
    common::UniqueFd memfd;
    absl::Status received =
        common::ReceiveWithFd(fd, {reinterpret_cast<std::byte*>(&request), sizeof(request)}, &memfd,
                              std::chrono::milliseconds(-1));
    if (absl::IsNotFound(received) || absl::IsUnavailable(received)) break;  // closed
    absl::Status status = received;
    if (status.ok() &&
        (request.magic != protocol::kRequestMagic || request.version != protocol::kVersion ||
         request.kind != protocol::kRegisterBuffer)) {
      status = absl::InvalidArgumentError(
          absl::StrCat("not a buffer-socket request of version ", protocol::kVersion));
    }
    if (status.ok() && !memfd.valid()) {
      status = absl::InvalidArgumentError("the request carries no file descriptor");
    }
    if (status.ok()) status = allowed;
    uint64_t id = 0;
    std::string session;
    if (status.ok()) {
      session.assign(request.session_id, strnlen(request.session_id, sizeof(request.session_id)));
      absl::StatusOr<uint64_t> registered =
          handler_(*peer, session, request.size_bytes, std::move(memfd));
      status = registered.status();
      if (registered.ok()) id = *registered;
    }
    if (!status.ok()) {
      refused_++;
      Log()->warn("buffer socket: request from pid {} uid {} refused: {}",
                  peer.ok() ? peer->pid : 0, peer.ok() ? peer->uid : 0, status.ToString());
    }
    const absl::Status answered = Respond(fd, status, id);
    if (!answered.ok() && status.ok()) {
      // The client gave up on this registration (its deadline passed) and shut the connection
      // before the answer: nobody will ever name the buffer, so it goes now.
      Log()->warn(
          "buffer socket: the answer to pid {}'s registration of buffer {} in session {} could "
          "not be sent ({}); releasing the buffer",
          peer.ok() ? peer->pid : 0, id, session, answered.message());
      released_++;
      if (release_) release_(session, id);
    }
    // A malformed message ends the connection: the stream cannot be trusted any more.
    if (absl::IsInvalidArgument(received)) break;
  }
  connection->done = true;
}

// ---------------------------------------------------------------------------------------------
// GrpcUnixListener

class RefuseAllService : public grpc::CallbackGenericService {
 public:
  explicit RefuseAllService(std::string message) : message_(std::move(message)) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Refuse : public grpc::ServerGenericBidiReactor {
     public:
      explicit Refuse(const std::string& message) {
        Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, message));
      }
      void OnDone() override { delete this; }
    };
    return new Refuse(message_);
  }

 private:
  const std::string message_;
};

struct RefusingServer::Impl {
  explicit Impl(std::string message) : service(std::move(message)) {}
  RefuseAllService service;
  std::unique_ptr<grpc::Server> server;
};

absl::StatusOr<std::unique_ptr<RefusingServer>> RefusingServer::Start(std::string message) {
  auto impl = std::make_unique<Impl>(std::move(message));
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(4 << 10);
  // A refused peer's connection does not stay: closed when idle for 2 s, and after 10 s anyway.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 2000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, 1000);
  builder.RegisterCallbackGenericService(&impl->service);
  impl->server = builder.BuildAndStart();
  if (!impl->server) return absl::UnavailableError("cannot start the refusing gRPC server");
  return std::unique_ptr<RefusingServer>(new RefusingServer(std::move(impl)));
}

RefusingServer::RefusingServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RefusingServer::~RefusingServer() { Shutdown(); }

grpc::Server* RefusingServer::server() { return impl_->server.get(); }

void RefusingServer::Shutdown() { impl_->server->Shutdown(std::chrono::system_clock::now()); }

absl::StatusOr<std::unique_ptr<GrpcUnixListener>> GrpcUnixListener::Start(const std::string& path,
                                                                          SocketAccess access,
                                                                          grpc::Server* server,
                                                                          grpc::Server* refuse) {
  ASSIGN_OR_RETURN(common::UniqueFd listener, ListenUnix(path, SOCK_STREAM, 128, access));
  common::UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return Errno("eventfd", path);
  std::unique_ptr<GrpcUnixListener> l(new GrpcUnixListener(path, std::move(access), server, refuse,
                                                           std::move(listener), std::move(wake)));
  l->acceptor_ = std::thread([raw = l.get()] { raw->AcceptLoop(); });
  return l;
}

GrpcUnixListener::GrpcUnixListener(std::string path, SocketAccess access, grpc::Server* server,
                                   grpc::Server* refuse, common::UniqueFd listener,
                                   common::UniqueFd wake)
    : path_(std::move(path)),
      access_(std::move(access)),
      server_(server),
      refuse_(refuse),
      listener_(std::move(listener)),
      wake_(std::move(wake)) {}

GrpcUnixListener::~GrpcUnixListener() { Stop(); }

void GrpcUnixListener::Stop() {
  std::call_once(stop_, [this] {
    const uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof(one));
    if (acceptor_.joinable()) acceptor_.join();
    listener_.Reset();
    unlink(path_.c_str());
  });
}

void GrpcUnixListener::AcceptLoop() {
  common::SetCurrentThreadName("trib-rpc-accept");
  while (true) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      Log()->error("local socket '{}': poll: {}", path_, std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    // Non-blocking, as gRPC's endpoints expect of a descriptor they are handed.
    common::UniqueFd fd(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) {
      if (StoppedDuringAcceptPause(wake_.get(), "local socket", path_)) return;
      continue;
    }
    absl::StatusOr<common::PeerCredentials> peer = common::GetPeerCredentials(fd.get());
    absl::Status allowed = peer.ok() ? CheckPeer(access_, *peer) : peer.status();
    if (allowed.ok()) {
      accepted_++;
      grpc::AddInsecureChannelFromFd(server_, fd.Release());
      continue;
    }
    refused_++;
    // At most kMaxRefusedPer10s refused connections get their answer in any 10 s (each is
    // held by the refusing server until idle or old); beyond that they are closed unanswered.
    const auto now = std::chrono::steady_clock::now();
    while (!recent_refusals_.empty() && now - recent_refusals_.front() > std::chrono::seconds(10)) {
      recent_refusals_.pop_front();
    }
    if (recent_refusals_.size() >= kMaxRefusedPer10s) continue;  // `fd` closes
    recent_refusals_.push_back(now);
    Log()->warn("local socket '{}': connection refused: {}", path_, allowed.message());
    grpc::AddInsecureChannelFromFd(refuse_, fd.Release());
  }
}

}  // namespace tributary::agent
