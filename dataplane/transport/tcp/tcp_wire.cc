#include "dataplane/transport/tcp/tcp_wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dataplane/transport/socket_address.h"
#include "dataplane/transport/transport.h"

namespace tributary::dataplane::tcp {
namespace {

template <typename T>
void Put(std::byte* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = std::byte((value >> (8 * i)) & 0xff);
}

template <typename T>
T Get(const std::byte* in) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(in[i]) << (8 * i);
  return value;
}

constexpr std::byte kFrameMagic[3] = {std::byte{'T'}, std::byte{'R'}, std::byte{'F'}};

}  // namespace

std::vector<std::byte> EncodeHello(const std::string& listening_address) {
  std::vector<std::byte> out(kHelloFixedBytes + listening_address.size());
  Put<uint64_t>(out.data(), kHelloMagic);
  Put<uint16_t>(out.data() + 8, kProtocolVersion);
  Put<uint16_t>(out.data() + 10, static_cast<uint16_t>(listening_address.size()));
  std::memcpy(out.data() + kHelloFixedBytes, listening_address.data(), listening_address.size());
  return out;
}

absl::StatusOr<size_t> ParseHelloFixed(std::span<const std::byte> bytes) {
  if (bytes.size() < kHelloFixedBytes) {
    return absl::InvalidArgumentError("handshake shorter than its fixed part");
  }
  const uint64_t magic = Get<uint64_t>(bytes.data());
  if (magic != kHelloMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("bad handshake magic 0x%016x (not a tributary data-plane peer)", magic));
  }
  const uint16_t version = Get<uint16_t>(bytes.data() + 8);
  if (version != kProtocolVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported protocol version ", version,
                                                   " (this agent speaks ", kProtocolVersion, ")"));
  }
  const uint16_t length = Get<uint16_t>(bytes.data() + 10);
  if (length == 0 || length > kMaxAddressBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("handshake address length ", length, " outside 1..", kMaxAddressBytes));
  }
  return static_cast<size_t>(length);
}

absl::StatusOr<std::string> ParseHelloAddress(std::span<const std::byte> bytes) {
  std::string address(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  for (char c : address) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError("handshake address has non-printable bytes");
    }
  }
  absl::StatusOr<SocketAddress> parsed = ParsePeerAddress(address);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("handshake address: ", parsed.status().message()));
  }
  return address;
}

std::vector<std::byte> EncodeAck() {
  std::vector<std::byte> out(kAckBytes);
  Put<uint64_t>(out.data(), kAckMagic);
  Put<uint16_t>(out.data() + 8, kProtocolVersion);
  return out;
}

absl::Status ParseAck(std::span<const std::byte> bytes) {
  if (bytes.size() != kAckBytes) return absl::InvalidArgumentError("handshake reply truncated");
  if (Get<uint64_t>(bytes.data()) != kAckMagic) {
    return absl::InvalidArgumentError("bad handshake reply (not a tributary data-plane peer)");
  }
  const uint16_t version = Get<uint16_t>(bytes.data() + 8);
  if (version != kProtocolVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer speaks protocol version ", version, ", this agent ", kProtocolVersion));
  }
  return absl::OkStatus();
}

void EncodeFrameHeader(const FrameHeader& header, std::byte* out) {
  std::memcpy(out, kFrameMagic, sizeof(kFrameMagic));
  out[3] = std::byte{static_cast<uint8_t>(kProtocolVersion)};
  Put<uint32_t>(out + 4, header.header_length);
  Put<uint64_t>(out + 8, header.payload_length);
  Put<uint64_t>(out + 16, header.sequence);
}

absl::StatusOr<FrameHeader> ParseFrameHeader(std::span<const std::byte> bytes,
                                             uint64_t max_payload_bytes,
                                             uint64_t expected_sequence) {
  if (bytes.size() < kFrameHeaderBytes) {
    return absl::InvalidArgumentError("frame header truncated");
  }
  if (std::memcmp(bytes.data(), kFrameMagic, sizeof(kFrameMagic)) != 0) {
    return absl::InvalidArgumentError("bad frame magic");
  }
  if (bytes[3] != std::byte{static_cast<uint8_t>(kProtocolVersion)}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame of protocol version ", static_cast<int>(bytes[3]), ", expected ", kProtocolVersion));
  }
  FrameHeader header;
  header.header_length = Get<uint32_t>(bytes.data() + 4);
  header.payload_length = Get<uint64_t>(bytes.data() + 8);
  header.sequence = Get<uint64_t>(bytes.data() + 16);
  if (header.header_length > Transport::kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("frame header length ", header.header_length,
                                                   " over the limit of ",
                                                   Transport::kMaxHeaderBytes));
  }
  if (header.payload_length > max_payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("frame payload length ", header.payload_length,
                                                   " over the limit of ", max_payload_bytes));
  }
  if (header.sequence != expected_sequence) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame sequence ", header.sequence, ", expected ", expected_sequence));
  }
  return header;
}

}  // namespace tributary::dataplane::tcp
