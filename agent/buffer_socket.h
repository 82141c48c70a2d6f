// The agent's local sockets: who may connect (mode, group, SO_PEERCRED), how a socket path is
// claimed (never deleting what is not ours), the buffer socket through which training
// processes hand their sealed memfds to the agent (common/buffer_socket_protocol.h), and the
// gRPC socket's listener, which checks every connection's peer before gRPC serves it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/unix_fd.h"

namespace grpc {
class Server;
}

namespace tributary::agent {

// Who may use the agent's local sockets. Root and the agent's own uid always may; so may the
// members of `group` (by the peer's primary gid, and by the file's group for connect) and the
// uids listed. The socket files get `mode` (default 0660: no world access) and `group`.
struct SocketAccess {
  mode_t mode = 0660;
  std::optional<gid_t> group;
  std::vector<uid_t> allowed_uids;
};

// OK when `peer` may use the agent; PERMISSION_DENIED naming the uid and the rule otherwise.
absl::Status CheckPeer(const SocketAccess& access, const common::PeerCredentials& peer);

// Makes `path` free for a new Unix socket: nothing there, or a stale socket nobody listens on
// (removed). ALREADY_EXISTS when a live process serves it; FAILED_PRECONDITION when the path is
// not a socket (it is never deleted).
absl::Status ClaimSocketPath(const std::string& path);

// chmod / chown of a socket file just bound.
absl::Status ApplySocketAccess(const std::string& path, const SocketAccess& access);

class BufferSocketServer {
 public:
  // Registers the memfd `fd` of `size_bytes` for `session_id` on behalf of `peer`; returns the
  // buffer id. Runs on a connection's thread.
  using Handler = std::function<absl::StatusOr<uint64_t>(const common::PeerCredentials& peer,
                                                         const std::string& session_id,
                                                         uint64_t size_bytes, common::UniqueFd fd)>;

  // Undoes a registration of `handler` whose answer could not be sent: the client gave up on
  // it (its deadline passed) and shut the connection, so nobody knows the buffer's id and it
  // would stay mapped until its session ends. Runs on a connection's thread.
  using Release = std::function<void(const std::string& session_id, uint64_t buffer_id)>;

  static constexpr int kMaxConnections = 256;

  // Claims `path`, listens (SOCK_SEQPACKET) and serves until Stop. `release` may be empty
  // (registrations whose answer was lost then stay).
  static absl::StatusOr<std::unique_ptr<BufferSocketServer>> Start(const std::string& path,
                                                                   SocketAccess access,
                                                                   Handler handler,
                                                                   Release release = nullptr);
  ~BufferSocketServer();
  // Closes the socket (removes the file) and every connection; joins the threads. Idempotent.
  void Stop();

  const std::string& path() const { return path_; }
  uint64_t refused_requests() const { return refused_.load(); }
  // Registrations undone because their answer could not be sent.
  uint64_t released_registrations() const { return released_.load(); }

 private:
  struct Connection {
    common::UniqueFd fd;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  BufferSocketServer(std::string path, SocketAccess access, Handler handler, Release release,
                     common::UniqueFd listener, common::UniqueFd wake);
  void AcceptLoop();
  void Serve(Connection* connection);
  void ReapLocked();

  const std::string path_;
  const SocketAccess access_;
  const Handler handler_;
  const Release release_;
  common::UniqueFd listener_;
  common::UniqueFd wake_;  // eventfd: Stop wakes the acceptor
  std::thread acceptor_;
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> released_{0};

  std::mutex mu_;
  bool stopped_ = false;
  std::list<Connection> connections_;
};

// The agent's gRPC Unix socket, bound and accepted here instead of by gRPC, so that each
// connection's peer is checked (SO_PEERCRED, CheckPeer) before gRPC reads a byte of it: an
// allowed peer's connection is handed to `server`, a refused one to `refuse`, a server that
// answers every call with PERMISSION_DENIED naming what is allowed (RefusingServer), and closes
// the connection once idle for 2 s or 10 s old; past kMaxRefusedPer10s refusals in 10 s, refused
// connections are closed unanswered. Every call rides a checked connection, so the check holds
// per call whatever the file's mode. The socket is bound with no access for others until
// `access` is applied. Out of descriptors, the acceptor logs and waits instead of spinning. Both
// servers are built without listening ports and must outlive the listener.
class GrpcUnixListener {
 public:
  static constexpr size_t kMaxRefusedPer10s = 64;

  static absl::StatusOr<std::unique_ptr<GrpcUnixListener>> Start(const std::string& path,
                                                                 SocketAccess access,
                                                                 grpc::Server* server,
                                                                 grpc::Server* refuse);
  ~GrpcUnixListener();
  // Closes the socket (removes the file) and joins the acceptor; connections already handed to
  // gRPC end with their servers. Idempotent.
  void Stop();

  uint64_t accepted_connections() const { return accepted_.load(); }
  uint64_t refused_connections() const { return refused_.load(); }

 private:
  GrpcUnixListener(std::string path, SocketAccess access, grpc::Server* server,
                   grpc::Server* refuse, common::UniqueFd listener, common::UniqueFd wake);
  void AcceptLoop();

  const std::string path_;
  const SocketAccess access_;
  grpc::Server* server_;
  grpc::Server* refuse_;
  common::UniqueFd listener_;
  common::UniqueFd wake_;
  std::thread acceptor_;
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> refused_{0};
  std::deque<std::chrono::steady_clock::time_point> recent_refusals_;  // acceptor thread only
  std::once_flag stop_;
};

// A gRPC server, without ports, whose every method answers PERMISSION_DENIED with `message`:
// where GrpcUnixListener sends the peers it refuses.
class RefusingServer {
 public:
  static absl::StatusOr<std::unique_ptr<RefusingServer>> Start(std::string message);
  ~RefusingServer();
  grpc::Server* server();
  void Shutdown();

 private:
  struct Impl;
  explicit RefusingServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};
// The refusal for peers CheckPeer does not allow, without the peer's own uid (the refusing
// server cannot tell connections apart).
std::string RefusalMessage(const SocketAccess& access);

}  // namespace tributary::agent
