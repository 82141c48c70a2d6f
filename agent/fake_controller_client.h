// A ControllerClient for tests: no thread and no controller; the test hands plans over and
// samples heartbeat loads, on its own thread.
#pragma once

#include <mutex>
#include <vector>

#include "agent/controller_client.h"

namespace tributary::agent {

// Thread-safe.
class FakeControllerClient final : public ControllerClient {
 public:
  // Delivers `plans` as the real client does after a fetch (on the caller's thread).
  void DeliverPlans(const std::vector<tributary::v1::JobPlan>& plans) {
    PlansCallback on_plans;
    {
      std::lock_guard lock(mu_);
      on_plans = on_plans_;
    }
    on_plans(plans);
  }
  // The load a heartbeat would carry after `elapsed_seconds`.
  tributary::v1::NodeLoad SampleLoad(double elapsed_seconds) {
    LoadFn load;
    {
      std::lock_guard lock(mu_);
      load = load_;
    }
    return load(elapsed_seconds);
  }
  void set_registered(bool registered) {
    std::lock_guard lock(mu_);
    registered_ = registered;
  }
  void set_heartbeats(uint64_t sent, uint64_t failed) {
    std::lock_guard lock(mu_);
    sent_ = sent;
    failed_ = failed;
  }
  bool started() const {
    std::lock_guard lock(mu_);
    return started_;
  }
  bool stopped() const {
    std::lock_guard lock(mu_);
    return stopped_;
  }
  int refreshes() const {
    std::lock_guard lock(mu_);
    return refreshes_;
  }

  void Start(PlansCallback on_plans, LoadFn load) override {
    std::lock_guard lock(mu_);
    on_plans_ = std::move(on_plans);
    load_ = std::move(load);
    started_ = true;
  }
  void Stop() override {
    std::lock_guard lock(mu_);
    stopped_ = true;
  }
  void RequestRefresh() override {
    std::lock_guard lock(mu_);
    ++refreshes_;
  }
  bool registered() const override {
    std::lock_guard lock(mu_);
    return registered_;
  }
  uint64_t heartbeats_sent() const override {
    std::lock_guard lock(mu_);
    return sent_;
  }
  uint64_t heartbeats_failed() const override {
    std::lock_guard lock(mu_);
    return failed_;
  }

 private:
  mutable std::mutex mu_;
  PlansCallback on_plans_;
  LoadFn load_;
  bool registered_ = false;
  uint64_t sent_ = 0, failed_ = 0;
  bool started_ = false, stopped_ = false;
  int refreshes_ = 0;
};

}  // namespace tributary::agent
