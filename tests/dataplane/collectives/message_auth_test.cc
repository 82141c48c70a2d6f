#include "dataplane/collectives/message_auth.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/hash.h"
#include "dataplane/transport/inprocess/inprocess_transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tributary::dataplane {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// Collects what reaches the handler above the authenticator.
class Inbox {
 public:
  Transport::ReceiveHandler Handler() {
    return [this](std::span<const std::byte> header, std::span<const std::byte> payload) {
      WireHeader h;
      ASSERT_EQ(header.size(), sizeof(h));
      std::memcpy(&h, header.data(), sizeof(h));
      std::lock_guard lock(mu_);
      received_.push_back(
          {h, std::string(reinterpret_cast<const char*>(payload.data()), payload.size())});
      cv_.notify_all();
    };
  }
  // Waits (with a deadline) until `n` messages arrived.
  bool WaitFor(size_t n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 5s, [&] { return received_.size() >= n; });
  }
  size_t size() {
    std::lock_guard lock(mu_);
    return received_.size();
  }
  std::vector<std::pair<WireHeader, std::string>> Take() {
    std::lock_guard lock(mu_);
    return std::move(received_);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<WireHeader, std::string>> received_;
};

WireHeader Push(const std::string& job, uint64_t iteration, uint64_t count) {
  WireHeader h;
  h.kind = static_cast<uint8_t>(MessageKind::kPush);
  h.algorithm = static_cast<uint8_t>(Algorithm::kPushPull);
  h.job = common::StableHash64(job);
  h.tensor = common::StableHash64("grad");
  h.iteration = iteration;
  h.plan_version = 3;
  h.tensor_count = count;
  h.num_chunks = 1;
  h.chunk_count = count;
  return h;
}

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

absl::Status SendAndWait(Transport& from, const std::string& to, const WireHeader& h,
                         const std::string& payload) {
  std::promise<absl::Status> done;
  from.Send(to, AsBytes(h), Bytes(payload), [&](absl::Status s) { done.set_value(s); });
  auto future = done.get_future();
  if (future.wait_for(5s) != std::future_status::ready) return absl::DeadlineExceededError("send");
  return future.get();
}

struct Pair {
  common::FakeClock clock;
  InProcessNetwork network;
  std::unique_ptr<AuthenticatingTransport> a, b;
  InProcessTransport* raw_a = nullptr;  // a's inner transport: sends bypass a's signing
  Inbox inbox;                          // b's receive side

  explicit Pair(MessageAuthOptions options = {}) {
    auto inner_a = network.CreateEndpoint("a");
    raw_a = inner_a.get();
    a = std::make_unique<AuthenticatingTransport>(std::move(inner_a), &clock, options);
    b = std::make_unique<AuthenticatingTransport>(network.CreateEndpoint("b"), &clock, options);
    a->SetReceiveHandler([](auto, auto) {});
    b->SetReceiveHandler(inbox.Handler());
  }
  ~Pair() {
    a->Shutdown();
    b->Shutdown();
  }
};

TEST(MessageAuth, SignedMessagesOfMembersArriveIntact) {
  Pair p;
  const uint64_t job = common::StableHash64("job-a");
  ASSERT_TRUE(p.a->SetJobSecret(job, "secret of job a, 32 bytes long!!").ok());
  ASSERT_TRUE(p.b->SetJobSecret(job, "secret of job a, 32 bytes long!!").ok());
  for (uint64_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-a", i, 4), "0123456789abcdef").ok());
  }
  ASSERT_TRUE(p.inbox.WaitFor(3));
  auto got = p.inbox.Take();
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i].first.iteration, i);
    EXPECT_EQ(got[i].second, "0123456789abcdef");
  }
  EXPECT_EQ(p.b->stats().verified_messages, 3u);
  EXPECT_EQ(p.a->stats().signed_messages, 3u);
}

TEST(MessageAuth, AWrongSecretIsDroppedAndCountedNeverDelivered) {
  Pair p;
  const uint64_t job = common::StableHash64("job-a");
  ASSERT_TRUE(p.a->SetJobSecret(job, "the attacker's guess").ok());
  ASSERT_TRUE(p.b->SetJobSecret(job, "the real secret").ok());
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-a", 0, 4), "0123456789abcdef").ok());
  // An unsigned message (zero MAC) sent straight on the inner transport, and a forged one with
  // random MAC bytes: neither is delivered.
  WireHeader forged = Push("job-a", 1, 4);
  ASSERT_TRUE(SendAndWait(*p.raw_a, "b", forged, "0123456789abcdef").ok());
  std::memset(forged.mac, 0x5a, sizeof(forged.mac));
  ASSERT_TRUE(SendAndWait(*p.raw_a, "b", forged, "0123456789abcdef").ok());
  // A member's message after them still arrives (the inner transport delivers in order, so once
  // it is in, the three before it were judged).
  ASSERT_TRUE(p.a->SetJobSecret(job, "the real secret").ok());
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-a", 2, 4), "0123456789abcdef").ok());
  ASSERT_TRUE(p.inbox.WaitFor(1));
  auto got = p.inbox.Take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].first.iteration, 2u);
  EXPECT_EQ(p.b->stats().bad_mac, 3u);
}

