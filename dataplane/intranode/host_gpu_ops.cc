#include "dataplane/intranode/host_gpu_ops.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tributary::dataplane {

absl::Status HostGpuOps::CheckGpu(int gpu) const {
  if (gpu < 0 || gpu >= gpus_) {
    return absl::InvalidArgumentError(absl::StrCat("no GPU ", gpu, " (", gpus_, " GPUs)"));
  }
  return absl::OkStatus();
}

void HostGpuOps::RegisterBuffer(int gpu, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  ranges_.push_back({p, p + bytes, gpu});
}

absl::StatusOr<void*> HostGpuOps::AllocateDevice(int gpu, size_t bytes) {
  if (absl::Status s = CheckGpu(gpu); !s.ok()) return s;
  storage_.push_back(std::make_unique<char[]>(bytes));
  RegisterBuffer(gpu, storage_.back().get(), bytes);
  return static_cast<void*>(storage_.back().get());
}

absl::StatusOr<void*> HostGpuOps::AllocateHost(size_t bytes) {
  storage_.push_back(std::make_unique<char[]>(bytes));
  RegisterBuffer(-1, storage_.back().get(), bytes);
  return static_cast<void*>(storage_.back().get());
}

absl::StatusOr<int> HostGpuOps::Owner(const void* p, size_t bytes) const {
  const char* c = static_cast<const char*>(p);
  for (const Range& r : ranges_) {
    if (c >= r.begin && c + bytes <= r.end) return r.gpu;
  }
  return absl::InvalidArgumentError("memory outside every registered buffer");
}

absl::Status HostGpuOps::CopyAsync(int gpu, void* dst, const void* src, size_t bytes) {
  if (absl::Status s = CheckGpu(gpu); !s.ok()) return s;
  absl::StatusOr<int> from = Owner(src, bytes);
  if (!from.ok()) return from.status();
  absl::StatusOr<int> to = Owner(dst, bytes);
  if (!to.ok()) return to.status();
  std::string what;
  if (*from >= 0 && *to < 0) {
    what = absl::StrCat("d2h ", *from);
  } else if (*from < 0 && *to >= 0) {
    what = absl::StrCat("h2d ", *to);
  } else if (*from >= 0 && *to >= 0 && *from != *to) {
    what = absl::StrCat("peer ", *from, "->", *to);
  } else if (*from >= 0) {
    what = absl::StrCat("local ", *from);
  } else {
    what = "h2h";
  }
  // A queue copies only to or from its own GPU's memory (or between host buffers).
  if (*from != gpu && *to != gpu && !(*from < 0 && *to < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " enqueued on GPU ", gpu));
  }
  log_.push_back(absl::StrCat(what, " on ", gpu));
  std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status HostGpuOps::ReduceAsync(int gpu, common::DataType dtype, void* dst,
                                     std::span<const void* const> srcs, size_t count) {
  if (absl::Status s = CheckGpu(gpu); !s.ok()) return s;
  if (srcs.empty()) return absl::InvalidArgumentError("a reduction needs a source");
  const size_t bytes = count * common::DataTypeSize(dtype);
  for (const void* p : srcs) {
    absl::StatusOr<int> owner = Owner(p, bytes);
    if (!owner.ok()) return owner.status();
    if (*owner != gpu) {
      return absl::InvalidArgumentError(absl::StrCat("GPU ", gpu, " reduces memory of ",
                                                     *owner < 0 ? "the host" : "GPU ",
                                                     *owner < 0 ? "" : absl::StrCat(*owner)));
    }
  }
  log_.push_back(absl::StrCat("reduce ", srcs.size(), " on ", gpu));
  if (srcs.size() == 1) {
    std::memmove(dst, srcs[0], bytes);
    return absl::OkStatus();
  }
  reducer_.Sum2(dtype, dst, srcs[0], srcs[1], count);
  for (size_t i = 2; i < srcs.size(); ++i) reducer_.Sum(dtype, dst, srcs[i], count);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> HostGpuOps::Fence(int gpu) {
  if (absl::Status s = CheckGpu(gpu); !s.ok()) return s;
  log_.push_back(absl::StrCat("fence ", gpu));
  return next_fence_++;
}

absl::Status HostGpuOps::WaitFence(int gpu, uint64_t fence) {
  if (absl::Status s = CheckGpu(gpu); !s.ok()) return s;
  if (fence >= next_fence_) return absl::InvalidArgumentError("a fence never enqueued");
  log_.push_back(absl::StrCat("wait ", gpu));
  return absl::OkStatus();  // Work ran when it was enqueued.
}

absl::Status HostGpuOps::Synchronize(int gpu) { return CheckGpu(gpu); }

}  // namespace tributary::dataplane
