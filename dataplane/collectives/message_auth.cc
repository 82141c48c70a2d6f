#include "dataplane/collectives/message_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace tributary::dataplane {
namespace {

constexpr auto Log = common::ComponentLog<"auth">;

void ComputeMac(const WireHeader& header, std::string_view secret,
                uint8_t (&mac)[WireHeader::kMacBytes]) {
  WireHeader unsigned_header = header;
  std::memset(unsigned_header.mac, 0, sizeof(unsigned_header.mac));
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(&unsigned_header), sizeof(unsigned_header), digest,
       &length);
  std::memcpy(mac, digest, sizeof(mac));
}

}  // namespace

void SignHeader(WireHeader& header, std::string_view secret) {
  ComputeMac(header, secret, header.mac);
}

bool VerifyHeader(const WireHeader& header, std::string_view secret) {
  uint8_t expected[WireHeader::kMacBytes];
  ComputeMac(header, secret, expected);
  return CRYPTO_memcmp(expected, header.mac, sizeof(expected)) == 0;
}

AuthenticatingTransport::AuthenticatingTransport(std::unique_ptr<Transport> inner,
                                                 const common::Clock* clock,
                                                 MessageAuthOptions options)
    : inner_(std::move(inner)), clock_(clock), options_(options) {}

AuthenticatingTransport::~AuthenticatingTransport() { inner_->Shutdown(); }

void AuthenticatingTransport::SetReceiveHandler(ReceiveHandler handler) {
  handler_ = std::move(handler);
  inner_->SetReceiveHandler(
      [this](std::span<const std::byte> header, std::span<const std::byte> payload) {
        OnReceive(header, payload);
      });
}

absl::Status AuthenticatingTransport::SetJobSecret(uint64_t job_hash, std::string secret,
                                                   std::vector<uint32_t> instances,
                                                   uint64_t plan_version) {
  if (secret.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job 0x", absl::Hex(job_hash), " has an empty data-plane secret"));
  }
  std::sort(instances.begin(), instances.end());
  std::vector<Parked> ready;
  JobEntry entry;
  {
    std::lock_guard lock(mu_);
    secrets_[job_hash].secret = secret;
    secrets_[job_hash].instances = std::move(instances);
    secrets_[job_hash].instances_version = plan_version;
    entry.instances = secrets_[job_hash].instances;
    entry.instances_version = plan_version;
    ExpireParkedLocked(clock_->Now());
    for (auto it = parked_.begin(); it != parked_.end();) {
      if (it->header.job != job_hash) {
        ++it;
        continue;
      }
      parked_bytes_ -= it->payload.size() + sizeof(WireHeader);
      ready.push_back(std::move(*it));
      it = parked_.erase(it);
    }
  }
  uint64_t verified_bytes = 0;
  for (Parked& p : ready) {
    if (!VerifyHeader(p.header, secret)) {
      stats_.bad_mac++;
      Log()->warn("parked message of job 0x{:x} ({}) dropped: wrong job secret", job_hash,
                  Describe(p.header));
      continue;
    }
    stats_.verified_messages++;
    if (!KnownInstance(entry, p.header)) continue;
    verified_bytes += sizeof(WireHeader) + p.payload.size();
    handler_(AsBytes(p.header), p.payload);
  }
  if (verified_bytes > 0) {
    std::lock_guard lock(mu_);
    if (auto it = secrets_.find(job_hash); it != secrets_.end()) {
      it->second.bytes.received += verified_bytes;
    }
  }
  return absl::OkStatus();
}

void AuthenticatingTransport::RemoveJob(uint64_t job_hash) {
  std::lock_guard lock(mu_);
  secrets_.erase(job_hash);
}

