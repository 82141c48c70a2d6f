#include "dataplane/staging/cuda_copy_engine.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "dataplane/cuda/cuda_status.h"

namespace tributary::dataplane {
using cuda::CudaStatus;

absl::StatusOr<std::unique_ptr<CudaCopyEngine>> CudaCopyEngine::Create(int device) {
  if (absl::Status s = cuda::CheckCudaDevice(device); !s.ok()) return s;
  cuda::ScopedCudaDevice on_device(device);
  if (!on_device.status().ok()) return on_device.status();
  cudaStream_t stream = nullptr;
  if (absl::Status s = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                  "cudaStreamCreateWithFlags");
      !s.ok()) {
    return s;
  }
  cudaEvent_t event = nullptr;
  if (absl::Status s = CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                  "cudaEventCreateWithFlags");
      !s.ok()) {
    cudaStreamDestroy(stream);
    return s;
  }
  return std::unique_ptr<CudaCopyEngine>(new CudaCopyEngine(device, stream, event));
}

CudaCopyEngine::CudaCopyEngine(int device, cudaStream_t stream, cudaEvent_t event)
    : device_(device), stream_(stream), event_(event), completer_([this] { CompletionLoop(); }) {}

CudaCopyEngine::~CudaCopyEngine() {
  Synchronize().IgnoreError();
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_.notify_one();
  completer_.join();  // Runs what is still queued first.
  cuda::ScopedCudaDevice on_device(device_);
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  cudaEventDestroy(event_);
  cudaStreamDestroy(stream_);
}

void CudaCopyEngine::CompletionLoop() {
  cudaSetDevice(device_);
  std::unique_lock lock(mu_);
  while (true) {
    work_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    if (pending_.empty()) return;  // Stopping, and nothing left to report.
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    lock.unlock();
    // Sleeps until the copies before the event are done (cudaEventBlockingSync): no spinning.
    absl::Status s =
        CudaStatus(cudaEventSynchronize(p.event), "copy stream (cudaEventSynchronize)");
    p.done(std::move(s));
    p.done = nullptr;  // Whatever it captured goes before Synchronize can return.
    lock.lock();
    free_events_.push_back(p.event);
    ++completed_;
    drained_.notify_all();
  }
}

absl::StatusOr<StagingMemory> CudaCopyEngine::AllocateStaging(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("staging memory of 0 bytes");
  cuda::ScopedCudaDevice on_device(device_);
  void* p = nullptr;
  if (absl::Status s = CudaStatus(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc");
      !s.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot pin ", bytes, " bytes of staging memory: ", s.message()));
  }
  return StagingMemory(p, bytes, [](void* q) { cudaFreeHost(q); });
}

absl::Status CudaCopyEngine::CopyAsync(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr)
    return absl::InvalidArgumentError("copy with a null pointer");
  cuda::ScopedCudaDevice on_device(device_);
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_),
                    "cudaMemcpyAsync");
}

absl::Status CudaCopyEngine::NotifyAsync(absl::AnyInvocable<void(absl::Status)> done) {
  cudaEvent_t event = nullptr;
  {
    std::lock_guard lock(mu_);
    if (!free_events_.empty()) {
      event = free_events_.back();
      free_events_.pop_back();
    }
  }
  cuda::ScopedCudaDevice on_device(device_);
  if (!on_device.status().ok()) return on_device.status();
  if (event == nullptr) {
    if (absl::Status s = CudaStatus(
            cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventBlockingSync),
            "cudaEventCreateWithFlags");
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = CudaStatus(cudaEventRecord(event, stream_), "cudaEventRecord"); !s.ok()) {
    std::lock_guard lock(mu_);
    free_events_.push_back(event);
    return s;
  }
  {
    std::lock_guard lock(mu_);
    pending_.push_back({event, std::move(done)});
    ++notified_;
  }
  work_.notify_one();
  return absl::OkStatus();
}

absl::Status CudaCopyEngine::Synchronize() {
  absl::Status s;
  {
    cuda::ScopedCudaDevice on_device(device_);
    s = on_device.status().ok()
            ? CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize")
            : on_device.status();
  }
  std::unique_lock lock(mu_);
  const uint64_t target = notified_;
  drained_.wait(lock, [&] { return completed_ >= target; });
  return s;
}

absl::Status CudaCopyEngine::WaitFor(cudaStream_t producer) {
  cuda::ScopedCudaDevice on_device(device_);
  if (absl::Status s = CudaStatus(cudaEventRecord(event_, producer), "cudaEventRecord"); !s.ok()) {
    return s;
  }
  return CudaStatus(cudaStreamWaitEvent(stream_, event_, 0), "cudaStreamWaitEvent");
}

}  // namespace tributary::dataplane
