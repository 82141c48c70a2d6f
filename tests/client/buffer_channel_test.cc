// The client's end of the agent's buffer socket (client/buffer_channel.h) against a listener
// that accepts nothing: an agent that stopped accepting is UNAVAILABLE at once, never a connect
// that blocks for good.
#include "client/buffer_channel.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "common/buffer_socket_protocol.h"
#include "common/unix_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tributary::client::internal {
namespace {

using ::testing::HasSubstr;

common::UniqueFd BoundSeqpacket(const std::string& path, sockaddr_un* address) {
  *address = sockaddr_un{};
  address->sun_family = AF_UNIX;
  std::strncpy(address->sun_path, path.c_str(), sizeof(address->sun_path) - 1);
  common::UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  EXPECT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(address), sizeof(*address)), 0);
  return fd;
}

TEST(BufferChannelTest, AnAgentWhoseBacklogIsFullIsUnavailableAtOnce) {
  const std::string agent = "/tmp/trib-bc-" + std::to_string(getpid()) + ".sock";
  const std::string buffers = common::buffer_socket::PathFor(agent);
  unlink(buffers.c_str());
  absl::Cleanup remove = [&] { unlink(buffers.c_str()); };
  sockaddr_un address;
  common::UniqueFd listener = BoundSeqpacket(buffers, &address);
  ASSERT_EQ(listen(listener.get(), 0), 0);  // room for one pending connection, never accepted
  common::UniqueFd pending(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  ASSERT_EQ(connect(pending.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);

  auto channel = BufferChannel::Connect("unix:" + agent);
  EXPECT_EQ(channel.status().code(), absl::StatusCode::kUnavailable) << channel.status();
  EXPECT_THAT(channel.status().message(), HasSubstr("backlog is full"));
}

}  // namespace
}  // namespace tributary::client::internal
