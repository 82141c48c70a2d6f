// A CollectiveRunner for tests: records what it is asked, fails Start on demand, and leaves
// every started operation pending until the test completes it.
#pragma once

#include <map>
#include <mutex>
#include <string>
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
  };
  struct AbortCall {
    std::string job_id;
    std::string tensor;
    uint64_t iteration;
    absl::Status reason;
  };

  // Start returns `status` from now on (OK: the operation is kept pending).
  void FailStartWith(absl::Status status) {
    std::lock_guard lock(mu_);
    start_error_ = std::move(status);
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
    return starts_.size();
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
    std::lock_guard lock(mu_);
    if (!start_error_.ok()) return start_error_;
    starts_.push_back({job_id, std::move(op)});
    return absl::OkStatus();
  }
  void Abort(const std::string& job_id, const std::string& tensor, uint64_t iteration,
             const absl::Status& reason) override {
    std::lock_guard lock(mu_);
    aborts_.push_back({job_id, tensor, iteration, reason});
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
  mutable std::mutex mu_;
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
