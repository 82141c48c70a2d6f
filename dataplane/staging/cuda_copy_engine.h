// CudaCopyEngine: CopyEngine on a CUDA stream of its own, staging in cudaHostAlloc'd memory.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/statusor.h"
#include "dataplane/staging/copy_engine.h"

namespace tributary::dataplane {

// Copies with cudaMemcpyAsync (direction from the pointers: unified addressing) on a
// non-blocking stream created for the engine, so they overlap the reduction kernels on the
// compute streams; completions through cudaStreamAddCallback (on a CUDA runtime thread, which is
// why callbacks must not call the engine). Staging memory is page-locked (cudaHostAlloc), which
// DMA needs to run asynchronously.
//
// Thread-safety: as CopyEngine. Destroying the engine synchronizes its stream first.
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
  CudaCopyEngine(int device, cudaStream_t stream, cudaEvent_t event)
      : device_(device), stream_(stream), event_(event) {}

  int device_;
  cudaStream_t stream_;
  cudaEvent_t event_;  // For WaitFor.
};

}  // namespace tributary::dataplane
