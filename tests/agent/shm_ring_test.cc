// The control ring's layout and its single-producer / single-consumer ends (common/shm_ring.h),
// which the agent and the client share: header checks, wrap-around, full, empty, counters out
// of range, a producer and a consumer thread with exact counts, and the doorbell across two
// processes (the futex is not process-private).
#include "common/shm_ring.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tributary::common::shm_ring {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// An anonymous shared mapping holding a ring (shared with a forked child, too).
class Mapping {
 public:
  explicit Mapping(RingConfig config)
      : config_(config), bytes_(TotalBytes(config.sq_capacity, config.cq_capacity)) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    data_ = p == MAP_FAILED ? nullptr : p;
    if (data_ != nullptr) EXPECT_TRUE(InitializeHeader(data_, bytes_, config).ok());
  }
  ~Mapping() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  RingView view() const { return ViewOf(data_, config_); }
  ControlRingHeader* header() const { return static_cast<ControlRingHeader*>(data_); }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  RingConfig config_;
  size_t bytes_;
  void* data_ = nullptr;
};

SubmissionEntry Entry(uint64_t ticket) {
  SubmissionEntry e{};
  e.ticket = ticket;
  e.count = ticket * 3;
  e.name_bytes = 1;
  e.name[0] = static_cast<char>('a' + ticket % 26);
  return e;
}

