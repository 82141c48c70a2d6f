#include "dataplane/schedule/chunk_map.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tributary::dataplane {

uint32_t NumChunks(uint64_t count, size_t element_size, uint64_t partition_bytes) {
  const uint64_t per_chunk = std::max<uint64_t>(1, partition_bytes / element_size);
  const uint64_t chunks = (count + per_chunk - 1) / per_chunk;
  return static_cast<uint32_t>(std::clamp<uint64_t>(chunks, 1, UINT32_MAX));
}

uint32_t PushPullChunks(uint64_t count, size_t element_size, uint64_t partition_bytes,
                        size_t num_servers, bool lone) {
  const uint32_t by_partition = NumChunks(count, element_size, partition_bytes);
  const uint64_t bytes = count * element_size;
  const uint64_t servers = std::max<size_t>(1, num_servers);
  uint64_t min_chunk = kMinPipelineChunkBytes;
  if (lone) {
    min_chunk = bytes / servers >= kLoneBulkChunkBytes * kLoneBulkChunksPerServer
                    ? kLoneBulkChunkBytes
                    : kMinLoneChunkBytes;
  }
  const uint64_t by_size = std::max<uint64_t>(1, bytes / min_chunk);
  const uint64_t spread = std::min<uint64_t>(servers, bytes / kMinSpreadChunkBytes);
  const uint64_t wanted =
      std::max(spread, std::min<uint64_t>(by_size, uint64_t{kPipelineChunksPerServer} * servers));
  return static_cast<uint32_t>(std::clamp<uint64_t>(std::max<uint64_t>(by_partition, wanted), 1,
                                                    std::min<uint64_t>(count, UINT32_MAX)));
}

ChunkRange GetChunk(uint64_t count, uint32_t num_chunks, uint32_t index) {
  const unsigned __int128 c = count;
  const uint64_t begin = static_cast<uint64_t>(c * index / num_chunks);
  const uint64_t end = static_cast<uint64_t>(c * (index + 1) / num_chunks);
  return ChunkRange{index, begin, end - begin};
}

absl::StatusOr<ChunkMap> ChunkMap::Create(std::span<const uint64_t> weights) {
  if (weights.empty()) return absl::InvalidArgumentError("a chunk map needs at least one server");
  std::vector<uint64_t> cumulative{0};
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] == 0) {
      return absl::InvalidArgumentError(absl::StrCat("server ", i, " has weight 0"));
    }
    cumulative.push_back(cumulative.back() + weights[i]);
    if (cumulative.back() > kWeightTotal) break;
  }
  if (cumulative.back() != kWeightTotal) {
    return absl::InvalidArgumentError(
        absl::StrCat("server weights sum to ", cumulative.back(), ", not 2^32"));
  }
  return ChunkMap(std::move(cumulative));
}

uint32_t ChunkMap::ServerOf(uint64_t tensor_hash, uint32_t num_chunks, uint32_t index) const {
  // Exact integer arithmetic on a circle of circumference c * 2^32: chunk i sits at
  // h*c + i*2^32, server s owns [c*W_s, c*W_{s+1}).
  const unsigned __int128 c = num_chunks;
  const unsigned __int128 circle = c * kWeightTotal;
  const unsigned __int128 h = tensor_hash & (kWeightTotal - 1);
  const unsigned __int128 pos =
      (h * c + static_cast<unsigned __int128>(index) * kWeightTotal) % circle;
  // First server whose arc end c*W_{s+1} is beyond pos.
  size_t lo = 0, hi = cumulative_.size() - 1;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const size_t mid = (lo + hi) / 2;
    if (c * cumulative_[mid] <= pos) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return static_cast<uint32_t>(lo);
}

}  // namespace tributary::dataplane

namespace tributary::dataplane {

std::vector<uint32_t> ChunkMap::SendOrder(uint64_t tensor_hash, uint32_t num_chunks,
                                          uint32_t rotation) const {
  std::vector<std::vector<uint32_t>> by_server(num_servers());
  for (uint32_t i = 0; i < num_chunks; ++i) {
    by_server[ServerOf(tensor_hash, num_chunks, i)].push_back(i);
  }
  struct Key {
    double position;
    uint32_t server;
    uint32_t chunk;
  };
  std::vector<Key> keys;
  keys.reserve(num_chunks);
  for (uint32_t s = 0; s < by_server.size(); ++s) {
    const double n = static_cast<double>(by_server[s].size());
    for (uint32_t j = 0; j < by_server[s].size(); ++j) {
      keys.push_back({(j + 0.5) / n, s, by_server[s][j]});
    }
  }
  std::sort(keys.begin(), keys.end(), [](const Key& a, const Key& b) {
    return a.position != b.position ? a.position < b.position : a.server < b.server;
  });
  // Rotate each run of keys at one position by `rotation`.
  for (size_t begin = 0; begin < keys.size();) {
    size_t end = begin + 1;
    while (end < keys.size() && keys[end].position == keys[begin].position) ++end;
    std::rotate(keys.begin() + begin, keys.begin() + begin + rotation % (end - begin),
                keys.begin() + end);
    begin = end;
  }
  std::vector<uint32_t> order;
  order.reserve(num_chunks);
  for (const Key& k : keys) order.push_back(k.chunk);
  return order;
}

}  // namespace tributary::dataplane
