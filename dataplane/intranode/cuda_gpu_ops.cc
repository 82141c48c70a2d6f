#include "dataplane/intranode/cuda_gpu_ops.h"

#include "absl/strings/str_cat.h"
#include "dataplane/cuda/cuda_status.h"

namespace tributary::dataplane {

using cuda::CudaStatus;
using cuda::ScopedCudaDevice;

absl::StatusOr<std::unique_ptr<CudaGpuOps>> CudaGpuOps::Create(std::vector<int> devices) {
  std::unique_ptr<CudaGpuOps> ops(new CudaGpuOps());
  std::map<int, std::shared_ptr<CudaReducer>> reducers;
  for (int device : devices) {
    if (!reducers.count(device)) {
      absl::StatusOr<std::unique_ptr<CudaReducer>> r = CudaReducer::Create(device);
      if (!r.ok()) return r.status();
      reducers[device] = std::move(*r);
    }
    ScopedCudaDevice on_device(device);
    if (!on_device.status().ok()) return on_device.status();
    cudaStream_t stream = nullptr;
    if (absl::Status s = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                    "cudaStreamCreateWithFlags");
        !s.ok()) {
      return s;
    }
    ops->gpus_.push_back({device, stream, reducers[device]});
  }
  return ops;
}

CudaGpuOps::~CudaGpuOps() {
  for (Gpu& g : gpus_) {
    ScopedCudaDevice on_device(g.device);
    cudaStreamSynchronize(g.stream);
    cudaStreamDestroy(g.stream);
  }
  for (auto& [id, event] : fences_) cudaEventDestroy(event);
  for (auto& [device, p] : device_memory_) {
    ScopedCudaDevice on_device(device);
    cudaFree(p);
  }
  for (void* p : host_memory_) cudaFreeHost(p);
}

absl::Status CudaGpuOps::CheckGpu(int gpu) const {
  if (gpu < 0 || gpu >= gpu_count()) {
    return absl::InvalidArgumentError(absl::StrCat("no GPU ", gpu, " (", gpu_count(), " GPUs)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaGpuOps::AllocateDevice(int gpu, size_t bytes) {
  if (absl::Status s = CheckGpu(gpu); !s.ok()) return s;
  ScopedCudaDevice on_device(gpus_[gpu].device);
  void* p = nullptr;
  if (absl::Status s = CudaStatus(cudaMalloc(&p, bytes), "cudaMalloc"); !s.ok()) return s;
  device_memory_.emplace_back(gpus_[gpu].device, p);
  return p;
}

absl::StatusOr<void*> CudaGpuOps::AllocateHost(size_t bytes) {
  void* p = nullptr;
  if (absl::Status s = CudaStatus(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc");
      !s.ok()) {
    return s;
  }
  host_memory_.push_back(p);
  return p;
}

absl::Status CudaGpuOps::CopyAsync(int gpu, void* dst, const void* src, size_t bytes) {
  if (absl::Status s = CheckGpu(gpu); !s.ok()) return s;
  ScopedCudaDevice on_device(gpus_[gpu].device);
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, gpus_[gpu].stream),
                    "cudaMemcpyAsync");
}

absl::Status CudaGpuOps::ReduceAsync(int gpu, common::DataType dtype, void* dst,
                                     std::span<const void* const> srcs, size_t count) {
  if (absl::Status s = CheckGpu(gpu); !s.ok()) return s;
  return gpus_[gpu].reducer->ReduceAsync(dtype, dst, srcs, count, false, gpus_[gpu].stream);
}

absl::StatusOr<uint64_t> CudaGpuOps::Fence(int gpu) {
  if (absl::Status s = CheckGpu(gpu); !s.ok()) return s;
  ScopedCudaDevice on_device(gpus_[gpu].device);
  cudaEvent_t event = nullptr;
  if (absl::Status s = CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                  "cudaEventCreateWithFlags");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CudaStatus(cudaEventRecord(event, gpus_[gpu].stream), "cudaEventRecord");
      !s.ok()) {
    cudaEventDestroy(event);
    return s;
  }
  fences_[next_fence_] = event;
  return next_fence_++;
}

absl::Status CudaGpuOps::WaitFence(int gpu, uint64_t fence) {
  if (absl::Status s = CheckGpu(gpu); !s.ok()) return s;
  auto it = fences_.find(fence);
  if (it == fences_.end()) return absl::InvalidArgumentError("unknown or already waited fence");
  absl::Status s = CudaStatus(cudaEventSynchronize(it->second), "cudaEventSynchronize");
  cudaEventDestroy(it->second);
  fences_.erase(it);
  return s;
}

absl::Status CudaGpuOps::Synchronize(int gpu) {
  if (absl::Status s = CheckGpu(gpu); !s.ok()) return s;
  ScopedCudaDevice on_device(gpus_[gpu].device);
  return CudaStatus(cudaStreamSynchronize(gpus_[gpu].stream), "cudaStreamSynchronize");
}

}  // namespace tributary::dataplane
