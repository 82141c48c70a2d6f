// Stable hashes shared by every node: the same input gives the same value on every machine.
#pragma once

#include <cstdint>
#include <string_view>

namespace tributary::common {

// 64-bit FNV-1a. Stable across processes and builds; used on the wire and in plans.
constexpr uint64_t StableHash64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  // Finalise (splitmix64) so that short, similar names spread over the whole range.
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

}  // namespace tributary::common
