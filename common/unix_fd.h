// File descriptors over Unix-domain sockets (SCM_RIGHTS) and the peer credentials of such a
// socket (SO_PEERCRED): how a training process hands the agent a sealed memfd, and how the agent
// knows which uid is asking.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tributary::common {

// Owns one file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) Reset(std::exchange(other.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// SO_PEERCRED of a connected Unix-domain socket.
absl::StatusOr<PeerCredentials> GetPeerCredentials(int socket);

// Sends all of `bytes` on `socket` as one message, with `fd` attached (SCM_RIGHTS) when >= 0.
absl::Status SendWithFd(int socket, std::span<const std::byte> bytes, int fd);

// Receives one message of exactly `out.size()` bytes from a SOCK_SEQPACKET socket, and the
// descriptors attached to it: none, or one (into `fd`; any more are closed and the message is
// refused). NOT_FOUND on an orderly end of stream; DEADLINE_EXCEEDED when nothing arrives within
// `timeout` (negative: wait forever); INVALID_ARGUMENT for a message of another size or with
// truncated control data.
absl::Status ReceiveWithFd(int socket, std::span<std::byte> out, UniqueFd* fd,
                           std::chrono::milliseconds timeout);

}  // namespace tributary::common
