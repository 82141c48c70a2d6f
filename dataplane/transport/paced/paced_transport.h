// Emulates a NIC of a given speed on top of another transport by pacing its egress: each message
// leaves when the last of its bytes would have left a link of that rate. For local clusters on
// loopback, where every "NIC" is otherwise as fast as memcpy. Network-bound measurements belong to
// the emulated cluster (network namespaces with tc shaping); this is the root-free stand-in.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "dataplane/transport/transport.h"

namespace tributary::dataplane {

// Threading: Send may be called from any thread; a pacing thread hands held messages to the
// inner transport in departure order. Receive handlers run on the inner transport's thread.
class PacedTransport final : public Transport {
 public:
  // `bytes_per_s` > 0: the emulated link rate (header and payload bytes both count).
  PacedTransport(std::unique_ptr<Transport> inner, double bytes_per_s);
  ~PacedTransport() override;

  std::string Address() const override { return inner_->Address(); }
  void SetReceiveHandler(ReceiveHandler handler) override {
    inner_->SetReceiveHandler(std::move(handler));
  }
  void Send(const std::string& peer_address, std::span<const std::byte> header,
            std::span<const std::byte> payload, SendCallback done) override;
  void SetPeerUnsentLimit(const std::string& peer_address, uint32_t bytes) override {
    inner_->SetPeerUnsentLimit(peer_address, bytes);
  }
  void SetPeerCongestionControl(const std::string& peer_address, const std::string& name) override {
    inner_->SetPeerCongestionControl(peer_address, name);
  }
  void Shutdown() override;

 private:
  struct Held {
    std::chrono::steady_clock::time_point departure;
    uint64_t seq;
    std::string peer;
    std::vector<std::byte> header;
    std::span<const std::byte> payload;
    SendCallback done;
    bool operator>(const Held& o) const {
      return departure != o.departure ? departure > o.departure : seq > o.seq;
    }
  };
  void Run();

  std::unique_ptr<Transport> inner_;
  const double bytes_per_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Held, std::vector<Held>, std::greater<>> held_;
  std::chrono::steady_clock::time_point link_free_{};
  uint64_t seq_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tributary::dataplane
