// Internal: the client's end of a CUDA buffer registration (Client::RegisterCudaBuffer), kept
// free of CUDA headers so that client.h builds without CUDA.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tributary::client::internal {

// A device allocation exported by CUDA IPC (dataplane/cuda/cuda_ipc.h CudaIpcExport): its
// record for the agent and the interprocess ready event. Thread-safe (MarkReady records an
// event; CUDA serializes).
class CudaExport {
 public:
  virtual ~CudaExport() = default;
  // The 160-byte record the agent opens (RegisterCudaBufferRequest.record).
  virtual const std::string& record() const = 0;
  // Records the ready event on `stream` (a cudaStream_t; null: the legacy default stream):
  // the agent's copy of the buffer waits for the work queued there before it.
  virtual absl::Status MarkReady(void* stream) = 0;
};

// Exports [allocation, allocation + bytes) on `device`; `allocation` must be the base of a
// cudaMalloc allocation. FAILED_PRECONDITION "this client was built without CUDA" in such a
// build, "no CUDA device (...)" without a driver or GPU; INVALID_ARGUMENT for a null or
// non-exportable allocation, 0 bytes or a device out of range.
absl::StatusOr<std::unique_ptr<CudaExport>> ExportCudaBuffer(void* allocation, size_t bytes,
                                                             int device);

}  // namespace tributary::client::internal
