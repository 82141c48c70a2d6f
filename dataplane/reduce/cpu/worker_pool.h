// A small set of persistent threads that run the parts of data-parallel calls.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace tributary::dataplane {

// Runs the parts of ParallelFor calls on `num_workers` threads owned by the pool plus the
// calling thread.
//
// Threading: ParallelFor may be called from any number of threads at once (but not from inside
// a part). Every caller runs parts of its own call too, so a call completes even when all
// workers are busy with other calls; workers never block inside a part. The destructor joins
// the workers and must not run concurrently with ParallelFor.
class WorkerPool {
 public:
  // num_workers >= 0; 0 makes ParallelFor run everything on the calling thread.
  explicit WorkerPool(int num_workers);
  ~WorkerPool();

  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Calls fn(part) once for each part in [0, parts), in any order and on any of the pool's
  // threads or the caller's, and returns when every call has returned.
  void ParallelFor(int parts, absl::FunctionRef<void(int)> fn);

  int num_workers() const { return static_cast<int>(workers_.size()); }

 private:
  // One ParallelFor call; lives on the caller's stack and stays queued while parts remain
  // unclaimed. All fields are guarded by mu_.
  struct Job {
    absl::FunctionRef<void(int)> fn;
    int parts;
    int next = 0;       // First unclaimed part.
    int remaining = 0;  // Parts not yet finished.
  };

  // Claims the next part of `job` (mu_ held); dequeues the job when it was the last one.
  int ClaimLocked(Job* job);
  void WorkerLoop();

  std::mutex mu_;
  std::condition_variable work_cv_;  // Signals queued jobs or shutdown to workers.
  std::condition_variable done_cv_;  // Signals finished parts to waiting callers.
  std::deque<Job*> queue_;           // Jobs with unclaimed parts, oldest first.
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace tributary::dataplane
