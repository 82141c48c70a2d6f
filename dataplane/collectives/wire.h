// The push/pull protocol's message header. Fixed layout, little-endian hosts only, validated on
// receipt: a malformed or truncated message from a peer is rejected, never trusted.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace tributary::dataplane {

enum class MessageKind : uint8_t {
  kPush = 1,    // worker -> server: this worker's contribution to one chunk
  kResult = 2,  // server -> worker: the reduced chunk
  kError = 3,   // server -> worker: the (tensor, iteration) failed; payload is the reason
};

enum class ReduceKind : uint8_t {
  kSum = 1,        // the server adds every worker's chunk (average divides on the workers)
  kBroadcast = 2,  // the server forwards the root worker's chunk; others push empty chunks
};

#pragma pack(push, 1)
struct WireHeader {
  static constexpr uint32_t kMagic = 0x42495254;  // "TRIB"
  static constexpr uint8_t kVersion = 1;
  static constexpr uint32_t kFromServer = UINT32_MAX;

  uint32_t magic = kMagic;
  uint8_t version = kVersion;
  uint8_t kind = 0;        // MessageKind
  uint8_t dtype = 0;       // common::DataType
  uint8_t reduce = 0;      // ReduceKind
  uint64_t job = 0;        // StableHash64(job id)
  uint64_t tensor = 0;     // StableHash64(tensor name)
  uint64_t iteration = 0;  // n-th submission of this tensor name in the job
  uint64_t plan_version = 0;
  uint64_t tensor_count = 0;  // elements in the whole tensor
  uint32_t num_chunks = 0;
  uint32_t chunk = 0;
  uint64_t chunk_offset = 0;  // first element of this chunk
  uint64_t chunk_count = 0;   // elements in this chunk
  uint32_t sender = 0;        // worker rank, or kFromServer
  uint32_t root = 0;          // broadcast: rank of the root worker node
  uint32_t error_code = 0;    // absl::StatusCode, kError only
  uint32_t reserved = 0;
};
#pragma pack(pop)

// Identifies one collective: sums never mix jobs, tensors or iterations.
struct CollectiveKey {
  uint64_t job = 0;
  uint64_t tensor = 0;
  uint64_t iteration = 0;
  friend bool operator==(const CollectiveKey&, const CollectiveKey&) = default;
  friend auto operator<=>(const CollectiveKey&, const CollectiveKey&) = default;
};

inline CollectiveKey KeyOf(const WireHeader& h) { return {h.job, h.tensor, h.iteration}; }

inline std::span<const std::byte> AsBytes(const WireHeader& h) {
  return {reinterpret_cast<const std::byte*>(&h), sizeof(h)};
}

// Parses and validates a header against the payload that came with it: magic, version, kinds,
// dtype, chunk index and range, payload length. INVALID_ARGUMENT naming the field otherwise.
absl::StatusOr<WireHeader> ParseHeader(std::span<const std::byte> header, size_t payload_bytes);

// "tensor 0x.. iteration 3 chunk 2/5" for messages.
std::string Describe(const WireHeader& h);

}  // namespace tributary::dataplane
