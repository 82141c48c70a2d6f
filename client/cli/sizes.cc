#include "client/cli/sizes.h"

#include <optional>
#include <string>

#include "common/byte_size.h"

namespace tributary::client::cli {

absl::StatusOr<uint64_t> ParseSize(std::string_view text) {
  std::string error;
  const std::optional<uint64_t> size = common::ParseByteSize(text, &error);
  if (!size) return absl::InvalidArgumentError(error);
  return *size;
}

absl::StatusOr<std::vector<uint64_t>> ParseSizeList(std::string_view text) {
  std::string error;
  std::optional<std::vector<uint64_t>> sizes = common::ParseByteSizeList(text, &error);
  if (!sizes) return absl::InvalidArgumentError(error);
  return *std::move(sizes);
}

CLI::Validator ByteSize() {
  return CLI::Validator(
      [](std::string& text) {
        std::string error;
        const std::optional<uint64_t> size = common::ParseByteSize(text, &error);
        if (!size) return error;
        text = std::to_string(*size);
        return std::string();
      },
      "SIZE", "byte size");
}

CLI::Validator ByteSizeList() {
  return CLI::Validator(
      [](const std::string& text) {
        std::string error;
        return common::ParseByteSizeList(text, &error) ? std::string() : error;
      },
      "SIZES", "byte size list");
}

}  // namespace tributary::client::cli
