// Byte sizes on the command line: "4096", "4K", "64M", "1G" and lists/ranges of them.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tributary::client::cli {

// One size: a decimal number with an optional binary unit suffix, case-insensitive:
// B, K/KB/KiB (1024), M/MB/MiB (1024^2), G/GB/GiB (1024^3), T/TB/TiB. INVALID_ARGUMENT on
// anything else or on overflow.
absl::StatusOr<uint64_t> ParseSize(std::string_view text);

// A list of sizes for a benchmark sweep: comma-separated items, each a size or a range
// "MIN:MAX" that stands for MIN, 2*MIN, 4*MIN, ... up to MAX inclusive (like nccl-tests -b/-e
// with -f 2). Sizes keep the order given; all must be > 0 and ranges need MIN <= MAX.
// Examples: "4K:64M", "1K,3,1M", "1K:4K,1M".
absl::StatusOr<std::vector<uint64_t>> ParseSizeList(std::string_view text);

}  // namespace tributary::client::cli
