// A Transport whose endpoints live in one process: N ranks as threads in unit tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "dataplane/transport/transport.h"

namespace tributary::dataplane {

class InProcessTransport;

// The "network" that in-process endpoints attach to. Thread-safe. Outlives its endpoints.
class InProcessNetwork {
 public:
  // Creates an endpoint reachable at `address` (must be unique within this network).
  std::unique_ptr<InProcessTransport> CreateEndpoint(const std::string& address);

  // Delivers raw bytes to `address` as if a peer had sent them (for malformed-input tests).
  void Inject(const std::string& address, std::span<const std::byte> header,
              std::span<const std::byte> payload);

  // While frozen, messages to `address` are held back (a hung peer); unfreezing delivers them.
  void SetFrozen(const std::string& address, bool frozen);
  // While cut, messages from `from` to `to` are lost, and their sends still succeed (a peer that
  // died after its sends were accepted, before they arrived).
  void SetCut(const std::string& from, const std::string& to, bool cut);

 private:
  friend class InProcessTransport;
  void Detach(const std::string& address);
  InProcessTransport* Find(const std::string& address);

  std::mutex mu_;
  std::map<std::string, InProcessTransport*> endpoints_;
  std::set<std::pair<std::string, std::string>> cut_;
};

// Copies every message at Send time and delivers it on the receiver's thread, in order per
// sender. Completions run on the sender's thread.
class InProcessTransport final : public Transport {
 public:
  ~InProcessTransport() override;

  std::string Address() const override { return address_; }
  void SetReceiveHandler(ReceiveHandler handler) override;
  void Send(const std::string& peer_address, std::span<const std::byte> header,
            std::span<const std::byte> payload, SendCallback done) override;
  void Shutdown() override;
  // Returns true once every task queued here before the call (deliveries to this endpoint and
  // completions of its sends) has run and been destroyed, or false after `timeout` (or when the
  // endpoint is shut down). Not from this endpoint's own thread. For tests that look at state a
  // completion releases.
  bool Flush(std::chrono::milliseconds timeout);

 private:
  friend class InProcessNetwork;
  InProcessTransport(InProcessNetwork* network, std::string address);
  void Post(std::function<void()> task);
  void Deliver(std::vector<std::byte> header, std::vector<std::byte> payload);
  void SetFrozen(bool frozen);
  void Run();

  InProcessNetwork* network_;
  const std::string address_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::deque<std::function<void()>> held_;  // deliveries held while frozen
  bool frozen_ = false;
  bool stopping_ = false;
  ReceiveHandler handler_;
  std::thread thread_;
};

}  // namespace tributary::dataplane
