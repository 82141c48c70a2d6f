// The control ring: the per-session fast path between a training process and its agent, in
// one POSIX shared-memory object. A submission queue (process -> agent) and a completion queue
// (agent -> process), each a single-producer / single-consumer ring of fixed-size entries with
// atomic head and tail counters, and a futex doorbell per direction with a "waiter present"
// flag, so that a producer makes a system call only when its consumer sleeps.
//
// This header is the ONE definition of the layout; the client (client/control_ring.*) creates
// and initialises the object, the agent (agent/control_ring_host.*) maps it after the
// AttachControlRing RPC (api/tributary/v1/agent.proto). Both sides treat the other's writes as
// untrusted: a consumer copies an entry out before looking at it, and both check every counter
// they read against their own copy (RingResult::kCorrupt, never an out-of-range index).
//
// Layout (offsets in bytes, every part 64-byte aligned):
//   [0, sizeof(ControlRingHeader))                 ControlRingHeader
//   [SubmissionOffset(), + sq_capacity * 256)      SubmissionEntry slots
//   [CompletionOffset(sq), + cq_capacity * 512)    CompletionEntry slots
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tributary::common::shm_ring {

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the ring needs lock-free 64-bit atomics");
static_assert(std::atomic<uint32_t>::is_always_lock_free,
              "the doorbells need lock-free 32-bit atomics");

inline constexpr uint64_t kMagic = 0x474e495242495254;  // "TRIBRING" read little-endian
inline constexpr uint32_t kVersion = 1;
// Capacities are powers of two in [kMinCapacity, kMaxCapacity] entries.
inline constexpr uint32_t kMinCapacity = 2;
inline constexpr uint32_t kMaxCapacity = 4096;
// Tensor names longer than this go through the Submit RPC.
inline constexpr uint32_t kMaxTensorName = 200;
// Error messages longer than this are cut to it (ending in "...").
inline constexpr uint32_t kMaxMessage = 496;
// Both sides' default spin budget before a doorbell sleep (SpinPolicy): about two futex
// wake-ups on this project's VMs.
inline constexpr std::chrono::microseconds kDefaultSpin{50};

// One submission: what tributary.v1.SubmitRequest carries, minus the session (the ring is the
// session's) and the wait (results always come back as completions).
struct SubmissionEntry {
  uint64_t ticket;  // chosen by the client; echoed in the completion
  uint64_t buffer_id;
  uint64_t offset_bytes;
  uint64_t count;
  int32_t dtype;  // tributary.v1.DataType
  int32_t op;     // tributary.v1.CollectiveOp
  uint32_t root_rank;
  int32_t priority;
  uint32_t name_bytes;  // valid bytes of `name`, 1..kMaxTensorName
  uint32_t reserved;
  char name[kMaxTensorName];  // not NUL-terminated
};
static_assert(sizeof(SubmissionEntry) == 256);
static_assert(std::is_trivially_copyable_v<SubmissionEntry>);

// One result: the ticket of its submission and the operation's status.
struct CompletionEntry {
  uint64_t ticket;
  int32_t code;            // absl::StatusCode (== grpc::StatusCode)
  uint32_t message_bytes;  // valid bytes of `message`, 0..kMaxMessage
  char message[kMaxMessage];
};
static_assert(sizeof(CompletionEntry) == 512);
static_assert(std::is_trivially_copyable_v<CompletionEntry>);

// One direction's counters. `head` counts entries ever pushed (written by the producer only),
// `tail` entries ever popped (written by the consumer only); slot of entry n is n % capacity.
// The consumer sets `waiting` before it sleeps on `doorbell`; the first producer that sees it
// clears it, bumps `doorbell` and calls FUTEX_WAKE (the consumer clears it too when it wakes).
struct RingCounters {
  alignas(64) uint64_t head;
  alignas(64) uint64_t tail;
  alignas(64) uint32_t doorbell;
  uint32_t waiting;
};

// At offset 0 of the object. Every field is accessed through std::atomic_ref; the
// configuration fields are written once by the client before AttachControlRing and read once
// by the agent, which keeps its own checked copy.
struct ControlRingHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t sq_capacity;
  uint32_t cq_capacity;
  uint32_t sq_entry_bytes;
  uint32_t cq_entry_bytes;
  uint32_t reserved;
  uint64_t total_bytes;
  // Set by the agent while it holds completions that did not fit the completion queue: the
  // client then rings the submission doorbell after it frees completion slots.
  alignas(64) uint32_t cq_blocked;
  // Set by the agent when it stops serving the ring (the session ended); it then rings the
  // completion doorbell.
  uint32_t agent_closed;
  RingCounters sq;  // process -> agent
  RingCounters cq;  // agent -> process
};
static_assert(std::is_standard_layout_v<ControlRingHeader>);
static_assert(std::is_trivially_copyable_v<ControlRingHeader>);

inline constexpr size_t SubmissionOffset() { return (sizeof(ControlRingHeader) + 63) / 64 * 64; }
inline constexpr size_t CompletionOffset(uint32_t sq_capacity) {
  return SubmissionOffset() + size_t{sq_capacity} * sizeof(SubmissionEntry);
}
inline constexpr size_t TotalBytes(uint32_t sq_capacity, uint32_t cq_capacity) {
  return CompletionOffset(sq_capacity) + size_t{cq_capacity} * sizeof(CompletionEntry);
}

