// `tributary job-stats`: GetJobStats' answer as text, and the --what-if parser.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "tributary/v1/controller.pb.h"

namespace tributary::client::cli {

// "8:2,16:0" -> {(8, 2), (16, 0)}: workers:spares pairs, workers >= 1. INVALID_ARGUMENT naming
// the bad pair.
absl::StatusOr<std::vector<std::pair<uint32_t, uint32_t>>> ParseWhatIf(const std::string& text);

// Three tables: observed vs predicted for the job, one row per node, and the what-if rows.
std::string RenderJobStats(const tributary::v1::JobStats& stats);

}  // namespace tributary::client::cli
