// Job membership on the data plane: a Transport decorator that signs every outgoing message with
// its job's secret and drops every incoming message that does not prove membership of its job.
//
// The controller issues each job a random secret and hands it, with the plan, only to the job's
// nodes. Every data-plane message is one WireHeader (+ payload); the header names its job, and
// its `mac` field carries HMAC-SHA256(secret, header with `mac` zeroed), truncated to 16 bytes.
// The header holds the job, tensor, iteration, epoch (plan version), sender, chunk and lengths,
// so a peer that does not know the secret can neither forge a message nor move a captured one to
// another job, epoch, chunk or length; its bytes are dropped and counted, never summed.
//
// Incarnations: every signed header is stamped with this agent process's instance tag
// (SetInstance; WireHeader::sender_instance, under the MAC). A job whose plan names its nodes'
// instances (SetJobSecret's `instances`) accepts only messages stamped with one of them (or 0,
// an unstamped sender): a restarted agent's previous process, frozen and resumed, cannot feed
// the job's sums; such messages are dropped and counted (old_instance). A message of a newer
// epoch than that plan passes (a node this one has no plan for yet may be in the newer plan;
// dropping its messages split a collective's verdict in chaos spare-freeze trials).
//
// What it does not do: the payload is not covered (an HMAC over every tensor byte would cost more
// than the transfer) and nothing is encrypted. Against an attacker on the path (who can rewrite
// bytes in flight) run the data plane over an encrypted network (IPsec, WireGuard); this layer
// keeps out the much more common stranger who can merely reach a port.
//
// Messages for a job whose secret is not known yet (a peer got the plan first) are parked --
// bounded in bytes, and for `park_timeout` -- and checked when the secret arrives
// (SetJobSecret); a message that cannot be parked or expires is dropped and counted. Sends for a
// job without a secret fail with FAILED_PRECONDITION, never go out unsigned.
//
// Threading: as Transport. One mutex guards the secrets and the park; the inner transport and
// the handler are called outside it. Parked messages are delivered from SetJobSecret's thread.
#pragma once

#include <openssl/sha.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "dataplane/collectives/wire.h"
#include "dataplane/transport/transport.h"

namespace tributary::dataplane {

struct MessageAuthOptions {
  size_t max_parked_bytes = 64 << 20;
  std::chrono::milliseconds park_timeout{30000};
};

struct MessageAuthStats {
  std::atomic<uint64_t> signed_messages{0};
  std::atomic<uint64_t> verified_messages{0};
  std::atomic<uint64_t> bad_mac{0};         // wrong secret: dropped
  std::atomic<uint64_t> malformed{0};       // not a WireHeader at all: dropped
  std::atomic<uint64_t> parked{0};          // job's secret unknown on arrival
  std::atomic<uint64_t> park_dropped{0};    // park full, or expired before the secret came
  std::atomic<uint64_t> unsigned_sends{0};  // sends refused: no secret for the job
  std::atomic<uint64_t> old_instance{0};    // a sender process the plan does not name: dropped
};

// HMAC-SHA256 of headers under one job secret, keyed once: the hash states after the key's inner
// and outer pad blocks are computed when it is made, and each message starts from copies of them
// (plain structs: OpenSSL's SHA256_CTX). OpenSSL's one-shot HMAC() hashed the pads and looked up
// the algorithm per message: 2.5 us a header, 9% of the agents' CPU in a 4 KiB all-reduce loop.
// EVP_MAC keyed once (until session 31) still duplicated provider contexts per message, with an
// allocation and a cleanse each: libcrypto was 8% of a worker agent's CPU and 14% of a summation
// server's on BERT-large's small tensors. Immutable after Create: thread-safe without a lock.
// SHA256_CTX and its functions are deprecated in OpenSSL 3 (still there): a build with
// OPENSSL_NO_DEPRECATED_3_0 or OPENSSL_API_COMPAT >= 30000 would need another way in.
class HeaderMac {
 public:
  // INVALID_ARGUMENT for an empty secret; INTERNAL when OpenSSL fails to hash the pads.
  static absl::StatusOr<std::shared_ptr<const HeaderMac>> Create(std::string_view secret);
  ~HeaderMac();
  HeaderMac(const HeaderMac&) = delete;
  HeaderMac& operator=(const HeaderMac&) = delete;

