// ExportCudaBuffer of a client built without CUDA.
#include "client/cuda_export.h"

namespace tributary::client::internal {

absl::StatusOr<std::unique_ptr<CudaExport>> ExportCudaBuffer(void*, size_t, int) {
  return absl::FailedPreconditionError(
      "this client was built without CUDA: it cannot register CUDA buffers (rebuild it with "
      "nvcc found, CMake TRIBUTARY_CUDA=ON, or use Client::AllocateBuffer)");
}

}  // namespace tributary::client::internal