// The configuration a side has checked and keeps (never re-read from shared memory).
struct RingConfig {
  uint32_t sq_capacity = 0;
  uint32_t cq_capacity = 0;
};

// Writes a fresh header (zero counters) into `memory` of `bytes` bytes; the caller created it
// zero-filled. INVALID_ARGUMENT when the capacities are not powers of two in range or `bytes`
// is too small.
absl::Status InitializeHeader(void* memory, size_t bytes, RingConfig config);

// Reads the header of an object mapped with `mapped_bytes` bytes once and checks it: magic,
// version, entry sizes, capacities, total size. INVALID_ARGUMENT naming the bad field.
absl::StatusOr<RingConfig> ReadHeader(const void* memory, size_t mapped_bytes);

enum class RingResult { kOk, kEmpty, kFull, kCorrupt };

// FUTEX_WAIT on a word of a shared mapping (no FUTEX_PRIVATE_FLAG: it works across
// processes): sleeps while *word == expected, at most `timeout`. Returns on a wake, on a
// timeout, at once when the value differs, or spuriously; callers re-check their condition.
void FutexWait(uint32_t* word, uint32_t expected, std::chrono::nanoseconds timeout);
// Bumps *word and FUTEX_WAKEs every sleeper on it.
void Ring(uint32_t* word);

// Adaptive spinning before a doorbell sleep. A futex wake-up costs tens of microseconds on a
// VM, each way; a side that expects its wait to be short first polls the ring (with a CPU pause
// between looks) for at most the budget, and while it polls the other side makes no system call
// either (it rings only a sleeper). "Expects": the moving average of its recent waits, each
// counted at most 4 x the budget, is under the budget. So a loop of quick local operations
// spins, while a process waiting on a collective across the network (hundreds of microseconds
// and more) or an agent between training iterations sleeps at once, and costs no CPU.
// Threading: one thread at a time (the owner's lock or thread).
class SpinPolicy {
 public:
  explicit SpinPolicy(std::chrono::nanoseconds budget = std::chrono::nanoseconds(0))
      : budget_(std::max(budget, std::chrono::nanoseconds(0))) {}

  // How long to poll before the next sleep: the budget, or zero.
  std::chrono::nanoseconds NextSpin() const {
    return average_ < budget_ ? budget_ : std::chrono::nanoseconds(0);
  }
  // One wait that ended: from the moment the side found nothing to the moment it found work,
  // polled and slept alike.
  void Record(std::chrono::nanoseconds waited) {
    const std::chrono::nanoseconds counted =
        std::clamp(waited, std::chrono::nanoseconds(0), 4 * budget_);
    average_ += (counted - average_) / 4;
  }
  std::chrono::nanoseconds budget() const { return budget_; }
  std::chrono::nanoseconds average() const { return average_; }

 private:
  std::chrono::nanoseconds budget_;
  std::chrono::nanoseconds average_{0};
};

// A hint to the CPU that this thread is polling (lets the sibling hyper-thread run).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls `ready` for at most `budget`; true as soon as it holds, false when the budget ran out
// (or is zero).
template <typename Predicate>
bool SpinUntil(std::chrono::nanoseconds budget, Predicate ready) {
  if (budget <= std::chrono::nanoseconds(0)) return false;
  const auto end = std::chrono::steady_clock::now() + budget;
  while (true) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      CpuRelax();
    }
    if (std::chrono::steady_clock::now() >= end) return ready();
  }
}

// The producer end of one direction. Keeps its own head; checks the consumer's tail.
// Threading: one thread at a time (callers serialise pushes).
template <typename Entry>
class RingProducer {
 public:
  RingProducer() = default;
  RingProducer(RingCounters* counters, Entry* slots, uint32_t capacity)
      : c_(counters), slots_(slots), capacity_(capacity) {}

  // Copies `entry` into the next slot and publishes it. kFull when the consumer has not freed
  // a slot, kCorrupt when the consumer's tail is not within [head - capacity, head].
  RingResult Push(const Entry& entry) {
    const uint64_t tail = std::atomic_ref(c_->tail).load(std::memory_order_acquire);
    if (head_ - tail > capacity_) return RingResult::kCorrupt;
    if (head_ - tail == capacity_) return RingResult::kFull;
    std::memcpy(&slots_[head_ & (capacity_ - 1)], &entry, sizeof(Entry));
    ++head_;
    // seq_cst: ordered before the load of `waiting` in Notify (the consumer stores `waiting`,
    // then loads `head`), so one of the two sides always sees the other.
    std::atomic_ref(c_->head).store(head_, std::memory_order_seq_cst);
    return RingResult::kOk;
  }
  // Free slots as of the consumer's current tail (0 when it is corrupt). seq_cst: after the
  // agent's store of `cq_blocked`, against the client's store of `tail` then load of
  // `cq_blocked` (an acquire load is outside the total order, and both sides could miss the
  // other where acquire loads are weaker than seq_cst ones, as with AArch64's LDAPR).
  uint32_t free_slots() const {
    const uint64_t tail = std::atomic_ref(c_->tail).load(std::memory_order_seq_cst);
    const uint64_t used = head_ - tail;
    return used > capacity_ ? 0 : capacity_ - static_cast<uint32_t>(used);
  }
  // Wakes the consumer if it sleeps or is about to; no system call otherwise. True when it rang.
  // Once per sleep: the producer that rings takes `waiting` back to 0, so the pushes that follow
  // while the woken consumer waits for a CPU make no system call (one per entry before: BERT-
  // large's 243 completions cost the agent 243 FUTEX_WAKEs, all but the first waking nobody).
  bool Notify() {
    if (std::atomic_ref(c_->waiting).load(std::memory_order_seq_cst) == 0) return false;
    if (std::atomic_ref(c_->waiting).exchange(0, std::memory_order_seq_cst) == 0) return false;
    Ring(&c_->doorbell);
    return true;
  }
  uint64_t head() const { return head_; }

