// The Transport contract, checked for every real transport (UCX and TCP) with the same cases:
// messages of every size both ways and in send order, all-to-all, sends to self, concurrent
// senders, handlers that send, limits, bad addresses, dead and silent peers, reconnection, idle
// CPU and shutdown. Transport-specific behaviour (the TCP transport's hostile-input defences, its
// payload limit) is in tcp_transport_test.cc.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "dataplane/transport/tcp/tcp_transport.h"
#include "dataplane/transport/ucx/ucx_transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/dataplane/transport/transport_test_util.h"

namespace tributary::dataplane {
namespace {

using namespace transport_testing;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

struct UcxKind {
  using TransportType = UcxTransport;
  using Options = UcxTransportOptions;
  static constexpr const char* kName = "Ucx";
  static void SetUpEnvironment() {
    // Loopback over TCP only; overwrite=0 keeps what ctest or the user set.
    setenv("UCX_NET_DEVICES", "lo", 0);
    setenv("UCX_TLS", "tcp", 0);
  }
};

struct TcpKind {
  using TransportType = TcpTransport;
  using Options = TcpTransportOptions;
  static constexpr const char* kName = "Tcp";
  static void SetUpEnvironment() {}
};

template <typename Kind>
class TransportContractTest : public ::testing::Test {
 protected:
  using TransportType = typename Kind::TransportType;
  using Options = typename Kind::Options;

  static void SetUpTestSuite() { Kind::SetUpEnvironment(); }

  static std::unique_ptr<TransportType> Make(Options options = {}) {
    absl::StatusOr<std::unique_ptr<TransportType>> transport = TransportType::Create(options);
    EXPECT_TRUE(transport.ok()) << transport.status();
    return transport.ok() ? *std::move(transport) : nullptr;
  }
};

struct KindNames {
  template <typename Kind>
  static std::string GetName(int) {
    return Kind::kName;
  }
};

using Kinds = ::testing::Types<UcxKind, TcpKind>;
TYPED_TEST_SUITE(TransportContractTest, Kinds, KindNames);

TYPED_TEST(TransportContractTest, AddressNamesTheBoundPort) {
  auto transport = this->Make();
  ASSERT_NE(transport, nullptr);
  const std::string address = transport->Address();
  ASSERT_THAT(address, testing::StartsWith("127.0.0.1:"));
  EXPECT_NE(PortOf(address), 0);
}

TYPED_TEST(TransportContractTest, BusyPortFailsCreate) {
  auto first = this->Make();
  ASSERT_NE(first, nullptr);
  const std::string address = first->Address();
  typename TestFixture::Options options;
  options.port = PortOf(address);
  auto second = TestFixture::TransportType::Create(options);
  EXPECT_FALSE(second.ok());
}

TYPED_TEST(TransportContractTest, ExchangesMessagesOfEverySizeBothWays) {
  auto a = this->Make();
  auto b = this->Make();
  ASSERT_TRUE(a && b);
  Inbox a_inbox, b_inbox;
  StopOnExit stop{a.get(), b.get()};
  a->SetReceiveHandler(a_inbox.Handler());
  b->SetReceiveHandler(b_inbox.Handler());

  const std::vector<size_t> sizes = {0, 1, 4097, 1 << 20, 16 << 20};
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<std::byte> payload = Pattern(sizes[i], i);
    const std::vector<std::byte> header = Bytes("size=" + std::to_string(sizes[i]));
    ASSERT_TRUE(SendAndWait(*a, b->Address(), header, payload).ok()) << sizes[i];
    ASSERT_TRUE(SendAndWait(*b, a->Address(), header, payload).ok()) << sizes[i];
  }
  ASSERT_TRUE(a_inbox.WaitFor(sizes.size()));
  ASSERT_TRUE(b_inbox.WaitFor(sizes.size()));
  for (Inbox* inbox : {&a_inbox, &b_inbox}) {
    std::vector<Message> messages = inbox->Take();
    ASSERT_EQ(messages.size(), sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_EQ(Text(messages[i].header), "size=" + std::to_string(sizes[i]));
      EXPECT_TRUE(messages[i].payload == Pattern(sizes[i], i)) << "payload of size " << sizes[i];
    }
  }
}

TYPED_TEST(TransportContractTest, MixedSizesArriveInSendOrder) {
  // Large messages (UCX rendezvous, TCP multi-read) finish after small ones behind them;
  // delivery must still keep order.
  auto a = this->Make();
  auto b = this->Make();
  ASSERT_TRUE(a && b);
  Inbox inbox;
  b->SetReceiveHandler(inbox.Handler());
  const std::vector<size_t> sizes = {16 << 20, 1, 0, 1 << 20, 4097, 16 << 20, 3, 1 << 20, 1};
  std::vector<std::vector<std::byte>> payloads;
  for (size_t i = 0; i < sizes.size(); ++i) payloads.push_back(Pattern(sizes[i], i + 100));
  Completions completions;
  StopOnExit stop{a.get(), b.get()};
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<std::byte> header = Bytes(std::to_string(i));
    a->Send(b->Address(), header, payloads[i], completions.Callback());
  }
  ASSERT_TRUE(completions.WaitFor(sizes.size()));
  for (const absl::Status& status : completions.Statuses()) EXPECT_TRUE(status.ok()) << status;
  ASSERT_TRUE(inbox.WaitFor(sizes.size()));
  std::vector<Message> messages = inbox.Take();
  ASSERT_EQ(messages.size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(Text(messages[i].header), std::to_string(i));
    EXPECT_TRUE(messages[i].payload == payloads[i]) << "message " << i;
  }
}

