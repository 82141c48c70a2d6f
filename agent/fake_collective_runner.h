// A CollectiveRunner for tests: records what it is asked, fails Start on demand, and leaves
// every started operation pending until the test completes it -- or, with CompleteOnStart,
// completes each at once as the data plane of a one-node job would (tests and benchmarks of the
// local path).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agent/collective_runner.h"

namespace tributary::agent {

// Thread-safe.
class FakeCollectiveRunner final : public CollectiveRunner {
 public:
  struct SetJobCall {
    dataplane::JobView view;
    dataplane::Algorithm algorithm;
  };
  struct StartCall {
    std::string job_id;
    dataplane::Operation op;
    std::thread::id thread;  // the thread that called Start
  };
  struct AbortCall {
    std::string job_id;
    std::string tensor;
    uint64_t iteration;
    absl::Status reason;
  };

  // While held, Start waits (on the starting thread) until ReleaseStarts -- except on the
  // thread that called HoldStarts, whose starts go through (recorded with their thread), so that
  // a test expecting its starts on another thread fails rather than blocks itself.
  void HoldStarts() {
    std::lock_guard lock(mu_);
    hold_starts_ = true;
    holder_ = std::this_thread::get_id();
  }
  void ReleaseStarts() {
    {
      std::lock_guard lock(mu_);
      hold_starts_ = false;
    }
    released_.notify_all();
  }
  // Waits until Start has been called `n` times (num_starts), at most `timeout`; false if not.
  bool WaitForStarts(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return started_.wait_for(lock, timeout,
                             [&] { return starts_.size() + completed_on_start_ >= n; });
  }
  // Start returns `status` from now on (OK: the operation is kept pending).
  void FailStartWith(absl::Status status) {
    std::lock_guard lock(mu_);
    start_error_ = std::move(status);
  }
  // From now on Start computes each operation at once, on the starting thread, as a job of
  // this one node would, and runs its `done`: sum and average of float32 buffers (written into
  // every buffer), broadcast of the root's buffer (any dtype), all-gather (any dtype) and
  // reduce-scatter (float32) with block l belonging to local buffer l; a sum, average or
  // reduce-scatter of another dtype completes with UNIMPLEMENTED. Such operations are counted
  // (num_starts) but not kept (start(i) is not available for them).
  void CompleteOnStart(bool on) {
    std::lock_guard lock(mu_);
    complete_on_start_ = on;
  }
  // Runs the `index`-th started operation's `done` with `status` (once).
  void Complete(size_t index, const absl::Status& status) {
    std::function<void(absl::Status)> done;
    {
      std::lock_guard lock(mu_);
      done = std::move(starts_.at(index).op.done);
      starts_.at(index).op.done = nullptr;
    }
    if (done) done(status);
  }
  // What the heartbeat's next TakeObservations returns.
  void AddObservation(const std::string& job_id, JobObservation o) {
    std::lock_guard lock(mu_);
    observations_[job_id] = o;
  }
  void SetTraffic(uint64_t sent, uint64_t received) {
    std::lock_guard lock(mu_);
    sent_ = sent;
    received_ = received;
  }
  // Runs the plan-missing callback, as a peer naming an unknown job would.
  void ReportPlanMissing() {
    std::function<void()> cb;
    {
      std::lock_guard lock(mu_);
      cb = plan_missing_;
    }
    if (cb) cb();
  }

  std::vector<SetJobCall> set_jobs() const {
    std::lock_guard lock(mu_);
    return set_jobs_;
  }
  std::vector<std::string> removed_jobs() const {
    std::lock_guard lock(mu_);
    return removed_jobs_;
  }
  size_t num_starts() const {
    std::lock_guard lock(mu_);
    return starts_.size() + completed_on_start_;
  }
  // A copy of the `index`-th Start call (its `done` is empty once completed).
  StartCall start(size_t index) const {
    std::lock_guard lock(mu_);
    return starts_.at(index);
  }
  std::vector<AbortCall> aborts() const {
    std::lock_guard lock(mu_);
    return aborts_;
  }
  int ticks() const {
    std::lock_guard lock(mu_);
    return ticks_;
  }
  bool shut_down() const {
    std::lock_guard lock(mu_);
    return shut_down_;
  }

