#include "client/buffer_channel.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/buffer_socket_protocol.h"
#include "common/status_macros.h"

namespace tributary::client::internal {

namespace protocol = common::buffer_socket;

absl::StatusOr<std::unique_ptr<BufferChannel>> BufferChannel::Connect(
    const std::string& agent_address) {
  if (agent_address.rfind("unix:", 0) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared buffers need the local agent's unix socket; agent address '",
                     agent_address, "' is not unix:PATH"));
  }
  std::string socket_path = agent_address.substr(5);
  if (socket_path.rfind("//", 0) == 0) socket_path = socket_path.substr(2);  // unix:///abs
  const std::string path = protocol::PathFor(socket_path);
  ASSIGN_OR_RETURN(common::UniqueFd fd, Dial(path));
  return std::unique_ptr<BufferChannel>(new BufferChannel(path, std::move(fd)));
}

absl::StatusOr<common::UniqueFd> BufferChannel::Dial(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer socket path '", path, "' is too long for a unix socket"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  // Non-blocking for the connect only: a unix socket's connect blocks while the listener's
  // backlog is full (an agent that stopped accepting); non-blocking, it fails at once (EAGAIN).
  common::UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) {
    return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  // A full backlog can be a burst of processes joining at once: asked again for about 300 ms
  // (10 ms doubling to 160 ms) before it counts as an agent that stopped accepting.
  int connected = connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address));
  for (auto pause = std::chrono::milliseconds(10);
       connected != 0 && errno == EAGAIN && pause <= std::chrono::milliseconds(160); pause *= 2) {
    std::this_thread::sleep_for(pause);  // a bounded retry of a refused connect, not a wait
    connected = connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address));
  }
  if (connected != 0) {
    const int error = errno;
    if (error == EAGAIN) {
      return absl::UnavailableError(absl::StrCat(
          "the agent's buffer socket '", path,
          "' accepted no connection for 300 ms (its backlog is full: is the agent stuck?)"));
    }
    if (error == EACCES || error == EPERM) {
      return absl::PermissionDeniedError(absl::StrCat(
          "cannot connect to the agent's buffer socket '", path, "': ", std::strerror(error),
          "; the agent admits root, its own uid, its --socket-group and --socket-allow-uid"));
    }
    return absl::UnavailableError(absl::StrCat("cannot connect to the agent's buffer socket '",
                                               path, "': ", std::strerror(error)));
  }
  // Requests block in sendmsg (bounded: one request in flight) and wait for answers in poll.
  const int flags = fcntl(fd.get(), F_GETFL);
  if (flags < 0 || fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("fcntl: ", std::strerror(errno)));
  }
  return fd;
}

absl::StatusOr<uint64_t> BufferChannel::Register(const std::string& session_id, int fd,
                                                 uint64_t size_bytes,
                                                 std::chrono::milliseconds timeout) {
  protocol::Request request;
  if (session_id.size() >= sizeof(request.session_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("session id of ", session_id.size(), " bytes is too long"));
  }
  std::memcpy(request.session_id, session_id.data(), session_id.size());
  request.size_bytes = size_bytes;
  std::lock_guard lock(mu_);
  if (!socket_.valid()) {
    // The last request failed on the connection (the stream was out of step): a fresh one.
    absl::StatusOr<common::UniqueFd> again = Dial(path_);
    if (!again.ok()) {
      return absl::Status(
          again.status().code(),
          absl::StrCat("connecting again after a failed request: ", again.status().message()));
    }
    socket_ = *std::move(again);
  }
  absl::Status sent = common::SendWithFd(
      socket_.get(), {reinterpret_cast<const std::byte*>(&request), sizeof(request)}, fd);
  protocol::Response response;
  absl::Status received =
      sent.ok() ? common::ReceiveWithFd(socket_.get(),
                                        {reinterpret_cast<std::byte*>(&response), sizeof(response)},
                                        nullptr, timeout)
                : sent;
  if (absl::IsDeadlineExceeded(received)) {
    // Giving up. Shutting the connection down first decides the race with the agent's answer:
    // an answer queued before the shutdown is read here (the buffer is registered after all),
    // and one sent after it fails, and the agent then releases the buffer (nobody would know its
    // id). Either way no registration stays behind unknown.
    shutdown(socket_.get(), SHUT_RDWR);
    received = common::ReceiveWithFd(socket_.get(),
                                     {reinterpret_cast<std::byte*>(&response), sizeof(response)},
                                     nullptr, std::chrono::milliseconds(0));
    socket_.Reset();                   // shut down: the next call connects again
    if (absl::IsNotFound(received)) {  // nothing came before the shutdown
      return absl::DeadlineExceededError(
          absl::StrCat("registering a buffer over '", path_, "': no answer within ",
                       timeout.count(), " ms (the agent releases the buffer if it answers later)"));
    }
  }
  if (!received.ok() || response.magic != protocol::kResponseMagic) {
    socket_.Reset();  // the stream is out of step: the next call connects again
    const std::string why =
        received.ok() ? std::string("a malformed response") : std::string(received.message());
    return absl::UnavailableError(absl::StrCat("registering a buffer over '", path_, "': ", why));
  }
  if (response.code != 0) {
    return absl::Status(
        static_cast<absl::StatusCode>(response.code),
        std::string(response.message, strnlen(response.message, sizeof(response.message))));
  }
  return response.buffer_id;
}

}  // namespace tributary::client::internal
