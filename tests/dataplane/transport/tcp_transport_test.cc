// TcpTransport: the Transport contract (the behaviours ucx_transport_test.cc checks for UCX), and
// hostile bytes over real sockets: after each, a real message between two transports still
// arrives intact and the counters say what was rejected.
#include "dataplane/transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "dataplane/transport/tcp/tcp_wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tributary::dataplane {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kWait = 5s;  // Deadline for any single expected event.

std::vector<std::byte> Pattern(size_t size, uint32_t seed) {
  std::vector<std::byte> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = std::byte((i * 131 + seed * 7 + (i >> 12)) & 0xff);
  return bytes;
}

std::vector<std::byte> Bytes(const std::string& text) {
  std::vector<std::byte> bytes(text.size());
  std::memcpy(bytes.data(), text.data(), text.size());
  return bytes;
}

std::string Text(std::span<const std::byte> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

uint16_t PortOf(const std::string& address) {
  return static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
}

struct Message {
  std::vector<std::byte> header;
  std::vector<std::byte> payload;
};

// Collects received messages; waits with deadlines.
class Inbox {
 public:
  Transport::ReceiveHandler Handler() {
    return [this](std::span<const std::byte> header, std::span<const std::byte> payload) {
      std::lock_guard lock(mu_);
      messages_.push_back({{header.begin(), header.end()}, {payload.begin(), payload.end()}});
      cv_.notify_all();
    };
  }

  bool WaitFor(size_t count, std::chrono::milliseconds timeout = kWait) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return messages_.size() >= count; });
  }

  std::vector<Message> Take() {
    std::lock_guard lock(mu_);
    return std::move(messages_);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Message> messages_;
};

// Counts completions and keeps their statuses.
class Completions {
 public:
  Transport::SendCallback Callback() {
    return [this](absl::Status status) {
      std::lock_guard lock(mu_);
      statuses_.push_back(std::move(status));
      cv_.notify_all();
    };
  }

  bool WaitFor(size_t count, std::chrono::milliseconds timeout = kWait) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return statuses_.size() >= count; });
  }

  std::vector<absl::Status> Statuses() {
    std::lock_guard lock(mu_);
    return statuses_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<absl::Status> statuses_;
};

absl::Status SendAndWait(Transport& from, const std::string& to, std::span<const std::byte> header,
                         std::span<const std::byte> payload,
                         std::chrono::milliseconds timeout = kWait) {
  auto done = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> result = done->get_future();
  from.Send(to, header, payload, [done](absl::Status status) { done->set_value(status); });
  if (result.wait_for(timeout) != std::future_status::ready) {
    return absl::DeadlineExceededError("send did not complete");
  }
  return result.get();
}

sockaddr_in Loopback(uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  return addr;
}

// A loopback port nobody listens on.
uint16_t ClosedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = Loopback(0);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// A loopback TCP listener that never accepts: the kernel completes the TCP handshake, but no
// handshake reply ever comes, so sends to it stay pending.
class BlackHole {
 public:
  BlackHole() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = Loopback(0);
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(fd_, 16);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    address_ = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  }
  ~BlackHole() { close(fd_); }
  int fd() const { return fd_; }
  const std::string& address() const { return address_; }

 private:
  int fd_ = -1;
  std::string address_;
};

// A blocking client socket for hostile input; every read has a deadline (SO_RCVTIMEO).
class RawClient {
 public:
  explicit RawClient(const std::string& address) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = Loopback(PortOf(address));
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    timeval timeout{.tv_sec = 5, .tv_usec = 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~RawClient() {
    if (fd_ >= 0) close(fd_);
  }
  bool connected() const { return connected_; }
  int fd() const { return fd_; }

  bool Write(std::span<const std::byte> bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }
  // Ends the stream (the server sees EOF) but keeps reading possible.
  void EndOutput() { shutdown(fd_, SHUT_WR); }

  // Reads exactly `size` bytes; empty on EOF, error or the 5 s deadline.
  std::vector<std::byte> Read(size_t size) {
    std::vector<std::byte> bytes(size);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = recv(fd_, bytes.data() + done, size - done, 0);
      if (n <= 0) return {};
      done += static_cast<size_t>(n);
    }
    return bytes;
  }

