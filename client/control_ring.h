// The client's end of a session's control ring (the fast path; layout in common/shm_ring.h):
// collectives are pushed into a shared-memory submission queue and their results read from a
// completion queue, without a gRPC call or a thread hop per operation.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/shm_buffer.h"
#include "common/shm_ring.h"

namespace tributary::client::internal {

// One submission's result as the ring delivers it. Shared by the Handle (and its copies) and
// the ring until the result arrives; `done` and `status` are guarded by the ring's mutex.
struct RingSlot {
  uint64_t ticket = 0;
  bool done = false;
  absl::Status status;
};

// What a submission names (the session is the ring's).
struct RingSubmission {
  std::string_view tensor_name;  // 1..common::shm_ring::kMaxTensorName bytes
  uint64_t buffer_id = 0;
  uint64_t offset_bytes = 0;
  uint64_t count = 0;
  int32_t dtype = 0;  // tributary.v1.DataType
  int32_t op = 0;     // tributary.v1.CollectiveOp
  uint32_t root_rank = 0;
  int32_t priority = 0;
};

// Ownership: owns the shared-memory object (created here, unlinked once the agent mapped it or
// when this goes away). Shared by the session, its Client and its Handles.
// Threading: thread-safe. Submissions are serialised by a mutex (the queue has one producer).
// Results are read by one thread at a time: a waiter becomes the reader, drains the completion
// queue into the slots of whoever submitted them and sleeps on the completion doorbell (the
// agent rings it only when the reader announced itself), after polling it for a moment when
// recent waits were short; other waiters sleep on a condition
// variable and the reader wakes them when their result, or the reader role, is free.
class ControlRing {
 public:
  // Creates the object with `capacity` entries per direction (a power of two in [2, 4096]).
  // A waiter whose recent waits were shorter than `spin` polls the completion queue for up to
  // that long before it sleeps on the doorbell (common/shm_ring.h SpinPolicy; zero: never).
  static absl::StatusOr<std::unique_ptr<ControlRing>> Create(
      uint32_t capacity, std::chrono::nanoseconds spin = common::shm_ring::kDefaultSpin);
  ControlRing(const ControlRing&) = delete;
  ControlRing& operator=(const ControlRing&) = delete;

  // For AttachControlRing: the ring's memfd (until CloseMemfd) and size, to register it with
  // the agent over the buffer socket.
  int memfd() const { return buffer_->fd(); }
  uint64_t size_bytes() const { return buffer_->size(); }
  // The agent has mapped the memory: the descriptor can go (the mappings keep it alive).
  void CloseMemfd() { buffer_->fd_.Reset(); }

  // Pushes a submission and returns its slot; null when the ring cannot take it now (as many
  // operations in flight as the completion queue holds, submission queue full, or closed):
  // the caller submits over gRPC instead.
  std::shared_ptr<RingSlot> TrySubmit(const RingSubmission& submission);

  // Waits until `slot`'s result arrives (returns it), the ring is closed (returns why) or
  // `deadline` passes (nullopt; the operation goes on). A past deadline polls once.
  std::optional<absl::Status> Wait(RingSlot& slot, std::chrono::steady_clock::time_point deadline);

  // Ends the ring: every waiter, now and later, whose result has not arrived gets `why` (the
  // first call's); submissions go elsewhere. Wakes the reader. Idempotent.
  void Close(absl::Status why);
  bool closed() const { return closed_flag_.load(std::memory_order_acquire); }

  // Operations submitted whose result has not been read from the completion queue.
  uint32_t in_flight() const { return in_flight_.load(std::memory_order_acquire); }

 private:
  ControlRing(std::unique_ptr<SharedBuffer> buffer, common::shm_ring::RingView view,
              std::chrono::nanoseconds spin);

  // Pops every completion into its slot, frees slots for the agent (ringing it when it is
  // blocked) and wakes the waiters. mu_ held; reader_ false (a reader asleep would not see
  // what this popped until its doorbell rings), or the ring being closed (which rings it).
  void DrainLocked();
  void CloseLocked(absl::Status why);

  const std::unique_ptr<SharedBuffer> buffer_;
  const common::shm_ring::RingView view_;

  std::mutex submit_mu_;
  common::shm_ring::RingProducer<common::shm_ring::SubmissionEntry> sq_;  // Guarded by submit_mu_.
  std::atomic<uint64_t> next_ticket_{1};
  std::atomic<uint32_t> in_flight_{0};
  std::atomic<bool> closed_flag_{false};

  std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_; the reader reads its tail while it sleeps, with reader_ set.
  common::shm_ring::RingConsumer<common::shm_ring::CompletionEntry> cq_;
  bool reader_ = false;  // Guarded by mu_: a waiter reads (or sleeps on) the completion queue.
  common::shm_ring::SpinPolicy spin_;                            // Guarded by mu_.
  std::unordered_map<uint64_t, std::weak_ptr<RingSlot>> slots_;  // Guarded by mu_: in flight.
  absl::Status closed_;                                          // Guarded by mu_.
};

}  // namespace tributary::client::internal
