// A Transport decorator that counts the bytes (header + payload) its node sends and receives, so
// that the agent can tell its own data-plane traffic apart from everything else on the NIC.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "dataplane/transport/transport.h"

namespace tributary::dataplane {

class CountingTransport : public Transport {
 public:
  explicit CountingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}

  std::string Address() const override { return inner_->Address(); }
  void SetReceiveHandler(ReceiveHandler handler) override {
    inner_->SetReceiveHandler(
        [this, handler = std::move(handler)](std::span<const std::byte> header,
                                             std::span<const std::byte> payload) {
          received_.fetch_add(header.size() + payload.size(), std::memory_order_relaxed);
          handler(header, payload);
        });
  }
  void Send(const std::string& peer_address, std::span<const std::byte> header,
            std::span<const std::byte> payload, SendCallback done) override {
    sent_.fetch_add(header.size() + payload.size(), std::memory_order_relaxed);
    inner_->Send(peer_address, header, payload, std::move(done));
  }
  void SetPeerUnsentLimit(const std::string& peer_address, uint32_t bytes) override {
    inner_->SetPeerUnsentLimit(peer_address, bytes);
  }
  void SetPeerCongestionControl(const std::string& peer_address, const std::string& name) override {
    inner_->SetPeerCongestionControl(peer_address, name);
  }
  void Shutdown() override { inner_->Shutdown(); }

  // Bytes handed to Send (whether or not they were delivered) and bytes received, since start.
  uint64_t bytes_sent() const { return sent_.load(std::memory_order_relaxed); }
  uint64_t bytes_received() const { return received_.load(std::memory_order_relaxed); }

 private:
  std::unique_ptr<Transport> inner_;
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> received_{0};
};

}  // namespace tributary::dataplane
