// ImportCudaBuffer of an agent built with CUDA.
#include "agent/cuda_buffer.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "dataplane/cuda/cuda_ipc.h"
#include "dataplane/cuda/cuda_status.h"

namespace tributary::agent {
namespace {

namespace cuda = dataplane::cuda;

// The imported device buffer, its pinned mirror and the stream its copies run on. The copies
// run on the agent's one staging thread (mirror_stager.h); the stream keeps them in order.
class CudaMirror final : public MirroredMemory {
 public:
  CudaMirror(int device, std::unique_ptr<cuda::CudaIpcImport> import, std::byte* host,
             cudaStream_t stream)
      : device_(device), import_(std::move(import)), host_(host), stream_(stream) {}
  ~CudaMirror() override {
    cuda::ScopedCudaDevice on_device(device_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    cudaFreeHost(host_);
    import_.reset();  // cudaIpcCloseMemHandle
  }

  std::byte* host() const override { return host_; }
  uint64_t size() const override { return import_->bytes(); }

  absl::Status CopyIn(uint64_t offset, uint64_t bytes) override {
    cuda::ScopedCudaDevice on_device(device_);
    RETURN_IF_ERROR(on_device.status());
    // After the process's kernels that wrote the buffer (its MarkReady before the Submit).
    RETURN_IF_ERROR(import_->WaitReady(stream_));
    RETURN_IF_ERROR(cuda::CudaStatus(
        cudaMemcpyAsync(host_ + offset, static_cast<const std::byte*>(import_->data()) + offset,
                        bytes, cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync(device to host)"));
    return cuda::CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  absl::Status CopyOut(uint64_t offset, uint64_t bytes) override {
    cuda::ScopedCudaDevice on_device(device_);
    RETURN_IF_ERROR(on_device.status());
    RETURN_IF_ERROR(
        cuda::CudaStatus(cudaMemcpyAsync(static_cast<std::byte*>(import_->data()) + offset,
                                         host_ + offset, bytes, cudaMemcpyHostToDevice, stream_),
                         "cudaMemcpyAsync(host to device)"));
    // Synchronized before the operation completes: the process's next kernels see the result.
    return cuda::CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

 private:
  const int device_;
  std::unique_ptr<cuda::CudaIpcImport> import_;
  std::byte* const host_;
  const cudaStream_t stream_;
};

}  // namespace

bool AgentHasCuda() { return true; }

absl::StatusOr<std::shared_ptr<SharedMemoryMapping>> ImportCudaBuffer(const std::string& record,
                                                                      const std::string& what) {
  absl::StatusOr<cuda::CudaIpcBuffer> parsed = cuda::ParseCudaIpcBuffer(record);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", parsed.status().message()));
  }
  if (absl::Status size = CheckBufferSize(parsed->bytes); !size.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", size.message()));
  }
  absl::StatusOr<int> devices = cuda::CudaDeviceCount();
  if (!devices.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": this agent's machine has ", devices.status().message()));
  }
  // The exporter's ordinal: the process and its agent see the node's devices alike.
  if (parsed->device >= *devices) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": device ", parsed->device,
                                                   " is not one of this machine's ", *devices,
                                                   " CUDA devices"));
  }
  cuda::ScopedCudaDevice on_device(parsed->device);
  RETURN_IF_ERROR(on_device.status());
  ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaIpcImport> import, cuda::CudaIpcImport::Open(*parsed));
  void* host = nullptr;
  RETURN_IF_ERROR(cuda::CudaStatus(cudaHostAlloc(&host, parsed->bytes, cudaHostAllocPortable),
                                   "cudaHostAlloc"));
  cudaStream_t stream = nullptr;
  if (absl::Status s = cuda::CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                        "cudaStreamCreateWithFlags");
      !s.ok()) {
    cudaFreeHost(host);
    return s;
  }
  return std::make_shared<SharedMemoryMapping>(
      what, std::make_unique<CudaMirror>(parsed->device, std::move(import),
                                         static_cast<std::byte*>(host), stream));
}

}  // namespace tributary::agent
