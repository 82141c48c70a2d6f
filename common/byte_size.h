// Byte sizes as people write them: "4096", "4K", "64MiB", "1G", and benchmark sweeps of them
// ("4K:64M", "1K,3,1M"). The project's one parser: the CLI (through client/cli/sizes.h and its
// CLI11 validator) and the benchmark suite's Gloo / MPI peers (bench/suite/peer_common.h) use it.
// Header-only C++17 with no dependencies, because run.py compiles the peers with a bare
// `g++ -std=c++17` where CMake did not build them; errors are therefore a message string, which
// the CLI turns into an absl::Status.
#pragma once

#include <cctype>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tributary::common {

namespace byte_size_internal {

inline std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Sets *error (when given) to "invalid size '<text>': <why>"; returns nullopt for the caller.
inline std::nullopt_t Fail(std::string_view text, std::string_view why, std::string* error) {
  if (error != nullptr) {
    *error = "invalid size '" + std::string(text) + "': " + std::string(why);
  }
  return std::nullopt;
}

}  // namespace byte_size_internal

// One size: a decimal number with an optional binary unit suffix, case-insensitive:
// B, K/KB/KiB (1024), M/MB/MiB (1024^2), G/GB/GiB (1024^3), T/TB/TiB (1024^4); spaces around the
// number and the unit are ignored. nullopt (and *error set, when given) on anything else or on
// overflow.
inline std::optional<uint64_t> ParseByteSize(std::string_view text, std::string* error = nullptr) {
  using byte_size_internal::Fail;
  using byte_size_internal::Trim;
  const std::string_view s = Trim(text);
  size_t digits = 0;
  while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  if (digits == 0) return Fail(text, "expected a number such as 4096, 4K, 64M or 1G", error);
  uint64_t value = 0;
  for (size_t i = 0; i < digits; ++i) {
    const uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (value > (std::numeric_limits<uint64_t>::max() - d) / 10) {
      return Fail(text, "too large", error);
    }
    value = value * 10 + d;
  }
  std::string unit(Trim(s.substr(digits)));
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
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
    return Fail(text, "unknown unit; use B, K, M, G or T (powers of 1024)", error);
  }
  if (shift > 0 && value > (std::numeric_limits<uint64_t>::max() >> shift)) {
    return Fail(text, "too large", error);
  }
  return value << shift;
}

// A list of sizes for a benchmark sweep: comma-separated items, each a size or a range "MIN:MAX"
// that stands for MIN, 2*MIN, 4*MIN, ... up to MAX inclusive (like nccl-tests -b/-e with -f 2).
// Sizes keep the order given; all must be > 0 and ranges need MIN <= MAX. Examples: "4K:64M",
// "1K,3,1M", "1K:4K,1M". nullopt (and *error set, when given) on a bad list.
inline std::optional<std::vector<uint64_t>> ParseByteSizeList(std::string_view text,
                                                              std::string* error = nullptr) {
  using byte_size_internal::Fail;
  using byte_size_internal::Trim;
  std::vector<uint64_t> sizes;
  std::string_view rest = text;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = Trim(rest.substr(0, comma));
    if (item.empty()) return Fail(text, "empty item in the list", error);
    const size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      const std::optional<uint64_t> size = ParseByteSize(item, error);
      if (!size) return std::nullopt;
      if (*size == 0) return Fail(item, "sizes must be > 0", error);
      sizes.push_back(*size);
    } else {
      const std::optional<uint64_t> lo = ParseByteSize(item.substr(0, colon), error);
      if (!lo) return std::nullopt;
      const std::optional<uint64_t> hi = ParseByteSize(item.substr(colon + 1), error);
      if (!hi) return std::nullopt;
      if (*lo == 0) return Fail(item, "a range must start above 0", error);
      if (*lo > *hi) return Fail(item, "a range MIN:MAX needs MIN <= MAX", error);
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

}  // namespace tributary::common
