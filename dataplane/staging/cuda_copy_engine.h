// CudaCopyEngine: CopyEngine on a CUDA stream of its own, staging in cudaHostAlloc'd memory.
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "dataplane/staging/copy_engine.h"

namespace tributary::dataplane {

// Copies with cudaMemcpyAsync (direction from the pointers: unified addressing) on a
// non-blocking stream created for the engine, so they overlap the reduction kernels on the
// compute streams. Completions by events, not stream callbacks: NotifyAsync records an event
// (blocking-sync, from a pool) on the stream and the engine's completion thread waits for the
// events in order and calls each `done` there. A cudaStreamAddCallback would stop the stream
// until its host callback returned -- one host round trip (~40 us on an H100) per chunk, which
// held a pipeline of 256 KiB chunks to 6 GB/s of a 55 GB/s link (bench/cuda_staging_bench.cc).
// Staging memory is page-locked (cudaHostAlloc), which DMA needs to run asynchronously.
//
// Thread-safety: as CopyEngine (callbacks must not call the engine). Synchronize returns once the
// stream is idle and every `done` notified before it has returned. Destroying the engine
// synchronizes first.
class CudaCopyEngine final : public CopyEngine {
 public:
  // FAILED_PRECONDITION "no CUDA device ..." without a driver or a GPU.
  static absl::StatusOr<std::unique_ptr<CudaCopyEngine>> Create(int device = 0);
  ~CudaCopyEngine() override;

  const char* name() const override { return "cuda"; }
  absl::StatusOr<StagingMemory> AllocateStaging(size_t bytes) override;
  absl::Status CopyAsync(void* dst, const void* src, size_t bytes) override;
  absl::Status NotifyAsync(absl::AnyInvocable<void(absl::Status)> done) override;
  absl::Status Synchronize() override;

  // Makes the copies enqueued from now on wait for the work enqueued so far on `producer` (the
  // compute stream whose kernel writes the tensor), without blocking the host.
  absl::Status WaitFor(cudaStream_t producer);

  cudaStream_t stream() const { return stream_; }

 private:
  struct Pending {
    cudaEvent_t event;
    absl::AnyInvocable<void(absl::Status)> done;
  };
  CudaCopyEngine(int device, cudaStream_t stream, cudaEvent_t event);
  void CompletionLoop();

  const int device_;
  const cudaStream_t stream_;
  const cudaEvent_t event_;  // For WaitFor.

  std::mutex mu_;
  std::condition_variable work_;          // A notification was queued, or the engine stops.
  std::condition_variable drained_;       // A notification's `done` returned.
  std::deque<Pending> pending_;           // Guarded by mu_: recorded events, in stream order.
  std::vector<cudaEvent_t> free_events_;  // Guarded by mu_: the pool.
  uint64_t notified_ = 0;                 // Guarded by mu_.
  uint64_t completed_ = 0;                // Guarded by mu_.
  bool stopping_ = false;                 // Guarded by mu_.
  std::thread completer_;                 // Runs CompletionLoop; last member.
};

}  // namespace tributary::dataplane
