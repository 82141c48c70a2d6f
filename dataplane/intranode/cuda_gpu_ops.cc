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
    ops->gpus_.push_back({device, reducers[device]});
  }
  for (int g = 0; g < ops->gpu_count(); ++g) {
    absl::StatusOr<int> q = ops->AddQueue(g);
    if (!q.ok()) return q.status();
  }
  // Direct copies between distinct devices where the hardware allows (NVLink or PCIe P2P);
  // cudaMemcpyAsync stages the others through the host.
  for (auto& [a, ra] : reducers) {
    for (auto& [b, rb] : reducers) {
      int can = 0;
      if (a == b || cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can) continue;
      ScopedCudaDevice on_device(a);
      cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
        return CudaStatus(e, "cudaDeviceEnablePeerAccess");
      }
      cudaGetLastError();  // Clears cudaErrorPeerAccessAlreadyEnabled.
    }
  }
  return ops;
}

CudaGpuOps::~CudaGpuOps() {
  if (recording_) {
    ScopedCudaDevice on_device(gpus_[0].device);
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(capture_, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  for (Queue& q : queues_) {
    ScopedCudaDevice on_device(gpus_[q.gpu].device);
    cudaStreamSynchronize(q.stream);
    cudaStreamDestroy(q.stream);
  }
  if (capture_ != nullptr) {
    ScopedCudaDevice on_device(gpus_[0].device);
    cudaStreamSynchronize(capture_);
    cudaStreamDestroy(capture_);
  }
  for (auto& [id, exec] : recordings_) cudaGraphExecDestroy(exec);
  for (auto& [id, fence] : fences_) cudaEventDestroy(fence.event);
  for (auto& [device, pool] : free_events_) {
    for (cudaEvent_t event : pool) cudaEventDestroy(event);
  }
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

absl::Status CudaGpuOps::CheckQueue(int queue) const {
  if (queue < 0 || queue >= static_cast<int>(queues_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("no queue ", queue, " (", queues_.size(), " queues)"));
  }
  return absl::OkStatus();
}

int CudaGpuOps::QueueGpu(int queue) const {
  return CheckQueue(queue).ok() ? queues_[queue].gpu : -1;
}

absl::StatusOr<int> CudaGpuOps::AddQueue(int gpu) {
  if (absl::Status s = CheckGpu(gpu); !s.ok()) return s;
  ScopedCudaDevice on_device(gpus_[gpu].device);
  if (!on_device.status().ok()) return on_device.status();
  cudaStream_t stream = nullptr;
  if (absl::Status s = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                  "cudaStreamCreateWithFlags");
      !s.ok()) {
    return s;
  }
  queues_.push_back({gpu, stream});
  return static_cast<int>(queues_.size()) - 1;
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

absl::Status CudaGpuOps::CopyAsync(int queue, void* dst, const void* src, size_t bytes) {
  if (absl::Status s = CheckQueue(queue); !s.ok()) return s;
  const Queue& q = queues_[queue];
  ScopedCudaDevice on_device(gpus_[q.gpu].device);
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, q.stream),
                    "cudaMemcpyAsync");
}

absl::Status CudaGpuOps::ReduceAsync(int queue, common::DataType dtype, void* dst,
                                     std::span<const void* const> srcs, size_t count) {
  if (absl::Status s = CheckQueue(queue); !s.ok()) return s;
  const Queue& q = queues_[queue];
  return gpus_[q.gpu].reducer->ReduceAsync(dtype, dst, srcs, count, false, q.stream);
}

absl::Status CudaGpuOps::DivideAsync(int queue, common::DataType dtype, void* dst, size_t count,
                                     uint64_t divisor) {
  if (absl::Status s = CheckQueue(queue); !s.ok()) return s;
  const Queue& q = queues_[queue];
  return gpus_[q.gpu].reducer->DivideAsync(dtype, dst, count, divisor, q.stream);
}

absl::StatusOr<uint64_t> CudaGpuOps::Fence(int queue) {
  if (absl::Status s = CheckQueue(queue); !s.ok()) return s;
  const Queue& q = queues_[queue];
  ScopedCudaDevice on_device(gpus_[q.gpu].device);
  absl::StatusOr<cudaEvent_t> taken = TakeEvent(gpus_[q.gpu].device);
  if (!taken.ok()) return taken.status();
  cudaEvent_t event = *taken;
  if (absl::Status s = CudaStatus(cudaEventRecord(event, q.stream), "cudaEventRecord"); !s.ok()) {
    cudaEventDestroy(event);
    return s;
  }
  fences_[next_fence_] = {gpus_[q.gpu].device, event};
  return next_fence_++;
}

// Events are reused: a stream that waits for one captured its last record when the wait was
// enqueued, so recording it again later does not change what that stream waits for.
absl::StatusOr<cudaEvent_t> CudaGpuOps::TakeEvent(int device) {
  std::vector<cudaEvent_t>& pool = free_events_[device];
  cudaEvent_t event = nullptr;
  if (!pool.empty()) {
    event = pool.back();
    pool.pop_back();
    return event;
  }
  ScopedCudaDevice on_device(device);
  if (absl::Status s = CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                  "cudaEventCreateWithFlags");
      !s.ok()) {
    return s;
  }
  return event;
}

