// ImportCudaBuffer of an agent built with CUDA.
#include "agent/cuda_buffer.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "dataplane/cuda/cuda_ipc.h"
#include "dataplane/cuda/cuda_status.h"
#include "dataplane/intranode/cuda_gpu_ops.h"

namespace tributary::agent {
namespace {

namespace cuda = dataplane::cuda;

constexpr auto Log = common::ComponentLog<"agent">;
constexpr std::chrono::milliseconds kTeardownWait{1000};

// The imported device buffer, its pinned mirror and the stream its copies run on. The copies
// run on the agent's one staging thread (mirror_stager.h); the stream keeps them in order.
class CudaMirror final : public MirroredMemory {
 public:
  CudaMirror(int device, std::unique_ptr<cuda::CudaIpcImport> import, std::byte* host,
             cudaStream_t stream, cudaEvent_t done)
      : device_(device), import_(std::move(import)), host_(host), stream_(stream), done_(done) {}
  // Work is left on the stream only after a wait that timed out (a copy behind a process's ready
  // event that never came). The teardown waits for it at most kTeardownWait (the service drops
  // its buffers outside its lock); past that the stream, the pinned mirror and the imported
  // handle are left to the process's exit rather than freed under queued copies. Any other
  // error (a context already torn down at exit) frees them as before.
  ~CudaMirror() override {
    cuda::ScopedCudaDevice on_device(device_);
    const absl::Status idle = WaitForStream(kTeardownWait, "the copies queued on the buffer");
    if (absl::IsDeadlineExceeded(idle)) {
      Log()->error(
          "CUDA buffer of {} bytes on device {}: {}; leaving its stream, pinned mirror and IPC "
          "handle in place until the agent exits",
          import_->bytes(), device_, idle.message());
      (void)import_.release();  // not closed: the queued copies still name it
      return;
    }
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
    cudaFreeHost(host_);
    import_.reset();  // cudaIpcCloseMemHandle
  }

  std::byte* host() const override { return host_; }
  uint64_t size() const override { return import_->bytes(); }

  absl::Status CopyIn(uint64_t offset, uint64_t bytes, std::chrono::milliseconds timeout) override {
    cuda::ScopedCudaDevice on_device(device_);
    RETURN_IF_ERROR(on_device.status());
    // After the process's kernels that wrote the buffer (its MarkReady before the Submit).
    RETURN_IF_ERROR(import_->WaitReady(stream_));
    RETURN_IF_ERROR(cuda::CudaStatus(
        cudaMemcpyAsync(host_ + offset, static_cast<const std::byte*>(import_->data()) + offset,
                        bytes, cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync(device to host)"));
    return WaitForStream(timeout,
                         "the process's GPU work before its submit (the ready event) "
                         "and the copy to the agent");
  }

  void* device_data() const override { return import_->data(); }
  int device() const override { return device_; }
  absl::Status WaitReady(std::chrono::milliseconds timeout) override {
    cuda::ScopedCudaDevice on_device(device_);
    RETURN_IF_ERROR(on_device.status());
    RETURN_IF_ERROR(import_->WaitReady(stream_));
    return WaitForStream(timeout, "the process's GPU work before its submit (the ready event)");
  }

  absl::Status CopyOut(uint64_t offset, uint64_t bytes,
                       std::chrono::milliseconds timeout) override {
    cuda::ScopedCudaDevice on_device(device_);
    RETURN_IF_ERROR(on_device.status());
    RETURN_IF_ERROR(
        cuda::CudaStatus(cudaMemcpyAsync(static_cast<std::byte*>(import_->data()) + offset,
                                         host_ + offset, bytes, cudaMemcpyHostToDevice, stream_),
                         "cudaMemcpyAsync(host to device)"));
    // Done before the operation completes: the process's next kernels see the result.
    return WaitForStream(timeout, "the copy of the result back to the process's GPU memory");
  }

 private:
  // Waits for everything on stream_ until `timeout`: an event recorded after it, polled with a
  // backoff from 20 us to 1 ms (cudaStreamSynchronize has no deadline). DEADLINE_EXCEEDED names
  // `what`; the work stays queued, in order before any later copy on the stream.
  absl::Status WaitForStream(std::chrono::milliseconds timeout, const char* what) {
    RETURN_IF_ERROR(cuda::CudaStatus(cudaEventRecord(done_, stream_), "cudaEventRecord"));
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(20);
    while (true) {
      const cudaError_t e = cudaEventQuery(done_);
      if (e != cudaErrorNotReady) return cuda::CudaStatus(e, "cudaEventQuery");
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(what, " did not finish within ",
                                                        timeout.count(),
                                                        " ms: is a kernel of the process stuck?"));
      }
      std::this_thread::sleep_for(pause);  // polling a GPU event, bounded by the deadline
      pause = std::min<std::chrono::microseconds>(2 * pause, std::chrono::milliseconds(1));
    }
  }

  const int device_;
  std::unique_ptr<cuda::CudaIpcImport> import_;
  std::byte* const host_;
  const cudaStream_t stream_;
  const cudaEvent_t done_;  // WaitForStream's
};

}  // namespace

bool AgentHasCuda() { return true; }

absl::StatusOr<std::unique_ptr<dataplane::GpuOps>> MakeDeviceGpuOps(
    const std::vector<int>& devices) {
  ASSIGN_OR_RETURN(std::unique_ptr<dataplane::CudaGpuOps> ops,
                   dataplane::CudaGpuOps::Create(devices));
  return std::unique_ptr<dataplane::GpuOps>(std::move(ops));
}

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
  cudaEvent_t done = nullptr;
  if (absl::Status s = cuda::CudaStatus(cudaEventCreateWithFlags(&done, cudaEventDisableTiming),
                                        "cudaEventCreateWithFlags");
      !s.ok()) {
    cudaStreamDestroy(stream);
    cudaFreeHost(host);
    return s;
  }
  return std::make_shared<SharedMemoryMapping>(
      what, std::make_unique<CudaMirror>(parsed->device, std::move(import),
                                         static_cast<std::byte*>(host), stream, done));
}

}  // namespace tributary::agent
