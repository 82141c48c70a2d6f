#include "client/python/c10d/callback_threads.h"

#include <exception>
#include <utility>

#include "common/logging.h"
#include "common/thread_name.h"

namespace tributary::client::c10d {
namespace {

constexpr auto Log = common::ComponentLog<"c10d">;

}  // namespace

CallbackThreads::CallbackThreads(size_t warn_threads, size_t max_threads,
                                 std::chrono::milliseconds idle_timeout,
                                 std::chrono::milliseconds bound_wait, StartThread start_thread)
    : warn_threads_(warn_threads),
      max_threads_(max_threads == 0 ? 1 : max_threads),
      idle_timeout_(idle_timeout),
      bound_wait_(bound_wait),
      start_thread_(std::move(start_thread)) {}

CallbackThreads& CallbackThreads::Process() {
  static CallbackThreads* threads = new CallbackThreads();
  return *threads;
}

void CallbackThreads::DetachedThread(std::function<void()> body) {
  std::thread([body = std::move(body)] {
    common::SetCurrentThreadName("trib-c10d-cb");
    body();
  }).detach();
}

void CallbackThreads::Run(std::function<void()> task) {
  std::unique_lock<std::mutex> lock(mu_);
  tasks_.push_back(std::move(task));
  if (tasks_.size() <= idle_) {
    cv_.notify_one();
    return;
  }
  if (threads_ >= max_threads_) {
    if (!warned_max_) {
      warned_max_ = true;
      Log()->warn(
          "all {} future-callback threads are busy: completions wait for one (a callback that "
          "blocks on another collective's future holds a thread)",
          max_threads_);
    }
    if (!watching_) {
      watching_ = true;
      try {
        start_thread_([this] { Watch(); });
      } catch (const std::exception& e) {
        watching_ = false;  // the next task at the bound tries again
        Log()->error("cannot start the future-callback threads' watcher ({})", e.what());
      }
    }
    return;
  }
  if (threads_ >= warn_threads_ && !warned_many_) {
    warned_many_ = true;
    Log()->warn(
        "{} future-callback threads are busy: starting more, up to {} (callbacks that "
        "block hold a thread each)",
        threads_, max_threads_);
  }
  const std::string error = StartLoopLocked();
  if (error.empty() || threads_ > 0) return;  // a running thread takes the task when it is free
  std::function<void()> mine = std::move(tasks_.back());
  tasks_.pop_back();
  lock.unlock();
  Log()->warn("cannot start a future-callback thread ({}): completing the future on this thread",
              error);
  mine();
}

std::string CallbackThreads::StartLoopLocked() {
  ++threads_;  // counted before it runs: Loop's exit takes it back
  try {
    start_thread_([this] { Loop(); });
  } catch (const std::exception& e) {
    --threads_;
    return e.what();
  }
  return "";
}

void CallbackThreads::Watch() {
  std::unique_lock<std::mutex> lock(mu_);
  bool logged_stuck = false;  // one line per spell for what cannot be helped
  while (!tasks_.empty()) {
    const uint64_t taken = taken_;
    if (watch_cv_.wait_for(lock, bound_wait_, [&] { return tasks_.empty(); })) break;
    if (taken_ != taken || idle_ >= tasks_.size()) continue;  // the threads make progress
    const size_t busy = threads_;
    if (busy >= 2 * max_threads_) {
      ++ceiling_hits_;
      if (!std::exchange(logged_stuck, true)) {
        Log()->error(
            "no future-callback thread took a completion for {} ms with all {} busy, twice the "
            "bound: starting no more ({} completions wait; callbacks that block on other "
            "collectives hold every thread)",
            bound_wait_.count(), busy, tasks_.size());
      }
      continue;
    }
    const std::string error = StartLoopLocked();
    if (error.empty()) {
      Log()->error(
          "no future-callback thread took a completion for {} ms with all {} busy: starting one "
          "more (callbacks blocked on collectives whose completions wait behind them would "
          "otherwise wait for good; {} completions wait)",
          bound_wait_.count(), busy, tasks_.size());
    } else if (!std::exchange(logged_stuck, true)) {
      Log()->error("no future-callback thread took a completion for {} ms and none can start ({})",
                   bound_wait_.count(), error);
    }
  }
  watching_ = false;
}

size_t CallbackThreads::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return threads_;
}

uint64_t CallbackThreads::ceiling_hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ceiling_hits_;
}

size_t CallbackThreads::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tasks_.size();
}

void CallbackThreads::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ++idle_;
    const bool got = cv_.wait_for(lock, idle_timeout_, [&] { return !tasks_.empty(); });
    --idle_;
    if (!got) {
      --threads_;
      return;
    }
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    ++taken_;
    if (tasks_.empty() && watching_) watch_cv_.notify_one();
    lock.unlock();
    task();
    task = nullptr;  // its captures go before the lock is taken again
    lock.lock();
  }
}

}  // namespace tributary::client::c10d
