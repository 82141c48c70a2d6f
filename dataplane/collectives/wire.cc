#include "dataplane/collectives/wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dataplane/schedule/chunk_map.h"

namespace tributary::dataplane {
namespace {

using common::DataType;
using common::DataTypeSize;

bool IsPushPullKind(uint8_t kind) {
  return kind == static_cast<uint8_t>(MessageKind::kPush) ||
         kind == static_cast<uint8_t>(MessageKind::kResult);
}

bool IsPeerKind(uint8_t kind) {
  return kind == static_cast<uint8_t>(MessageKind::kPeerQuery) ||
         kind == static_cast<uint8_t>(MessageKind::kPeerAnswer) ||
         kind == static_cast<uint8_t>(MessageKind::kPeerFetch);
}

// Chunks of at most 2^56 bytes: byte counts (and a version before them) never wrap around.
absl::Status CheckChunkBytes(const WireHeader& h) {
  if (h.chunk_count > (uint64_t{1} << 56) / DataTypeSize(static_cast<DataType>(h.dtype))) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", h.chunk_count, " elements is too large"));
  }
  return absl::OkStatus();
}

// A chunk of the push/pull chunk map (push/pull and the parameter server): in range, where the
// map puts it, and not too large.
absl::Status CheckChunkOfTheMap(const WireHeader& h) {
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
  if (absl::Status size = CheckChunkBytes(h); !size.ok()) return size;
  return absl::OkStatus();
}

// Push and result: a chunk of the push/pull chunk map.
absl::Status ValidatePushPull(const WireHeader& h, size_t payload_bytes) {
  if (absl::Status chunk = CheckChunkOfTheMap(h); !chunk.ok()) return chunk;
  const uint64_t bytes = h.chunk_count * DataTypeSize(static_cast<DataType>(h.dtype));
  const bool empty_broadcast_push = h.kind == static_cast<uint8_t>(MessageKind::kPush) &&
                                    h.reduce == static_cast<uint8_t>(Reduction::kBroadcast) &&
                                    h.sender != h.root;
  const uint64_t want = empty_broadcast_push ? 0 : bytes;
  if (payload_bytes != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload of ", payload_bytes, " bytes, expected ", want, " (truncated?)"));
  }
  return absl::OkStatus();
}

// Peer recovery (push/pull): the answer's code; a query's or fetch's shape, a fetch's chunk list.
absl::Status ValidatePeer(const WireHeader& h, size_t payload_bytes) {
  if (h.sender == WireHeader::kFromServer) {
    return absl::InvalidArgumentError("peer message without a worker rank");
  }
  if (h.kind == static_cast<uint8_t>(MessageKind::kPeerAnswer)) {
    if (h.error_code != 0 && h.error_code != static_cast<uint32_t>(absl::StatusCode::kNotFound)) {
      return absl::InvalidArgumentError(absl::StrCat("bad peer answer ", h.error_code));
    }
    if (payload_bytes != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("payload of ", payload_bytes, " bytes, expected 0"));
    }
    return absl::OkStatus();
  }
  if (!common::IsValidDataType(h.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", h.dtype));
  }
  if (h.tensor_count == 0 || h.num_chunks == 0 || h.num_chunks > h.tensor_count) {
    return absl::InvalidArgumentError(
        absl::StrCat(h.num_chunks, " chunks of a tensor of ", h.tensor_count, " elements"));
  }
  if (h.kind == static_cast<uint8_t>(MessageKind::kPeerQuery)) {
    if (payload_bytes != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("payload of ", payload_bytes, " bytes, expected 0"));
    }
    return absl::OkStatus();
  }
  if (payload_bytes == 0 || payload_bytes % 4 != 0 || payload_bytes / 4 > h.num_chunks) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk list of ", payload_bytes, " bytes for ", h.num_chunks, " chunks"));
  }
  return absl::OkStatus();
}

// Parameter server: init / delta pushes, pulls and their answers (see wire.h).
absl::Status ValidateParameterServer(const WireHeader& h, size_t payload_bytes) {
  const auto r = static_cast<Reduction>(h.reduce);
  if (!IsParameterServer(r)) {
    return absl::InvalidArgumentError(absl::StrCat("reduction ", std::string(ReductionName(r)),
                                                   " does not run on the parameter server"));
  }
  if (h.world_size == 0 || h.root >= h.world_size ||
      (h.sender != h.root && h.sender != WireHeader::kFromServer)) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", h.root, " (sender ", h.sender, ") of a world of ", h.world_size));
  }
  const uint8_t kind = h.kind;
  if (kind == static_cast<uint8_t>(MessageKind::kError)) return absl::OkStatus();
  // Pushes carry values (init by rank 0, deltas); pulls ask for them (init by other ranks, pulls).
  if ((kind == static_cast<uint8_t>(MessageKind::kPush) && r == Reduction::kPsPull) ||
      (kind == static_cast<uint8_t>(MessageKind::kPull) && r == Reduction::kPsDelta)) {
    return absl::InvalidArgumentError(
        absl::StrCat("message kind ", kind, " does not carry ", std::string(ReductionName(r))));
  }
  if (kind != static_cast<uint8_t>(MessageKind::kPush) &&
      kind != static_cast<uint8_t>(MessageKind::kPull) &&
      kind != static_cast<uint8_t>(MessageKind::kResult)) {
    return absl::InvalidArgumentError(
        absl::StrCat("message kind ", kind, " does not belong to parameter_server"));
  }
  if ((kind == static_cast<uint8_t>(MessageKind::kResult)) !=
      (h.sender == WireHeader::kFromServer)) {
    return absl::InvalidArgumentError("only the server answers, and only with results");
  }
  if (r == Reduction::kPsDelta && kind == static_cast<uint8_t>(MessageKind::kPush) && h.step == 0) {
    return absl::InvalidArgumentError("delta with clock 0 (clocks start at 1)");
  }
  if (absl::Status chunk = CheckChunkOfTheMap(h); !chunk.ok()) return chunk;
  const uint64_t bytes = h.chunk_count * DataTypeSize(static_cast<DataType>(h.dtype));
  bool ok = false;
  if (kind == static_cast<uint8_t>(MessageKind::kPush)) ok = payload_bytes == bytes;
  if (kind == static_cast<uint8_t>(MessageKind::kPull)) ok = payload_bytes == 0;
  if (kind == static_cast<uint8_t>(MessageKind::kResult)) {
    ok = payload_bytes == bytes + sizeof(uint64_t) ||
         (payload_bytes == 0 && r != Reduction::kPsPull);
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat("payload of ", payload_bytes,
                                                   " bytes does not fit a chunk of ", bytes,
                                                   " bytes (truncated?)"));
  }
  return absl::OkStatus();
}

