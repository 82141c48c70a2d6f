// Work decided under a lock and run after it is released: completing operation handles,
// ending KeepAlive streams, calling the data plane. Keeps those calls (which may take locks of
// their own or run for a while) out of the agent's critical sections.
#pragma once

#include <functional>
#include <utility>
#include <vector>

namespace tributary::agent {

// Not thread-safe: one per critical section, on the stack of the thread that owns the lock.
class Deferred {
 public:
  Deferred() = default;
  Deferred(const Deferred&) = delete;
  Deferred& operator=(const Deferred&) = delete;
  // Runs what is left (Run should have been called after the lock was released).
  ~Deferred() { Run(); }

  void Add(std::function<void()> work) { work_.push_back(std::move(work)); }
  // Runs the queued work in order; call it with no lock held.
  void Run() {
    std::vector<std::function<void()>> work;
    work.swap(work_);
    for (auto& w : work) w();
  }
  bool empty() const { return work_.empty(); }

 private:
  std::vector<std::function<void()>> work_;
};

}  // namespace tributary::agent