  // Sends a valid handshake and checks the reply.
  bool Handshake(const std::string& claimed = "127.0.0.1:9") {
    if (!Write(tcp::EncodeHello(claimed))) return false;
    const std::vector<std::byte> ack = Read(tcp::kAckBytes);
    return !ack.empty() && tcp::ParseAck(ack).ok();
  }

  // True once the server closed the connection (EOF or reset) within the 5 s deadline.
  bool WaitClosed() {
    std::byte scratch[4096];
    while (true) {
      const ssize_t n = recv(fd_, scratch, sizeof(scratch), 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET || errno == EPIPE;
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

std::vector<std::byte> Frame(uint32_t header_length, uint64_t payload_length, uint64_t sequence) {
  std::vector<std::byte> bytes(tcp::kFrameHeaderBytes);
  tcp::EncodeFrameHeader(
      {.header_length = header_length, .payload_length = payload_length, .sequence = sequence},
      bytes.data());
  return bytes;
}

std::vector<std::byte> Concat(std::initializer_list<std::vector<std::byte>> parts) {
  std::vector<std::byte> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

// Shuts the transports down when it goes out of scope. Declared after the state that handlers and
// completions use, so none of them runs on destroyed state, even when an ASSERT returns early.
class StopOnExit {
 public:
  StopOnExit(std::initializer_list<Transport*> transports) : transports_(transports) {}
  ~StopOnExit() {
    for (Transport* transport : transports_) {
      if (transport != nullptr) transport->Shutdown();
    }
  }

 private:
  std::vector<Transport*> transports_;
};

std::chrono::microseconds ProcessCpuTime() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto micros = [](const timeval& tv) {
    return std::chrono::seconds(tv.tv_sec) + std::chrono::microseconds(tv.tv_usec);
  };
  return micros(usage.ru_utime) + micros(usage.ru_stime);
}

std::unique_ptr<TcpTransport> Make(TcpTransportOptions options = {}) {
  absl::StatusOr<std::unique_ptr<TcpTransport>> transport = TcpTransport::Create(options);
  EXPECT_TRUE(transport.ok()) << transport.status();
  return transport.ok() ? *std::move(transport) : nullptr;
}

// --- The Transport contract (as ucx_transport_test.cc checks it for UCX). ---

TEST(TcpTransportTest, AddressNamesTheBoundPort) {
  auto transport = Make();
  ASSERT_NE(transport, nullptr);
  const std::string address = transport->Address();
  ASSERT_THAT(address, testing::StartsWith("127.0.0.1:"));
  EXPECT_NE(PortOf(address), 0);
}

TEST(TcpTransportTest, BusyPortFailsCreateAsUnavailable) {
  auto first = Make();
  ASSERT_NE(first, nullptr);
  TcpTransportOptions options;
  options.port = PortOf(first->Address());
  absl::StatusOr<std::unique_ptr<TcpTransport>> second = TcpTransport::Create(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr(std::to_string(options.port)));
}

TEST(TcpTransportTest, BadOptionsAreInvalidArgument) {
  TcpTransportOptions options;
  options.listen_host = "no such host.invalid";
  EXPECT_EQ(TcpTransport::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.max_half_open_connections = 0;
  EXPECT_EQ(TcpTransport::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TcpTransportTest, ExchangesMessagesOfEverySizeBothWays) {
  auto a = Make();
  auto b = Make();
  ASSERT_TRUE(a && b);
  Inbox a_inbox, b_inbox;
  StopOnExit stop{a.get(), b.get()};
  a->SetReceiveHandler(a_inbox.Handler());
  b->SetReceiveHandler(b_inbox.Handler());

  const std::vector<size_t> sizes = {0, 1, 4097, 1 << 20, 16 << 20};
  std::vector<std::vector<std::byte>> payloads;
  for (size_t i = 0; i < sizes.size(); ++i) payloads.push_back(Pattern(sizes[i], i));
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<std::byte> header = Bytes("size=" + std::to_string(sizes[i]));
    ASSERT_TRUE(SendAndWait(*a, b->Address(), header, payloads[i]).ok()) << sizes[i];
    ASSERT_TRUE(SendAndWait(*b, a->Address(), header, payloads[i]).ok()) << sizes[i];
  }
  ASSERT_TRUE(a_inbox.WaitFor(sizes.size()));
  ASSERT_TRUE(b_inbox.WaitFor(sizes.size()));
  for (Inbox* inbox : {&a_inbox, &b_inbox}) {
    std::vector<Message> messages = inbox->Take();
    ASSERT_EQ(messages.size(), sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_EQ(Text(messages[i].header), "size=" + std::to_string(sizes[i]));
      EXPECT_TRUE(messages[i].payload == payloads[i]) << "payload of size " << sizes[i];
    }
  }
  EXPECT_EQ(a->protocol_errors() + b->protocol_errors(), 0u);
  EXPECT_EQ(a->rejected_connections() + b->rejected_connections(), 0u);
  EXPECT_EQ(a->accepted_connections(), 1u);  // One connection per direction, reused.
  EXPECT_EQ(b->accepted_connections(), 1u);
}

TEST(TcpTransportTest, SixtyFourMebibyteMessageArrivesIntact) {
  auto a = Make();
  auto b = Make();
  ASSERT_TRUE(a && b);
  std::promise<bool> intact;
  const std::vector<std::byte> payload = Pattern(64 << 20, 64);
  b->SetReceiveHandler([&](std::span<const std::byte> header, std::span<const std::byte> data) {
    intact.set_value(Text(header) == "big" &&
                     std::equal(data.begin(), data.end(), payload.begin(), payload.end()));
  });
  StopOnExit stop{a.get(), b.get()};
  ASSERT_TRUE(SendAndWait(*a, b->Address(), Bytes("big"), payload).ok());
  std::future<bool> result = intact.get_future();
  ASSERT_EQ(result.wait_for(kWait), std::future_status::ready);
  EXPECT_TRUE(result.get());
}

TEST(TcpTransportTest, MixedSizesArriveInSendOrder) {
  auto a = Make();
  auto b = Make();
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

TEST(TcpTransportTest, ThreeTransportsAllToAll) {
  std::vector<std::unique_ptr<TcpTransport>> nodes;
  std::vector<std::unique_ptr<Inbox>> inboxes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(Make());
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

TEST(TcpTransportTest, SendsToSelfAreDelivered) {
  auto a = Make();
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

TEST(TcpTransportTest, ConcurrentSendersDeliverEachMessageOnceInOrder) {
  auto a = Make();
  auto b = Make();
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
  // Every 250th message spans many reads, to mix buffered and direct receives in one stream.
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

TEST(TcpTransportTest, PingPongFromReceiveHandlers) {
  auto a = Make();
  auto b = Make();
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

TEST(TcpTransportTest, HeaderOverTheLimitIsInvalidArgument) {
  auto a = Make();
  auto b = Make();
  ASSERT_TRUE(a && b);
  const std::vector<std::byte> header(Transport::kMaxHeaderBytes + 1);
  absl::Status status = SendAndWait(*a, b->Address(), header, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  Inbox inbox;
  StopOnExit stop{a.get(), b.get()};
  b->SetReceiveHandler(inbox.Handler());
  const std::vector<std::byte> max_header = Pattern(Transport::kMaxHeaderBytes, 3);
  ASSERT_TRUE(SendAndWait(*a, b->Address(), max_header, Pattern(10, 4)).ok());
  ASSERT_TRUE(inbox.WaitFor(1));
  EXPECT_TRUE(inbox.Take()[0].header == max_header);
}

TEST(TcpTransportTest, PayloadOverTheLimitIsInvalidArgument) {
  TcpTransportOptions options;
  options.max_payload_bytes = 1000;
  auto a = Make(options);
  auto b = Make(options);
  ASSERT_TRUE(a && b);
  Inbox inbox;
  StopOnExit stop{a.get(), b.get()};
  b->SetReceiveHandler(inbox.Handler());
  absl::Status status = SendAndWait(*a, b->Address(), Bytes("h"), Pattern(1001, 1));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("1000"));
  ASSERT_TRUE(SendAndWait(*a, b->Address(), Bytes("h"), Pattern(1000, 1)).ok());
  ASSERT_TRUE(inbox.WaitFor(1));
  EXPECT_TRUE(inbox.Take()[0].payload == Pattern(1000, 1));
}

TEST(TcpTransportTest, MalformedAddressIsInvalidArgument) {
  auto a = Make();
  ASSERT_NE(a, nullptr);
  for (const std::string address : {"nohost", "1.2.3:x", "", ":80", "1.2.3:80", "127.0.0.1:",
                                    "127.0.0.1:0", "127.0.0.1:70000", "localhost:80", "[::1:80"}) {
    absl::Status status = SendAndWait(*a, address, Bytes("h"), {}, 1s);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << address << ": " << status;
  }
}

TEST(TcpTransportTest, ClosedPortIsUnavailableWithinTheConnectTimeout) {
  TcpTransportOptions options;
  options.connect_timeout = 2000ms;
  auto a = Make(options);
  ASSERT_NE(a, nullptr);
  const std::string peer = "127.0.0.1:" + std::to_string(ClosedPort());
  const Clock::time_point start = Clock::now();
  absl::Status status = SendAndWait(*a, peer, Bytes("h"), Pattern(10, 1), 3000ms);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr(peer));
  EXPECT_LT(Clock::now() - start, 2500ms);
}

TEST(TcpTransportTest, SilentPeerTimesOutAsUnavailable) {
  TcpTransportOptions options;
  options.connect_timeout = 300ms;
  auto a = Make(options);
  ASSERT_NE(a, nullptr);
  BlackHole hole;
  const Clock::time_point start = Clock::now();
  absl::Status status = SendAndWait(*a, hole.address(), Bytes("h"), Pattern(10, 1), 3000ms);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr(hole.address()));
  EXPECT_THAT(status.message(), HasSubstr("timed out"));
  EXPECT_LT(Clock::now() - start, 2000ms);
}

TEST(TcpTransportTest, PeerShutdownMidStreamFailsSendsWithoutHanging) {
  auto a = Make();
  auto b = Make();
  ASSERT_TRUE(a && b);
  std::atomic<int> b_received = 0;
  std::promise<void> some_arrived;
  b->SetReceiveHandler([&](std::span<const std::byte>, std::span<const std::byte>) {
    if (++b_received == 3) some_arrived.set_value();
  });
  const std::string b_address = b->Address();
  const std::vector<std::byte> payload = Pattern(1 << 20, 5);

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
  absl::Status after = SendAndWait(*a, b_address, Bytes("x"), Pattern(10, 1));
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable) << after;
}

TEST(TcpTransportTest, ReconnectsAfterThePeerComesBackOnItsPort) {
  auto a = Make();
  auto b = Make();
  ASSERT_TRUE(a && b);
  const std::string b_address = b->Address();
  ASSERT_TRUE(SendAndWait(*a, b_address, Bytes("1"), Pattern(10, 1)).ok());
  b.reset();  // b closes its side first: its port has connections in TIME_WAIT.
  absl::Status failed;
  for (int i = 0; i < 1000 && failed.ok(); ++i) {
    failed = SendAndWait(*a, b_address, Bytes("2"), Pattern(10, 1));
  }
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  TcpTransportOptions options;
  options.port = PortOf(b_address);
  auto revived = Make(options);  // SO_REUSEADDR: TIME_WAIT does not block the restart.
  ASSERT_NE(revived, nullptr);
  Inbox inbox;
  StopOnExit stop{a.get(), revived.get()};
  revived->SetReceiveHandler(inbox.Handler());
  ASSERT_TRUE(SendAndWait(*a, b_address, Bytes("3"), Pattern(10, 1)).ok());
  ASSERT_TRUE(inbox.WaitFor(1));
  EXPECT_EQ(Text(inbox.Take()[0].header), "3");
}

TEST(TcpTransportTest, IdleTransportUsesNoCpu) {
  auto a = Make();
  auto b = Make();
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

TEST(TcpTransportTest, ShutdownCancelsPendingSends) {
  auto a = Make();
  ASSERT_NE(a, nullptr);
  BlackHole hole;  // The handshake reply never comes, so the sends stay pending.
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
  absl::Status late = SendAndWait(*a, hole.address(), Bytes("h"), payload, 1s);
  EXPECT_EQ(late.code(), absl::StatusCode::kCancelled) << late;
  a->Shutdown();
}

TEST(TcpTransportTest, ListenerThatRepliesGarbageFailsTheSendAndCountsIt) {
  auto a = Make();
  ASSERT_NE(a, nullptr);
  BlackHole evil;
  Completions completions;
  StopOnExit stop{a.get()};
  const std::vector<std::byte> payload = Pattern(10, 1);
  a->Send(evil.address(), Bytes("h"), payload, completions.Callback());
  const int fd = accept(evil.fd(), nullptr, nullptr);
  ASSERT_GE(fd, 0);
  const std::vector<std::byte> garbage(tcp::kAckBytes, std::byte{0xff});
  ASSERT_EQ(send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL), 10);
  ASSERT_TRUE(completions.WaitFor(1));
  const absl::Status status = completions.Statuses()[0];
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr(evil.address()));
  EXPECT_THAT(status.message(), HasSubstr("handshake reply"));
  EXPECT_EQ(a->protocol_errors(), 1u);
  close(fd);
}

// --- Hostile input on the listening port, over real sockets. ---

class TcpHostileInputTest : public ::testing::Test {
 protected:
  void Start(TcpTransportOptions options = {}) {
    target_ = Make(options);
    sender_ = Make();
    ASSERT_TRUE(target_ && sender_);
    target_->SetReceiveHandler(inbox_.Handler());
  }

  void TearDown() override {
    if (sender_) sender_->Shutdown();
    if (target_) target_->Shutdown();
  }

  // A real message from another transport still arrives intact.
  void ExpectHealthy() {
    const std::vector<std::byte> payload = Pattern(100 << 10, ++healthy_checks_);
    const std::vector<std::byte> header = Bytes("healthy " + std::to_string(healthy_checks_));
    ASSERT_TRUE(SendAndWait(*sender_, target_->Address(), header, payload).ok());
    ASSERT_TRUE(inbox_.WaitFor(1));
    std::vector<Message> messages = inbox_.Take();
    ASSERT_EQ(messages.size(), 1u);
    EXPECT_EQ(Text(messages[0].header), Text(header));
    EXPECT_TRUE(messages[0].payload == payload);
  }

  // Sends `bytes` on a fresh connection (after a valid handshake when asked), ends the stream
  // and waits for the target to close the connection.
  void SendAndExpectClosed(std::span<const std::byte> bytes, bool handshake = false) {
    RawClient client(target_->Address());
    ASSERT_TRUE(client.connected());
    if (handshake) ASSERT_TRUE(client.Handshake());
    client.Write(bytes);  // The target may close before it has read everything.
    client.EndOutput();
    ASSERT_TRUE(client.WaitClosed()) << "the target did not close the connection";
  }

  std::unique_ptr<TcpTransport> target_;
  std::unique_ptr<TcpTransport> sender_;
  Inbox inbox_;
  uint32_t healthy_checks_ = 0;
};

TEST_F(TcpHostileInputTest, SixteenBytesOfFfAreRejected) {
  Start();
  RawClient client(target_->Address());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.Write(std::vector<std::byte>(16, std::byte{0xff})));
  // No EndOutput: the target must close on the bad magic alone.
  ASSERT_TRUE(client.WaitClosed());
  EXPECT_EQ(target_->rejected_connections(), 1u);
  EXPECT_EQ(target_->protocol_errors(), 0u);
  ExpectHealthy();
}

TEST_F(TcpHostileInputTest, ZerosTextAndBadHandshakesAreRejected) {
  Start();
  std::vector<std::vector<std::byte>> inputs = {
      std::vector<std::byte>(4096, std::byte{0}),
      Bytes("GET / HTTP/1.1\r\nHost: agent\r\n\r\n"),
      Bytes("SSH-2.0-OpenSSH_9.2\r\n"),
  };
  std::vector<std::byte> wrong_version = tcp::EncodeHello("127.0.0.1:9");
  wrong_version[8] = std::byte{2};
  inputs.push_back(wrong_version);
  std::vector<std::byte> long_address = tcp::EncodeHello("127.0.0.1:9");
  long_address[10] = std::byte{0xff};  // Announces 255 bytes of address.
  inputs.push_back(long_address);
  inputs.push_back(tcp::EncodeHello("localhost:80"));  // Not numeric.
  inputs.push_back(tcp::EncodeHello("127.0.0.1:0"));
  std::vector<std::byte> control = tcp::EncodeHello("127.0.0.1:99");
  control.back() = std::byte{0};  // A NUL inside the address.
  inputs.push_back(control);
  const std::vector<std::byte> hello = tcp::EncodeHello("127.0.0.1:9");
  inputs.push_back({hello.begin(), hello.begin() + 6});  // Truncated handshake.
  for (size_t i = 0; i < inputs.size(); ++i) {
    SCOPED_TRACE(i);
    SendAndExpectClosed(inputs[i]);
    EXPECT_EQ(target_->rejected_connections(), i + 1);
    ExpectHealthy();
  }
  EXPECT_EQ(target_->protocol_errors(), 0u);
  EXPECT_EQ(target_->accepted_connections(), 1u);  // The sender's, reused by every check.
}

TEST_F(TcpHostileInputTest, FramesAfterAValidHandshakeAreValidated) {
  Start();
  const std::vector<std::byte> empty_frame = Frame(0, 0, 0);
  std::vector<std::byte> bad_version = empty_frame;
  bad_version[3] = std::byte{9};
  const std::vector<std::vector<std::byte>> inputs = {
      Bytes("garbage after a valid handshake"),
      Frame(0, uint64_t{1} << 40, 0),               // 2^40 bytes announced
      Frame(Transport::kMaxHeaderBytes + 1, 0, 0),  // header over the limit
      Frame(0, 0, 5),                               // wrong sequence
      bad_version,
      {empty_frame.begin(), empty_frame.begin() + 10},                   // truncated frame header
      Concat({Frame(4, 1000, 0), Bytes("head"), Pattern(500, 1)}),       // truncated payload
      Concat({Frame(4, 1 << 20, 0), Bytes("head"), Pattern(70000, 1)}),  // truncated, direct read
      Concat({Frame(2, 0, 0), Bytes("ok"), Frame(0, 0, 0)}),             // sequence repeated
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    SCOPED_TRACE(i);
    SendAndExpectClosed(inputs[i], /*handshake=*/true);
    EXPECT_EQ(target_->protocol_errors(), i + 1);
    if (i + 1 == inputs.size()) {
      // The valid frame before the violation was delivered, and only it.
      ASSERT_TRUE(inbox_.WaitFor(1));
      std::vector<Message> messages = inbox_.Take();
      ASSERT_EQ(messages.size(), 1u);
      EXPECT_EQ(Text(messages[0].header), "ok");
    }
    ExpectHealthy();  // Also: nothing else reached the handler.
  }
  EXPECT_EQ(target_->rejected_connections(), 0u);
}

TEST_F(TcpHostileInputTest, ValidFramesFromARawClientAreDelivered) {
  // The positive control for the tests above: the raw encoder speaks the protocol.
  Start();
  RawClient client(target_->Address());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.Handshake());
  const std::vector<std::byte> payload = Pattern(300000, 7);
  ASSERT_TRUE(client.Write(Concat({Frame(3, 5, 0), Bytes("one"), Pattern(5, 1),
                                   Frame(3, payload.size(), 1), Bytes("two"), payload})));
  ASSERT_TRUE(inbox_.WaitFor(2));
  std::vector<Message> messages = inbox_.Take();
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(Text(messages[0].header), "one");
  EXPECT_TRUE(messages[0].payload == Pattern(5, 1));
  EXPECT_EQ(Text(messages[1].header), "two");
  EXPECT_TRUE(messages[1].payload == payload);
  client.EndOutput();
  ASSERT_TRUE(client.WaitClosed());
  EXPECT_EQ(target_->protocol_errors(), 0u);
  EXPECT_EQ(target_->rejected_connections(), 0u);
}

TEST_F(TcpHostileInputTest, SlowHandshakeIsClosedAtItsDeadline) {
  TcpTransportOptions options;
  options.handshake_timeout = 200ms;
  Start(options);
  const Clock::time_point start = Clock::now();
  RawClient client(target_->Address());
  ASSERT_TRUE(client.connected());
  const std::vector<std::byte> hello = tcp::EncodeHello("127.0.0.1:9");
  ASSERT_TRUE(client.Write(std::span(hello).first(5)));
  ASSERT_TRUE(client.WaitClosed());  // Never finishes the handshake; waits on the target.
  EXPECT_GE(Clock::now() - start, 200ms);
  EXPECT_EQ(target_->rejected_connections(), 1u);
  ExpectHealthy();
}

TEST_F(TcpHostileInputTest, HundredsOfHeldConnectionsDoNotLockOutPeers) {
  TcpTransportOptions options;
  options.max_half_open_connections = 16;
  options.handshake_timeout = 60s;  // Only the cap closes connections here.
  Start(options);
  constexpr int kHeld = 300;
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < kHeld; ++i) {
    held.push_back(std::make_unique<RawClient>(target_->Address()));
    ASSERT_TRUE(held.back()->connected()) << i;
  }
  // The target keeps the newest 16 and closes the others: wait (poll, with a deadline) until
  // the clients see those closes.
  const Clock::time_point deadline = Clock::now() + kWait;
  int closed = 0;
  while (closed < kHeld - 16 && Clock::now() < deadline) {
    std::vector<pollfd> fds;
    for (const auto& client : held) fds.push_back({.fd = client->fd(), .events = POLLIN});
    ASSERT_GE(poll(fds.data(), fds.size(), 100), 0);
    closed = 0;
    for (const pollfd& fd : fds) closed += (fd.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
  }
  EXPECT_EQ(closed, kHeld - 16);
  EXPECT_EQ(target_->rejected_connections(), static_cast<uint64_t>(kHeld - 16));
  ExpectHealthy();
  EXPECT_EQ(target_->protocol_errors(), 0u);
}

TEST_F(TcpHostileInputTest, RandomBytesWithAndWithoutAValidHandshake) {
  Start();
  std::mt19937_64 random(20261123);
  constexpr int kStrings = 3000;
  uint64_t expect_rejected = 0;
  uint64_t expect_errors = 0;
  for (int i = 0; i < kStrings; ++i) {
    SCOPED_TRACE(i);
    const bool handshake = random() % 2 == 0;
    // Mostly short strings; some longer than the read buffer's first chunk.
    const size_t length = 1 + (random() % 8 == 0 ? random() % 8192 : random() % 64);
    std::vector<std::byte> bytes(length);
    for (std::byte& b : bytes) b = std::byte(random() & 0xff);
    // Keep a few strings close to valid: a correct frame magic and version in front.
    if (handshake && length >= 4 && random() % 4 == 0) {
      const std::vector<std::byte> frame = Frame(0, 0, 0);
      std::copy(frame.begin(), frame.begin() + 4, bytes.begin());
    }
    SendAndExpectClosed(bytes, handshake);
    if (::testing::Test::HasFatalFailure()) return;
    (handshake ? expect_errors : expect_rejected) += 1;
    if (i % 500 == 499) ExpectHealthy();
  }
  EXPECT_EQ(target_->rejected_connections(), expect_rejected);
  EXPECT_EQ(target_->protocol_errors(), expect_errors);
  EXPECT_EQ(target_->accepted_connections(), expect_errors + 1);  // + the sender's
  ExpectHealthy();
}

// The decoders alone: random headers never pass unless they are valid.
TEST(TcpWireTest, RandomFrameHeadersAndHellosAreRejected) {
  std::mt19937_64 random(7);
  for (int i = 0; i < 100000; ++i) {
    std::byte bytes[tcp::kHelloFixedBytes + tcp::kMaxAddressBytes];
    for (std::byte& b : bytes) b = std::byte(random() & 0xff);
    EXPECT_FALSE(tcp::ParseFrameHeader(std::span(bytes, tcp::kFrameHeaderBytes), 1 << 30, 0).ok());
    EXPECT_FALSE(tcp::ParseHelloFixed(std::span(bytes, tcp::kHelloFixedBytes)).ok());
    EXPECT_FALSE(tcp::ParseHelloAddress(std::span(bytes, 1 + random() % 64)).ok());
  }
  const std::vector<std::byte> frame = Frame(7, 99, 3);
  absl::StatusOr<tcp::FrameHeader> parsed = tcp::ParseFrameHeader(frame, 99, 3);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->header_length, 7u);
  EXPECT_EQ(parsed->payload_length, 99u);
  EXPECT_FALSE(tcp::ParseFrameHeader(frame, 98, 3).ok());
  EXPECT_FALSE(tcp::ParseFrameHeader(frame, 99, 4).ok());
}

}  // namespace
}  // namespace tributary::dataplane
