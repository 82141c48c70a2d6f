#include "agent/op_handle.h"

namespace tributary::agent {

void OpHandle::Complete(const absl::Status& status) {
  std::vector<Waiter> waiters;
  {
    std::lock_guard lock(mu_);
    if (done_) return;
    done_ = true;
    status_ = status;
    delivered_ = !waiters_.empty();
    waiters.swap(waiters_);
  }
  for (Waiter& w : waiters) w.reply(status, /*done=*/true);
}

std::optional<absl::Status> OpHandle::ResultOrPark(Waiter* waiter) {
  std::lock_guard lock(mu_);
  if (done_) return status_;
  if (waiter != nullptr) waiters_.push_back(std::move(*waiter));
  return std::nullopt;
}

void OpHandle::ExpireWaiters(common::Clock::TimePoint now, bool all) {
  std::vector<Waiter> expired;
  {
    std::lock_guard lock(mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (all || it->deadline <= now) {
        expired.push_back(std::move(*it));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Waiter& w : expired) w.reply(absl::OkStatus(), /*done=*/false);
}

bool OpHandle::done_and_delivered() const {
  std::lock_guard lock(mu_);
  return done_ && delivered_;
}

}  // namespace tributary::agent
