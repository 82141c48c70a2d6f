// libFuzzer target: the data plane's message header decoder (dataplane/collectives/wire.h).
// Input: one byte choosing the header length (0..Transport::kMaxHeaderBytes), the header, then
// the payload -- what a transport hands DataPlaneNode for every message. ParseHeader must
// reject anything malformed with a Status; what it accepts must be self-consistent.
#include <cstddef>
#include <cstdint>
#include <span>

#include "dataplane/collectives/wire.h"

namespace {

using tributary::dataplane::MessageKind;
using tributary::dataplane::ParseHeader;
using tributary::dataplane::Transport;
using tributary::dataplane::WireHeader;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  const size_t header_bytes =
      std::min<size_t>(data[0] % (Transport::kMaxHeaderBytes + 1), size - 1);
  const std::span<const std::byte> header(bytes + 1, header_bytes);
  const size_t payload_bytes = size - 1 - header_bytes;
  absl::StatusOr<WireHeader> h = ParseHeader(header, payload_bytes);
  if (!h.ok()) {
    // A rejection always says why.
    if (h.status().message().empty()) __builtin_trap();
    return 0;
  }
  // Accepted: the magic and version were checked, and the description names the message.
  if (h->magic != WireHeader::kMagic || h->version != WireHeader::kVersion) __builtin_trap();
  // A chunk's payload holds exactly its elements (none for a broadcast push by a non-root):
  // receivers read chunk_count elements from it. Exact arithmetic, no wrap-around. Peer
  // recovery's messages carry none, or (a fetch) a list of chunk indices.
  const auto kind = static_cast<MessageKind>(h->kind);
  if (h->algorithm == static_cast<uint8_t>(tributary::dataplane::Algorithm::kParameterServer)) {
    // Parameter server: a push holds the chunk's values, a pull nothing, an answer nothing (an
    // acknowledgement) or an 8-byte version and the values.
    if (kind != MessageKind::kError) {
      const unsigned __int128 bytes =
          static_cast<unsigned __int128>(h->chunk_count) *
          tributary::common::DataTypeSize(static_cast<tributary::common::DataType>(h->dtype));
      const bool ok = kind == MessageKind::kPush   ? bytes == payload_bytes
                      : kind == MessageKind::kPull ? payload_bytes == 0
                      : kind == MessageKind::kResult
                          ? payload_bytes == 0 || bytes + 8 == payload_bytes
                          : false;
      if (!ok || h->root >= h->world_size) __builtin_trap();
    }
  } else if (kind == MessageKind::kPeerQuery || kind == MessageKind::kPeerAnswer) {
    // Push/pull peer recovery: questions and answers carry no payload.
    if (payload_bytes != 0 || h->sender == WireHeader::kFromServer) __builtin_trap();
  } else if (kind == MessageKind::kPeerFetch) {
    // A list of chunk indices: whole uint32s, at least one, at most one per chunk.
    if (payload_bytes == 0 || payload_bytes % 4 != 0 || payload_bytes / 4 > h->num_chunks ||
        h->num_chunks == 0 || h->num_chunks > h->tensor_count) {
      __builtin_trap();
    }
  } else if (kind != MessageKind::kError && kind != MessageKind::kAbort) {
    const unsigned __int128 bytes =
        static_cast<unsigned __int128>(h->chunk_count) *
        tributary::common::DataTypeSize(static_cast<tributary::common::DataType>(h->dtype));
    if (bytes != payload_bytes && payload_bytes != 0) __builtin_trap();
    if (payload_bytes == 0 && bytes != 0 &&
        !(kind == MessageKind::kPush &&
          h->reduce == static_cast<uint8_t>(tributary::dataplane::Reduction::kBroadcast))) {
      __builtin_trap();
    }
  }
  if (Describe(*h).empty()) __builtin_trap();
  return 0;
}
