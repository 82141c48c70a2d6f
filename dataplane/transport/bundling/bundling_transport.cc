#include "dataplane/transport/bundling/bundling_transport.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace tributary::dataplane {
namespace {

constexpr auto Log = common::ComponentLog<"transport">;

#pragma pack(push, 1)
struct BundleHeader {
  static constexpr uint32_t kMagic = 0x4e425254;  // "TRBN"
  uint32_t magic = kMagic;
  uint32_t version = 1;
  uint32_t count = 0;  // records in the payload
  uint32_t reserved = 0;
};
// One record in the payload: this, the header, padding to 8, the payload, padding to 8.
struct RecordPrefix {
  uint32_t header_bytes = 0;
  uint32_t payload_bytes = 0;
};
#pragma pack(pop)

constexpr size_t Pad8(size_t n) { return (n + 7) & ~size_t{7}; }

size_t RecordBytes(size_t header, size_t payload) {
  return sizeof(RecordPrefix) + Pad8(header) + Pad8(payload);
}

void AppendRecord(std::vector<std::byte>& out, std::span<const std::byte> header,
                  std::span<const std::byte> payload) {
  const size_t at = out.size();
  out.resize(at + RecordBytes(header.size(), payload.size()));
  std::byte* p = out.data() + at;
  const RecordPrefix prefix{static_cast<uint32_t>(header.size()),
                            static_cast<uint32_t>(payload.size())};
  std::memcpy(p, &prefix, sizeof(prefix));
  p += sizeof(prefix);
  if (!header.empty()) std::memcpy(p, header.data(), header.size());
  p += Pad8(header.size());
  if (!payload.empty()) std::memcpy(p, payload.data(), payload.size());
}

}  // namespace

BundlingTransport::BundlingTransport(std::unique_ptr<Transport> inner, BundlingOptions options)
    : inner_(std::move(inner)), options_(options) {}

BundlingTransport::~BundlingTransport() { Shutdown(); }

void BundlingTransport::SetReceiveHandler(ReceiveHandler handler) {
  handler_ = std::move(handler);
  inner_->SetReceiveHandler(
      [this](std::span<const std::byte> header, std::span<const std::byte> payload) {
        BundleHeader b;
        if (header.size() == sizeof(BundleHeader)) std::memcpy(&b, header.data(), sizeof(b));
        if (header.size() == sizeof(BundleHeader) && b.magic == BundleHeader::kMagic) {
          if (b.version != 1) {
            stats_.malformed_bundles++;
            Log()->warn("bundle of version {} dropped (this node speaks version 1)", b.version);
            return;
          }
          Unpack(payload, b.count);
          return;
        }
        handler_(header, payload);
      });
}

void BundlingTransport::Unpack(std::span<const std::byte> payload, uint32_t count) {
  // Check the whole bundle before delivering any of it: all or nothing.
  size_t at = 0;
  for (uint32_t i = 0; i < count; ++i) {
    RecordPrefix r;
    if (payload.size() - at < sizeof(r)) {
      stats_.malformed_bundles++;
      Log()->warn("bundle of {} records truncated at record {}; dropped", count, i);
      return;
    }
    std::memcpy(&r, payload.data() + at, sizeof(r));
    if (r.header_bytes > kMaxHeaderBytes ||
        payload.size() - at - sizeof(r) <
            RecordBytes(r.header_bytes, r.payload_bytes) - sizeof(r)) {
      stats_.malformed_bundles++;
      Log()->warn("bundle record {} of {} claims {}+{} bytes beyond the message; dropped", i, count,
                  r.header_bytes, r.payload_bytes);
      return;
    }
    at += RecordBytes(r.header_bytes, r.payload_bytes);
  }
  if (at != payload.size()) {
    stats_.malformed_bundles++;
    Log()->warn("bundle of {} records has {} trailing bytes; dropped", count, payload.size() - at);
    return;
  }
  stats_.bundles_received++;
  at = 0;
  for (uint32_t i = 0; i < count; ++i) {
    RecordPrefix r;
    std::memcpy(&r, payload.data() + at, sizeof(r));
    const std::byte* p = payload.data() + at + sizeof(r);
    handler_({p, r.header_bytes}, {p + Pad8(r.header_bytes), r.payload_bytes});
    at += RecordBytes(r.header_bytes, r.payload_bytes);
  }
}

