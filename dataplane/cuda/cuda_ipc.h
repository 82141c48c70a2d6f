// CUDA IPC: a device buffer of one process opened in place by another on the same node (a
// training process's tensor read and written by the agent), with an event ordering the access.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tributary::dataplane::cuda {

// What crosses the process boundary: the allocation's IPC handle, the buffer's place in it, and
// an interprocess event the exporter records when the bytes are final.
struct CudaIpcBuffer {
  cudaIpcMemHandle_t memory{};
  cudaIpcEventHandle_t ready{};
  uint64_t offset = 0;  // Bytes from the allocation's base (IPC handles name whole allocations).
  uint64_t bytes = 0;
  int32_t device = 0;  // The exporter's device ordinal (the importer's may differ: see Open).
};

// A fixed 160-byte little-endian record with a magic and a version (for the agent's RPC or
// buffer socket); ParseCudaIpcBuffer is INVALID_ARGUMENT for anything else.
std::string SerializeCudaIpcBuffer(const CudaIpcBuffer& buffer);
absl::StatusOr<CudaIpcBuffer> ParseCudaIpcBuffer(absl::string_view bytes);

// The exporter's side: owns the interprocess event. The allocation stays the caller's and must
// outlive every importer's use.
class CudaIpcExport {
 public:
  // `allocation` is the base pointer cudaMalloc returned (on `device`); the buffer is
  // [allocation + offset, + bytes). INVALID_ARGUMENT for memory that is not such an allocation.
  static absl::StatusOr<std::unique_ptr<CudaIpcExport>> Create(void* allocation, size_t offset,
                                                               size_t bytes, int device);
  ~CudaIpcExport();

  // Records the ready event on `producer` (the stream whose work writes the buffer).
  absl::Status MarkReady(cudaStream_t producer);
  const CudaIpcBuffer& buffer() const { return buffer_; }

 private:
  CudaIpcExport(CudaIpcBuffer buffer, cudaEvent_t event) : buffer_(buffer), event_(event) {}
  CudaIpcBuffer buffer_;
  cudaEvent_t event_;
};

// The importer's side: the buffer mapped into this process until destruction.
class CudaIpcImport {
 public:
  // Opens on the calling thread's current device (peer access enabled lazily when it is not the
  // exporter's). FAILED_PRECONDITION "no CUDA device" without a GPU; the runtime's error for a
  // handle of this process or of a process that has freed the allocation.
  static absl::StatusOr<std::unique_ptr<CudaIpcImport>> Open(const CudaIpcBuffer& buffer);
  ~CudaIpcImport();

  void* data() const { return static_cast<char*>(base_) + offset_; }
  size_t bytes() const { return bytes_; }
  // Makes `stream`'s later work wait for the exporter's MarkReady.
  absl::Status WaitReady(cudaStream_t stream);

 private:
  CudaIpcImport(void* base, size_t offset, size_t bytes, cudaEvent_t event)
      : base_(base), offset_(offset), bytes_(bytes), event_(event) {}
  void* base_;
  size_t offset_;
  size_t bytes_;
  cudaEvent_t event_;
};

}  // namespace tributary::dataplane::cuda
