// A pool of registered SharedBuffers through which the c10d backend stages CPU tensors: one copy
// in before a collective, one copy out after it.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "client/shm_buffer.h"

namespace tributary::client::c10d {

// Buffers are sized in powers of two (at least kMinBytes) and kept per size after use, so a
// training loop that issues the same collectives every step registers its buffers with the agent
// once (registration is an RPC). At most kMaxFreePerSize idle buffers are kept per size; the
// rest are freed (unregistered, unmapped, unlinked).
//
// Threading: thread-safe. A Lease may be released from any thread.
class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  static constexpr size_t kMinBytes = 64 * 1024;
  static constexpr size_t kMaxFreePerSize = 8;

  // A buffer of at least the requested size, returned to the pool when destroyed.
  class Lease {
   public:
    Lease(std::shared_ptr<StagingPool> pool, std::shared_ptr<SharedBuffer> buffer);
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();
    const SharedBuffer& buffer() const { return *buffer_; }
    char* data() const { return static_cast<char*>(buffer_->data()); }
    // The buffer is freed rather than returned to the pool: an operation on it may still be
    // running in the agent (a wait that gave up), which would read the next user's input and
    // write over its result.
    void Discard() { discard_ = true; }

   private:
    std::shared_ptr<StagingPool> pool_;
    std::shared_ptr<SharedBuffer> buffer_;
    bool discard_ = false;
  };

  // `client` must outlive the pool's buffers' use (the pool holds it).
  explicit StagingPool(std::shared_ptr<Client> client);

  // A buffer of at least `bytes` bytes (> 0): an idle one of the right size, or a new one
  // allocated and registered through the client.
  absl::StatusOr<std::unique_ptr<Lease>> Acquire(size_t bytes);

  // Buffers allocated so far (for tests and the README's figures).
  size_t allocations() const;

 private:
  void Release(std::shared_ptr<SharedBuffer> buffer);

  const std::shared_ptr<Client> client_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<std::shared_ptr<SharedBuffer>>> free_;  // Guarded by mu_.
  size_t allocations_ = 0;                                             // Guarded by mu_.
};

}  // namespace tributary::client::c10d