TEST(MessageAuth, ASignedHeaderMovedToAnotherIterationOrEpochFailsTheCheck) {
  const std::string secret = "s3cret";
  WireHeader h = Push("job-a", 7, 4);
  SignHeader(h, secret);
  EXPECT_TRUE(VerifyHeader(h, secret));
  for (auto mutate : std::vector<void (*)(WireHeader&)>{
           [](WireHeader& x) { x.iteration++; }, [](WireHeader& x) { x.plan_version++; },
           [](WireHeader& x) { x.job ^= 1; }, [](WireHeader& x) { x.chunk_count--; },
           [](WireHeader& x) { x.sender++; }, [](WireHeader& x) { x.mac[15] ^= 1; }}) {
    WireHeader copy = h;
    mutate(copy);
    EXPECT_FALSE(VerifyHeader(copy, secret));
  }
  EXPECT_FALSE(VerifyHeader(h, "s3cret "));
}

// A keyed MAC, used by several threads at once, gives exactly OpenSSL's one-shot HMAC-SHA256 of
// the header with its mac zeroed (truncated to kMacBytes), for secrets shorter than, as long as
// and longer than SHA-256's 64-byte block (hashed first).
TEST(MessageAuth, AKeyedMacMatchesOneShotHmacFromManyThreads) {
  for (const size_t length : {1, 32, 48, 63, 64, 65, 200}) {
    std::string secret;
    for (size_t i = 0; i < length; ++i) secret.push_back(static_cast<char>('a' + (i * 7) % 26));
    absl::StatusOr<std::shared_ptr<const HeaderMac>> mac = HeaderMac::Create(secret);
    ASSERT_TRUE(mac.ok()) << mac.status();
    const auto one_shot = [&](WireHeader h) {
      std::memset(h.mac, 0, sizeof(h.mac));
      unsigned char digest[EVP_MAX_MD_SIZE];
      unsigned int digest_length = 0;
      HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(&h), sizeof(h), digest, &digest_length);
      return std::string(reinterpret_cast<const char*>(digest), WireHeader::kMacBytes);
    };
    std::vector<std::future<int>> threads;
    for (int t = 0; t < 4; ++t) {
      threads.push_back(std::async(std::launch::async, [&, t] {
        int wrong = 0;
        for (uint64_t i = 0; i < 500; ++i) {
          WireHeader h = Push("job-a", t * 1000 + i, static_cast<uint32_t>(i % 7));
          if (!(*mac)->Sign(h) ||
              std::string(reinterpret_cast<const char*>(h.mac), sizeof(h.mac)) != one_shot(h) ||
              !(*mac)->Verify(h)) {
            ++wrong;
          }
          h.iteration++;
          if ((*mac)->Verify(h)) ++wrong;
        }
        return wrong;
      }));
    }
    for (auto& t : threads) EXPECT_EQ(t.get(), 0) << "secret of " << length << " bytes";
  }
  EXPECT_EQ(HeaderMac::Create("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MessageAuth, MessagesForAJobNotYetKnownAreParkedThenCheckedWhenTheSecretArrives) {
  Pair p;
  const uint64_t job = common::StableHash64("job-a");
  ASSERT_TRUE(p.a->SetJobSecret(job, "real").ok());
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-a", 0, 4), "member's bytes..").ok());
  WireHeader forged = Push("job-a", 1, 4);
  ASSERT_TRUE(SendAndWait(*p.raw_a, "b", forged, "stranger's bytes").ok());
  // Both are parked at b (it has no plan for job-a yet), and so is a third, signed one.
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-a", 2, 4), "member's bytes..").ok());
  // A send completes when it leaves a, not when b has handled it: a message to a job b does know
  // arrives after the three (one sender, one order) and proves they were judged.
  ASSERT_TRUE(p.a->SetJobSecret(common::StableHash64("job-b"), "b's").ok());
  ASSERT_TRUE(p.b->SetJobSecret(common::StableHash64("job-b"), "b's").ok());
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-b", 0, 4), "0123456789abcdef").ok());
  ASSERT_TRUE(p.inbox.WaitFor(1));
  auto known = p.inbox.Take();
  ASSERT_EQ(known.size(), 1u);
  EXPECT_EQ(known[0].first.job, common::StableHash64("job-b"));
  EXPECT_EQ(p.b->stats().parked, 3u);
  ASSERT_TRUE(p.b->SetJobSecret(job, "real").ok());
  ASSERT_TRUE(p.inbox.WaitFor(2));
  auto got = p.inbox.Take();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].first.iteration, 0u);
  EXPECT_EQ(got[1].first.iteration, 2u);
  EXPECT_EQ(p.b->stats().parked, 3u);
  EXPECT_EQ(p.b->stats().bad_mac, 1u);
}