TYPED_TEST(TransportContractTest, ThreeTransportsAllToAll) {
  std::vector<std::unique_ptr<typename TestFixture::TransportType>> nodes;
  std::vector<std::unique_ptr<Inbox>> inboxes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(this->Make());
    ASSERT_NE(nodes.back(), nullptr);
    inboxes.push_back(std::make_unique<Inbox>());
    nodes.back()->SetReceiveHandler(inboxes.back()->Handler());
  }
  const std::vector<size_t> sizes = {0, 1, 4097, 1 << 20};
  std::vector<std::vector<std::byte>> payloads;
  for (size_t s = 0; s < sizes.size(); ++s) payloads.push_back(Pattern(sizes[s], s));
  Completions completions;
  StopOnExit stop{nodes[0].get(), nodes[1].get(), nodes[2].get()};
  size_t sends = 0;
  for (int from = 0; from < 3; ++from) {
    for (int to = 0; to < 3; ++to) {
      if (from == to) continue;
      for (size_t s = 0; s < sizes.size(); ++s) {
        const std::vector<std::byte> header = Bytes(std::to_string(from) + "/" + std::to_string(s));
        nodes[from]->Send(nodes[to]->Address(), header, payloads[s], completions.Callback());
        ++sends;
      }
    }
  }
  ASSERT_TRUE(completions.WaitFor(sends));
  for (const absl::Status& status : completions.Statuses()) EXPECT_TRUE(status.ok()) << status;
  for (int to = 0; to < 3; ++to) {
    ASSERT_TRUE(inboxes[to]->WaitFor(2 * sizes.size()));
    std::map<std::string, std::vector<std::byte>> got;
    for (Message& message : inboxes[to]->Take()) {
      got[Text(message.header)] = std::move(message.payload);
    }
    EXPECT_EQ(got.size(), 2 * sizes.size());
    for (int from = 0; from < 3; ++from) {
      if (from == to) continue;
      for (size_t s = 0; s < sizes.size(); ++s) {
        const std::string key = std::to_string(from) + "/" + std::to_string(s);
        ASSERT_TRUE(got.contains(key)) << key;
        EXPECT_TRUE(got[key] == payloads[s]) << key;
      }
    }
  }
}

TYPED_TEST(TransportContractTest, SendsToSelfAreDelivered) {
  auto a = this->Make();
  ASSERT_NE(a, nullptr);
  Inbox inbox;
  StopOnExit stop{a.get()};
  a->SetReceiveHandler(inbox.Handler());
  const std::vector<std::byte> payload = Pattern(1 << 20, 9);
  ASSERT_TRUE(SendAndWait(*a, a->Address(), Bytes("self"), payload).ok());
  ASSERT_TRUE(inbox.WaitFor(1));
  std::vector<Message> messages = inbox.Take();
  EXPECT_EQ(Text(messages[0].header), "self");
  EXPECT_TRUE(messages[0].payload == payload);
}

