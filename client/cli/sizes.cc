#include "client/cli/sizes.h"

#include <cctype>
#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tributary::client::cli {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

absl::Status BadSize(std::string_view text, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid size '", std::string(text), "': ", std::string(why)));
}

}  // namespace

absl::StatusOr<uint64_t> ParseSize(std::string_view text) {
  const std::string_view s = Trim(text);
  size_t digits = 0;
  while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  if (digits == 0) return BadSize(text, "expected a number such as 4096, 4K, 64M or 1G");
  uint64_t value = 0;
  for (size_t i = 0; i < digits; ++i) {
    const uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (value > (std::numeric_limits<uint64_t>::max() - d) / 10) {
      return BadSize(text, "too large");
    }
    value = value * 10 + d;
  }
  const std::string unit = absl::AsciiStrToLower(std::string(Trim(s.substr(digits))));
  int shift = 0;
  if (unit.empty() || unit == "b") {
    shift = 0;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    shift = 10;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    shift = 20;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    shift = 30;
  } else if (unit == "t" || unit == "tb" || unit == "tib") {
    shift = 40;
  } else {
    return BadSize(text, "unknown unit; use B, K, M, G or T (powers of 1024)");
  }
  if (shift > 0 && value > (std::numeric_limits<uint64_t>::max() >> shift)) {
    return BadSize(text, "too large");
  }
  return value << shift;
}

absl::StatusOr<std::vector<uint64_t>> ParseSizeList(std::string_view text) {
  std::vector<uint64_t> sizes;
  std::string_view rest = text;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = Trim(rest.substr(0, comma));
    if (item.empty()) return BadSize(text, "empty item in the list");
    const size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      auto size = ParseSize(item);
      if (!size.ok()) return size.status();
      if (*size == 0) return BadSize(item, "sizes must be > 0");
      sizes.push_back(*size);
    } else {
      auto lo = ParseSize(item.substr(0, colon));
      if (!lo.ok()) return lo.status();
      auto hi = ParseSize(item.substr(colon + 1));
      if (!hi.ok()) return hi.status();
      if (*lo == 0) return BadSize(item, "a range must start above 0");
      if (*lo > *hi) return BadSize(item, "a range MIN:MAX needs MIN <= MAX");
      for (uint64_t size = *lo; size <= *hi; size *= 2) {
        sizes.push_back(size);
        if (size > std::numeric_limits<uint64_t>::max() / 2) break;
      }
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return sizes;
}

}  // namespace tributary::client::cli
