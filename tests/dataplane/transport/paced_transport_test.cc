#include "dataplane/transport/paced/paced_transport.h"

#include <atomic>
#include <future>

#include "dataplane/transport/inprocess/inprocess_transport.h"
#include "gtest/gtest.h"

namespace tributary::dataplane {
namespace {

TEST(PacedTransport, DeliversEverythingInOrderAtTheLinkRate) {
  InProcessNetwork network;
  auto receiver = network.CreateEndpoint("r");
  PacedTransport sender(network.CreateEndpoint("s"), /*bytes_per_s=*/1e6);
  std::mutex mu;
  std::vector<uint8_t> order;
  std::promise<void> all;
  receiver->SetReceiveHandler([&](std::span<const std::byte> h, std::span<const std::byte> p) {
    std::lock_guard lock(mu);
    order.push_back(static_cast<uint8_t>(h[0]));
    EXPECT_EQ(p.size(), 10000u);
    if (order.size() == 20) all.set_value();
  });
  std::vector<std::byte> payload(10000);
  std::atomic<int> completed{0};
  const auto start = std::chrono::steady_clock::now();
  for (uint8_t i = 0; i < 20; ++i) {
    std::byte header[1] = {std::byte{i}};
    sender.Send("r", header, payload, [&](absl::Status s) {
      EXPECT_TRUE(s.ok());
      completed++;
    });
  }
  ASSERT_EQ(all.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  // 20 x 10 kB at 1 MB/s cannot arrive in less than 0.2 s (a lower bound: no timing flake).
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(195));
  std::vector<uint8_t> want(20);
  for (uint8_t i = 0; i < 20; ++i) want[i] = i;
  EXPECT_EQ(order, want);
  sender.Shutdown();
  receiver->Shutdown();
}

TEST(PacedTransport, ShutdownCancelsHeldMessages) {
  InProcessNetwork network;
  auto receiver = network.CreateEndpoint("r");
  PacedTransport sender(network.CreateEndpoint("s"), /*bytes_per_s=*/100);  // 100 s per message
  std::vector<std::byte> payload(10000);
  std::promise<absl::Status> result;
  sender.Send("r", {}, payload, [&](absl::Status s) { result.set_value(s); });
  sender.Shutdown();
  auto f = result.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(f.get().code(), absl::StatusCode::kCancelled);
  receiver->Shutdown();
}

}  // namespace
}  // namespace tributary::dataplane