TEST(ShmRingTest, HeaderRoundTripsAndBadHeadersAreRejectedByField) {
  Mapping m({8, 16});
  ASSERT_NE(m.data(), nullptr);
  auto config = ReadHeader(m.data(), m.bytes());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->sq_capacity, 8u);
  EXPECT_EQ(config->cq_capacity, 16u);
  EXPECT_EQ(m.bytes(), SubmissionOffset() + 8 * 256 + 16 * 512);

  EXPECT_THAT(ReadHeader(m.data(), m.bytes() - 1).status().message(), HasSubstr("needs"));
  m.header()->version = 2;
  EXPECT_THAT(ReadHeader(m.data(), m.bytes()).status().message(),
              HasSubstr("layout version 2 is not supported"));
  m.header()->version = kVersion;
  m.header()->sq_capacity = 6;
  EXPECT_THAT(ReadHeader(m.data(), m.bytes()).status().message(),
              HasSubstr("must be powers of two"));
  m.header()->sq_capacity = 8;
  m.header()->sq.head = 3;
  EXPECT_THAT(ReadHeader(m.data(), m.bytes()).status().message(), HasSubstr("start at zero"));
  m.header()->sq.head = 0;
  m.header()->magic = 1;
  EXPECT_EQ(ReadHeader(m.data(), m.bytes()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ReadHeader(m.data(), m.bytes()).status().message(), HasSubstr("bad magic"));
  EXPECT_EQ(InitializeHeader(m.data(), m.bytes(), {8, 8192}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InitializeHeader(m.data(), 100, {8, 8}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShmRingTest, EmptyFullAndWrapAround) {
  Mapping m({4, 4});
  RingView v = m.view();
  RingProducer<SubmissionEntry> producer(&v.header->sq, v.sq, 4);
  RingConsumer<SubmissionEntry> consumer(&v.header->sq, v.sq, 4);
  SubmissionEntry out;
  EXPECT_EQ(consumer.Pop(&out), RingResult::kEmpty);
  EXPECT_FALSE(consumer.HasWork());

  uint64_t pushed = 0, popped = 0;
  // Eleven rounds of "fill up, drain three": the indices wrap around the 4 slots many times.
  for (int round = 0; round < 11; ++round) {
    while (producer.Push(Entry(pushed + 1)) == RingResult::kOk) ++pushed;
    EXPECT_EQ(producer.Push(Entry(999)), RingResult::kFull);
    EXPECT_EQ(producer.free_slots(), 0u);
    EXPECT_EQ(pushed - popped, 4u);
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(consumer.Pop(&out), RingResult::kOk);
      ++popped;
      ASSERT_EQ(out.ticket, popped);
      ASSERT_EQ(out.count, popped * 3);
      ASSERT_EQ(out.name[0], static_cast<char>('a' + popped % 26));
    }
    EXPECT_EQ(producer.free_slots(), 3u);
  }
  while (consumer.Pop(&out) == RingResult::kOk) ASSERT_EQ(out.ticket, ++popped);
  EXPECT_EQ(popped, pushed);
  EXPECT_EQ(pushed, 4u + 10 * 3);  // 4, then 3 per round
  EXPECT_EQ(v.header->sq.head, pushed);
  EXPECT_EQ(v.header->sq.tail, popped);
}

TEST(ShmRingTest, CountersOutOfRangeAreCorruptNotIndices) {
  Mapping m({4, 4});
  RingView v = m.view();
  RingConsumer<SubmissionEntry> consumer(&v.header->sq, v.sq, 4);
  SubmissionEntry out;
  v.header->sq.head = 5;  // more than capacity ahead of the consumer's tail 0
  EXPECT_EQ(consumer.Pop(&out), RingResult::kCorrupt);
  v.header->sq.head = ~uint64_t{0};  // "behind" the tail
  EXPECT_EQ(consumer.Pop(&out), RingResult::kCorrupt);
  EXPECT_EQ(consumer.tail(), 0u);

  RingProducer<CompletionEntry> producer(&v.header->cq, v.cq, 4);
  v.header->cq.tail = 1;  // the consumer claims to have popped what was never pushed
  EXPECT_EQ(producer.Push(MakeCompletion(1, absl::OkStatus())), RingResult::kCorrupt);
  EXPECT_EQ(producer.free_slots(), 0u);
  EXPECT_EQ(producer.head(), 0u);
}

TEST(ShmRingTest, ProducerAndConsumerThreadsExchangeEveryEntryOnceInOrder) {
  constexpr uint64_t kEntries = 200000;
  Mapping m({8, 8});
  RingView v = m.view();
  std::atomic<uint64_t> rings{0};
  std::thread producer_thread([&] {
    RingProducer<SubmissionEntry> producer(&v.header->sq, v.sq, 8);
    for (uint64_t t = 1; t <= kEntries;) {
      if (producer.Push(Entry(t)) == RingResult::kOk) {
        ++t;
        if (producer.Notify()) ++rings;
      } else {
        std::this_thread::yield();
      }
    }
  });
  RingConsumer<SubmissionEntry> consumer(&v.header->sq, v.sq, 8);
  uint64_t next = 1, sum = 0;
  bool in_order = true;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (next <= kEntries && std::chrono::steady_clock::now() < deadline) {
    SubmissionEntry out;
    const RingResult r = consumer.Pop(&out);
    ASSERT_NE(r, RingResult::kCorrupt);
    if (r == RingResult::kEmpty) {
      consumer.Sleep(100ms, [] { return false; });
      continue;
    }
    in_order = in_order && out.ticket == next && out.count == next * 3;
    sum += out.ticket;
    ++next;
  }
  producer_thread.join();
  EXPECT_TRUE(in_order);
  EXPECT_EQ(next, kEntries + 1);
  EXPECT_EQ(sum, kEntries * (kEntries + 1) / 2);
  // The producer rang only when the consumer had announced itself.
  EXPECT_LE(rings.load(), kEntries);
  EXPECT_EQ(v.header->sq.waiting, 0u);
}

// A producer rings once per sleep: the woken consumer may wait for a CPU before it clears
// `waiting`, and the pushes meanwhile make no system call (they did, one FUTEX_WAKE each).
TEST(ShmRingTest, ProducerRingsOncePerSleep) {
  Mapping m({8, 8});
  RingView v = m.view();
  RingProducer<SubmissionEntry> producer(&v.header->sq, v.sq, 8);
  const uint32_t doorbell = v.header->sq.doorbell;
  v.header->sq.waiting = 1;  // as the consumer leaves it when it goes to sleep
  ASSERT_EQ(producer.Push(Entry(1)), RingResult::kOk);
  EXPECT_TRUE(producer.Notify());
  EXPECT_EQ(v.header->sq.waiting, 0u);
  EXPECT_EQ(v.header->sq.doorbell, doorbell + 1);
  for (uint64_t t = 2; t <= 4; ++t) {
    ASSERT_EQ(producer.Push(Entry(t)), RingResult::kOk);
    EXPECT_FALSE(producer.Notify());
  }
  EXPECT_EQ(v.header->sq.doorbell, doorbell + 1);
  // The consumer's next sleep announces itself again, and the next push rings.
  v.header->sq.waiting = 1;
  ASSERT_EQ(producer.Push(Entry(5)), RingResult::kOk);
  EXPECT_TRUE(producer.Notify());
  EXPECT_EQ(v.header->sq.doorbell, doorbell + 2);
  RingConsumer<SubmissionEntry> consumer(&v.header->sq, v.sq, 8);
  SubmissionEntry out;
  for (uint64_t t = 1; t <= 5; ++t) {
    ASSERT_EQ(consumer.Pop(&out), RingResult::kOk);
    EXPECT_EQ(out.ticket, t);
  }
}

// What ConsumeInOrder saw.
struct Consumed {
  uint64_t next = 1;  // the next ticket expected: count + 1 when every entry came
  bool in_order = true;
  bool corrupt = false;
  std::chrono::steady_clock::duration longest_sleep{};
};

// Pops the entries with tickets 1..count, sleeping on the doorbell (at most `sleep` each time)
// while the ring is empty, for at most `limit` in all; `taken(ticket)` runs after each entry.
template <typename Taken>
Consumed ConsumeInOrder(RingConsumer<SubmissionEntry>& consumer, uint64_t count,
                        std::chrono::nanoseconds sleep, std::chrono::nanoseconds limit,
                        Taken taken) {
  Consumed c;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (c.next <= count && std::chrono::steady_clock::now() < deadline) {
    SubmissionEntry out;
    const RingResult r = consumer.Pop(&out);
    if (r == RingResult::kCorrupt) {
      c.corrupt = true;
      break;
    }
    if (r == RingResult::kEmpty) {
      const auto start = std::chrono::steady_clock::now();
      consumer.Sleep(sleep, [] { return false; });
      c.longest_sleep = std::max(c.longest_sleep, std::chrono::steady_clock::now() - start);
      continue;
    }
    c.in_order = c.in_order && out.ticket == c.next;
    taken(c.next++);
  }
  return c;
}

// Late Notify calls -- a producer's, for an entry the consumer has already popped -- may take the
// consumer's `waiting` flag at any moment. A thread that does nothing else stands for them here,
// while a producer pushes one entry at a time and waits for it to be taken, so that the consumer
// goes to sleep before almost every entry. No sleep may last its timeout: each push still wakes
// the consumer. (Sleep reads the doorbell before setting the flag for this; the window the other
// order leaves is two instructions wide; with that order this test failed 9 runs in 10, with
// this one none in 30.)
TEST(ShmRingTest, LateNotifiesNeverLoseAWakeUp) {
  constexpr uint64_t kEntries = 20000;
  Mapping m({8, 8});
  RingView v = m.view();
  std::atomic<bool> done{false};
  std::atomic<uint64_t> consumed{0};
  std::thread late_notifier([&] {
    RingProducer<SubmissionEntry> late(&v.header->sq, v.sq, 8);  // Notify only
    while (!done.load()) late.Notify();
  });
  std::atomic<bool> pushed_all{true};
  std::thread producer_thread([&] {
    RingProducer<SubmissionEntry> producer(&v.header->sq, v.sq, 8);
    for (uint64_t t = 1; t <= kEntries && !done.load(); ++t) {
      if (producer.Push(Entry(t)) != RingResult::kOk) {
        pushed_all = false;
        return;
      }
      producer.Notify();
      while (consumed.load() < t && !done.load()) std::this_thread::yield();
    }
  });
  RingConsumer<SubmissionEntry> consumer(&v.header->sq, v.sq, 8);
  const Consumed c =
      ConsumeInOrder(consumer, kEntries, 5s, 120s, [&](uint64_t ticket) { consumed = ticket; });
  done = true;
  producer_thread.join();
  late_notifier.join();
  EXPECT_TRUE(pushed_all);
  EXPECT_FALSE(c.corrupt);
  EXPECT_TRUE(c.in_order);
  EXPECT_EQ(c.next, kEntries + 1);
  EXPECT_LT(c.longest_sleep, 2500ms);
}

TEST(ShmRingTest, DoorbellWakesAConsumerInAnotherProcess) {
  constexpr uint64_t kEntries = 2000;
  Mapping m({4, 4});
  RingView v = m.view();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The producer, in its own process: pushes in bursts, ringing when the parent sleeps.
    RingProducer<SubmissionEntry> producer(&v.header->sq, v.sq, 4);
    for (uint64_t t = 1; t <= kEntries;) {
      if (producer.Push(Entry(t)) == RingResult::kOk) {
        ++t;
        producer.Notify();
      } else {
        std::this_thread::yield();
      }
    }
    _exit(0);
  }
  RingConsumer<SubmissionEntry> consumer(&v.header->sq, v.sq, 4);
  const Consumed c = ConsumeInOrder(consumer, kEntries, 20s, 60s, [](uint64_t) {});
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_FALSE(c.corrupt);
  EXPECT_TRUE(c.in_order);
  EXPECT_EQ(c.next, kEntries + 1);
  // Every sleep ended by the other process's FUTEX_WAKE, none by the 20 s timeout (a
  // process-private futex would not reach this process).
  EXPECT_LT(c.longest_sleep, 10s);
}

TEST(SpinPolicyTest, SpinsWhileRecentWaitsAreShortAndSleepsAfterLongOnes) {
  SpinPolicy policy(50us);
  EXPECT_EQ(policy.NextSpin(), 50us);  // nothing known yet: try polling
  for (int i = 0; i < 20; ++i) policy.Record(3us);
  EXPECT_EQ(policy.NextSpin(), 50us);
  // One wait across an iteration boundary (seconds) counts as 4 budgets: the average moves a
  // quarter of the way there (3 + (200 - 3) / 4 = 52 us) and the next wait sleeps at once.
  policy.Record(5s);
  EXPECT_LE(policy.average(), 53us);
  EXPECT_EQ(policy.NextSpin(), 0us);
  // Short waits again (seen through a doorbell sleep, ~25 us here): polling resumes after one.
  policy.Record(25us);
  EXPECT_LT(policy.average(), 50us);
  EXPECT_EQ(policy.NextSpin(), 50us);
  // Waits that are always long (a collective across the network) never poll.
  for (int i = 0; i < 20; ++i) policy.Record(300us);
  EXPECT_EQ(policy.NextSpin(), 0us);
  EXPECT_LE(policy.average(), 200us);
}

TEST(SpinPolicyTest, ZeroOrNegativeBudgetNeverPolls) {
  SpinPolicy off;
  EXPECT_EQ(off.NextSpin(), 0us);
  off.Record(1us);
  EXPECT_EQ(off.NextSpin(), 0us);
  SpinPolicy negative(-5us);
  EXPECT_EQ(negative.budget(), 0us);
  EXPECT_EQ(negative.NextSpin(), 0us);
}

TEST(SpinUntilTest, ReturnsAsSoonAsReadyAndFalseWhenTheBudgetRunsOut) {
  int looks = 0;
  EXPECT_TRUE(SpinUntil(1s, [&] { return ++looks == 3; }));
  EXPECT_EQ(looks, 3);
  EXPECT_FALSE(SpinUntil(0us, [] { return true; }));  // no budget: no look
  EXPECT_FALSE(SpinUntil(20us, [] { return false; }));
}

TEST(SpinUntilTest, SeesAnEntryPushedByAnotherThreadWithoutTheDoorbell) {
  Mapping m({8, 8});
  RingView v = m.view();
  RingConsumer<SubmissionEntry> consumer(&v.header->sq, v.sq, 8);
  std::thread producer_thread([&] {
    RingProducer<SubmissionEntry> producer(&v.header->sq, v.sq, 8);
    ASSERT_EQ(producer.Push(Entry(7)), RingResult::kOk);
    EXPECT_FALSE(producer.Notify());  // the consumer polls: no waiter, no system call
  });
  // A generous budget: the test ends as soon as the entry is there.
  EXPECT_TRUE(SpinUntil(60s, [&] { return consumer.HasWork(); }));
  producer_thread.join();
  SubmissionEntry out;
  ASSERT_EQ(consumer.Pop(&out), RingResult::kOk);
  EXPECT_EQ(out.ticket, 7u);
}

TEST(ShmRingTest, CompletionsCarryCodeAndBoundedMessage) {
  const CompletionEntry ok = MakeCompletion(7, absl::OkStatus());
  EXPECT_EQ(ok.ticket, 7u);
  EXPECT_TRUE(StatusOf(ok).ok());

  const absl::Status aborted = absl::AbortedError("rank 3 left");
  EXPECT_EQ(StatusOf(MakeCompletion(8, aborted)), aborted);

  const std::string long_message(kMaxMessage + 100, 'x');
  const absl::Status cut = StatusOf(MakeCompletion(9, absl::DataLossError(long_message)));
  EXPECT_EQ(cut.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(cut.message().size(), kMaxMessage);
  EXPECT_EQ(cut.message().substr(kMaxMessage - 4), "x...");

  CompletionEntry bad = MakeCompletion(10, aborted);
  bad.code = 77;
  bad.message_bytes = 100000;  // clamped to the entry
  EXPECT_EQ(StatusOf(bad).code(), absl::StatusCode::kInternal);
  EXPECT_THAT(StatusOf(bad).message(), HasSubstr("unknown status code 77"));
}

}  // namespace
}  // namespace tributary::common::shm_ring
