// The client's end of the agent's buffer socket (common/buffer_socket_protocol.h): hands the
// agent a SharedBuffer's sealed memfd and gets the buffer's id back.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "common/unix_fd.h"

namespace tributary::client::internal {

class BufferChannel {
 public:
  // Connects to the buffer socket of the agent at `agent_address` ("unix:PATH"). UNAVAILABLE when
  // no agent serves it, PERMISSION_DENIED when this uid may not connect (the message says how to
  // get access), FAILED_PRECONDITION for an agent reached over TCP (shared memory needs a local
  // agent and its unix socket).
  static absl::StatusOr<std::unique_ptr<BufferChannel>> Connect(const std::string& agent_address);

  // Registers the sealed memfd `fd` of `size_bytes` bytes with session `session_id`; the agent's
  // status comes back as is. Thread-safe (one request at a time). A request that failed on the
  // connection (no or a malformed answer within `timeout`) closes it; the next request connects
  // again (registration does not depend on the connection). Without an answer within `timeout`
  // the connection is shut down: DEADLINE_EXCEEDED, and the agent, whose late answer then cannot
  // be sent, releases the buffer (an answer that came before the shutdown is used).
  absl::StatusOr<uint64_t> Register(const std::string& session_id, int fd, uint64_t size_bytes,
                                    std::chrono::milliseconds timeout);

 private:
  BufferChannel(std::string path, common::UniqueFd socket)
      : path_(std::move(path)), socket_(std::move(socket)) {}

  // A connected socket to the buffer socket at `path` (the errors of Connect).
  static absl::StatusOr<common::UniqueFd> Dial(const std::string& path);

  const std::string path_;
  std::mutex mu_;
  common::UniqueFd socket_;  // Guarded by mu_; invalid after a failed request.
};

}  // namespace tributary::client::internal
