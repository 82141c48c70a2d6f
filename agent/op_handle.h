// The result of one local process's submission, and the waits parked on it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"

namespace tributary::agent {

// Thread-safe. Completed once, by the data plane's `done` or by a failed gather; waiters are
// answered outside its mutex.
class OpHandle {
 public:
  // Answers one wait: the operation's result and done = true, or OK and done = false when the
  // wait's timeout passed first.
  using Reply = std::function<void(const absl::Status& status, bool done)>;
  struct Waiter {
    Reply reply;
    common::Clock::TimePoint deadline;
  };

  // Records the result (the first call wins) and answers every parked waiter.
  void Complete(const absl::Status& status);
  // The result when done (`waiter` is left as it was). Otherwise nullopt, and `*waiter`, unless
  // null, is moved into the handle and parked until Complete or ExpireWaiters.
  std::optional<absl::Status> ResultOrPark(Waiter* waiter);
  // Answers (done = false) the parked waiters whose deadline is at or before `now`; `all`
  // answers every one.
  void ExpireWaiters(common::Clock::TimePoint now, bool all);
  // Done, and the result went to a parked waiter: nobody needs the handle any more.
  bool done_and_delivered() const;
  // Parameter-server pulls: the parameters' version, set before Complete.
  void set_version(uint64_t v) { version_.store(v, std::memory_order_release); }
  uint64_t version() const { return version_.load(std::memory_order_acquire); }

 private:
  mutable std::mutex mu_;
  bool done_ = false;            // Guarded by mu_.
  bool delivered_ = false;       // Guarded by mu_: Complete answered a parked waiter.
  absl::Status status_;          // Guarded by mu_.
  std::vector<Waiter> waiters_;  // Guarded by mu_.
  std::atomic<uint64_t> version_{0};
};

}  // namespace tributary::agent
