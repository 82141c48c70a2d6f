// GpuOps: the intra-node executors' view of a node's GPUs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace tributary::dataplane {

// The node's GPUs as in-order work queues, one per GPU (a CUDA stream each), with memory.
// Implementations: HostGpuOps (host memory, work run at once: the executors' orchestration runs
// and is tested without a GPU) and CudaGpuOps (streams, CudaReducer, cudaMemcpyAsync).
//
// Work enqueued on GPU g runs in order after everything enqueued on g before it; work on
// different GPUs is unordered. Not thread-safe: one executor thread enqueues.
class GpuOps {
 public:
  virtual ~GpuOps() = default;

  virtual int gpu_count() const = 0;

  // `bytes` of memory on GPU g (scratch), and page-locked host memory. Freed by the GpuOps.
  virtual absl::StatusOr<void*> AllocateDevice(int gpu, size_t bytes) = 0;
  virtual absl::StatusOr<void*> AllocateHost(size_t bytes) = 0;

  // Enqueues on GPU `gpu`'s queue a copy of `bytes` from `src` to `dst`: device to host, host to
  // device, or between two GPUs (a peer copy).
  virtual absl::Status CopyAsync(int gpu, void* dst, const void* src, size_t bytes) = 0;

  // Enqueues on GPU `gpu`'s queue dst = srcs[0] + srcs[1] + ... (CudaReducer's bits).
  virtual absl::Status ReduceAsync(int gpu, common::DataType dtype, void* dst,
                                   std::span<const void* const> srcs, size_t count) = 0;

  // Enqueues a fence on GPU `gpu`'s queue; WaitFence blocks until the work enqueued before it
  // has finished (not the work enqueued after it). A fence is waited for at most once.
  virtual absl::StatusOr<uint64_t> Fence(int gpu) = 0;
  virtual absl::Status WaitFence(int gpu, uint64_t fence) = 0;

  // Blocks until everything enqueued on GPU `gpu` so far has finished.
  virtual absl::Status Synchronize(int gpu) = 0;
};

}  // namespace tributary::dataplane
