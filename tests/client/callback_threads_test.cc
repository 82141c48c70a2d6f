// The c10d backend's future-callback threads (client/python/c10d/callback_threads.h): a task
// that blocks gets a thread of its own up to the bound, the rest wait for one, and for a thread
// past the bound when no thread takes a task for the bound's wait; a thread that cannot be
// started leaves the task to a running thread, or to the caller when none runs.
#include "client/python/c10d/callback_threads.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "gtest/gtest.h"

namespace tributary::client::c10d {
namespace {

using namespace std::chrono_literals;

// Tasks that block until Open(); counts those that started and finished.
class Gate {
 public:
  void Pass() {
    std::unique_lock lock(mu_);
    ++started_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
    ++finished_;
    cv_.notify_all();
  }
  void Open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool WaitStarted(int n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 10s, [&] { return started_ >= n; });
  }
  bool WaitFinished(int n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 10s, [&] { return finished_ >= n; });
  }
  int started() {
    std::lock_guard lock(mu_);
    return started_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int started_ = 0;
  int finished_ = 0;
};

TEST(CallbackThreadsTest, BlockedTasksGetAThreadEachUpToTheBoundAndTheRestWait) {
  constexpr int kMax = 4;
  // Never destroyed, as the process's one: detached threads may outlive the test body (held by
  // statics, so that LeakSanitizer sees them reachable).
  static auto* threads = new CallbackThreads(kMax / 2, kMax, 1h, 1h);
  static auto* gate = new Gate();
  for (int i = 0; i < kMax + 3; ++i) threads->Run([] { gate->Pass(); });
  EXPECT_EQ(threads->threads(), static_cast<size_t>(kMax));
  ASSERT_TRUE(gate->WaitStarted(kMax));
  EXPECT_EQ(threads->queued(), 3u);
  EXPECT_EQ(gate->started(), kMax);
  gate->Open();
  ASSERT_TRUE(gate->WaitFinished(kMax + 3));
  EXPECT_EQ(threads->threads(), static_cast<size_t>(kMax));
}

// Every thread runs a callback blocked on what a queued task does (DDP's PowerSGD hook waiting on
// the future of a collective whose completion is behind it): after the bound's wait, a thread
// past the bound runs that task, and everything finishes.
TEST(CallbackThreadsTest, TasksBlockedOnAQueuedTaskGetAThreadPastTheBoundAfterItsWait) {
  constexpr int kMax = 2;
  static auto* threads = new CallbackThreads(kMax, kMax, 1h, 200ms);
  static auto* gate = new Gate();
  for (int i = 0; i < kMax; ++i) threads->Run([] { gate->Pass(); });
  ASSERT_TRUE(gate->WaitStarted(kMax));
  threads->Run([] { gate->Open(); });
  ASSERT_TRUE(gate->WaitFinished(kMax));
  EXPECT_GE(threads->threads(), static_cast<size_t>(kMax + 1));
  EXPECT_LE(threads->threads(), static_cast<size_t>(2 * kMax));
  EXPECT_EQ(threads->queued(), 0u);
}

// Callbacks that block for good (on each other, say) get threads past the bound up to twice it,
// and no more: the rest wait.
TEST(CallbackThreadsTest, ThreadsPastTheBoundStopAtTwiceIt) {
  constexpr int kMax = 2;
  static auto* threads = new CallbackThreads(kMax, kMax, 1h, 1ms);
  static auto* gate = new Gate();  // never opened
  for (int i = 0; i < 2 * kMax + 1; ++i) threads->Run([] { gate->Pass(); });
  ASSERT_TRUE(gate->WaitStarted(2 * kMax));
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (threads->ceiling_hits() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_GE(threads->ceiling_hits(), 3u);
  EXPECT_EQ(threads->threads(), static_cast<size_t>(2 * kMax));
  EXPECT_EQ(threads->queued(), 1u);
  EXPECT_EQ(gate->started(), 2 * kMax);
}

TEST(CallbackThreadsTest, IdleThreadsEnd) {
  static auto* threads = new CallbackThreads(1, 2, 1ms, 1h);
  static auto* gate = new Gate();
  gate->Open();
  threads->Run([] { gate->Pass(); });
  ASSERT_TRUE(gate->WaitFinished(1));
  // The thread ends after 1 ms without work; a later task starts another.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (threads->threads() != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_EQ(threads->threads(), 0u);
  threads->Run([] { gate->Pass(); });
  ASSERT_TRUE(gate->WaitFinished(2));
}

TEST(CallbackThreadsTest, ATaskWhoseThreadCannotStartRunsOnTheCallerWhenNoneRuns) {
  std::atomic<bool> fail{true};
  static auto* threads = new CallbackThreads(4, 4, 1h, 1h, [&fail](std::function<void()> body) {
    if (fail)
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
    std::thread(std::move(body)).detach();
  });
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  threads->Run([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, caller);
  EXPECT_EQ(threads->threads(), 0u);

  // With a thread running (blocked), a failed start leaves the task queued for it.
  fail = false;
  static auto* gate = new Gate();
  threads->Run([] { gate->Pass(); });
  ASSERT_TRUE(gate->WaitStarted(1));
  fail = true;
  std::atomic<bool> second{false};
  threads->Run([&second] { second = true; });
  EXPECT_EQ(threads->threads(), 1u);
  EXPECT_EQ(threads->queued(), 1u);
  EXPECT_FALSE(second);
  gate->Open();
  ASSERT_TRUE(gate->WaitFinished(1));
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!second && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_TRUE(second);
}

}  // namespace
}  // namespace tributary::client::c10d