 private:
  RingCounters* c_ = nullptr;
  Entry* slots_ = nullptr;
  uint32_t capacity_ = 0;
  uint64_t head_ = 0;
};

// The consumer end of one direction. Keeps its own tail; checks the producer's head.
// Threading: Pop from one thread at a time; HasWork and tail from any.
template <typename Entry>
class RingConsumer {
 public:
  RingConsumer() = default;
  RingConsumer(RingCounters* counters, Entry* slots, uint32_t capacity)
      : c_(counters), slots_(slots), capacity_(capacity) {}

  // Copies the oldest entry out (before the caller looks at it: the producer's memory is
  // untrusted) and frees its slot. kEmpty when there is none, kCorrupt when the producer's
  // head is not within [tail, tail + capacity].
  RingResult Pop(Entry* out) {
    const uint64_t head = std::atomic_ref(c_->head).load(std::memory_order_acquire);
    const uint64_t tail = Tail();
    if (head - tail > capacity_) return RingResult::kCorrupt;
    if (head == tail) return RingResult::kEmpty;
    std::memcpy(out, &slots_[tail & (capacity_ - 1)], sizeof(Entry));
    std::atomic_ref(tail_).store(tail + 1, std::memory_order_relaxed);
    std::atomic_ref(c_->tail).store(tail + 1, std::memory_order_seq_cst);
    return RingResult::kOk;
  }
  // True when the producer has published entries not yet popped (or corrupted its head). May
  // run on another thread than Pop's (the agent's ring thread asks while a Submit RPC drains).
  bool HasWork() const {
    return std::atomic_ref(c_->head).load(std::memory_order_seq_cst) != Tail();
  }
  // Sleeps on the doorbell for at most `timeout` unless there is work or `wake_early()` is
  // true once this consumer has announced itself. Returns without sleeping in those cases.
  // The doorbell's sequence is read before `waiting` is set: a producer that takes the flag
  // (Notify) then rings after it, and the futex wait returns at once. Read after, a late Notify
  // for an entry already popped could take the flag and ring in between, and the next push,
  // seeing no flag, would not ring: the sleep would last its whole timeout.
  template <typename Predicate>
  void Sleep(std::chrono::nanoseconds timeout, Predicate wake_early) {
    const uint32_t seq = std::atomic_ref(c_->doorbell).load(std::memory_order_seq_cst);
    std::atomic_ref(c_->waiting).store(1, std::memory_order_seq_cst);
    if (!HasWork() && !wake_early()) FutexWait(&c_->doorbell, seq, timeout);
    std::atomic_ref(c_->waiting).store(0, std::memory_order_seq_cst);
  }
  uint64_t tail() const { return Tail(); }

 private:
  uint64_t Tail() const {
    return std::atomic_ref(const_cast<uint64_t&>(tail_)).load(std::memory_order_relaxed);
  }

  RingCounters* c_ = nullptr;
  Entry* slots_ = nullptr;
  uint32_t capacity_ = 0;
  alignas(8) uint64_t tail_ = 0;  // written by Pop; read by HasWork and tail() on any thread
};

// The two directions of a mapped, checked ring.
struct RingView {
  ControlRingHeader* header = nullptr;
  SubmissionEntry* sq = nullptr;
  CompletionEntry* cq = nullptr;
  RingConfig config;
};
inline RingView ViewOf(void* memory, RingConfig config) {
  auto* base = static_cast<std::byte*>(memory);
  return RingView{reinterpret_cast<ControlRingHeader*>(base),
                  reinterpret_cast<SubmissionEntry*>(base + SubmissionOffset()),
                  reinterpret_cast<CompletionEntry*>(base + CompletionOffset(config.sq_capacity)),
                  config};
}

// A completion for `ticket` with `status`'s code and message (cut to kMaxMessage bytes, the
// cut ones ending in "...").
CompletionEntry MakeCompletion(uint64_t ticket, const absl::Status& status);
// The status a completion carries (its code checked: an unknown code becomes INTERNAL).
absl::Status StatusOf(const CompletionEntry& entry);

}  // namespace tributary::common::shm_ring