TYPED_TEST(TransportContractTest, ConcurrentSendersDeliverEachMessageOnceInOrder) {
  auto a = this->Make();
  auto b = this->Make();
  ASSERT_TRUE(a && b);
  constexpr int kThreads = 2;
  constexpr int kPerThread = 2000;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<int>> received(kThreads);
  int total = 0;
  bool payload_ok = true;
  b->SetReceiveHandler([&](std::span<const std::byte> header, std::span<const std::byte> payload) {
    int thread, seq;
    std::memcpy(&thread, header.data(), sizeof(int));
    std::memcpy(&seq, header.data() + sizeof(int), sizeof(int));
    const std::vector<std::byte> expected = Pattern(payload.size(), seq);
    std::lock_guard lock(mu);
    payload_ok &= std::equal(payload.begin(), payload.end(), expected.begin(), expected.end());
    received[thread].push_back(seq);
    ++total;
    cv.notify_all();
  });
  // Every 250th message is 1 MiB (UCX rendezvous, many TCP reads), to mix paths in one stream.
  auto size_of = [](int seq) -> size_t { return seq % 250 == 0 ? (1 << 20) : seq % 300; };
  std::vector<std::vector<std::vector<std::byte>>> payloads(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) payloads[t].push_back(Pattern(size_of(i), i));
  }
  Completions completions;
  StopOnExit stop{a.get(), b.get()};
  std::vector<std::thread> senders;
  for (int t = 0; t < kThreads; ++t) {
    senders.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        std::byte header[2 * sizeof(int)];
        std::memcpy(header, &t, sizeof(int));
        std::memcpy(header + sizeof(int), &i, sizeof(int));
        a->Send(b->Address(), header, payloads[t][i], completions.Callback());
      }
    });
  }
  for (std::thread& sender : senders) sender.join();
  ASSERT_TRUE(completions.WaitFor(kThreads * kPerThread));
  for (const absl::Status& status : completions.Statuses()) ASSERT_TRUE(status.ok()) << status;
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, kWait, [&] { return total >= kThreads * kPerThread; }));
  EXPECT_EQ(total, kThreads * kPerThread);
  EXPECT_TRUE(payload_ok);
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(received[t].size(), static_cast<size_t>(kPerThread));
    for (int i = 0; i < kPerThread; ++i) ASSERT_EQ(received[t][i], i) << "thread " << t;
  }
}

TYPED_TEST(TransportContractTest, PingPongFromReceiveHandlers) {
  auto a = this->Make();
  auto b = this->Make();
  ASSERT_TRUE(a && b);
  constexpr int kRoundTrips = 100;
  const std::vector<std::byte> payload = Pattern(64, 1);
  std::promise<void> finished;
  std::atomic<int> a_received = 0;
  std::atomic<bool> all_ok = true;
  auto check = [&all_ok](absl::Status status) {
    if (!status.ok()) all_ok = false;
  };
  StopOnExit stop{a.get(), b.get()};
  const std::string a_address = a->Address();
  const std::string b_address = b->Address();
  // b echoes; a sends the next ping from its handler until kRoundTrips pongs came back.
  b->SetReceiveHandler([&](std::span<const std::byte> header, std::span<const std::byte>) {
    b->Send(a_address, header, payload, check);
  });
  a->SetReceiveHandler([&](std::span<const std::byte> header, std::span<const std::byte> data) {
    if (data.size() != payload.size()) all_ok = false;
    const int n = ++a_received;
    if (n == kRoundTrips) {
      finished.set_value();
      return;
    }
    a->Send(b_address, header, payload, check);
  });
  a->Send(b_address, Bytes("ping"), payload, check);
  ASSERT_EQ(finished.get_future().wait_for(kWait), std::future_status::ready);
  a->Shutdown();
  b->Shutdown();
  EXPECT_EQ(a_received.load(), kRoundTrips);  // Nothing duplicated, nothing more in flight.
  EXPECT_TRUE(all_ok);
}

