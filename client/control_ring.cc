#include "client/control_ring.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace tributary::client::internal {
namespace {

namespace ring = common::shm_ring;
using SteadyClock = std::chrono::steady_clock;

constexpr auto Log = common::ComponentLog<"client">;

// Longest single sleep of the reader: Close wakes it, this only bounds a lost wake-up.
constexpr std::chrono::milliseconds kMaxReaderSleep{1000};

}  // namespace

absl::StatusOr<std::unique_ptr<ControlRing>> ControlRing::Create(uint32_t capacity,
                                                                 std::chrono::nanoseconds spin) {
  const ring::RingConfig config{capacity, capacity};
  if (capacity < ring::kMinCapacity || capacity > ring::kMaxCapacity ||
      (capacity & (capacity - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("control ring capacity ", capacity, " must be a power of two in [",
                     ring::kMinCapacity, ", ", ring::kMaxCapacity, "]"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SharedBuffer> buffer,
                   SharedBuffer::Create(ring::TotalBytes(capacity, capacity)));
  RETURN_IF_ERROR(ring::InitializeHeader(buffer->data(), buffer->size(), config));
  const ring::RingView view = ring::ViewOf(buffer->data(), config);
  return std::unique_ptr<ControlRing>(new ControlRing(std::move(buffer), view, spin));
}

ControlRing::ControlRing(std::unique_ptr<SharedBuffer> buffer, ring::RingView view,
                         std::chrono::nanoseconds spin)
    : buffer_(std::move(buffer)),
      view_(view),
      sq_(&view_.header->sq, view_.sq, view_.config.sq_capacity),
      cq_(&view_.header->cq, view_.cq, view_.config.cq_capacity),
      spin_(spin) {}

std::shared_ptr<RingSlot> ControlRing::TrySubmit(const RingSubmission& s) {
  if (closed() || s.tensor_name.empty() || s.tensor_name.size() > ring::kMaxTensorName) {
    return nullptr;
  }
  // At most cq_capacity in flight: the agent's completions always find a slot.
  if (in_flight_.load(std::memory_order_acquire) >= view_.config.cq_capacity) {
    std::lock_guard lock(mu_);
    if (!reader_) DrainLocked();
    if (in_flight_.load(std::memory_order_acquire) >= view_.config.cq_capacity) return nullptr;
  }
  auto slot = std::make_shared<RingSlot>();
  slot->ticket = next_ticket_.fetch_add(1, std::memory_order_relaxed);
  ring::SubmissionEntry entry{};
  entry.ticket = slot->ticket;
  entry.buffer_id = s.buffer_id;
  entry.offset_bytes = s.offset_bytes;
  entry.count = s.count;
  entry.dtype = s.dtype;
  entry.op = s.op;
  entry.root_rank = s.root_rank;
  entry.priority = s.priority;
  entry.name_bytes = static_cast<uint32_t>(s.tensor_name.size());
  std::memcpy(entry.name, s.tensor_name.data(), s.tensor_name.size());
  {
    // Registered before it is pushed, so that the reader finds it.
    std::lock_guard lock(mu_);
    if (!closed_.ok()) return nullptr;
    slots_[slot->ticket] = slot;
  }
  in_flight_.fetch_add(1, std::memory_order_acq_rel);
  ring::RingResult pushed;
  {
    std::lock_guard lock(submit_mu_);
    pushed = sq_.Push(entry);
  }
  if (pushed == ring::RingResult::kOk) {
    sq_.Notify();  // a system call only when the agent's ring thread sleeps
    return slot;
  }
  in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  std::lock_guard lock(mu_);
  slots_.erase(slot->ticket);
  if (pushed == ring::RingResult::kCorrupt) {
    CloseLocked(absl::InternalError("the control ring's submission tail is out of range"));
  }
  return nullptr;
}

void ControlRing::DrainLocked() {
  bool popped = false;
  ring::CompletionEntry entry;
  while (true) {
    const ring::RingResult r = cq_.Pop(&entry);
    if (r == ring::RingResult::kEmpty) break;
    if (r == ring::RingResult::kCorrupt) {
      CloseLocked(absl::InternalError("the control ring's completion head is out of range"));
      break;
    }
    popped = true;
    in_flight_.fetch_sub(1, std::memory_order_acq_rel);
    auto it = slots_.find(entry.ticket);
    if (it == slots_.end()) {
      Log()->warn("control ring completion for unknown ticket {} ignored", entry.ticket);
      continue;
    }
    if (std::shared_ptr<RingSlot> slot = it->second.lock()) {
      slot->done = true;
      slot->status = ring::StatusOf(entry);
    }
    slots_.erase(it);  // a handle dropped unwaited just loses its result
  }
  if (!popped) return;
  if (std::atomic_ref(view_.header->cq_blocked).load(std::memory_order_seq_cst) != 0) {
    ring::Ring(&view_.header->sq.doorbell);  // the agent holds results for the freed slots
  }
  cv_.notify_all();
}

std::optional<absl::Status> ControlRing::Wait(RingSlot& slot, SteadyClock::time_point deadline) {
  std::unique_lock lock(mu_);
  // When this call first found its result missing; its wait feeds the spin policy.
  std::optional<SteadyClock::time_point> waiting_since;
  bool polled = false;  // this call polled the completion queue once already
  auto done = [&] {
    if (waiting_since) spin_.Record(SteadyClock::now() - *waiting_since);
    return slot.status;
  };
  while (true) {
    // Once this side closed the ring (Leave), what the agent writes after is not read: an
    // operation still pending then fails with the close's error, however late its waiter comes
    // (the agent answers a session that left with "not found").
    if (slot.done) return done();
    if (!closed_.ok()) return closed_;
    if (!reader_) DrainLocked();
    if (slot.done) return done();
    if (std::atomic_ref(view_.header->agent_closed).load(std::memory_order_acquire) != 0) {
      if (!reader_) DrainLocked();  // what it wrote before closing
      if (slot.done) return done();
      CloseLocked(absl::UnavailableError(
          "the agent closed the control ring: the session ended (the process left, or the "
          "agent shut down or found the ring corrupt)"));
      continue;
    }
    const auto now = SteadyClock::now();
    if (now >= deadline) return std::nullopt;
    if (reader_) {
      cv_.wait_until(lock, deadline);
      continue;
    }
    if (!waiting_since) waiting_since = now;
    reader_ = true;
    const std::chrono::nanoseconds spin =
        polled ? std::chrono::nanoseconds(0)
               : std::min<std::chrono::nanoseconds>(spin_.NextSpin(), deadline - now);
    polled = true;
    lock.unlock();
    auto wake_early = [this] {
      return closed() ||
             std::atomic_ref(view_.header->agent_closed).load(std::memory_order_seq_cst) != 0;
    };
    if (!ring::SpinUntil(spin, [&] { return cq_.HasWork() || wake_early(); })) {
      const auto sleep = std::min<SteadyClock::duration>(deadline - now, kMaxReaderSleep);
      cq_.Sleep(sleep, wake_early);
    }
    lock.lock();
    reader_ = false;
    cv_.notify_all();  // another waiter may take the reader role
  }
}

void ControlRing::Close(absl::Status why) {
  std::lock_guard lock(mu_);
  // Results the agent completed before are in the completion queue: they are the operations'
  // results, not the close's error. (A reader asleep only looks at the queue; popping is done
  // under mu_, so draining here is safe, and CloseLocked wakes that reader.)
  if (closed_.ok()) DrainLocked();
  CloseLocked(std::move(why));
}

void ControlRing::CloseLocked(absl::Status why) {
  if (!closed_.ok()) return;
  closed_ = why.ok() ? absl::UnavailableError("the control ring is closed") : std::move(why);
  closed_flag_.store(true, std::memory_order_seq_cst);
  ring::Ring(&view_.header->cq.doorbell);  // wakes our own reader
  cv_.notify_all();
}

}  // namespace tributary::client::internal
