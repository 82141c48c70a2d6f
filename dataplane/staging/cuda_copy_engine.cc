#include "dataplane/staging/cuda_copy_engine.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "dataplane/cuda/cuda_status.h"

namespace tributary::dataplane {
namespace {

using cuda::CudaStatus;

void CUDART_CB OnStreamDone(cudaStream_t, cudaError_t status, void* user) {
  std::unique_ptr<absl::AnyInvocable<void(absl::Status)>> done(
      static_cast<absl::AnyInvocable<void(absl::Status)>*>(user));
  // No CUDA call is allowed in a stream callback (not even the error-name lookups): the code.
  (*done)(status == cudaSuccess ? absl::OkStatus()
                                : absl::InternalError(absl::StrCat(
                                      "copy stream failed: cudaError_t ", static_cast<int>(status),
                                      " (see cudaGetErrorName)")));
}

}  // namespace

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

CudaCopyEngine::~CudaCopyEngine() {
  cuda::ScopedCudaDevice on_device(device_);
  cudaStreamSynchronize(stream_);
  cudaEventDestroy(event_);
  cudaStreamDestroy(stream_);
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
  auto* heap = new absl::AnyInvocable<void(absl::Status)>(std::move(done));
  cuda::ScopedCudaDevice on_device(device_);
  absl::Status s =
      CudaStatus(cudaStreamAddCallback(stream_, OnStreamDone, heap, 0), "cudaStreamAddCallback");
  if (!s.ok()) delete heap;
  return s;
}

absl::Status CudaCopyEngine::Synchronize() {
  cuda::ScopedCudaDevice on_device(device_);
  return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

absl::Status CudaCopyEngine::WaitFor(cudaStream_t producer) {
  cuda::ScopedCudaDevice on_device(device_);
  if (absl::Status s = CudaStatus(cudaEventRecord(event_, producer), "cudaEventRecord"); !s.ok()) {
    return s;
  }
  return CudaStatus(cudaStreamWaitEvent(stream_, event_, 0), "cudaStreamWaitEvent");
}

}  // namespace tributary::dataplane