TYPED_TEST(TransportContractTest, HeaderOverTheLimitIsInvalidArgument) {
  auto a = this->Make();
  auto b = this->Make();
  ASSERT_TRUE(a && b);
  const std::vector<std::byte> header(Transport::kMaxHeaderBytes + 1);
  absl::Status status = SendAndWait(*a, b->Address(), header, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  // The largest allowed header still goes through.
  Inbox inbox;
  StopOnExit stop{a.get(), b.get()};
  b->SetReceiveHandler(inbox.Handler());
  const std::vector<std::byte> max_header = Pattern(Transport::kMaxHeaderBytes, 3);
  ASSERT_TRUE(SendAndWait(*a, b->Address(), max_header, Pattern(10, 4)).ok());
  ASSERT_TRUE(inbox.WaitFor(1));
  EXPECT_TRUE(inbox.Take()[0].header == max_header);
}

TYPED_TEST(TransportContractTest, MalformedAddressIsInvalidArgument) {
  auto a = this->Make();
  ASSERT_NE(a, nullptr);
  for (const std::string address : {"nohost", "1.2.3:x", "", ":80", "1.2.3:80", "127.0.0.1:",
                                    "127.0.0.1:0", "127.0.0.1:70000", "localhost:80", "[::1:80"}) {
    absl::Status status = SendAndWait(*a, address, Bytes("h"), {}, 1s);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << address << ": " << status;
  }
}

TYPED_TEST(TransportContractTest, ClosedPortIsUnavailableWithinTheConnectTimeout) {
  typename TestFixture::Options options;
  options.connect_timeout = 2000ms;
  auto a = this->Make(options);
  ASSERT_NE(a, nullptr);
  const std::string peer = "127.0.0.1:" + std::to_string(ClosedPort());
  const Clock::time_point start = Clock::now();
  absl::Status status = SendAndWait(*a, peer, Bytes("h"), Pattern(10, 1), 3000ms);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr(peer));
  EXPECT_LT(Clock::now() - start, 2500ms);
}

TYPED_TEST(TransportContractTest, SilentPeerTimesOutAsUnavailable) {
  typename TestFixture::Options options;
  options.connect_timeout = 300ms;
  auto a = this->Make(options);
  ASSERT_NE(a, nullptr);
  BlackHole hole;
  const Clock::time_point start = Clock::now();
  absl::Status status = SendAndWait(*a, hole.address(), Bytes("h"), Pattern(10, 1), 3000ms);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr(hole.address()));
  EXPECT_THAT(status.message(), HasSubstr("timed out"));
  EXPECT_LT(Clock::now() - start, 2000ms);
}

TYPED_TEST(TransportContractTest, PeerShutdownMidStreamFailsSendsWithoutHanging) {
  auto a = this->Make();
  auto b = this->Make();
  ASSERT_TRUE(a && b);
  std::atomic<int> b_received = 0;
  std::promise<void> some_arrived;
  b->SetReceiveHandler([&](std::span<const std::byte>, std::span<const std::byte>) {
    if (++b_received == 3) some_arrived.set_value();
  });
  const std::string b_address = b->Address();
  const std::vector<std::byte> payload = Pattern(1 << 20, 5);

  // a streams with a window of 8 sends until one fails; b shuts down in the middle.
  std::mutex mu;
  std::condition_variable cv;
  int outstanding = 0;
  int sent = 0;
  std::vector<absl::Status> statuses;
  std::atomic<bool> failed = false;
  StopOnExit stop{a.get(), b.get()};
  std::thread sender([&] {
    const Clock::time_point deadline = Clock::now() + 3 * kWait;  // Bounds a failing test only.
    while (!failed && Clock::now() < deadline) {
      {
        std::unique_lock lock(mu);
        if (!cv.wait_until(lock, deadline, [&] { return outstanding < 8; })) break;
        ++outstanding;
        ++sent;
      }
      a->Send(b_address, Bytes("x"), payload, [&](absl::Status status) {
        std::lock_guard lock(mu);
        if (!status.ok()) failed = true;
        statuses.push_back(std::move(status));
        --outstanding;
        cv.notify_all();
      });
    }
  });
  EXPECT_EQ(some_arrived.get_future().wait_for(kWait), std::future_status::ready);
  b->Shutdown();
  sender.join();
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, kWait, [&] { return outstanding == 0; }))
        << outstanding << " sends never completed";
    EXPECT_TRUE(failed) << "no send failed after the peer shut down";
    EXPECT_EQ(statuses.size(), static_cast<size_t>(sent));
    for (const absl::Status& status : statuses) {
      EXPECT_TRUE(status.ok() || status.code() == absl::StatusCode::kUnavailable) << status;
      if (!status.ok()) {
        EXPECT_THAT(status.message(), HasSubstr(b_address));
      }
    }
  }
  // Once b is gone, a new send fails too (after reconnecting to a closed port).
  absl::Status after = SendAndWait(*a, b_address, Bytes("x"), Pattern(10, 1));
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable) << after;
}

