// Keeps the data plane's large transient buffers (fused tensors, peer recovery's copies of the
// sums) for the next collective instead of handing them back to malloc.
//
// Why: an agent frees and allocates a tensor's worth of such buffers every iteration, of sizes
// that change from one iteration to the next (fusion cuts differently). malloc (jemalloc here)
// either purges the freed pages after its decay time or, with purging off, still places many
// new buffers on fresh addresses; either way the first write of every page faults again, at
// 12 us per fault on virtualized page tables. With nothing recycled a worker agent spent 1.9x
// the CPU per ResNet-50 iteration (BENCHMARKS.md, session 45). A pool keyed by size class hands the
// same pages back, already mapped.
//
// Buffers of at least kMinPooledBytes are rounded up to a size class (four per doubling, so at
// most a quarter more than asked) and come back to the pool when the last reference goes; the
// pool keeps at most `keep_bytes` of them, freeing the longest kept first to make room, and hands
// out the most recently returned of a class first. Smaller requests are plain allocations.
// Thread-safe; a buffer may be released on any thread, and may outlive the BufferPool object that
// made it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace tributary::common {

class BufferPool {
 public:
  static constexpr uint64_t kMinPooledBytes = uint64_t{16} << 10;
  static constexpr uint64_t kDefaultKeepBytes = uint64_t{512} << 20;

  explicit BufferPool(uint64_t keep_bytes = kDefaultKeepBytes);

  // The process's pool: the agent's fusion and push/pull share it.
  static BufferPool& Process();

  // An uninitialized buffer of at least `bytes` bytes (ClassBytes(bytes) for pooled sizes).
  // Throws std::bad_alloc like new[] when memory runs out.
  std::shared_ptr<std::byte[]> Get(uint64_t bytes);

  // The bytes Get(bytes) allocates: `bytes` below kMinPooledBytes, else rounded up to the next of
  // 2^k, 1.25 * 2^k, 1.5 * 2^k, 1.75 * 2^k.
  static uint64_t ClassBytes(uint64_t bytes);

  // Frees kept buffers down to `keep_bytes` and keeps at most that many from now on.
  void SetKeepBytes(uint64_t keep_bytes);

  struct Stats {
    uint64_t reused = 0;      // Get served from a kept buffer
    uint64_t allocated = 0;   // Get of a pooled size that allocated (nothing kept of its class)
    uint64_t freed = 0;       // kept buffers freed to stay within keep_bytes
    uint64_t kept_bytes = 0;  // bytes kept now, waiting for a Get
    uint64_t kept_buffers = 0;
  };
  Stats stats() const;

 private:
  struct State;
  std::shared_ptr<State> state_;  // shared with every buffer out, so they may outlive the pool
};

}  // namespace tributary::common
