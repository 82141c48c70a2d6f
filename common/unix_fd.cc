#include "common/unix_fd.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tributary::common {
namespace {

absl::Status Errno(std::string_view what) {
  const int error = errno;
  return absl::Status(error == EAGAIN || error == EWOULDBLOCK ? absl::StatusCode::kDeadlineExceeded
                                                              : absl::StatusCode::kUnavailable,
                      absl::StrCat(std::string(what), ": ", std::strerror(error)));
}

}  // namespace

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

absl::StatusOr<PeerCredentials> GetPeerCredentials(int socket) {
  ucred cred{};
  socklen_t length = sizeof(cred);
  if (getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0) {
    return Errno("getsockopt(SO_PEERCRED)");
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

absl::Status SendWithFd(int socket, std::span<const std::byte> bytes, int fd) {
  iovec iov{const_cast<std::byte*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  while (true) {
    const ssize_t n = sendmsg(socket, &msg, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(bytes.size())) return absl::OkStatus();
    if (n >= 0) return absl::UnavailableError("sendmsg: short write on a message socket");
    if (errno != EINTR) return Errno("sendmsg");
  }
}

absl::Status ReceiveWithFd(int socket, std::span<std::byte> out, UniqueFd* fd,
                           std::chrono::milliseconds timeout) {
  if (timeout.count() >= 0) {
    pollfd p{socket, POLLIN, 0};
    int ready;
    do {
      ready = poll(&p, 1, static_cast<int>(timeout.count()));
    } while (ready < 0 && errno == EINTR);
    if (ready < 0) return Errno("poll");
    if (ready == 0) return absl::DeadlineExceededError("no message within the deadline");
  }
  iovec iov{out.data(), out.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Errno("recvmsg");
  // Whatever arrived attached is ours to close unless it is the one descriptor we accept.
  std::vector<int> received;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int f;
      std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      received.push_back(f);
    }
  }
  auto close_all = [&] {
    for (int f : received) close(f);
  };
  if (n == 0 && received.empty()) return absl::NotFoundError("end of stream");
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || static_cast<size_t>(n) != out.size()) {
    close_all();
    return absl::InvalidArgumentError(absl::StrCat(
        "message of ", n, (msg.msg_flags & MSG_TRUNC) != 0 ? "+" : "", " bytes, expected ",
        out.size(), (msg.msg_flags & MSG_CTRUNC) != 0 ? " (too many descriptors attached)" : ""));
  }
  if (received.size() > 1) {
    close_all();
    return absl::InvalidArgumentError(
        absl::StrCat(received.size(), " descriptors attached, expected at most one"));
  }
  if (fd != nullptr) {
    fd->Reset(received.empty() ? -1 : received[0]);
  } else {
    close_all();
  }
  return absl::OkStatus();
}

}  // namespace tributary::common
