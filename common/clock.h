// Time as an injected dependency: production code asks a Clock, tests drive a FakeClock.
#pragma once

#include <chrono>
#include <mutex>

namespace tributary::common {

// Monotonic time source. Implementations are thread-safe.
class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

// The process's steady clock.
class SystemClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  // A process-wide instance for production wiring.
  static SystemClock* Get();
};

// A clock that moves only when a test advances it.
class FakeClock final : public Clock {
 public:
  TimePoint Now() const override {
    std::lock_guard lock(mu_);
    return now_;
  }
  void Advance(std::chrono::nanoseconds d) {
    std::lock_guard lock(mu_);
    now_ += d;
  }

 private:
  mutable std::mutex mu_;
  TimePoint now_{std::chrono::seconds(1000)};
};

}  // namespace tributary::common
