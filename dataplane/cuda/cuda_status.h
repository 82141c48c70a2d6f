// The CUDA runtime's errors as absl::Status, and the device probe every CUDA part starts with.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tributary::dataplane::cuda {

// OK for cudaSuccess; otherwise INTERNAL naming the call and the runtime's error name and text,
// e.g. "cudaMemcpyAsync failed: cudaErrorInvalidValue (invalid argument)". Clears the
// runtime's last (non-sticky) error so that it is reported once.
absl::Status CudaStatus(cudaError_t error, const char* call);

// The number of CUDA devices, >= 1. Without a driver or a device (cudaErrorNoDevice,
// cudaErrorInsufficientDriver, ...) FAILED_PRECONDITION whose message starts with
// "no CUDA device" and names the runtime's reason: a machine without a GPU is a state to report,
// never a crash.
absl::StatusOr<int> CudaDeviceCount();

// OK when `device` is an existing device ordinal (FAILED_PRECONDITION "no CUDA device" when
// there is none, INVALID_ARGUMENT when the ordinal is out of range).
absl::Status CheckCudaDevice(int device);

// Sets the calling thread's current device for the guard's lifetime and restores the previous
// one after.
class ScopedCudaDevice {
 public:
  explicit ScopedCudaDevice(int device);
  ~ScopedCudaDevice();
  ScopedCudaDevice(const ScopedCudaDevice&) = delete;
  ScopedCudaDevice& operator=(const ScopedCudaDevice&) = delete;

  // The status of the cudaSetDevice call.
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

}  // namespace tributary::dataplane::cuda