TEST(MessageAuth, TheParkIsBoundedInBytesAndTime) {
  MessageAuthOptions options;
  options.max_parked_bytes = 2 * (sizeof(WireHeader) + 16);
  options.park_timeout = 1s;
  Pair p(options);
  ASSERT_TRUE(p.a->SetJobSecret(common::StableHash64("job-a"), "real").ok());
  for (uint64_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-a", i, 4), "0123456789abcdef").ok());
  }
  // A fourth message to a job b does know proves the three were judged: one did not fit.
  ASSERT_TRUE(p.a->SetJobSecret(common::StableHash64("job-b"), "b's").ok());
  ASSERT_TRUE(p.b->SetJobSecret(common::StableHash64("job-b"), "b's").ok());
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-b", 0, 4), "0123456789abcdef").ok());
  ASSERT_TRUE(p.inbox.WaitFor(1));
  EXPECT_EQ(p.b->stats().parked, 2u);
  EXPECT_EQ(p.b->stats().park_dropped, 1u);
  // The secret arrives after the park timeout: the parked messages were dropped, not delivered.
  p.clock.Advance(1500ms);
  ASSERT_TRUE(p.b->SetJobSecret(common::StableHash64("job-a"), "real").ok());
  EXPECT_EQ(p.inbox.Take().size(), 1u);  // only job-b's
  EXPECT_EQ(p.b->stats().park_dropped, 3u);
}

TEST(MessageAuth, SendsWithoutASecretFailAndNothingLeavesUnsigned) {
  Pair p;
  absl::Status s = SendAndWait(*p.a, "b", Push("job-a", 0, 4), "0123456789abcdef");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("no data-plane secret"));
  EXPECT_EQ(p.a->stats().unsigned_sends, 1u);
  EXPECT_EQ(p.a->SetJobSecret(1, "").code(), absl::StatusCode::kInvalidArgument);
  const std::string short_header = "abc";
  std::promise<absl::Status> done;
  p.a->Send("b", Bytes(short_header), {}, [&](absl::Status st) { done.set_value(st); });
  EXPECT_EQ(done.get_future().get().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MessageAuth, RemovedJobsAreNoLongerAccepted) {
  Pair p;
  const uint64_t job = common::StableHash64("job-a");
  ASSERT_TRUE(p.a->SetJobSecret(job, "real").ok());
  ASSERT_TRUE(p.b->SetJobSecret(job, "real").ok());
  p.b->RemoveJob(job);
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-a", 0, 4), "0123456789abcdef").ok());
  ASSERT_TRUE(p.b->SetJobSecret(common::StableHash64("x"), "x").ok());
  ASSERT_TRUE(p.a->SetJobSecret(common::StableHash64("x"), "x").ok());
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("x", 0, 4), "0123456789abcdef").ok());
  ASSERT_TRUE(p.inbox.WaitFor(1));
  EXPECT_EQ(p.inbox.Take().size(), 1u);
  EXPECT_EQ(p.b->stats().parked, 1u);
}

