// Shared memory through which a training process hands tensors to its local agent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "common/unix_fd.h"

namespace tributary::client {

namespace internal {
class AgentSession;
class ControlRing;
class CudaExport;
}  // namespace internal

class Client;

// Anonymous shared memory created by this process (memfd_create, sized, its size sealed with
// F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, mapped MAP_SHARED read/write) that the local agent
// maps too once registered: Client::AllocateBuffer sends the memfd over the agent's buffer socket
// (common/buffer_socket_protocol.h). Tensor bytes move between the process and the agent through
// it; no bytes travel over gRPC. It has no name: no other process can open it, and it is gone
// once the last mapping closes -- nothing is left behind in /dev/shm when a process dies.
//
// Ownership: the buffer owns the mapping (and the memfd until it is registered). The destructor
// unregisters it from the agent (best effort, only while the session is active) and unmaps it.
// A buffer may outlive the Client that allocated it.
// Threading: the accessors are thread-safe; the bytes are the caller's to synchronise — do not
// write a region while a collective on it is in flight.
//
// A CUDA buffer (Client::RegisterCudaBuffer, is_cuda()) is the caller's device allocation
// registered by CUDA IPC instead: data() is the device pointer (as<T>() spans device memory,
// not to be read on the host), the buffer owns only the export (the allocation stays the
// caller's and must outlive the buffer), and each collective's submission first records the
// buffer's ready event on its stream, so the agent copies the region only after the work
// queued there. When a collective on it is done (Handle::Wait OK) the result is in device
// memory, visible to kernels launched after.
class SharedBuffer {
 public:
  // Creates and maps a new sealed memfd of `bytes` bytes (> 0), zero-filled, labelled
  // "tributary-<pid>-<counter>" (what /proc/PID/maps shows). Not registered with any agent
  // (id() == 0); Client::AllocateBuffer creates and registers one.
  static absl::StatusOr<std::unique_ptr<SharedBuffer>> Create(size_t bytes);

  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;
  ~SharedBuffer();

  // Start of the mapping in this process.
  void* data() const { return data_; }
  // Size of the object and the mapping, bytes.
  size_t size() const { return size_; }
  // The agent's id of the registered buffer; 0 when not registered.
  uint64_t id() const { return id_; }
  // The memfd's label, for messages.
  const std::string& name() const { return name_; }
  // The memfd while the buffer is not registered (what Client::AllocateBuffer sends to the
  // agent); -1 once it is.
  int fd() const { return fd_.get(); }
  // A CUDA device buffer (Client::RegisterCudaBuffer); then cuda_device() is its device.
  bool is_cuda() const { return cuda_ != nullptr; }
  int cuda_device() const { return cuda_device_; }

  // The whole buffer as elements of T (size() / sizeof(T) of them; the tail that does not fill
  // a whole T is left out).
  template <typename T>
  std::span<T> as() const {
    return std::span<T>(static_cast<T*>(data_), size_ / sizeof(T));
  }

 private:
  friend class Client;

  friend class internal::ControlRing;

  SharedBuffer(std::string name, void* data, size_t size, common::UniqueFd fd);
  // A CUDA buffer: `cuda` exports the device allocation at `data`; `stream` (a cudaStream_t,
  // null: the legacy default stream) is where MarkReady records the ready event.
  SharedBuffer(std::string name, void* data, size_t size,
               std::unique_ptr<internal::CudaExport> cuda, int device, void* stream);
  // CUDA buffers: records the ready event before a submission (OK for shared memory).
  absl::Status MarkReady() const;

  // Called by Client::AllocateBuffer once the agent has registered the buffer.
  void SetRegistration(std::shared_ptr<internal::AgentSession> session, uint64_t id);

  const std::string name_;
  void* const data_;
  const size_t size_;
  common::UniqueFd fd_;
  std::shared_ptr<internal::AgentSession> session_;
  uint64_t id_ = 0;
  const std::unique_ptr<internal::CudaExport> cuda_;
  const int cuda_device_ = -1;
  void* const cuda_stream_ = nullptr;
};

}  // namespace tributary::client
