// Copies of submitted regions kept for transparent retries (ClientOptions::retry_collectives),
// reused so that a copy costs a memcpy into memory already faulted in, not a fresh allocation
// whose pages the kernel must hand over first (on a loaded machine that was ~40x slower for
// 64 MiB). Internal to the client library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace tributary::client::internal {

// Holds at most kMaxBlocks free blocks and kMaxBytes free bytes; blocks in use are the handles'.
// Take hands out the smallest free block that fits. Enough blocks for one iteration of a model's
// tensors submitted one by one: with 64, BERT-large's 243 small tensors allocated 179 new blocks
// (and freed as many) every iteration, and glibc's malloc for them was 40 % of the submitting
// process's CPU at the iteration's start. Thread-safe.
class InputPool {
 public:
  struct Block {
    std::unique_ptr<std::byte[]> data;
    size_t capacity = 0;
  };
  static constexpr size_t kMaxBlocks = 4096;
  static constexpr size_t kMaxBytes = size_t{1} << 30;

  // A block of at least `bytes` (the smallest free one that fits, else a new one).
  Block Take(size_t bytes) {
    {
      std::lock_guard lock(mu_);
      if (auto it = free_.lower_bound(bytes); it != free_.end()) {
        Block b{std::move(it->second), it->first};
        free_bytes_ -= b.capacity;
        free_.erase(it);
        return b;
      }
      allocated_++;
    }
    const size_t capacity = bytes == 0 ? 1 : bytes;
    return Block{std::unique_ptr<std::byte[]>(new std::byte[capacity]), capacity};
  }
  // Keeps `b` for a later Take, or frees it when the pool is full.
  void Give(Block b) {
    if (b.data == nullptr) return;
    std::lock_guard lock(mu_);
    if (free_.size() >= kMaxBlocks || free_bytes_ + b.capacity > kMaxBytes) return;
    free_bytes_ += b.capacity;
    free_.emplace(b.capacity, std::move(b.data));
  }

  // Blocks allocated by Take so far (not served from the pool).
  uint64_t allocated() const {
    std::lock_guard lock(mu_);
    return allocated_;
  }
  size_t free_blocks() const {
    std::lock_guard lock(mu_);
    return free_.size();
  }

 private:
  mutable std::mutex mu_;
  std::multimap<size_t, std::unique_ptr<std::byte[]>> free_;  // by capacity; guarded by mu_
  size_t free_bytes_ = 0;                                     // Guarded by mu_.
  uint64_t allocated_ = 0;                                    // Guarded by mu_.
};

}  // namespace tributary::client::internal
