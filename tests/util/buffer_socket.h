// The agent's buffer socket for tests that serve a LocalService over their own gRPC server:
// processes register their memfds through it, as with a real agent (agent/buffer_socket.h).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "agent/buffer_socket.h"
#include "agent/local_service.h"
#include "common/buffer_socket_protocol.h"
#include "gtest/gtest.h"

namespace tributary::testing {

// Serves `service`'s buffers beside the gRPC socket at `socket_path` until the result is reset.
inline std::unique_ptr<agent::BufferSocketServer> ServeBuffers(agent::LocalService& service,
                                                               const std::string& socket_path) {
  auto server = agent::BufferSocketServer::Start(
      common::buffer_socket::PathFor(socket_path), {},
      [&service](const common::PeerCredentials& peer, const std::string& session, uint64_t size,
                 common::UniqueFd fd) {
        return service.RegisterBuffer(peer, session, size, std::move(fd));
      });
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

}  // namespace tributary::testing