absl::Status CudaGpuOps::WaitFence(int queue, uint64_t fence) {
  if (absl::Status s = CheckQueue(queue); !s.ok()) return s;
  if (recording_) return absl::FailedPreconditionError("a host wait while recording");
  auto it = fences_.find(fence);
  if (it == fences_.end()) return absl::InvalidArgumentError("unknown or already waited fence");
  absl::Status s = CudaStatus(cudaEventSynchronize(it->second.event), "cudaEventSynchronize");
  free_events_[it->second.device].push_back(it->second.event);
  fences_.erase(it);
  return s;
}

absl::Status CudaGpuOps::QueueWaitFence(int queue, uint64_t fence) {
  if (absl::Status s = CheckQueue(queue); !s.ok()) return s;
  auto it = fences_.find(fence);
  if (it == fences_.end()) return absl::InvalidArgumentError("unknown or released fence");
  const Queue& q = queues_[queue];
  ScopedCudaDevice on_device(gpus_[q.gpu].device);
  return CudaStatus(cudaStreamWaitEvent(q.stream, it->second.event, 0), "cudaStreamWaitEvent");
}

absl::Status CudaGpuOps::ReleaseFence(uint64_t fence) {
  auto it = fences_.find(fence);
  if (it == fences_.end()) return absl::InvalidArgumentError("unknown or released fence");
  // Streams already waiting for the event keep waiting for the work of its last record.
  free_events_[it->second.device].push_back(it->second.event);
  fences_.erase(it);
  return absl::OkStatus();
}

absl::Status CudaGpuOps::Synchronize(int queue) {
  if (absl::Status s = CheckQueue(queue); !s.ok()) return s;
  if (recording_) return absl::FailedPreconditionError("a host wait while recording");
  const Queue& q = queues_[queue];
  ScopedCudaDevice on_device(gpus_[q.gpu].device);
  return CudaStatus(cudaStreamSynchronize(q.stream), "cudaStreamSynchronize");
}

absl::Status CudaGpuOps::BeginRecording() {
  if (recording_) return absl::FailedPreconditionError("already recording");
  if (gpus_.empty()) return absl::FailedPreconditionError("no GPU");
  const int device = gpus_[0].device;
  ScopedCudaDevice on_device(device);
  if (capture_ == nullptr) {
    if (absl::Status s = CudaStatus(cudaStreamCreateWithFlags(&capture_, cudaStreamNonBlocking),
                                    "cudaStreamCreateWithFlags");
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = CudaStatus(cudaStreamBeginCapture(capture_, cudaStreamCaptureModeRelaxed),
                                  "cudaStreamBeginCapture");
      !s.ok()) {
    return s;
  }
  recording_ = true;
  // Fork: every queue joins the capture by waiting for an event recorded in it.
  absl::StatusOr<cudaEvent_t> fork = TakeEvent(device);
  absl::Status s = fork.status();
  if (s.ok()) s = CudaStatus(cudaEventRecord(*fork, capture_), "cudaEventRecord");
  for (size_t q = 0; s.ok() && q < queues_.size(); ++q) {
    ScopedCudaDevice on_queue(gpus_[queues_[q].gpu].device);
    s = CudaStatus(cudaStreamWaitEvent(queues_[q].stream, *fork, 0), "cudaStreamWaitEvent");
  }
  if (fork.ok()) free_events_[device].push_back(*fork);
  if (!s.ok()) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(capture_, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    recording_ = false;
  }
  return s;
}

absl::StatusOr<uint64_t> CudaGpuOps::EndRecording() {
  if (!recording_) return absl::FailedPreconditionError("not recording");
  const int device = gpus_[0].device;
  // Join: the origin waits for every queue, which leaves the capture with it.
  absl::Status s;
  for (size_t q = 0; s.ok() && q < queues_.size(); ++q) {
    const int queue_device = gpus_[queues_[q].gpu].device;
    absl::StatusOr<cudaEvent_t> join = TakeEvent(queue_device);
    if (!join.ok()) {
      s = join.status();
      break;
    }
    {
      ScopedCudaDevice on_queue(queue_device);
      s = CudaStatus(cudaEventRecord(*join, queues_[q].stream), "cudaEventRecord");
    }
    if (s.ok()) s = CudaStatus(cudaStreamWaitEvent(capture_, *join, 0), "cudaStreamWaitEvent");
    free_events_[queue_device].push_back(*join);
  }
  ScopedCudaDevice on_device(device);
  cudaGraph_t graph = nullptr;
  absl::Status ended = CudaStatus(cudaStreamEndCapture(capture_, &graph), "cudaStreamEndCapture");
  recording_ = false;
  if (s.ok()) s = ended;
  cudaGraphExec_t exec = nullptr;
  if (s.ok()) s = CudaStatus(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (!s.ok()) return s;
  recordings_[next_recording_] = exec;
  return next_recording_++;
}

absl::Status CudaGpuOps::Replay(uint64_t recording, int queue) {
  if (absl::Status s = CheckQueue(queue); !s.ok()) return s;
  if (recording_) return absl::FailedPreconditionError("a replay while recording");
  auto it = recordings_.find(recording);
  if (it == recordings_.end()) return absl::InvalidArgumentError("unknown recording");
  const Queue& q = queues_[queue];
  ScopedCudaDevice on_device(gpus_[q.gpu].device);
  return CudaStatus(cudaGraphLaunch(it->second, q.stream), "cudaGraphLaunch");
}

absl::Status CudaGpuOps::DropRecording(uint64_t recording) {
  auto it = recordings_.find(recording);
  if (it == recordings_.end()) return absl::InvalidArgumentError("unknown recording");
  cudaGraphExecDestroy(it->second);
  recordings_.erase(it);
  return absl::OkStatus();
}

}  // namespace tributary::dataplane
