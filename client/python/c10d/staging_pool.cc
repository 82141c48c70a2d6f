#include "client/python/c10d/staging_pool.h"

#include <bit>
#include <utility>

namespace tributary::client::c10d {

StagingPool::Lease::Lease(std::shared_ptr<StagingPool> pool, std::shared_ptr<SharedBuffer> buffer)
    : pool_(std::move(pool)), buffer_(std::move(buffer)) {}

StagingPool::Lease::~Lease() {
  if (!discard_) pool_->Release(std::move(buffer_));
}

StagingPool::StagingPool(std::shared_ptr<Client> client) : client_(std::move(client)) {}

absl::StatusOr<std::unique_ptr<StagingPool::Lease>> StagingPool::Acquire(size_t bytes) {
  const size_t size = std::bit_ceil(bytes < kMinBytes ? kMinBytes : bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      std::shared_ptr<SharedBuffer> buffer = std::move(it->second.back());
      it->second.pop_back();
      return std::make_unique<Lease>(shared_from_this(), std::move(buffer));
    }
  }
  // Allocate outside the lock: registration is an RPC.
  absl::StatusOr<std::shared_ptr<SharedBuffer>> buffer = client_->AllocateBuffer(size);
  if (!buffer.ok()) return buffer.status();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++allocations_;
  }
  return std::make_unique<Lease>(shared_from_this(), *std::move(buffer));
}

size_t StagingPool::allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocations_;
}

void StagingPool::Release(std::shared_ptr<SharedBuffer> buffer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& list = free_[buffer->size()];
    if (list.size() < kMaxFreePerSize) {
      list.push_back(std::move(buffer));
      return;
    }
  }
  // Too many idle buffers of this size: this one is freed (unregistered, unmapped, unlinked)
  // here, outside the lock, as unregistering is an RPC.
  buffer.reset();
}

}  // namespace tributary::client::c10d