  void SetJob(const dataplane::JobView& view, dataplane::Algorithm algorithm) override {
    std::lock_guard lock(mu_);
    set_jobs_.push_back({view, algorithm});
  }
  void RemoveJob(const std::string& job_id) override {
    std::lock_guard lock(mu_);
    removed_jobs_.push_back(job_id);
  }
  absl::Status Start(const std::string& job_id, dataplane::Operation op) override {
    {
      std::unique_lock lock(mu_);
      released_.wait(lock, [&] { return !hold_starts_ || std::this_thread::get_id() == holder_; });
      if (!start_error_.ok()) return start_error_;
      if (!complete_on_start_) {
        starts_.push_back({job_id, std::move(op), std::this_thread::get_id()});
        started_.notify_all();
        return absl::OkStatus();
      }
      ++completed_on_start_;
      started_.notify_all();
      if (op.staged != nullptr && !op.staged->complete()) {
        // Computed once its whole input is there (StagedInputAdvanced).
        staged_.push_back(std::move(op));
        return absl::OkStatus();
      }
    }
    op.done(ComputeLocally(op));
    return absl::OkStatus();
  }
  void StagedInputAdvanced(const std::string& job_id, const std::string& tensor,
                           uint64_t iteration) override {
    std::vector<dataplane::Operation> ready;
    {
      std::lock_guard lock(mu_);
      for (auto it = staged_.begin(); it != staged_.end();) {
        if (it->tensor_name == tensor && it->iteration == iteration && it->staged->complete()) {
          ready.push_back(std::move(*it));
          it = staged_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (dataplane::Operation& op : ready) op.done(ComputeLocally(op));
  }
  void Abort(const std::string& job_id, const std::string& tensor, uint64_t iteration,
             const absl::Status& reason) override {
    std::vector<dataplane::Operation> failed;
    {
      std::lock_guard lock(mu_);
      aborts_.push_back({job_id, tensor, iteration, reason});
      for (auto it = staged_.begin(); it != staged_.end();) {
        if (it->tensor_name == tensor && it->iteration == iteration) {
          failed.push_back(std::move(*it));
          it = staged_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (dataplane::Operation& op : failed) op.done(reason);
  }
  void Tick() override {
    std::lock_guard lock(mu_);
    ++ticks_;
  }
  std::map<std::string, JobObservation> TakeObservations() override {
    std::lock_guard lock(mu_);
    return std::exchange(observations_, {});
  }
  uint64_t bytes_sent() const override {
    std::lock_guard lock(mu_);
    return sent_;
  }
  uint64_t bytes_received() const override {
    std::lock_guard lock(mu_);
    return received_;
  }
  void SetPlanMissingCallback(std::function<void()> callback) override {
    std::lock_guard lock(mu_);
    plan_missing_ = std::move(callback);
  }
  void Shutdown() override {
    std::lock_guard lock(mu_);
    shut_down_ = true;
  }

 private:
  // The result of `op` on a job of one node, written into its buffers.
  static absl::Status ComputeLocally(const dataplane::Operation& op) {
    const size_t bytes = op.count * common::DataTypeSize(op.dtype);
    if (op.reduction == dataplane::Reduction::kBroadcast) {
      const std::byte* root = op.buffers.at(op.root_local);
      for (std::byte* b : op.buffers) {
        if (b != root) std::memcpy(b, root, bytes);
      }
      return absl::OkStatus();
    }
    if (op.reduction == dataplane::Reduction::kAllGather) {
      // One node: the world is the local buffers, block l belongs to buffer l.
      for (size_t from = 0; from < op.buffers.size(); ++from) {
        for (size_t to = 0; to < op.buffers.size(); ++to) {
          if (to != from) {
            std::memcpy(op.buffers[to] + from * bytes, op.buffers[from] + from * bytes, bytes);
          }
        }
      }
      return absl::OkStatus();
    }
    if (op.dtype != common::DataType::kFloat32) {
      return absl::UnimplementedError("the fake runner reduces float32 only");
    }
    if (dataplane::IsReduceScatter(op.reduction)) {
      // One node: buffer l gets the reduction of block l.
      const size_t n = op.buffers.size();
      for (size_t block = 0; block < n; ++block) {
        for (uint64_t i = block * op.count; i < (block + 1) * op.count; ++i) {
          float sum = 0;
          for (const std::byte* b : op.buffers) sum += reinterpret_cast<const float*>(b)[i];
          if (op.reduction == dataplane::Reduction::kReduceScatterAverage) sum /= n;
          reinterpret_cast<float*>(op.buffers[block])[i] = sum;
        }
      }
      return absl::OkStatus();
    }
    for (uint64_t i = 0; i < op.count; ++i) {
      float sum = 0;
      for (const std::byte* b : op.buffers) sum += reinterpret_cast<const float*>(b)[i];
      if (op.reduction == dataplane::Reduction::kAverage) sum /= op.buffers.size();
      for (std::byte* b : op.buffers) reinterpret_cast<float*>(b)[i] = sum;
    }
    return absl::OkStatus();
  }

  mutable std::mutex mu_;
  std::condition_variable released_;
  std::condition_variable started_;
  bool hold_starts_ = false;
  std::thread::id holder_;  // HoldStarts' caller, whose starts are not held
  bool complete_on_start_ = false;
  size_t completed_on_start_ = 0;
  std::vector<dataplane::Operation> staged_;  // completing on start, waiting for their input
  absl::Status start_error_;
  std::vector<SetJobCall> set_jobs_;
  std::vector<std::string> removed_jobs_;
  std::vector<StartCall> starts_;
  std::vector<AbortCall> aborts_;
  std::map<std::string, JobObservation> observations_;
  uint64_t sent_ = 0, received_ = 0;
  std::function<void()> plan_missing_;
  int ticks_ = 0;
  bool shut_down_ = false;
};

}  // namespace tributary::agent
