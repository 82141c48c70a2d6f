#include "common/shm_ring.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"

namespace tributary::common::shm_ring {
namespace {

bool ValidCapacity(uint32_t c) {
  return c >= kMinCapacity && c <= kMaxCapacity && (c & (c - 1)) == 0;
}

}  // namespace

absl::Status InitializeHeader(void* memory, size_t bytes, RingConfig config) {
  if (!ValidCapacity(config.sq_capacity) || !ValidCapacity(config.cq_capacity)) {
    return absl::InvalidArgumentError(
        absl::StrCat("control ring capacities ", config.sq_capacity, "/", config.cq_capacity,
                     " must be powers of two in [", kMinCapacity, ", ", kMaxCapacity, "]"));
  }
  const size_t needed = TotalBytes(config.sq_capacity, config.cq_capacity);
  if (bytes < needed) {
    return absl::InvalidArgumentError(
        absl::StrCat("control ring needs ", needed, " bytes, the object has ", bytes));
  }
  auto* h = static_cast<ControlRingHeader*>(memory);
  std::memset(h, 0, sizeof(ControlRingHeader));
  h->version = kVersion;
  h->sq_capacity = config.sq_capacity;
  h->cq_capacity = config.cq_capacity;
  h->sq_entry_bytes = sizeof(SubmissionEntry);
  h->cq_entry_bytes = sizeof(CompletionEntry);
  h->total_bytes = needed;
  // The magic last: a reader that sees it sees the rest (the RPC that follows orders it anyway).
  std::atomic_ref(h->magic).store(kMagic, std::memory_order_release);
  return absl::OkStatus();
}

absl::StatusOr<RingConfig> ReadHeader(const void* memory, size_t mapped_bytes) {
  if (mapped_bytes < sizeof(ControlRingHeader)) {
    return absl::InvalidArgumentError(
        absl::StrCat("control ring object of ", mapped_bytes, " bytes is smaller than its header"));
  }
  ControlRingHeader h;  // one copy: the client may change the object concurrently
  std::memcpy(&h, memory, sizeof(h));
  if (h.magic != kMagic) {
    return absl::InvalidArgumentError("control ring has a bad magic number (not a control ring?)");
  }
  if (h.version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("control ring layout version ", h.version,
                                                   " is not supported (this agent speaks ",
                                                   kVersion, ")"));
  }
  if (h.sq_entry_bytes != sizeof(SubmissionEntry) || h.cq_entry_bytes != sizeof(CompletionEntry)) {
    return absl::InvalidArgumentError(
        absl::StrCat("control ring entry sizes ", h.sq_entry_bytes, "/", h.cq_entry_bytes,
                     " are not ", sizeof(SubmissionEntry), "/", sizeof(CompletionEntry)));
  }
  if (!ValidCapacity(h.sq_capacity) || !ValidCapacity(h.cq_capacity)) {
    return absl::InvalidArgumentError(absl::StrCat("control ring capacities ", h.sq_capacity, "/",
                                                   h.cq_capacity, " must be powers of two in [",
                                                   kMinCapacity, ", ", kMaxCapacity, "]"));
  }
  const size_t needed = TotalBytes(h.sq_capacity, h.cq_capacity);
  if (h.total_bytes != needed || mapped_bytes < needed) {
    return absl::InvalidArgumentError(absl::StrCat("control ring needs ", needed,
                                                   " bytes; header says ", h.total_bytes,
                                                   ", the mapping has ", mapped_bytes));
  }
  if (h.sq.head != 0 || h.sq.tail != 0 || h.cq.head != 0 || h.cq.tail != 0) {
    return absl::InvalidArgumentError("control ring counters must start at zero");
  }
  return RingConfig{h.sq_capacity, h.cq_capacity};
}

void FutexWait(uint32_t* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  if (timeout <= std::chrono::nanoseconds(0)) return;
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(timeout);
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(secs.count());
  ts.tv_nsec = static_cast<long>((timeout - secs).count());
  // EAGAIN (value changed), EINTR and ETIMEDOUT all mean: re-check.
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void Ring(uint32_t* word) {
  std::atomic_ref(*word).fetch_add(1, std::memory_order_seq_cst);
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

CompletionEntry MakeCompletion(uint64_t ticket, const absl::Status& status) {
  CompletionEntry e{};
  e.ticket = ticket;
  e.code = static_cast<int32_t>(status.code());
  const absl::string_view message = status.message();
  if (message.size() <= kMaxMessage) {
    e.message_bytes = static_cast<uint32_t>(message.size());
    // An OK status's message has a null data(): memcpy from null is undefined even for 0 bytes.
    if (!message.empty()) std::memcpy(e.message, message.data(), message.size());
  } else {
    constexpr std::string_view kCut = "...";
    const size_t keep = kMaxMessage - kCut.size();
    std::memcpy(e.message, message.data(), keep);
    std::memcpy(e.message + keep, kCut.data(), kCut.size());
    e.message_bytes = kMaxMessage;
  }
  return e;
}

absl::Status StatusOf(const CompletionEntry& entry) {
  const uint32_t bytes = std::min(entry.message_bytes, kMaxMessage);
  absl::string_view message(entry.message, bytes);
  if (entry.code < 0 || entry.code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::InternalError(
        absl::StrCat("the agent sent an unknown status code ", entry.code, ": ", message));
  }
  return absl::Status(static_cast<absl::StatusCode>(entry.code), message);
}

}  // namespace tributary::common::shm_ring
