#include "dataplane/collectives/wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dataplane/schedule/chunk_map.h"

namespace tributary::dataplane {

absl::StatusOr<WireHeader> ParseHeader(std::span<const std::byte> header, size_t payload_bytes) {
  if (header.size() != sizeof(WireHeader)) {
    return absl::InvalidArgumentError(
        absl::StrCat("header of ", header.size(), " bytes, expected ", sizeof(WireHeader)));
  }
  WireHeader h;
  std::memcpy(&h, header.data(), sizeof(h));
  if (h.magic != WireHeader::kMagic) return absl::InvalidArgumentError("bad magic");
  if (h.version != WireHeader::kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported version ", h.version));
  }
  if (h.kind < 1 || h.kind > 3) {
    return absl::InvalidArgumentError(absl::StrCat("unknown message kind ", h.kind));
  }
  if (h.kind == static_cast<uint8_t>(MessageKind::kError)) {
    if (h.error_code == 0 || h.error_code > 16) {
      return absl::InvalidArgumentError(absl::StrCat("bad error code ", h.error_code));
    }
    return h;
  }
  if (!common::IsValidDataType(h.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", h.dtype));
  }
  if (h.reduce != static_cast<uint8_t>(ReduceKind::kSum) &&
      h.reduce != static_cast<uint8_t>(ReduceKind::kBroadcast)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown reduction ", h.reduce));
  }
  if (h.tensor_count == 0 || h.num_chunks == 0 || h.num_chunks > h.tensor_count ||
      h.chunk >= h.num_chunks) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", h.chunk, "/", h.num_chunks,
                                                   " of a tensor of ", h.tensor_count,
                                                   " elements is out of range"));
  }
  const ChunkRange expected = GetChunk(h.tensor_count, h.num_chunks, h.chunk);
  if (h.chunk_offset != expected.offset || h.chunk_count != expected.count) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", h.chunk, " covers [", h.chunk_offset,
                                                   ", +", h.chunk_count, "), expected [",
                                                   expected.offset, ", +", expected.count, ")"));
  }
  const uint64_t bytes =
      h.chunk_count * common::DataTypeSize(static_cast<common::DataType>(h.dtype));
  const bool empty_broadcast_push = h.kind == static_cast<uint8_t>(MessageKind::kPush) &&
                                    h.reduce == static_cast<uint8_t>(ReduceKind::kBroadcast) &&
                                    h.sender != h.root;
  const uint64_t want = empty_broadcast_push ? 0 : bytes;
  if (payload_bytes != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload of ", payload_bytes, " bytes, expected ", want, " (truncated?)"));
  }
  return h;
}

std::string Describe(const WireHeader& h) {
  return absl::StrFormat("tensor %016x iteration %d chunk %d/%d", h.tensor, h.iteration, h.chunk,
                         h.num_chunks);
}

}  // namespace tributary::dataplane
