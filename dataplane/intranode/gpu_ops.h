// GpuOps: the intra-node executors' view of a node's GPUs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace tributary::dataplane {

// The node's GPUs as in-order work queues (CUDA streams) with memory. Implementations:
// HostGpuOps (host memory; work run at once or, for the executors' ordering tests, deferred and
// run in a random legal order) and CudaGpuOps (streams, CudaReducer, cudaMemcpyAsync, events).
//
// Queues: queue g for g < gpu_count() is GPU g's default queue; AddQueue(g) makes another queue
// of GPU g (its id >= gpu_count()). Work enqueued on a queue runs in order after everything
// enqueued on it before; work on different queues is unordered unless a queue waits for another
// queue's fence (QueueWaitFence). A queue's copies and sums touch its own GPU's memory (a peer
// copy may read or write the other GPU's), as a CUDA stream of that device would.
//
// Not thread-safe: one executor thread enqueues.
class GpuOps {
 public:
  virtual ~GpuOps() = default;

  virtual int gpu_count() const = 0;

  // Another in-order queue of GPU `gpu` (a stream of its own); returns its id.
  virtual absl::StatusOr<int> AddQueue(int gpu) = 0;
  // The GPU of a queue; -1 for an id that names no queue.
  virtual int QueueGpu(int queue) const = 0;

  // `bytes` of memory on GPU g (scratch), and page-locked host memory. Freed by the GpuOps.
  virtual absl::StatusOr<void*> AllocateDevice(int gpu, size_t bytes) = 0;
  virtual absl::StatusOr<void*> AllocateHost(size_t bytes) = 0;

  // Enqueues on `queue` a copy of `bytes` from `src` to `dst`: device to host, host to device,
  // or between two GPUs (a peer copy; one end is the queue's GPU).
  virtual absl::Status CopyAsync(int queue, void* dst, const void* src, size_t bytes) = 0;

  // Enqueues on `queue` dst = srcs[0] + srcs[1] + ... (CudaReducer's bits; dst may be srcs[0]).
  virtual absl::Status ReduceAsync(int queue, common::DataType dtype, void* dst,
                                   std::span<const void* const> srcs, size_t count) = 0;
  // Enqueues on `queue` dst[i] /= divisor (divisor >= 1; integers truncate toward zero).
  virtual absl::Status DivideAsync(int queue, common::DataType dtype, void* dst, size_t count,
                                   uint64_t divisor) = 0;

  // Enqueues a fence on `queue`: it is reached when the work enqueued on the queue before it has
  // finished. WaitFence blocks the caller until then and forgets the fence; QueueWaitFence makes
  // the work enqueued on `queue` after it wait for the fence (on the device: the caller does not
  // block), and leaves the fence for more waits; ReleaseFence forgets a fence that is not waited
  // for on the host (work already waiting for it is unaffected).
  virtual absl::StatusOr<uint64_t> Fence(int queue) = 0;
  virtual absl::Status WaitFence(int queue, uint64_t fence) = 0;
  virtual absl::Status QueueWaitFence(int queue, uint64_t fence) = 0;
  virtual absl::Status ReleaseFence(uint64_t fence) = 0;

  // Blocks until everything enqueued on `queue` so far has finished.
  virtual absl::Status Synchronize(int queue) = 0;

  // Recordings (CUDA graphs): between BeginRecording and EndRecording, the work enqueued on any
  // queue is recorded, not run (WaitFence and Synchronize are FAILED_PRECONDITION meanwhile, as
  // there is nothing to wait for). Replay enqueues all of a recording's work again, on the same
  // queues with the same dependencies, in one step (one graph launch instead of a call per
  // copy, sum and fence): it starts after the work enqueued on `queue` before the Replay, and
  // the work enqueued on `queue` after the Replay starts after all of it. A recording keeps the
  // pointers it was made with: replay it only while that memory lives.
  virtual absl::Status BeginRecording() = 0;
  virtual absl::StatusOr<uint64_t> EndRecording() = 0;
  virtual absl::Status Replay(uint64_t recording, int queue) = 0;
  virtual absl::Status DropRecording(uint64_t recording) = 0;
};

// The executors' shared argument checks: INVALID_ARGUMENT for an unknown dtype, not one buffer
// per GPU of `ops`, a null buffer, or an average by 0.
absl::Status CheckExecutorArguments(const GpuOps& ops, common::DataType dtype,
                                    std::span<void* const> buffers, bool average, uint64_t divisor);

}  // namespace tributary::dataplane
