// The TCP transport's wire format: the connection handshake and the frame header, encoded and
// validated here once (pure functions, no I/O). Every integer is little-endian.
//
//   hello (dialer -> listener, once):  magic u64 "TRIBTCP1" | version u16 | address length u16 |
//                                      the dialer's listening address ("ip:port", numeric)
//   ack   (listener -> dialer, once):  magic u64 "TRIBACK1" | version u16
//   frame (dialer -> listener):        "TRF" | version u8 | header length u32 |
//                                      payload length u64 | sequence u64 | header | payload
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tributary::dataplane::tcp {

inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr uint64_t kHelloMagic = 0x3150435442495254ULL;  // "TRIBTCP1" in memory
inline constexpr uint64_t kAckMagic = 0x314B434142495254ULL;    // "TRIBACK1" in memory
inline constexpr size_t kHelloFixedBytes = 12;                  // magic, version, length
inline constexpr size_t kMaxAddressBytes = 64;                  // "[v6]:port" fits easily
inline constexpr size_t kAckBytes = 10;
inline constexpr size_t kFrameHeaderBytes = 24;

// Encodes the hello a dialer sends first: its own listening address, so that the listener can
// name it in logs.
std::vector<std::byte> EncodeHello(const std::string& listening_address);

// Validates the fixed part of a hello (`bytes` holds at least kHelloFixedBytes) and returns the
// length of the address that follows. INVALID_ARGUMENT (bad magic, another protocol version, an
// address length of 0 or over kMaxAddressBytes) with a message naming what was wrong.
absl::StatusOr<size_t> ParseHelloFixed(std::span<const std::byte> bytes);

// Validates the address of a hello: a numeric "ipv4:port" or "[ipv6]:port".
absl::StatusOr<std::string> ParseHelloAddress(std::span<const std::byte> bytes);

std::vector<std::byte> EncodeAck();
// OK when `bytes` (kAckBytes of them) is the ack of this protocol version.
absl::Status ParseAck(std::span<const std::byte> bytes);

struct FrameHeader {
  uint32_t header_length = 0;   // bytes of the user header, <= Transport::kMaxHeaderBytes
  uint64_t payload_length = 0;  // bytes of the payload
  uint64_t sequence = 0;        // per connection, from 0
};

// Writes the kFrameHeaderBytes of `header` to `out`.
void EncodeFrameHeader(const FrameHeader& header, std::byte* out);

// Validates kFrameHeaderBytes of `bytes`: the magic and version, a header length of at most
// Transport::kMaxHeaderBytes, a payload length of at most `max_payload_bytes`, and the sequence
// number `expected_sequence`. INVALID_ARGUMENT naming the violation otherwise.
absl::StatusOr<FrameHeader> ParseFrameHeader(std::span<const std::byte> bytes,
                                             uint64_t max_payload_bytes,
                                             uint64_t expected_sequence);

}  // namespace tributary::dataplane::tcp
