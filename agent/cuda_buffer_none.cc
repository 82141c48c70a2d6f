// ImportCudaBuffer of an agent built without CUDA.
#include "agent/cuda_buffer.h"

namespace tributary::agent {

bool AgentHasCuda() { return false; }

absl::StatusOr<std::unique_ptr<dataplane::GpuOps>> MakeDeviceGpuOps(const std::vector<int>&) {
  return absl::FailedPreconditionError("this agent was built without CUDA");
}

absl::StatusOr<std::shared_ptr<SharedMemoryMapping>> ImportCudaBuffer(const std::string&,
                                                                      const std::string& what) {
  return absl::FailedPreconditionError(
      "this agent was built without CUDA: it cannot register CUDA buffers (rebuild it with "
      "nvcc found, CMake TRIBUTARY_CUDA=ON, or use shared-memory buffers)");
}

}  // namespace tributary::agent
