// A training process's shared memory (a sealed memfd it sent over the buffer socket) mapped
// into the agent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tributary::agent {

// The largest buffer or tensor the agent accepts: 1 TiB.
inline constexpr uint64_t kMaxTensorBytes = uint64_t{1} << 40;

// One mapping, read-write and shared with its creator. Unmapped when the last owner (the
// session that registered it, or an operation still using it) lets go. Immutable once made.
class SharedMemoryMapping {
 public:
  SharedMemoryMapping(std::string name, std::byte* data, uint64_t size)
      : name_(std::move(name)), data_(data), size_(size) {}
  SharedMemoryMapping(const SharedMemoryMapping&) = delete;
  SharedMemoryMapping& operator=(const SharedMemoryMapping&) = delete;
  ~SharedMemoryMapping();

  const std::string& name() const { return name_; }
  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  const std::string name_;
  std::byte* const data_;
  const uint64_t size_;
};

// INVALID_ARGUMENT unless `size_bytes` is in [1, 1 TiB].
absl::Status CheckBufferSize(uint64_t size_bytes);

// Maps the first `size_bytes` of the memfd `fd` a training process sent over the buffer socket
// (common/buffer_socket_protocol.h). The file must be sealed against shrinking and growing
// (F_SEAL_SHRINK | F_SEAL_GROW), so that it can never shrink under the mapping (SIGBUS), and
// hold at least `size_bytes`: INVALID_ARGUMENT, saying what is wrong, otherwise.
// RESOURCE_EXHAUSTED when mmap fails. `what` names it in messages ("buffer of session s").
// System calls: call it with no lock held.
absl::StatusOr<std::shared_ptr<SharedMemoryMapping>> MapSealedMemory(int fd, uint64_t size_bytes,
                                                                     const std::string& what);

}  // namespace tributary::agent
