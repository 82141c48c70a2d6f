#include "dataplane/transport/counting_transport.h"

#include <future>
#include <vector>

#include "dataplane/transport/inprocess/inprocess_transport.h"
#include "gtest/gtest.h"

namespace tributary::dataplane {
namespace {

TEST(CountingTransport, CountsHeaderAndPayloadBothWays) {
  InProcessNetwork network;
  CountingTransport a(network.CreateEndpoint("a"));
  CountingTransport b(network.CreateEndpoint("b"));
  std::promise<size_t> got;
  b.SetReceiveHandler([&](std::span<const std::byte> h, std::span<const std::byte> p) {
    got.set_value(h.size() + p.size());
  });
  a.SetReceiveHandler([](auto, auto) {});
  const std::vector<std::byte> header(12), payload(1000);
  std::promise<absl::Status> sent;
  a.Send("b", header, payload, [&](absl::Status s) { sent.set_value(s); });
  ASSERT_TRUE(sent.get_future().get().ok());
  EXPECT_EQ(got.get_future().get(), 1012u);
  EXPECT_EQ(a.bytes_sent(), 1012u);
  EXPECT_EQ(a.bytes_received(), 0u);
  EXPECT_EQ(b.bytes_received(), 1012u);
  EXPECT_EQ(b.bytes_sent(), 0u);
  EXPECT_EQ(a.Address(), "a");
  a.Shutdown();
  b.Shutdown();
}

}  // namespace
}  // namespace tributary::dataplane