  // HMAC-SHA256(secret, header with mac zeroed), first kMacBytes bytes, into header.mac. False
  // (header unchanged) only if OpenSSL fails.
  bool Sign(WireHeader& header) const;
  // True when header.mac is the MAC of the rest of the header (compared in constant time).
  bool Verify(const WireHeader& header) const;

 private:
  HeaderMac() = default;
  bool Compute(const WireHeader& header, uint8_t (&mac)[WireHeader::kMacBytes]) const;

  SHA256_CTX inner_;  // after (key ^ ipad)
  SHA256_CTX outer_;  // after (key ^ opad)
};

// One-off forms of HeaderMac::Sign / Verify (they key a HeaderMac per call). SignHeader leaves
// the header unchanged for an empty secret; VerifyHeader is then false.
void SignHeader(WireHeader& header, std::string_view secret);
bool VerifyHeader(const WireHeader& header, std::string_view secret);

class AuthenticatingTransport final : public Transport {
 public:
  AuthenticatingTransport(std::unique_ptr<Transport> inner, const common::Clock* clock,
                          MessageAuthOptions options = {});
  ~AuthenticatingTransport() override;

  // Installs (or replaces) the secret of the job whose StableHash64(job id) is `job_hash`, and
  // the instance tags of the agent processes its plan names (empty: not checked), then
  // delivers, verified, the messages parked for it. An empty secret is refused.
  // `plan_version` is the plan the instances come from: a message of a newer epoch (its sender
  // has a plan this node has not received yet) is not judged by them.
  absl::Status SetJobSecret(uint64_t job_hash, std::string secret,
                            std::vector<uint32_t> instances = {}, uint64_t plan_version = 0);
  // This agent process's instance tag, stamped into every header it signs (0: none).
  void SetInstance(uint32_t instance) { instance_ = instance; }
  // Forgets a deleted job's secret; its later messages are parked, then dropped.
  void RemoveJob(uint64_t job_hash);

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
  void Shutdown() override { inner_->Shutdown(); }

  const MessageAuthStats& stats() const { return stats_; }

  // Bytes (header + payload) of one job's messages sent (signed and handed to the inner
  // transport) and received (verified), since the previous TakeJobBytes.
  struct JobBytes {
    uint64_t sent = 0;
    uint64_t received = 0;
  };
  // Per job hash, the jobs with traffic since the previous call (for the agent's heartbeat).
  std::map<uint64_t, JobBytes> TakeJobBytes();

 private:
  struct JobEntry {
    std::shared_ptr<const HeaderMac> mac;
    std::vector<uint32_t> instances;  // sorted; empty: not checked
    uint64_t instances_version = 0;   // the plan version they come from
    JobBytes bytes;                   // since the last TakeJobBytes
  };
  struct Parked {
    WireHeader header;
    std::vector<std::byte> payload;
    common::Clock::TimePoint arrived;
  };

  void OnReceive(std::span<const std::byte> header, std::span<const std::byte> payload);
  // A verified message from a sender process the job's plan names (or an unstamped one).
  bool KnownInstance(const JobEntry& job, const WireHeader& h);
  void ExpireParkedLocked(common::Clock::TimePoint now);

  std::unique_ptr<Transport> inner_;
  const common::Clock* clock_;
  const MessageAuthOptions options_;
  ReceiveHandler handler_;
  MessageAuthStats stats_;
  std::atomic<uint32_t> instance_{0};

  std::mutex mu_;
  std::map<uint64_t, JobEntry> secrets_;  // by job hash
  std::deque<Parked> parked_;             // arrival order
  size_t parked_bytes_ = 0;
};

}  // namespace tributary::dataplane