TYPED_TEST(TransportContractTest, ReconnectsAfterThePeerComesBack) {
  auto a = this->Make();
  auto b = this->Make();
  ASSERT_TRUE(a && b);
  const std::string b_address = b->Address();
  ASSERT_TRUE(SendAndWait(*a, b_address, Bytes("1"), Pattern(10, 1)).ok());
  b.reset();
  // OK only means "sent from here": a send racing with a noticing the disconnect may still
  // complete OK, so keep sending (briefly) until the dead endpoint is detected.
  absl::Status failed;
  for (int i = 0; i < 1000 && failed.ok(); ++i) {
    failed = SendAndWait(*a, b_address, Bytes("2"), Pattern(10, 1));
  }
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  typename TestFixture::Options options;
  options.port = PortOf(b_address);
  auto revived = this->Make(options);
  ASSERT_NE(revived, nullptr);
  Inbox inbox;
  StopOnExit stop{a.get(), revived.get()};
  revived->SetReceiveHandler(inbox.Handler());
  ASSERT_TRUE(SendAndWait(*a, b_address, Bytes("3"), Pattern(10, 1)).ok());
  ASSERT_TRUE(inbox.WaitFor(1));
  EXPECT_EQ(Text(inbox.Take()[0].header), "3");
}

TYPED_TEST(TransportContractTest, IdleTransportUsesNoCpu) {
  auto a = this->Make();
  auto b = this->Make();
  ASSERT_TRUE(a && b);
  Inbox inbox;
  StopOnExit stop{a.get(), b.get()};
  b->SetReceiveHandler(inbox.Handler());
  ASSERT_TRUE(SendAndWait(*a, b->Address(), Bytes("warm"), Pattern(100, 1)).ok());
  ASSERT_TRUE(inbox.WaitFor(1));
  const std::chrono::microseconds before = ProcessCpuTime();
  std::this_thread::sleep_for(200ms);  // The measurement window itself, not a wait for state.
  const std::chrono::microseconds used = ProcessCpuTime() - before;
  EXPECT_LT(used, 20ms) << "two idle transports used " << used.count() << " us of CPU in 200 ms";
}

TYPED_TEST(TransportContractTest, ShutdownCancelsPendingSends) {
  auto a = this->Make();
  ASSERT_NE(a, nullptr);
  BlackHole hole;  // Connection setup never finishes, so the sends stay pending.
  Completions completions;
  const std::vector<std::byte> payload = Pattern(1000, 1);
  for (int i = 0; i < 5; ++i) a->Send(hole.address(), Bytes("h"), payload, completions.Callback());
  const Clock::time_point start = Clock::now();
  a->Shutdown();
  EXPECT_LT(Clock::now() - start, 3s);
  ASSERT_TRUE(completions.WaitFor(5, 0ms));  // Shutdown returned: every callback already ran.
  for (const absl::Status& status : completions.Statuses()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  }
  // After Shutdown, sends complete with CANCELLED at once; Shutdown is idempotent.
  absl::Status late = SendAndWait(*a, hole.address(), Bytes("h"), payload, 1s);
  EXPECT_EQ(late.code(), absl::StatusCode::kCancelled) << late;
  a->Shutdown();
}

}  // namespace
}  // namespace tributary::dataplane
