#include "dataplane/reduce/cuda/cuda_reducer.h"

#include <cstdlib>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "dataplane/cuda/cuda_status.h"
#include "dataplane/reduce/cuda/reduce_kernels.h"

namespace tributary::dataplane {
namespace {

constexpr auto Log = common::ComponentLog<"dataplane">;
using cuda::CudaStatus;
using cuda_reduce::ElementType;
using cuda_reduce::kMaxSources;

std::optional<ElementType> ToElementType(common::DataType t) {
  switch (t) {
    case common::DataType::kFloat32:
      return ElementType::kF32;
    case common::DataType::kFloat64:
      return ElementType::kF64;
    case common::DataType::kFloat16:
      return ElementType::kF16;
    case common::DataType::kBFloat16:
      return ElementType::kBf16;
    case common::DataType::kInt32:
      return ElementType::kI32;
    case common::DataType::kInt64:
      return ElementType::kI64;
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaReducer>> CudaReducer::Create(int device) {
  if (absl::Status s = cuda::CheckCudaDevice(device); !s.ok()) return s;
  int sms = 0, blocks_per_sm = 0, pageable = 0;
  if (absl::Status s =
          CudaStatus(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                     "cudaDeviceGetAttribute(MultiProcessorCount)");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CudaStatus(
          cudaDeviceGetAttribute(&blocks_per_sm, cudaDevAttrMaxBlocksPerMultiprocessor, device),
          "cudaDeviceGetAttribute(MaxBlocksPerMultiprocessor)");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CudaStatus(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, device),
                     "cudaDeviceGetAttribute(PageableMemoryAccess)");
      !s.ok()) {
    return s;
  }
  // 256-thread blocks: at most 2048 / 256 = 8 resident per SM on current GPUs.
  const int per_sm = blocks_per_sm > 0 && blocks_per_sm < 8 ? blocks_per_sm : 8;
  return std::unique_ptr<CudaReducer>(new CudaReducer(device, sms * per_sm, pageable != 0));
}

absl::Status CudaReducer::CheckPointer(const void* p, const char* what) const {
  if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, " is null"));
  cudaPointerAttributes attr{};
  if (absl::Status s = CudaStatus(cudaPointerGetAttributes(&attr, p), "cudaPointerGetAttributes");
      !s.ok()) {
    return s;
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice:
      if (attr.device != device_) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " is memory of CUDA device ", attr.device, ", the reducer runs on ", device_));
      }
      return absl::OkStatus();
    case cudaMemoryTypeManaged:
    case cudaMemoryTypeHost:
      return absl::OkStatus();
    case cudaMemoryTypeUnregistered:
    default:
      if (pageable_access_) return absl::OkStatus();
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is pageable host memory, which CUDA device ", device_,
                       " cannot access: pass device, managed or pinned "
                       "(cudaHostAlloc/cudaHostRegister) memory"));
  }
}

absl::Status CudaReducer::Pass(common::DataType dtype, void* dst, std::span<const void* const> srcs,
                               size_t count, bool divide, uint64_t divisor,
                               cudaStream_t stream) const {
  cuda_reduce::ReduceArgs args;
  args.dst = dst;
  args.num_sources = static_cast<int>(srcs.size());
  for (size_t s = 0; s < srcs.size(); ++s) args.src[s] = srcs[s];
  args.divide = divide;
  args.divisor = divisor;
  args.count = count;
  return CudaStatus(cuda_reduce::LaunchReduce(*ToElementType(dtype), args, max_blocks_, stream),
                    "reduction kernel launch");
}

absl::Status CudaReducer::ReduceAsync(common::DataType dtype, void* dst,
                                      std::span<const void* const> srcs, size_t count, bool average,
                                      cudaStream_t stream) const {
  if (!ToElementType(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown data type ", static_cast<int>(dtype)));
  }
  if (srcs.empty()) return absl::InvalidArgumentError("a reduction needs at least one source");
  for (size_t i = kMaxSources; i < srcs.size(); ++i) {
    if (srcs[i] == dst) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dst is source ", i, "; with more than ", kMaxSources,
          " sources dst may only be one of the first ", kMaxSources, " (it accumulates)"));
    }
  }
  if (count == 0) return absl::OkStatus();
  if (absl::Status s = CheckPointer(dst, "dst"); !s.ok()) return s;
  for (size_t i = 0; i < srcs.size(); ++i) {
    if (absl::Status s = CheckPointer(srcs[i], "a source"); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("source ", i, ": ", s.message()));
    }
  }
  cuda::ScopedCudaDevice on_device(device_);
  if (!on_device.status().ok()) return on_device.status();
  // Pass 1 folds the first 8 sources into dst; each further pass folds dst and 7 more.
  std::vector<const void*> pass(srcs.begin(),
                                srcs.begin() + std::min<size_t>(srcs.size(), kMaxSources));
  size_t next = pass.size();
  while (true) {
    const bool last = next == srcs.size();
    if (absl::Status s = Pass(dtype, dst, pass, count, last && average, srcs.size(), stream);
        !s.ok()) {
      return s;
    }
    if (last) return absl::OkStatus();
    pass.assign(1, dst);
    while (pass.size() < static_cast<size_t>(kMaxSources) && next < srcs.size()) {
      pass.push_back(srcs[next++]);
    }
  }
}

absl::Status CudaReducer::DivideAsync(common::DataType dtype, void* dst, size_t count,
                                      uint64_t divisor, cudaStream_t stream) const {
  if (!ToElementType(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown data type ", static_cast<int>(dtype)));
  }
  if (divisor == 0) return absl::InvalidArgumentError("divisor must be >= 1, not 0");
  if (count == 0) return absl::OkStatus();
  if (absl::Status s = CheckPointer(dst, "dst"); !s.ok()) return s;
  cuda::ScopedCudaDevice on_device(device_);
  if (!on_device.status().ok()) return on_device.status();
  const void* self[] = {dst};
  return Pass(dtype, dst, self, count, true, divisor, stream);
}

void CudaReducer::Synchronous(const char* what, absl::Status enqueued) {
  if (enqueued.ok()) {
    cuda::ScopedCudaDevice on_device(device_);
    enqueued = on_device.status().ok()
                   ? CudaStatus(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize")
                   : on_device.status();
  }
  if (!enqueued.ok()) {
    Log()->critical("CudaReducer::{} on CUDA device {} failed: {}", what, device_, enqueued);
    std::abort();
  }
}

void CudaReducer::Sum(common::DataType dtype, void* dst, const void* src, size_t count) {
  const void* srcs[] = {dst, src};
  Synchronous("Sum", ReduceAsync(dtype, dst, srcs, count, false, cudaStreamPerThread));
}

void CudaReducer::Sum2(common::DataType dtype, void* dst, const void* a, const void* b,
                       size_t count) {
  const void* srcs[] = {a, b};
  Synchronous("Sum2", ReduceAsync(dtype, dst, srcs, count, false, cudaStreamPerThread));
}

void CudaReducer::Divide(common::DataType dtype, void* dst, size_t count, uint64_t divisor) {
  Synchronous("Divide", DivideAsync(dtype, dst, count, divisor, cudaStreamPerThread));
}

}  // namespace tributary::dataplane
