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
// device, to run multi-GPU logic on a one-GPU machine); each queue is a non-blocking stream of
// its GPU's device; sums by CudaReducer, copies by cudaMemcpyAsync (unified addressing: peer,
// D2H, H2D), fences by CUDA events (queue waits by cudaStreamWaitEvent), device scratch by
// cudaMalloc, host memory by cudaHostAlloc (portable). Peer access is enabled between every two
// devices that support it (copies between the others go through the host, as CUDA does). Frees
// everything in its destructor, after synchronizing every stream.
class CudaGpuOps final : public GpuOps {
 public:
  // FAILED_PRECONDITION "no CUDA device ..." without a GPU; INVALID_ARGUMENT for a bad ordinal.
  static absl::StatusOr<std::unique_ptr<CudaGpuOps>> Create(std::vector<int> devices);
  ~CudaGpuOps() override;

  int gpu_count() const override { return static_cast<int>(gpus_.size()); }
  absl::StatusOr<int> AddQueue(int gpu) override;
  int QueueGpu(int queue) const override;
  absl::StatusOr<void*> AllocateDevice(int gpu, size_t bytes) override;
  absl::StatusOr<void*> AllocateHost(size_t bytes) override;
  absl::Status CopyAsync(int queue, void* dst, const void* src, size_t bytes) override;
  absl::Status ReduceAsync(int queue, common::DataType dtype, void* dst,
                           std::span<const void* const> srcs, size_t count) override;
  absl::Status DivideAsync(int queue, common::DataType dtype, void* dst, size_t count,
                           uint64_t divisor) override;
  absl::StatusOr<uint64_t> Fence(int queue) override;
  absl::Status WaitFence(int queue, uint64_t fence) override;
  absl::Status QueueWaitFence(int queue, uint64_t fence) override;
  absl::Status ReleaseFence(uint64_t fence) override;
  absl::Status Synchronize(int queue) override;
  // Stream capture (relaxed mode) from a stream of its own that every queue joins at the start
  // and that waits for every queue at the end; a recording is an instantiated CUDA graph.
  absl::Status BeginRecording() override;
  absl::StatusOr<uint64_t> EndRecording() override;
  absl::Status Replay(uint64_t recording, int queue) override;
  absl::Status DropRecording(uint64_t recording) override;

 private:
  struct Gpu {
    int device;
    std::shared_ptr<CudaReducer> reducer;  // Shared by GPUs on one device.
  };
  struct Queue {
    int gpu;
    cudaStream_t stream;
  };
  CudaGpuOps() = default;
  absl::Status CheckGpu(int gpu) const;
  absl::Status CheckQueue(int queue) const;

  std::vector<Gpu> gpus_;
  std::vector<Queue> queues_;
  std::vector<std::pair<int, void*>> device_memory_;  // (device, pointer).
  std::vector<void*> host_memory_;
  struct FenceEvent {
    int device;
    cudaEvent_t event;
  };
  std::map<uint64_t, FenceEvent> fences_;
  std::map<int, std::vector<cudaEvent_t>> free_events_;  // Per device, for reuse.
  absl::StatusOr<cudaEvent_t> TakeEvent(int device);
  // Recording: the capture's origin stream (on GPU 0's device), created at the first one.
  cudaStream_t capture_ = nullptr;
  bool recording_ = false;
  std::map<uint64_t, cudaGraphExec_t> recordings_;
  uint64_t next_recording_ = 0;
  uint64_t next_fence_ = 0;
};

}  // namespace tributary::dataplane
