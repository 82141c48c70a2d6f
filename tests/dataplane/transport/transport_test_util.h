// Helpers shared by the transport tests: received-message inboxes and send completions that wait
// with deadlines, byte patterns, and loopback sockets that misbehave (a closed port, a listener
// that never answers).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dataplane/transport/transport.h"

namespace tributary::dataplane::transport_testing {

using namespace std::chrono_literals;

inline constexpr std::chrono::milliseconds kWait = 5s;  // Deadline for any single expected event.

inline std::vector<std::byte> Pattern(size_t size, uint32_t seed) {
  std::vector<std::byte> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = std::byte((i * 131 + seed * 7 + (i >> 12)) & 0xff);
  return bytes;
}

inline std::vector<std::byte> Bytes(const std::string& text) {
  std::vector<std::byte> bytes(text.size());
  std::memcpy(bytes.data(), text.data(), text.size());
  return bytes;
}

inline std::string Text(std::span<const std::byte> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// The port of an "ip:port" address.
inline uint16_t PortOf(const std::string& address) {
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

// Sends one message and waits for its completion.
inline absl::Status SendAndWait(Transport& from, const std::string& to,
                                std::span<const std::byte> header,
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

inline sockaddr_in Loopback(uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  return addr;
}

// A loopback port nobody listens on.
inline uint16_t ClosedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = Loopback(0);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// A loopback TCP listener that never accepts: the kernel completes the TCP handshake, but no
// transport-level answer ever comes, so sends to it stay pending.
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
  BlackHole(const BlackHole&) = delete;
  BlackHole& operator=(const BlackHole&) = delete;
  int fd() const { return fd_; }
  const std::string& address() const { return address_; }

 private:
  int fd_ = -1;
  std::string address_;
};

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

inline std::chrono::microseconds ProcessCpuTime() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto micros = [](const timeval& tv) {
    return std::chrono::seconds(tv.tv_sec) + std::chrono::microseconds(tv.tv_usec);
  };
  return micros(usage.ru_utime) + micros(usage.ru_stime);
}

}  // namespace tributary::dataplane::transport_testing
