#include "dataplane/intranode/gpu_ops.h"

#include "absl/strings/str_cat.h"

namespace tributary::dataplane {

absl::Status CheckExecutorArguments(const GpuOps& ops, common::DataType dtype,
                                    std::span<void* const> buffers, bool average,
                                    uint64_t divisor) {
  if (common::DataTypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown data type ", static_cast<int>(dtype)));
  }
  if (buffers.size() != static_cast<size_t>(ops.gpu_count())) {
    return absl::InvalidArgumentError(
        absl::StrCat(buffers.size(), " buffers for ", ops.gpu_count(), " GPUs: one per GPU"));
  }
  if (average && divisor == 0) return absl::InvalidArgumentError("divisor must be >= 1");
  for (size_t g = 0; g < buffers.size(); ++g) {
    if (buffers[g] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("buffer of GPU ", g, " is null"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tributary::dataplane
