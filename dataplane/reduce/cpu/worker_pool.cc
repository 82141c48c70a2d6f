#include "dataplane/reduce/cpu/worker_pool.h"

#include <algorithm>

#include "common/status_macros.h"
#include "common/thread_name.h"

namespace tributary::dataplane {

WorkerPool::WorkerPool(int num_workers) {
  TRIBUTARY_CHECK(num_workers >= 0);
  workers_.reserve(num_workers);
  for (int i = 0; i < num_workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

int WorkerPool::ClaimLocked(Job* job) {
  const int part = job->next++;
  if (job->next == job->parts) queue_.erase(std::find(queue_.begin(), queue_.end(), job));
  return part;
}

void WorkerPool::ParallelFor(int parts, absl::FunctionRef<void(int)> fn) {
  if (parts <= 0) return;
  if (parts == 1 || workers_.empty()) {
    for (int p = 0; p < parts; ++p) fn(p);
    return;
  }
  Job job{fn, parts, 0, parts};
  {
    std::lock_guard lock(mu_);
    queue_.push_back(&job);
  }
  for (int i = 0; i < std::min(parts - 1, num_workers()); ++i) work_cv_.notify_one();
  std::unique_lock lock(mu_);
  while (job.next < job.parts) {
    const int part = ClaimLocked(&job);
    lock.unlock();
    job.fn(part);
    lock.lock();
    --job.remaining;
  }
  done_cv_.wait(lock, [&job] { return job.remaining == 0; });
}

void WorkerPool::WorkerLoop() {
  common::SetCurrentThreadName("trib-reduce");
  std::unique_lock lock(mu_);
  while (true) {
    work_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    Job* job = queue_.front();
    const int part = ClaimLocked(job);
    lock.unlock();
    job->fn(part);
    lock.lock();
    // Under the lock: once its caller sees remaining == 0 it returns and destroys `job`.
    if (--job->remaining == 0) done_cv_.notify_all();
  }
}

}  // namespace tributary::dataplane
