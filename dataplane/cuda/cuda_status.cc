#include "dataplane/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace tributary::dataplane::cuda {

absl::Status CudaStatus(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // Reported here; do not let the next call see it again.
  return absl::InternalError(absl::StrCat(call, " failed: ", cudaGetErrorName(error), " (",
                                          cudaGetErrorString(error), ")"));
}

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device (cudaGetDeviceCount: ", cudaGetErrorName(error), ": ",
                     cudaGetErrorString(error), ")"));
  }
  if (count <= 0) {
    return absl::FailedPreconditionError("no CUDA device (cudaGetDeviceCount found 0)");
  }
  return count;
}

absl::Status CheckCudaDevice(int device) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return count.status();
  if (device < 0 || device >= *count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " does not exist: ",
                                                   *count, " device(s), ordinals 0..", *count - 1));
  }
  return absl::OkStatus();
}

ScopedCudaDevice::ScopedCudaDevice(int device) {
  status_ = CudaStatus(cudaGetDevice(&previous_), "cudaGetDevice");
  if (!status_.ok()) {
    previous_ = -1;
    return;
  }
  if (previous_ != device) status_ = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
}

ScopedCudaDevice::~ScopedCudaDevice() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

}  // namespace tributary::dataplane::cuda
