// How GPU tensors reach the network: UCX's own CUDA memory support, or pinned staging.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace tributary::dataplane {

enum class GpuTransferMode {
  kUcxCudaMemory,  // UCX sends and receives device memory itself (cuda_copy / cuda_ipc).
  kPinnedStaging,  // StagingPipeline through cudaHostAlloc'd chunks.
};

struct GpuTransferChoice {
  GpuTransferMode mode = GpuTransferMode::kPinnedStaging;
  std::string reason;  // One line for the log: what was found.
};

// Pure: the choice from UCX_TLS's value (nullopt when unset) and whether the UCX build (its
// context, as configured) registers CUDA memory. UCX_TLS semantics: unset or "all" = every
// transport; "^a,b" = all but a and b; otherwise the listed ones, where "cuda" stands for
// cuda_copy, cuda_ipc and gdr_copy. UCX moves device memory only with cuda_copy enabled.
GpuTransferChoice ChooseGpuTransfer(const std::optional<std::string>& ucx_tls,
                                    bool ucx_has_cuda_memory);

// Whether a UCP context created with the process's UCX configuration supports CUDA memory
// (ucp_context_query's memory types include UCS_MEMORY_TYPE_CUDA). UNAVAILABLE when no UCP
// context can be created.
absl::StatusOr<bool> UcxSupportsCudaMemory();

// The choice for this process (UCX_TLS from the environment, the probe above), logged once at
// info on the "dataplane" logger: "gpu tensors: <mode>: <reason>".
GpuTransferChoice DetectGpuTransfer();

const char* GpuTransferModeName(GpuTransferMode mode);

}  // namespace tributary::dataplane
