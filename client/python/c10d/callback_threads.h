// The threads on which the backend completes its works' futures (process_group_tributary.cc):
// a future's callbacks run where it is completed, and one may block on another collective's
// future, so each gets a thread of its own, up to a bound.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace tributary::client::c10d {

// Runs each task on an idle thread, starting a new thread whenever more tasks wait than threads
// are idle, so that a task that blocks does not hold up another (a future callback may wait on
// a collective whose future is completed by a later task: DDP's PowerSGD hook does, one per
// bucket). Past `warn_threads` threads the log says so, once; at `max_threads`, tasks wait for a
// thread. That wait has a deadline: when no thread has taken a task for `bound_wait`, the
// threads may all be callbacks blocked on completions that wait behind them, so one thread more
// is started past the bound (logged as an error), and again after each `bound_wait` without
// progress, up to twice the bound (then tasks wait, as callbacks that block on each other
// cannot be helped by threads). A thread idle for `idle_timeout` ends. When no thread can be
// started (start_thread throws: the process is out of threads), the task waits for a running
// thread, or runs on the caller's when there is none.
//
// Threading: Run from any thread. The threads are detached: the object must outlive them (the
// process's one, Process(), is never destroyed, as its threads may still run callbacks while
// the interpreter exits).
class CallbackThreads {
 public:
  using StartThread = std::function<void(std::function<void()> body)>;

  static constexpr size_t kWarnThreads = 64;
  static constexpr size_t kMaxThreads = 1024;

  // `start_thread` runs its argument on a new detached thread (tests inject failures).
  explicit CallbackThreads(size_t warn_threads = kWarnThreads, size_t max_threads = kMaxThreads,
                           std::chrono::milliseconds idle_timeout = std::chrono::minutes(1),
                           std::chrono::milliseconds bound_wait = std::chrono::seconds(1),
                           StartThread start_thread = DetachedThread);

  static CallbackThreads& Process();

  void Run(std::function<void()> task);

  // Threads started and not ended (past the bound included); tasks waiting for a thread.
  size_t threads() const;
  size_t queued() const;
  // Times the watcher found no progress with twice the bound of threads busy.
  uint64_t ceiling_hits() const;

 private:
  static void DetachedThread(std::function<void()> body);
  void Loop();
  // While tasks wait at the bound: a thread past it after each bound_wait_ without progress.
  void Watch();
  // Starts a thread running Loop, counted in threads_; "" or why it could not. mu_ held.
  std::string StartLoopLocked();

  const size_t warn_threads_;
  const size_t max_threads_;
  const std::chrono::milliseconds idle_timeout_;
  const std::chrono::milliseconds bound_wait_;
  const StartThread start_thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;               // idle threads wait for tasks
  std::condition_variable watch_cv_;         // the watcher waits for the queue to empty
  std::deque<std::function<void()>> tasks_;  // Guarded by mu_.
  size_t idle_ = 0;                          // Guarded by mu_.
  size_t threads_ = 0;                       // Guarded by mu_: running Loop.
  bool warned_many_ = false;                 // Guarded by mu_.
  bool warned_max_ = false;                  // Guarded by mu_.
  bool watching_ = false;                    // Guarded by mu_: Watch runs.
  uint64_t taken_ = 0;                       // Guarded by mu_: tasks taken by threads, ever.
  uint64_t ceiling_hits_ = 0;                // Guarded by mu_.
};

}  // namespace tributary::client::c10d
