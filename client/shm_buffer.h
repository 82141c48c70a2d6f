// POSIX shared memory through which a training process hands tensors to its local agent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace tributary::client {

namespace internal {
class AgentSession;
}  // namespace internal

class Client;

// A POSIX shared-memory object created by this process (shm_open with O_CREAT | O_EXCL, sized
// with ftruncate, mapped MAP_SHARED read/write) that the local agent maps too, once
// registered. Tensor bytes move between the process and the agent through it; no bytes travel
// over gRPC.
//
// Ownership: the buffer owns the object and the mapping. The destructor unregisters it from the
// agent (best effort, only while the session is active), unmaps it and shm_unlinks the name, so
// the object is gone once the last mapping (the agent's) closes. A buffer may outlive the
// Client that allocated it.
// Threading: the accessors are thread-safe; the bytes are the caller's to synchronise — do not
// write a region while a collective on it is in flight.
class SharedBuffer {
 public:
  // Creates and maps a new object of `bytes` bytes (> 0), zero-filled, named
  // "/tributary-<pid>-<counter>-<random>". Not registered with any agent (id() == 0);
  // Client::AllocateBuffer creates and registers one.
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
  // The name passed to shm_open (starts with '/').
  const std::string& name() const { return name_; }

  // The whole buffer as elements of T (size() / sizeof(T) of them; the tail that does not fill
  // a whole T is left out).
  template <typename T>
  std::span<T> as() const {
    return std::span<T>(static_cast<T*>(data_), size_ / sizeof(T));
  }

 private:
  friend class Client;

  SharedBuffer(std::string name, void* data, size_t size);

  // Called by Client::AllocateBuffer once the agent has registered the buffer.
  void SetRegistration(std::shared_ptr<internal::AgentSession> session, uint64_t id);

  const std::string name_;
  void* const data_;
  const size_t size_;
  std::shared_ptr<internal::AgentSession> session_;
  uint64_t id_ = 0;
};

// Removes the shared-memory objects of SharedBuffers that process `pid` created and did not
// unlink (it was killed, or exited without running destructors): the names
// "/tributary-<pid>-*" (see SharedBuffer). For whoever started the process, once it has been
// reaped (a live process's buffers are left alone only by not calling this). Returns how many
// were removed; objects of other processes are never touched.
int UnlinkSharedBuffersOf(int pid);

}  // namespace tributary::client