// Data: a sub-chunk of a step of a ring / halving-doubling schedule.
absl::Status ValidateData(const WireHeader& h, size_t payload_bytes) {
  if (h.root >= h.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("root ", h.root, " of ", h.world_size));
  }
  if (h.tensor_count == 0 || h.num_chunks == 0 || h.chunk >= h.num_chunks ||
      h.chunk_offset > h.tensor_count || h.chunk_count > h.tensor_count - h.chunk_offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sub-chunk ", h.chunk, "/", h.num_chunks, " [", h.chunk_offset, ", +", h.chunk_count,
        ") of a tensor of ", h.tensor_count, " elements is out of range"));
  }
  if (absl::Status size = CheckChunkBytes(h); !size.ok()) return size;
  const uint64_t want = h.chunk_count * DataTypeSize(static_cast<DataType>(h.dtype));
  if (payload_bytes != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload of ", payload_bytes, " bytes, expected ", want, " (truncated?)"));
  }
  return absl::OkStatus();
}

}  // namespace

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
  if (h.kind < 1 || h.kind > kMaxMessageKind) {
    return absl::InvalidArgumentError(absl::StrCat("unknown message kind ", h.kind));
  }
  if (!IsValidAlgorithm(h.algorithm)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown algorithm ", h.algorithm));
  }
  const bool push_pull = h.algorithm == static_cast<uint8_t>(Algorithm::kPushPull);
  if (h.algorithm == static_cast<uint8_t>(Algorithm::kParameterServer)) {
    if (h.kind == static_cast<uint8_t>(MessageKind::kData) ||
        h.kind == static_cast<uint8_t>(MessageKind::kAbort)) {
      return absl::InvalidArgumentError(
          absl::StrCat("message kind ", h.kind, " does not belong to parameter_server"));
    }
    if (h.kind == static_cast<uint8_t>(MessageKind::kError) &&
        (h.error_code == 0 || h.error_code > 16)) {
      return absl::InvalidArgumentError(absl::StrCat("bad error code ", h.error_code));
    }
    if (!common::IsValidDataType(h.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", h.dtype));
    }
    if (!IsValidReduction(h.reduce)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown reduction ", h.reduce));
    }
    absl::Status valid = ValidateParameterServer(h, payload_bytes);
    if (!valid.ok()) return valid;
    return h;
  }
  if (h.kind == static_cast<uint8_t>(MessageKind::kPull)) {
    return absl::InvalidArgumentError("message kind 6 (pull) belongs to parameter_server only");
  }
  if (IsPeerKind(h.kind)) {
    if (!push_pull) {
      return absl::InvalidArgumentError(
          absl::StrCat("message kind ", h.kind, " belongs to push_pull only"));
    }
    if (absl::Status valid = ValidatePeer(h, payload_bytes); !valid.ok()) return valid;
    return h;
  }
  if (IsPushPullKind(h.kind) != push_pull && h.kind != static_cast<uint8_t>(MessageKind::kError) &&
      h.kind != static_cast<uint8_t>(MessageKind::kAbort)) {
    return absl::InvalidArgumentError(
        absl::StrCat("message kind ", h.kind, " does not belong to ",
                     std::string(AlgorithmName(Algorithm{h.algorithm}))));
  }
  // Ring and halving-doubling messages name their sender's rank.
  if (!push_pull && (h.world_size == 0 || h.sender >= h.world_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sender ", h.sender, " of a world of ", h.world_size));
  }
  if (h.kind == static_cast<uint8_t>(MessageKind::kError) ||
      h.kind == static_cast<uint8_t>(MessageKind::kAbort)) {
    if (h.error_code == 0 || h.error_code > 16) {
      return absl::InvalidArgumentError(absl::StrCat("bad error code ", h.error_code));
    }
    return h;
  }
  if (!common::IsValidDataType(h.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", h.dtype));
  }
  if (!IsValidReduction(h.reduce) || IsParameterServer(static_cast<Reduction>(h.reduce))) {
    return absl::InvalidArgumentError(absl::StrCat("unknown reduction ", h.reduce));
  }
  if (push_pull && IsBlockwise(static_cast<Reduction>(h.reduce))) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(ReductionName(static_cast<Reduction>(h.reduce))),
                     " does not run on push/pull (ring and halving-doubling only)"));
  }
  absl::Status valid =
      push_pull ? ValidatePushPull(h, payload_bytes) : ValidateData(h, payload_bytes);
  if (!valid.ok()) return valid;
  return h;
}

std::string Describe(const WireHeader& h) {
  return absl::StrFormat("tensor %016x iteration %d chunk %d/%d", h.tensor, h.iteration, h.chunk,
                         h.num_chunks);
}

}  // namespace tributary::dataplane