void AuthenticatingTransport::Send(const std::string& peer_address,
                                   std::span<const std::byte> header,
                                   std::span<const std::byte> payload, SendCallback done) {
  if (header.size() != sizeof(WireHeader)) {
    done(absl::InvalidArgumentError(absl::StrCat("data-plane header of ", header.size(),
                                                 " bytes, expected ", sizeof(WireHeader))));
    return;
  }
  WireHeader h;
  std::memcpy(&h, header.data(), sizeof(h));
  std::string secret;
  {
    std::lock_guard lock(mu_);
    auto it = secrets_.find(h.job);
    if (it != secrets_.end()) {
      secret = it->second.secret;
      it->second.bytes.sent += sizeof(WireHeader) + payload.size();
    }
  }
  if (secret.empty()) {
    stats_.unsigned_sends++;
    done(absl::FailedPreconditionError(
        absl::StrCat("no data-plane secret for job 0x", absl::Hex(h.job),
                     "; its plan has not arrived at this node (or was issued without one)")));
    return;
  }
  h.sender_instance = instance_.load(std::memory_order_relaxed);
  SignHeader(h, secret);
  stats_.signed_messages++;
  inner_->Send(peer_address, AsBytes(h), payload, std::move(done));
}

void AuthenticatingTransport::OnReceive(std::span<const std::byte> header,
                                        std::span<const std::byte> payload) {
  if (header.size() != sizeof(WireHeader)) {
    stats_.malformed++;
    return;
  }
  WireHeader h;
  std::memcpy(&h, header.data(), sizeof(h));
  if (h.magic != WireHeader::kMagic) {
    stats_.malformed++;
    return;
  }
  std::string secret;
  {
    std::lock_guard lock(mu_);
    auto it = secrets_.find(h.job);
    if (it != secrets_.end()) {
      secret = it->second.secret;
    } else {
      const common::Clock::TimePoint now = clock_->Now();
      ExpireParkedLocked(now);
      const size_t bytes = payload.size() + sizeof(WireHeader);
      if (parked_bytes_ + bytes > options_.max_parked_bytes) {
        stats_.park_dropped++;
        return;
      }
      stats_.parked++;
      parked_bytes_ += bytes;
      parked_.push_back(Parked{h, {payload.begin(), payload.end()}, now});
      return;
    }
  }
  if (!VerifyHeader(h, secret)) {
    const uint64_t n = ++stats_.bad_mac;
    if ((n & (n - 1)) == 0) {  // 1st, 2nd, 4th, ...: a flood does not flood the log
      Log()->warn("{} message(s) for job 0x{:x} failed authentication and were dropped (last: {})",
                  n, h.job, Describe(h));
    }
    return;
  }
  stats_.verified_messages++;
  {
    // Counted once verified: a stranger's bytes never inflate a job's traffic.
    std::lock_guard lock(mu_);
    if (auto it = secrets_.find(h.job); it != secrets_.end()) {
      if (!KnownInstance(it->second, h)) return;
      it->second.bytes.received += header.size() + payload.size();
    }
  }
  handler_(header, payload);
}

bool AuthenticatingTransport::KnownInstance(const JobEntry& job, const WireHeader& h) {
  if (h.sender_instance == 0 || job.instances.empty() || h.plan_version > job.instances_version ||
      std::binary_search(job.instances.begin(), job.instances.end(), h.sender_instance)) {
    return true;
  }
  const uint64_t n = ++stats_.old_instance;
  if ((n & (n - 1)) == 0) {
    Log()->warn(
        "{} message(s) of job 0x{:x} from an agent process its plan does not name were "
        "dropped (last: instance {:08x}, {})",
        n, h.job, h.sender_instance, Describe(h));
  }
  return false;
}

std::map<uint64_t, AuthenticatingTransport::JobBytes> AuthenticatingTransport::TakeJobBytes() {
  std::map<uint64_t, JobBytes> out;
  std::lock_guard lock(mu_);
  for (auto& [job_hash, entry] : secrets_) {
    if (entry.bytes.sent == 0 && entry.bytes.received == 0) continue;
    out[job_hash] = std::exchange(entry.bytes, JobBytes{});
  }
  return out;
}

void AuthenticatingTransport::ExpireParkedLocked(common::Clock::TimePoint now) {
  while (!parked_.empty() && now - parked_.front().arrived >= options_.park_timeout) {
    parked_bytes_ -= parked_.front().payload.size() + sizeof(WireHeader);
    parked_.pop_front();
    stats_.park_dropped++;
  }
}

}  // namespace tributary::dataplane
