// ExportCudaBuffer of a client built with CUDA.
#include "client/cuda_export.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "dataplane/cuda/cuda_ipc.h"

namespace tributary::client::internal {
namespace {

class CudaIpcExportImpl final : public CudaExport {
 public:
  explicit CudaIpcExportImpl(std::unique_ptr<dataplane::cuda::CudaIpcExport> exported)
      : exported_(std::move(exported)),
        record_(dataplane::cuda::SerializeCudaIpcBuffer(exported_->buffer())) {}
  const std::string& record() const override { return record_; }
  absl::Status MarkReady(void* stream) override {
    return exported_->MarkReady(static_cast<cudaStream_t>(stream));
  }

 private:
  const std::unique_ptr<dataplane::cuda::CudaIpcExport> exported_;
  const std::string record_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaExport>> ExportCudaBuffer(void* allocation, size_t bytes,
                                                             int device) {
  if (bytes == 0) return absl::InvalidArgumentError("a CUDA buffer must have at least 1 byte");
  absl::StatusOr<std::unique_ptr<dataplane::cuda::CudaIpcExport>> exported =
      dataplane::cuda::CudaIpcExport::Create(allocation, /*offset=*/0, bytes, device);
  if (!exported.ok()) return exported.status();
  return std::make_unique<CudaIpcExportImpl>(*std::move(exported));
}

}  // namespace tributary::client::internal
