// The agent's buffer socket: how a training process hands the agent the shared memory of a
// buffer. The process creates a memfd, sizes it, seals its size (F_SEAL_SHRINK | F_SEAL_GROW)
// and sends it with one request on a SOCK_SEQPACKET Unix socket next to the agent's gRPC socket
// ("<socket path>.buffers"); the agent checks the sender's uid (SO_PEERCRED), the seals and the
// size, maps it and answers with the buffer's id. No name is ever opened, so nobody can make the
// agent map someone else's memory, and the sealed size means the mapping cannot shrink under the
// agent (no SIGBUS).
//
// Fixed-size messages, native byte order (same host), one request then one response at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tributary::common::buffer_socket {

inline constexpr uint32_t kRequestMagic = 0x42465254;   // "TRFB"
inline constexpr uint32_t kResponseMagic = 0x52465254;  // "TRFR"
inline constexpr uint16_t kVersion = 1;
inline constexpr uint16_t kRegisterBuffer = 1;

#pragma pack(push, 1)
struct Request {
  uint32_t magic = kRequestMagic;
  uint16_t version = kVersion;
  uint16_t kind = kRegisterBuffer;
  uint64_t size_bytes = 0;
  char session_id[104] = {};  // NUL-padded
};
struct Response {
  uint32_t magic = kResponseMagic;
  int32_t code = 0;  // absl::StatusCode
  uint64_t buffer_id = 0;
  char message[496] = {};  // NUL-padded
};
#pragma pack(pop)
static_assert(sizeof(Request) == 120);
static_assert(sizeof(Response) == 512);

// The buffer socket of the agent serving gRPC at `agent_socket_path`.
inline std::string PathFor(std::string_view agent_socket_path) {
  return std::string(agent_socket_path) + ".buffers";
}

}  // namespace tributary::common::buffer_socket
