// Byte sizes on the command line ("4096", "4K", "64M", "1G" and sweeps of them): the CLI's
// adapters over the project's one parser, common/byte_size.h.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"

namespace tributary::client::cli {

// One size (common::ParseByteSize); INVALID_ARGUMENT with the parser's message otherwise.
absl::StatusOr<uint64_t> ParseSize(std::string_view text);

// A sweep's sizes (common::ParseByteSizeList): "4K:64M", "1K,3,1M", "1K:4K,1M".
absl::StatusOr<std::vector<uint64_t>> ParseSizeList(std::string_view text);

// A CLI11 transformer for a size option: rejects a bad size at parse time and hands the option
// its value in bytes ("64M" -> "67108864"), so the option can be a plain integer.
CLI::Validator ByteSize();

// A CLI11 check for a sweep option: rejects a bad list at parse time, leaves the text as given.
CLI::Validator ByteSizeList();

}  // namespace tributary::client::cli
