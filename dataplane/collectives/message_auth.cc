#include "dataplane/collectives/message_auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

// SHA256_Init/Update/Final are deprecated in OpenSSL 3 but kept: they are the one interface whose
// hash state is a plain struct, copied without an allocation (HeaderMac).
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace tributary::dataplane {
namespace {

constexpr auto Log = common::ComponentLog<"auth">;

}  // namespace

absl::StatusOr<std::shared_ptr<const HeaderMac>> HeaderMac::Create(std::string_view secret) {
  if (secret.empty()) return absl::InvalidArgumentError("empty data-plane secret");
  // RFC 2104: a key longer than the hash's block is hashed first; then zero-padded to the block.
  unsigned char key[SHA256_CBLOCK] = {};
  if (secret.size() > sizeof(key)) {
    SHA256(reinterpret_cast<const unsigned char*>(secret.data()), secret.size(), key);
  } else {
    std::memcpy(key, secret.data(), secret.size());
  }
  auto mac = std::shared_ptr<HeaderMac>(new HeaderMac());
  unsigned char pad[SHA256_CBLOCK];
  bool ok = true;
  for (auto [state, byte] : {std::pair{&mac->inner_, 0x36}, std::pair{&mac->outer_, 0x5c}}) {
    for (size_t i = 0; i < sizeof(pad); ++i) pad[i] = key[i] ^ byte;
    ok = ok && SHA256_Init(state) == 1 && SHA256_Update(state, pad, sizeof(pad)) == 1;
  }
  OPENSSL_cleanse(key, sizeof(key));
  OPENSSL_cleanse(pad, sizeof(pad));
  if (!ok)
    return absl::InternalError("OpenSSL could not key HMAC-SHA256 for the data-plane secret");
  return mac;
}

HeaderMac::~HeaderMac() {
  OPENSSL_cleanse(&inner_, sizeof(inner_));
  OPENSSL_cleanse(&outer_, sizeof(outer_));
}

bool HeaderMac::Compute(const WireHeader& header, uint8_t (&mac)[WireHeader::kMacBytes]) const {
  WireHeader unsigned_header = header;
  std::memset(unsigned_header.mac, 0, sizeof(unsigned_header.mac));
  unsigned char digest[SHA256_DIGEST_LENGTH];
  // H((K ^ opad) || H((K ^ ipad) || header)), from the pads' states hashed at Create.
  SHA256_CTX ctx = inner_;
  bool ok = SHA256_Update(&ctx, &unsigned_header, sizeof(unsigned_header)) == 1 &&
            SHA256_Final(digest, &ctx) == 1;
  ctx = outer_;
  ok = ok && SHA256_Update(&ctx, digest, sizeof(digest)) == 1 && SHA256_Final(digest, &ctx) == 1;
  OPENSSL_cleanse(&ctx, sizeof(ctx));
  if (ok) std::memcpy(mac, digest, sizeof(mac));
  return ok;
}

bool HeaderMac::Sign(WireHeader& header) const {
  uint8_t mac[WireHeader::kMacBytes];
  if (!Compute(header, mac)) return false;
  std::memcpy(header.mac, mac, sizeof(mac));
  return true;
}

bool HeaderMac::Verify(const WireHeader& header) const {
  uint8_t expected[WireHeader::kMacBytes];
  return Compute(header, expected) && CRYPTO_memcmp(expected, header.mac, sizeof(expected)) == 0;
}

void SignHeader(WireHeader& header, std::string_view secret) {
  if (auto mac = HeaderMac::Create(secret); mac.ok()) (*mac)->Sign(header);
}

bool VerifyHeader(const WireHeader& header, std::string_view secret) {
  auto mac = HeaderMac::Create(secret);
  return mac.ok() && (*mac)->Verify(header);
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
  absl::StatusOr<std::shared_ptr<const HeaderMac>> mac = HeaderMac::Create(secret);
  if (!mac.ok()) return mac.status();
  std::sort(instances.begin(), instances.end());
  std::vector<Parked> ready;
  JobEntry entry;
  {
    std::lock_guard lock(mu_);
    secrets_[job_hash].mac = *mac;
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
    if (!(*mac)->Verify(p.header)) {
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
  std::shared_ptr<const HeaderMac> mac;
  {
    std::lock_guard lock(mu_);
    auto it = secrets_.find(h.job);
    if (it != secrets_.end()) {
      mac = it->second.mac;
      it->second.bytes.sent += sizeof(WireHeader) + payload.size();
    }
  }
  if (mac == nullptr) {
    stats_.unsigned_sends++;
    done(absl::FailedPreconditionError(
        absl::StrCat("no data-plane secret for job 0x", absl::Hex(h.job),
                     "; its plan has not arrived at this node (or was issued without one)")));
    return;
  }
  h.sender_instance = instance_.load(std::memory_order_relaxed);
  if (!mac->Sign(h)) {
    done(absl::InternalError(
        absl::StrCat("OpenSSL failed to sign a data-plane message of job 0x", absl::Hex(h.job))));
    return;
  }
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
  std::shared_ptr<const HeaderMac> mac;
  {
    std::lock_guard lock(mu_);
    auto it = secrets_.find(h.job);
    if (it != secrets_.end()) {
      mac = it->second.mac;
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
  if (!mac->Verify(h)) {
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
