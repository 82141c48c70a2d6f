// Tensor fusion on the wire: a Transport decorator that packs small messages to one peer into
// one message while an earlier message to that peer is still being sent, and unpacks them on the
// other side (Nagle's rule, per peer). A training step submits dozens of small tensors (biases,
// norms) at once; their push/pull chunks, sums and ring sub-chunks to the same peer then share
// one transport message instead of paying one each, and every tensor keeps its own key, its own
// sum and its own completion -- no worker has to agree with another on what was fused.
//
// Rules: a message whose header and payload fit `max_record_bytes` is *small*. A small message
// to a peer with nothing in flight leaves at once (no delay when the link is idle); otherwise it
// joins that peer's pending bundle, which leaves when the peer's in-flight count drops to zero
// or the bundle reaches `max_bundle_bytes`. A large message first flushes the peer's pending
// bundle (messages to one peer stay in order). A bundle copies the small payloads it carries;
// their send callbacks run when the bundle's send completes, with its status.
//
// Both ends must use it: the receiving side recognises a bundle by its own header (magic
// "TRBN"), checks every record's lengths against the message, and hands each record to the
// handler as if it had arrived alone. A malformed bundle is dropped whole and counted.
//
// Threading: as Transport. One mutex guards the per-peer state; the inner transport and the
// callbacks are called outside it.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dataplane/transport/transport.h"

namespace tributary::dataplane {

struct BundlingOptions {
  // Messages up to this size (header + payload) may be bundled; 0 turns bundling off.
  size_t max_record_bytes = 64 << 10;
  // A pending bundle leaves once it holds this many bytes even with sends in flight.
  size_t max_bundle_bytes = 1 << 20;
};

struct BundlingStats {
  std::atomic<uint64_t> bundles_sent{0};      // bundles of two or more messages
  std::atomic<uint64_t> messages_bundled{0};  // messages that travelled in a bundle
  std::atomic<uint64_t> bundles_received{0};
  std::atomic<uint64_t> malformed_bundles{0};
};

class BundlingTransport final : public Transport {
 public:
  BundlingTransport(std::unique_ptr<Transport> inner, BundlingOptions options);
  ~BundlingTransport() override;

  std::string Address() const override { return inner_->Address(); }
  void SetReceiveHandler(ReceiveHandler handler) override;
  void Send(const std::string& peer_address, std::span<const std::byte> header,
            std::span<const std::byte> payload, SendCallback done) override;
  void SetPeerUnsentLimit(const std::string& peer_address, uint32_t bytes) override {
    inner_->SetPeerUnsentLimit(peer_address, bytes);
  }
  void SetPeerCongestionControl(const std::string& peer_address, const std::string& name) override {
    inner_->SetPeerCongestionControl(peer_address, name);
  }
  void Shutdown() override;

  const BundlingStats& stats() const { return stats_; }

 private:
  struct Bundle {
    std::vector<std::byte> bytes;  // the records
    std::vector<SendCallback> callbacks;
    uint32_t count = 0;
  };
  struct Peer {
    uint32_t in_flight = 0;  // messages handed to the inner transport, not completed
    std::unique_ptr<Bundle> pending;
  };
  // What to hand to the inner transport once mu_ is released.
  struct Outgoing {
    std::unique_ptr<Bundle> bundle;  // or:
    std::vector<std::byte> header;
    std::span<const std::byte> payload;
    SendCallback done;
  };

  // Takes the peer's pending bundle for sending (in_flight counted). mu_ held.
  void TakePendingLocked(Peer& peer, std::vector<Outgoing>& out);
  void SendAll(const std::string& peer_address, std::vector<Outgoing> out);
  void Completed(const std::string& peer_address);
  void Unpack(std::span<const std::byte> payload, uint32_t count);

  std::unique_ptr<Transport> inner_;
  const BundlingOptions options_;
  BundlingStats stats_;
  ReceiveHandler handler_;
  std::mutex mu_;
  std::map<std::string, Peer> peers_;  // Guarded by mu_.
  bool shut_down_ = false;             // Guarded by mu_.
};

}  // namespace tributary::dataplane
