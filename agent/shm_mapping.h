// A training process's shared memory (a sealed memfd it sent over the buffer socket) mapped
// into the agent.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tributary::agent {

// The largest buffer or tensor the agent accepts: 1 TiB.
inline constexpr uint64_t kMaxTensorBytes = uint64_t{1} << 40;

// Memory whose bytes live outside the agent's address space (a training process's CUDA
// buffer, agent/cuda_buffer.h), seen by the data plane through a host mirror. The agent copies
// an operation's region in before the data plane reads it and back after the operation
// succeeded (agent/mirror_stager.h). Copies block: they run on the staging thread only, never
// under a lock of the agent or on a data-plane thread.
class MirroredMemory {
 public:
  virtual ~MirroredMemory() = default;
  // The host mirror: what the data plane reads and writes, size() bytes.
  virtual std::byte* host() const = 0;
  virtual uint64_t size() const = 0;
  // Copies bytes [offset, offset + bytes) of the source into the mirror, ordered after the
  // source's owner marked them ready; returns once they are there, or DEADLINE_EXCEEDED after
  // `timeout` (the owner's work before the mark never finished; the copy stays queued, in order
  // before any later one).
  virtual absl::Status CopyIn(uint64_t offset, uint64_t bytes,
                              std::chrono::milliseconds timeout) = 0;
  // Copies the mirror's bytes [offset, offset + bytes) back to the source; returns once the
  // source's owner would see them, or DEADLINE_EXCEEDED after `timeout`.
  virtual absl::Status CopyOut(uint64_t offset, uint64_t bytes,
                               std::chrono::milliseconds timeout) = 0;

  // GPU memory the mirror stands for, opened in this process (null: not GPU memory), and its
  // CUDA device: what the intra-node executors work on (agent/gpu_aggregation.h).
  virtual void* device_data() const { return nullptr; }
  virtual int device() const { return -1; }
  // Returns once the owner's work before its ready mark has finished (as CopyIn waits for it),
  // or DEADLINE_EXCEEDED after `timeout`.
  virtual absl::Status WaitReady(std::chrono::milliseconds /*timeout*/) {
    return absl::UnimplementedError("this memory has no ready mark");
  }
};

// One mapping, read-write and shared with its creator. Unmapped when the last owner (the
// session that registered it, or an operation still using it) lets go. Immutable once made.
// Either a shared-memory mapping (munmapped at the end) or a MirroredMemory's host mirror
// (released with it).
class SharedMemoryMapping {
 public:
  SharedMemoryMapping(std::string name, std::byte* data, uint64_t size)
      : name_(std::move(name)), data_(data), size_(size) {}
  SharedMemoryMapping(std::string name, std::unique_ptr<MirroredMemory> mirror)
      : name_(std::move(name)),
        data_(mirror->host()),
        size_(mirror->size()),
        mirror_(std::move(mirror)) {}
  SharedMemoryMapping(const SharedMemoryMapping&) = delete;
  SharedMemoryMapping& operator=(const SharedMemoryMapping&) = delete;
  ~SharedMemoryMapping();

  const std::string& name() const { return name_; }
  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The memory behind the mirror, or null for shared memory.
  MirroredMemory* mirror() const { return mirror_.get(); }

 private:
  const std::string name_;
  std::byte* const data_;
  const uint64_t size_;
  const std::unique_ptr<MirroredMemory> mirror_;
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
