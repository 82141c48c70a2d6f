// CudaGpuOps: GpuOps on CUDA devices.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <vector>

#include "dataplane/intranode/gpu_ops.h"
#include "dataplane/reduce/cuda/cuda_reducer.h"

namespace tributary::dataplane {

// GPU g is CUDA device devices[g] (a device may appear more than once: several "GPUs" on one
// device, to run multi-GPU logic on a one-GPU machine), with a non-blocking stream of its own;
// sums by CudaReducer, copies by cudaMemcpyAsync (unified addressing: peer, D2H, H2D), fences by
// CUDA events, device scratch by cudaMalloc, host memory by cudaHostAlloc (portable). Frees
// everything in its destructor, after synchronizing every stream.
class CudaGpuOps final : public GpuOps {
 public:
  // FAILED_PRECONDITION "no CUDA device ..." without a GPU; INVALID_ARGUMENT for a bad ordinal.
  static absl::StatusOr<std::unique_ptr<CudaGpuOps>> Create(std::vector<int> devices);
  ~CudaGpuOps() override;

  int gpu_count() const override { return static_cast<int>(gpus_.size()); }
  absl::StatusOr<void*> AllocateDevice(int gpu, size_t bytes) override;
  absl::StatusOr<void*> AllocateHost(size_t bytes) override;
  absl::Status CopyAsync(int gpu, void* dst, const void* src, size_t bytes) override;
  absl::Status ReduceAsync(int gpu, common::DataType dtype, void* dst,
                           std::span<const void* const> srcs, size_t count) override;
  absl::StatusOr<uint64_t> Fence(int gpu) override;
  absl::Status WaitFence(int gpu, uint64_t fence) override;
  absl::Status Synchronize(int gpu) override;

 private:
  struct Gpu {
    int device;
    cudaStream_t stream;
    std::shared_ptr<CudaReducer> reducer;  // Shared by GPUs on one device.
  };
  CudaGpuOps() = default;
  absl::Status CheckGpu(int gpu) const;

  std::vector<Gpu> gpus_;
  std::vector<std::pair<int, void*>> device_memory_;  // (device, pointer).
  std::vector<void*> host_memory_;
  std::map<uint64_t, cudaEvent_t> fences_;
  uint64_t next_fence_ = 0;
};

}  // namespace tributary::dataplane
