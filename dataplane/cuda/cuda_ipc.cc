#include "dataplane/cuda/cuda_ipc.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "dataplane/cuda/cuda_status.h"

namespace tributary::dataplane::cuda {
namespace {

constexpr char kMagic[8] = {'T', 'R', 'B', 'C', 'U', 'I', 'P', 'C'};
constexpr uint32_t kVersion = 1;
// magic 8, version 4, device 4, offset 8, bytes 8, memory 64, event 64.
constexpr size_t kRecordBytes = 8 + 4 + 4 + 8 + 8 + 64 + 64;
static_assert(sizeof(cudaIpcMemHandle_t) == 64 && sizeof(cudaIpcEventHandle_t) == 64);

template <typename T>
void Put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));  // Little-endian hosts only (x86, Arm).
}
template <typename T>
T Get(const char*& p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  p += sizeof(v);
  return v;
}

}  // namespace

std::string SerializeCudaIpcBuffer(const CudaIpcBuffer& b) {
  std::string out(kMagic, sizeof(kMagic));
  Put(out, kVersion);
  Put(out, b.device);
  Put(out, b.offset);
  Put(out, b.bytes);
  Put(out, b.memory);
  Put(out, b.ready);
  return out;
}

absl::StatusOr<CudaIpcBuffer> ParseCudaIpcBuffer(absl::string_view bytes) {
  if (bytes.size() != kRecordBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a CUDA IPC buffer record has ", kRecordBytes, " bytes, not ", bytes.size()));
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError("not a CUDA IPC buffer record (bad magic)");
  }
  const char* p = bytes.data() + sizeof(kMagic);
  const uint32_t version = Get<uint32_t>(p);
  if (version != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA IPC buffer record version ", version, "; this build reads ", kVersion));
  }
  CudaIpcBuffer b;
  b.device = Get<int32_t>(p);
  b.offset = Get<uint64_t>(p);
  b.bytes = Get<uint64_t>(p);
  b.memory = Get<cudaIpcMemHandle_t>(p);
  b.ready = Get<cudaIpcEventHandle_t>(p);
  if (b.device < 0) return absl::InvalidArgumentError("negative device ordinal");
  if (b.offset + b.bytes < b.offset) return absl::InvalidArgumentError("offset + bytes overflows");
  return b;
}

absl::StatusOr<std::unique_ptr<CudaIpcExport>> CudaIpcExport::Create(void* allocation,
                                                                     size_t offset, size_t bytes,
                                                                     int device) {
  if (absl::Status s = CheckCudaDevice(device); !s.ok()) return s;
  if (allocation == nullptr) return absl::InvalidArgumentError("allocation is null");
  ScopedCudaDevice on_device(device);
  if (!on_device.status().ok()) return on_device.status();
  CudaIpcBuffer b;
  b.offset = offset;
  b.bytes = bytes;
  b.device = device;
  if (absl::Status s =
          CudaStatus(cudaIpcGetMemHandle(&b.memory, allocation), "cudaIpcGetMemHandle");
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot export the buffer (is it the base of a cudaMalloc allocation?): ", s.message()));
  }
  cudaEvent_t event = nullptr;
  if (absl::Status s = CudaStatus(
          cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming),
          "cudaEventCreateWithFlags(interprocess)");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CudaStatus(cudaIpcGetEventHandle(&b.ready, event), "cudaIpcGetEventHandle");
      !s.ok()) {
    cudaEventDestroy(event);
    return s;
  }
  return std::unique_ptr<CudaIpcExport>(new CudaIpcExport(b, event));
}

CudaIpcExport::~CudaIpcExport() { cudaEventDestroy(event_); }

absl::Status CudaIpcExport::MarkReady(cudaStream_t producer) {
  ScopedCudaDevice on_device(buffer_.device);
  return CudaStatus(cudaEventRecord(event_, producer), "cudaEventRecord");
}

absl::StatusOr<std::unique_ptr<CudaIpcImport>> CudaIpcImport::Open(const CudaIpcBuffer& b) {
  if (absl::StatusOr<int> count = CudaDeviceCount(); !count.ok()) return count.status();
  void* base = nullptr;
  if (absl::Status s =
          CudaStatus(cudaIpcOpenMemHandle(&base, b.memory, cudaIpcMemLazyEnablePeerAccess),
                     "cudaIpcOpenMemHandle");
      !s.ok()) {
    return s;
  }
  cudaEvent_t event = nullptr;
  if (absl::Status s =
          CudaStatus(cudaIpcOpenEventHandle(&event, b.ready), "cudaIpcOpenEventHandle");
      !s.ok()) {
    cudaIpcCloseMemHandle(base);
    return s;
  }
  return std::unique_ptr<CudaIpcImport>(new CudaIpcImport(base, b.offset, b.bytes, event));
}

CudaIpcImport::~CudaIpcImport() {
  cudaEventDestroy(event_);
  cudaIpcCloseMemHandle(base_);
}

absl::Status CudaIpcImport::WaitReady(cudaStream_t stream) {
  return CudaStatus(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent");
}

}  // namespace tributary::dataplane::cuda