TEST(MessageAuth, JobBytesCountSignedSendsAndVerifiedArrivalsPerJob) {
  Pair p;
  const uint64_t job_a = common::StableHash64("job-a");
  const uint64_t job_b = common::StableHash64("job-b");
  for (AuthenticatingTransport* t : {p.a.get(), p.b.get()}) {
    ASSERT_TRUE(t->SetJobSecret(job_a, "secret of job a, 32 bytes long!!").ok());
    ASSERT_TRUE(t->SetJobSecret(job_b, "secret of job b, 32 bytes long!!").ok());
  }
  const std::string payload(100, 'x');
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-a", 0, 25), payload).ok());
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-a", 1, 25), payload).ok());
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-b", 0, 25), payload).ok());
  // A forged message of job a (no MAC) is not the job's traffic.
  ASSERT_TRUE(SendAndWait(*p.raw_a, "b", Push("job-a", 2, 25), payload).ok());
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-b", 1, 25), payload).ok());
  ASSERT_TRUE(p.inbox.WaitFor(4));
  const uint64_t message = sizeof(WireHeader) + payload.size();
  auto sent = p.a->TakeJobBytes();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[job_a].sent, 2 * message);
  EXPECT_EQ(sent[job_a].received, 0u);
  EXPECT_EQ(sent[job_b].sent, 2 * message);
  auto received = p.b->TakeJobBytes();
  ASSERT_EQ(received.size(), 2u);
  EXPECT_EQ(received[job_a].received, 2 * message);
  EXPECT_EQ(received[job_a].sent, 0u);
  EXPECT_EQ(received[job_b].received, 2 * message);
  EXPECT_EQ(p.b->stats().bad_mac, 1u);
  // Since the previous call: nothing new.
  EXPECT_TRUE(p.a->TakeJobBytes().empty());
  EXPECT_TRUE(p.b->TakeJobBytes().empty());
}

TEST(MessageAuth, OnlyTheAgentProcessesThePlanNamesAreHeardAndTheStampIsSigned) {
  Pair p;
  const uint64_t job = common::StableHash64("job-a");
  const uint32_t old_process = InstanceTag(0x1111222233334444), new_process = InstanceTag(77);
  ASSERT_TRUE(p.a->SetJobSecret(job, "real").ok());
  // b's plan names the node's new agent process; a is still the old one (restarted meanwhile).
  ASSERT_TRUE(p.b->SetJobSecret(job, "real", {new_process, InstanceTag(5)}, 3).ok());
  p.a->SetInstance(old_process);
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-a", 0, 4), "old incarnation!").ok());
  // Unstamped (an agent that does not stamp): heard.
  p.a->SetInstance(0);
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-a", 1, 4), "0123456789abcdef").ok());
  p.a->SetInstance(new_process);
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-a", 2, 4), "0123456789abcdef").ok());
  ASSERT_TRUE(p.inbox.WaitFor(2));
  auto got = p.inbox.Take();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].first.iteration, 1u);
  EXPECT_EQ(got[1].first.iteration, 2u);
  EXPECT_EQ(got[1].first.sender_instance, new_process);
  EXPECT_EQ(p.b->stats().old_instance, 1u);
  EXPECT_EQ(p.b->stats().bad_mac, 0u);
  // The stamp is under the MAC: rewriting it breaks the message.
  WireHeader h = Push("job-a", 3, 4);
  h.sender_instance = old_process;
  SignHeader(h, "real");
  h.sender_instance = new_process;
  EXPECT_FALSE(VerifyHeader(h, "real"));
  // Parked messages are judged the same way when the plan arrives.
  const uint64_t later = common::StableHash64("job-later");
  ASSERT_TRUE(p.a->SetJobSecret(later, "l").ok());
  p.a->SetInstance(old_process);
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-later", 0, 4), "old incarnation!").ok());
  p.a->SetInstance(new_process);
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-later", 1, 4), "0123456789abcdef").ok());
  ASSERT_TRUE(SendAndWait(*p.a, "b", Push("job-a", 4, 4), "0123456789abcdef").ok());
  ASSERT_TRUE(p.inbox.WaitFor(1));  // job-a's: the two before it are parked
  p.inbox.Take();
  ASSERT_TRUE(p.b->SetJobSecret(later, "l", {new_process}, 3).ok());
  ASSERT_TRUE(p.inbox.WaitFor(1));
  got = p.inbox.Take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].first.iteration, 1u);
  EXPECT_EQ(p.b->stats().old_instance, 2u);
  // A message of a newer epoch than b's plan (b has not received the plan that names its
  // sender yet) is not judged by the older plan's instances.
  ASSERT_TRUE(p.b->SetJobSecret(later, "l", {new_process}, /*plan_version=*/3).ok());
  p.a->SetInstance(InstanceTag(99));
  WireHeader newer = Push("job-later", 2, 4);
  newer.plan_version = 4;
  ASSERT_TRUE(SendAndWait(*p.a, "b", newer, "0123456789abcdef").ok());
  ASSERT_TRUE(p.inbox.WaitFor(1));
  EXPECT_EQ(p.inbox.Take()[0].first.plan_version, 4u);
  EXPECT_EQ(p.b->stats().old_instance, 2u);
  EXPECT_EQ(InstanceTag(0), 0u);
  EXPECT_NE(InstanceTag(uint64_t{1} << 32 | 1), 0u);  // halves that cancel: still not 0
}

}  // namespace
}  // namespace tributary::dataplane
