#include "dataplane/staging/gpu_transfer.h"

#include <ucp/api/ucp.h>

#include <cstdlib>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace tributary::dataplane {
namespace {

constexpr auto Log = common::ComponentLog<"dataplane">;

bool NamesCudaCopy(std::string_view t) { return t == "cuda_copy" || t == "cuda"; }

// Whether a comma-separated list names cuda_copy.
bool ListNamesCudaCopy(std::string_view list) {
  while (true) {
    const size_t comma = list.find(',');
    if (NamesCudaCopy(list.substr(0, comma))) return true;
    if (comma == std::string_view::npos) return false;
    list.remove_prefix(comma + 1);
  }
}

}  // namespace

const char* GpuTransferModeName(GpuTransferMode mode) {
  switch (mode) {
    case GpuTransferMode::kUcxCudaMemory:
      return "UCX CUDA memory";
    case GpuTransferMode::kPinnedStaging:
      return "pinned staging";
  }
  return "unknown";
}

GpuTransferChoice ChooseGpuTransfer(const std::optional<std::string>& ucx_tls,
                                    bool ucx_has_cuda_memory) {
  const std::string tls = ucx_tls.value_or("");
  const std::string shown = ucx_tls ? absl::StrCat("UCX_TLS=", tls) : "UCX_TLS unset";
  bool enabled = false;  // UCX_TLS lets cuda_copy run.
  if (tls.empty() || tls == "all") {
    enabled = true;
  } else if (tls[0] == '^') {
    enabled = !ListNamesCudaCopy(std::string_view(tls).substr(1));
  } else {
    enabled = ListNamesCudaCopy(tls);
  }
  if (!enabled) {
    return {GpuTransferMode::kPinnedStaging,
            absl::StrCat(shown, " does not enable cuda_copy; staging through pinned host memory")};
  }
  if (!ucx_has_cuda_memory) {
    return {GpuTransferMode::kPinnedStaging,
            absl::StrCat(shown,
                         " but this UCX has no CUDA memory support (built without CUDA, "
                         "or its cuda transports did not load); staging through pinned "
                         "host memory")};
  }
  return {GpuTransferMode::kUcxCudaMemory,
          absl::StrCat(shown, " and UCX registers CUDA memory; device buffers go to UCX as is")};
}

absl::StatusOr<bool> UcxSupportsCudaMemory() {
  ucp_config_t* config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("ucp_config_read failed: ", ucs_status_string(s)));
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM;
  ucp_context_h context = nullptr;
  const ucs_status_t init = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (init != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("ucp_init failed: ", ucs_status_string(init)));
  }
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  const ucs_status_t query = ucp_context_query(context, &attr);
  ucp_cleanup(context);
  if (query != UCS_OK) {
    return absl::UnavailableError(
        absl::StrCat("ucp_context_query failed: ", ucs_status_string(query)));
  }
  return (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

GpuTransferChoice DetectGpuTransfer() {
  const char* env = std::getenv("UCX_TLS");
  const std::optional<std::string> tls = env ? std::optional<std::string>(env) : std::nullopt;
  absl::StatusOr<bool> cuda = UcxSupportsCudaMemory();
  GpuTransferChoice choice = ChooseGpuTransfer(tls, cuda.ok() && *cuda);
  if (!cuda.ok()) absl::StrAppend(&choice.reason, " (UCX probe: ", cuda.status().message(), ")");
  Log()->info("gpu tensors: {}: {}", GpuTransferModeName(choice.mode), choice.reason);
  return choice;
}

}  // namespace tributary::dataplane