void BundlingTransport::TakePendingLocked(Peer& peer, std::vector<Outgoing>& out) {
  if (!peer.pending) return;
  peer.in_flight++;
  Outgoing o;
  o.bundle = std::move(peer.pending);
  out.push_back(std::move(o));
}

void BundlingTransport::Send(const std::string& peer_address, std::span<const std::byte> header,
                             std::span<const std::byte> payload, SendCallback done) {
  std::vector<Outgoing> out;
  bool shut_down;
  {
    std::lock_guard lock(mu_);
    shut_down = shut_down_;
    if (!shut_down) {
      Peer& peer = peers_[peer_address];
      const bool small = options_.max_record_bytes > 0 && header.size() <= kMaxHeaderBytes &&
                         header.size() + payload.size() <= options_.max_record_bytes;
      if (small && (peer.in_flight > 0 || peer.pending)) {
        if (!peer.pending) peer.pending = std::make_unique<Bundle>();
        AppendRecord(peer.pending->bytes, header, payload);
        peer.pending->callbacks.push_back(std::move(done));
        peer.pending->count++;
        if (peer.pending->bytes.size() >= options_.max_bundle_bytes) {
          TakePendingLocked(peer, out);
        }
      } else {
        TakePendingLocked(peer, out);  // what waited goes first
        peer.in_flight++;
        Outgoing o;
        o.header.assign(header.begin(), header.end());
        o.payload = payload;
        o.done = std::move(done);
        out.push_back(std::move(o));
      }
    }
  }
  if (shut_down) {  // the inner transport answers CANCELLED
    inner_->Send(peer_address, header, payload, std::move(done));
    return;
  }
  SendAll(peer_address, std::move(out));
}

void BundlingTransport::SendAll(const std::string& peer_address, std::vector<Outgoing> out) {
  for (Outgoing& o : out) {
    if (o.bundle) {
      auto bundle = std::shared_ptr<Bundle>(std::move(o.bundle));
      auto done = [this, peer_address, bundle](absl::Status s) {
        Completed(peer_address);
        for (auto& cb : bundle->callbacks) {
          if (cb) cb(s);
        }
      };
      if (bundle->count == 1) {
        // A bundle of one: send it as it was, unwrapped (its payload is copied already).
        RecordPrefix r;
        std::memcpy(&r, bundle->bytes.data(), sizeof(r));
        const std::byte* p = bundle->bytes.data() + sizeof(r);
        inner_->Send(peer_address, {p, r.header_bytes}, {p + Pad8(r.header_bytes), r.payload_bytes},
                     std::move(done));
        continue;
      }
      stats_.bundles_sent++;
      stats_.messages_bundled += bundle->count;
      BundleHeader h;
      h.count = bundle->count;
      inner_->Send(peer_address, {reinterpret_cast<const std::byte*>(&h), sizeof(h)}, bundle->bytes,
                   std::move(done));
    } else {
      inner_->Send(peer_address, o.header, o.payload,
                   [this, peer_address, done = std::move(o.done)](absl::Status s) {
                     Completed(peer_address);
                     if (done) done(s);
                   });
    }
  }
}

void BundlingTransport::Completed(const std::string& peer_address) {
  std::vector<Outgoing> out;
  {
    std::lock_guard lock(mu_);
    auto it = peers_.find(peer_address);
    if (it == peers_.end()) return;
    Peer& peer = it->second;
    if (peer.in_flight > 0) peer.in_flight--;
    if (peer.in_flight == 0 && !shut_down_) TakePendingLocked(peer, out);
  }
  SendAll(peer_address, std::move(out));
}

void BundlingTransport::Shutdown() {
  std::vector<std::unique_ptr<Bundle>> dropped;
  {
    std::lock_guard lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    for (auto& [addr, peer] : peers_) {
      if (peer.pending) dropped.push_back(std::move(peer.pending));
    }
  }
  inner_->Shutdown();
  for (auto& bundle : dropped) {
    for (auto& cb : bundle->callbacks) {
      if (cb) cb(absl::CancelledError("the transport shut down before the message was sent"));
    }
  }
}

}  // namespace tributary::dataplane
