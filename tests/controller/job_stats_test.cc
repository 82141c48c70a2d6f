// GetJobStats: the agents' per-job reports aggregated over a job's nodes within the window (a
// FakeClock moves time), the what-if predictions against DESIGN.md §1.1's closed form computed
// here independently, errors, and the per-job metrics.
#include "controller/job_stats.h"

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "common/clock.h"
#include "common/metrics/metrics.h"
#include "controller/cluster_state.h"
#include "gtest/gtest.h"

namespace tributary::controller {
namespace {

using namespace std::chrono_literals;
using common::metrics::FindSample;

constexpr double kNic = 1.25e9;  // 10 Gbit/s
constexpr uint64_t kModelBytes = 64 << 20;

// DESIGN.md §1.1, written out again: t/M = 2n(n-1) / (D B), D = n^2 + kn - 2k, k <= n.
double ClosedFormSecondsPerByte(double n, double k, double b) {
  if (n <= 1) return 0;
  k = std::min(k, n);
  return 2 * n * (n - 1) / ((n * n + k * n - 2 * k) * b);
}

tributary::v1::JobObservation Report(uint64_t op_bytes, uint64_t sent, uint64_t received,
                                     uint64_t collectives, double busy, uint64_t iterations = 0,
                                     double iteration_seconds = 0, double iteration_max = 0,
                                     double iteration_busy = 0) {
  tributary::v1::JobObservation o;
  o.set_job_id("j");
  o.set_bytes(op_bytes);
  o.set_seconds(busy);
  o.set_wire_bytes_sent(sent);
  o.set_wire_bytes_received(received);
  o.set_collectives(collectives);
  o.set_busy_seconds(busy);
  o.set_iterations(iterations);
  o.set_iteration_seconds(iteration_seconds);
  o.set_iteration_max_seconds(iteration_max);
  o.set_iteration_busy_seconds(iteration_busy);
  return o;
}

class JobStatsTest : public ::testing::Test {
 protected:
  JobStatsTest() : state_(&clock_, Options(), 1, &registry_) {}

  static ClusterState::Options Options() {
    ClusterState::Options o;
    o.heartbeat_interval = 100ms;
    o.heartbeat_timeout = 60s;  // nobody dies here
    o.job_stats_window = 5s;
    return o;
  }

  void Register(const std::string& id, bool offers_summation) {
    tributary::v1::RegisterNodeRequest req;
    req.set_node_id(id);
    req.mutable_inventory()->set_hostname(id);
    req.mutable_inventory()->set_data_plane_address("127.0.0.1:" + std::to_string(1000 + n_++));
    req.mutable_inventory()->set_nic_bytes_per_s(kNic);
    req.mutable_inventory()->set_sum_bytes_per_s(100e9);
    req.mutable_inventory()->set_offers_summation(offers_summation);
    tributary::v1::RegisterNodeResponse resp;
    ASSERT_TRUE(state_.RegisterNode(req, &resp).ok());
    incarnations_[id] = resp.incarnation();
  }

  // Workers a, b, c; spares s1, s2; job j on a, b, c with both spares allowed.
  void SetUpJob() {
    for (const char* id : {"a", "b", "c"}) Register(id, false);
    for (const char* id : {"s1", "s2"}) Register(id, true);
    tributary::v1::CreateJobRequest req;
    req.set_job_id("j");
    for (const char* id : {"a", "b", "c"}) req.mutable_spec()->add_worker_nodes(id);
    req.mutable_spec()->set_model_bytes(kModelBytes);
    ASSERT_TRUE(state_.CreateJob(req, &job_).ok());
  }

  void Heartbeat(const std::string& id, std::vector<tributary::v1::JobObservation> reports) {
    tributary::v1::HeartbeatRequest req;
    req.set_node_id(id);
    req.set_incarnation(incarnations_[id]);
    for (auto& r : reports) *req.mutable_load()->add_jobs() = std::move(r);
    tributary::v1::HeartbeatResponse resp;
    ASSERT_TRUE(state_.Heartbeat(req, &resp).ok());
  }

  tributary::v1::JobStats Stats(std::vector<std::pair<uint32_t, uint32_t>> what_if = {}) {
    tributary::v1::GetJobStatsRequest req;
    req.set_job_id("j");
    for (const auto& [n, k] : what_if) {
      auto* w = req.add_what_if();
      w->set_workers(n);
      w->set_spares(k);
    }
    tributary::v1::JobStats stats;
    const absl::Status s = state_.GetJobStats(req, &stats);
    EXPECT_TRUE(s.ok()) << s;
    return stats;
  }

  const tributary::v1::NodeJobStats* Node(const tributary::v1::JobStats& stats,
                                          const std::string& id) {
    for (const auto& n : stats.nodes()) {
      if (n.node_id() == id) return &n;
    }
    return nullptr;
  }

  double Metric(const std::string& name, std::vector<std::pair<std::string, std::string>> labels) {
    std::vector<prometheus::MetricFamily> f = registry_.Collect();
    for (auto& m : state_.CollectMetrics()) f.push_back(std::move(m));
    const prometheus::ClientMetric* m = FindSample(f, name, labels);
    if (m == nullptr) return -1;
    return name.ends_with("_total") ? m->counter.value : m->gauge.value;
  }

  prometheus::Registry registry_;
  common::FakeClock clock_;
  ClusterState state_;
  tributary::v1::Job job_;
  int n_ = 0;
  std::map<std::string, uint64_t> incarnations_;
};

TEST_F(JobStatsTest, AggregatesTheReportsOfSeveralNodes) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob());
  ASSERT_EQ(job_.plan().workers_size(), 3);
  // Two heartbeats from each of a and b, one from c, one from the spare s1.
  Heartbeat("a", {Report(1000, 4000, 6000, 2, 0.5, 1, 2.0, 2.0, 0.5)});
  Heartbeat("b", {Report(1000, 3000, 3000, 2, 1.0, 1, 2.5, 2.5, 1.0)});
  Heartbeat("s1", {Report(0, 7000, 7000, 0, 0)});
  clock_.Advance(1s);
  Heartbeat("a", {Report(3000, 2000, 0, 1, 1.5, 2, 3.0, 1.75, 1.0)});
  Heartbeat("b", {Report(0, 0, 0, 0, 0.5)});
  Heartbeat("c", {Report(4000, 1000, 1000, 4, 2.0)});
  clock_.Advance(500ms);

  const tributary::v1::JobStats s = Stats();
  EXPECT_EQ(s.job_id(), "j");
  EXPECT_EQ(s.plan_version(), job_.plan().version());
  EXPECT_EQ(s.workers(), 3u);
  EXPECT_DOUBLE_EQ(s.window_seconds(), 5.0);
  EXPECT_EQ(s.reporting_nodes(), 4u);
  EXPECT_EQ(s.wire_bytes(), 12000u + 6000 + 2000 + 14000);
  EXPECT_EQ(s.collectives(), 2u + 2 + 1 + 4);
  // Worker nodes only: a (12000 bytes, 2 s), b (6000 bytes, 1.5 s), c (2000 bytes, 2 s).
  EXPECT_DOUBLE_EQ(s.achieved_bytes_per_s(), (12000.0 + 6000 + 2000) / (2.0 + 1.5 + 2.0));
  EXPECT_EQ(s.iterations(), 1u + 1 + 2);
  EXPECT_DOUBLE_EQ(s.mean_iteration_seconds(), (2.0 + 2.5 + 3.0) / 4);
  EXPECT_DOUBLE_EQ(s.max_iteration_seconds(), 2.5);
  EXPECT_DOUBLE_EQ(s.comm_fraction(), (0.5 + 1.0 + 1.0) / (2.0 + 2.5 + 3.0));
  EXPECT_DOUBLE_EQ(s.observed_seconds_per_byte(), (2.0 + 1.5 + 2.0) / (4000.0 + 1000 + 4000));
  EXPECT_DOUBLE_EQ(s.predicted_seconds_per_byte(), job_.plan().predicted_seconds_per_byte());
  EXPECT_DOUBLE_EQ(s.observed_to_predicted(),
                   s.observed_seconds_per_byte() / job_.plan().predicted_seconds_per_byte());
  EXPECT_EQ(s.model_bytes(), kModelBytes);
  EXPECT_DOUBLE_EQ(s.nic_bytes_per_s(), kNic);

  const auto* a = Node(s, "a");
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(a->worker());
  EXPECT_EQ(a->wire_bytes_sent(), 6000u);
  EXPECT_EQ(a->wire_bytes_received(), 6000u);
  EXPECT_EQ(a->collectives(), 3u);
  EXPECT_DOUBLE_EQ(a->busy_seconds(), 2.0);
  EXPECT_DOUBLE_EQ(a->achieved_bytes_per_s(), 6000.0);
  EXPECT_EQ(a->iterations(), 3u);
  EXPECT_DOUBLE_EQ(a->mean_iteration_seconds(), 5.0 / 3);
  EXPECT_DOUBLE_EQ(a->max_iteration_seconds(), 2.0);
  EXPECT_DOUBLE_EQ(a->comm_fraction(), 1.5 / 5.0);
  EXPECT_DOUBLE_EQ(a->last_report_age_s(), 0.5);
  const auto* s1 = Node(s, "s1");
  ASSERT_NE(s1, nullptr);
  EXPECT_FALSE(s1->worker());
  EXPECT_EQ(s1->wire_bytes_received(), 7000u);
  EXPECT_DOUBLE_EQ(s1->last_report_age_s(), 1.5);
  EXPECT_EQ(Node(s, "s2"), nullptr);  // never reported

  // The same numbers as metrics.
  EXPECT_DOUBLE_EQ(Metric("tributary_controller_job_achieved_bytes_per_second", {{"job", "j"}}),
                   s.achieved_bytes_per_s());
  EXPECT_DOUBLE_EQ(Metric("tributary_controller_job_comm_fraction", {{"job", "j"}}),
                   s.comm_fraction());
  EXPECT_DOUBLE_EQ(
      Metric("tributary_controller_job_iteration_seconds", {{"job", "j"}, {"stat", "mean"}}),
      s.mean_iteration_seconds());
  EXPECT_DOUBLE_EQ(
      Metric("tributary_controller_job_iteration_seconds", {{"job", "j"}, {"stat", "max"}}), 2.5);
  EXPECT_DOUBLE_EQ(Metric("tributary_controller_job_observed_to_predicted_ratio", {{"job", "j"}}),
                   s.observed_to_predicted());
}

TEST_F(JobStatsTest, ReportsOlderThanTheWindowExpire) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob());
  Heartbeat("a", {Report(1000, 1000, 1000, 1, 1.0)});
  clock_.Advance(3s);
  Heartbeat("b", {Report(1000, 500, 500, 1, 1.0)});
  clock_.Advance(1s);
  tributary::v1::JobStats s = Stats();
  EXPECT_EQ(s.reporting_nodes(), 2u);
  EXPECT_EQ(s.wire_bytes(), 3000u);

  // 5.5 s after a's report, 2.5 s after b's: a (which stopped reporting) dropped out.
  clock_.Advance(1500ms);
  s = Stats();
  EXPECT_EQ(s.reporting_nodes(), 1u);
  EXPECT_EQ(s.wire_bytes(), 1000u);
  ASSERT_EQ(s.nodes_size(), 1);
  EXPECT_EQ(s.nodes(0).node_id(), "b");
  EXPECT_DOUBLE_EQ(s.achieved_bytes_per_s(), 1000.0);

  // b's too; the sweep forgets them, and the job's statistics series go away.
  clock_.Advance(3s);
  state_.CheckLiveness();
  s = Stats();
  EXPECT_EQ(s.reporting_nodes(), 0u);
  EXPECT_EQ(s.wire_bytes(), 0u);
  EXPECT_EQ(s.nodes_size(), 0);
  EXPECT_EQ(s.achieved_bytes_per_s(), 0);
  EXPECT_EQ(s.observed_to_predicted(), 0);
  EXPECT_EQ(Metric("tributary_controller_job_achieved_bytes_per_second", {{"job", "j"}}), -1);
  // The plan's prediction and the what-if rows do not depend on reports.
  EXPECT_GT(s.predicted_seconds_per_byte(), 0);
  EXPECT_GT(s.what_if_size(), 0);
}

TEST_F(JobStatsTest, WhatIfPredictionsAreTheClosedForm) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob());
  const tributary::v1::JobStats s =
      Stats({{8, 2}, {4, 4}, {4, 0}, {3, 5}, {16, 16}, {2, 1}, {1, 3}});
  ASSERT_EQ(s.what_if_size(), 7);
  for (const auto& w : s.what_if()) {
    const double n = w.workers(), k = w.spares();
    const double expected = ClosedFormSecondsPerByte(n, k, kNic);
    SCOPED_TRACE(testing::Message() << "n=" << n << " k=" << k);
    EXPECT_NEAR(w.seconds_per_byte(), expected, 1e-12 * expected);
    EXPECT_NEAR(w.allreduce_seconds(), expected * kModelBytes, 1e-12 * expected * kModelBytes);
    if (n > 1) {
      const double ring = 2 * (n - 1) / (n * kNic);
      EXPECT_NEAR(w.speedup_vs_ring(), ring / expected, 1e-12);
    }
  }
  // Spot values: k = n gives M/B; k = 0 is ring; n = k = 4 is 1.5x ring (DESIGN.md).
  EXPECT_NEAR(s.what_if(1).seconds_per_byte(), 1 / kNic, 1e-9 / kNic);
  EXPECT_NEAR(s.what_if(1).speedup_vs_ring(), 1.5, 1e-12);
  EXPECT_NEAR(s.what_if(2).seconds_per_byte(), 2.0 * 3 / (4 * kNic), 1e-9 / kNic);
  EXPECT_NEAR(s.what_if(3).seconds_per_byte(), 1 / kNic, 1e-9 / kNic);  // k clamped to n = 3
  EXPECT_EQ(s.what_if(6).seconds_per_byte(), 0);                        // one worker: no network
}

TEST_F(JobStatsTest, TheDefaultGridHoldsTheCurrentPlanAndItsPredictionMatchesThePlan) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob());
  const tributary::v1::JobStats s = Stats();
  const uint32_t k = s.spares();
  ASSERT_EQ(k, 2u);  // uniform NICs, n = 3: both spares help (1 + k(n-2)/n^2)
  // n = 3 with k = 0, 1, 2 (two spares available), then n/2 = 1 and 2n = 6 with k = 2.
  ASSERT_EQ(s.what_if_size(), 5);
  const std::vector<std::pair<uint32_t, uint32_t>> expected = {
      {3, 0}, {3, 1}, {3, 2}, {1, 2}, {6, 2}};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(s.what_if(i).workers(), expected[i].first) << i;
    EXPECT_EQ(s.what_if(i).spares(), expected[i].second) << i;
    EXPECT_EQ(s.what_if(i).current(), i == 2) << i;
  }
  // The planner's own plan for this uniform cluster is the closed form too.
  EXPECT_NEAR(s.what_if(2).seconds_per_byte(), s.predicted_seconds_per_byte(),
              1e-9 * s.predicted_seconds_per_byte());
  EXPECT_NEAR(s.what_if(0).seconds_per_byte(), job_.plan().ring_seconds_per_byte(),
              1e-9 * job_.plan().ring_seconds_per_byte());
}

TEST_F(JobStatsTest, UnknownJobsAndBadWhatIfsAreClearErrors) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob());
  tributary::v1::GetJobStatsRequest req;
  req.set_job_id("nope");
  tributary::v1::JobStats stats;
  absl::Status s = state_.GetJobStats(req, &stats);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("job 'nope' not found"), std::string::npos) << s;

  req.set_job_id("j");
  req.add_what_if()->set_workers(0);
  s = state_.GetJobStats(req, &stats);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("workers must be in [1, 65536]"), std::string::npos) << s;

  req.clear_what_if();
  for (int i = 0; i < 65; ++i) req.add_what_if()->set_workers(2);
  EXPECT_EQ(state_.GetJobStats(req, &stats).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobStatsTest, ReportsOfUnknownJobsAreIgnoredAndDeletedJobsLoseTheirSeries) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob());
  tributary::v1::JobObservation other = Report(1, 1, 1, 1, 1);
  other.set_job_id("not-a-job");
  Heartbeat("a", {Report(1000, 1000, 1000, 1, 1.0, 1, 2.0, 2.0, 1.0), other});
  EXPECT_GT(Metric("tributary_controller_job_achieved_bytes_per_second", {{"job", "j"}}), 0);
  EXPECT_GT(Metric("tributary_controller_observed_bytes_total", {{"job", "j"}}), 0);
  EXPECT_EQ(Metric("tributary_controller_job_achieved_bytes_per_second", {{"job", "not-a-job"}}),
            -1);

  ASSERT_TRUE(state_.DeleteJob("j").ok());
  for (const char* name :
       {"tributary_controller_job_achieved_bytes_per_second",
        "tributary_controller_job_comm_fraction",
        "tributary_controller_job_observed_to_predicted_ratio",
        "tributary_controller_observed_bytes_total", "tributary_controller_observed_seconds_total",
        "tributary_controller_observed_seconds_per_byte"}) {
    EXPECT_EQ(Metric(name, {{"job", "j"}}), -1) << name;
  }
  EXPECT_EQ(Metric("tributary_controller_job_iteration_seconds", {{"job", "j"}, {"stat", "mean"}}),
            -1);

  // Created again under the same id: no statistics from before.
  tributary::v1::CreateJobRequest req;
  req.set_job_id("j");
  for (const char* id : {"a", "b", "c"}) req.mutable_spec()->add_worker_nodes(id);
  ASSERT_TRUE(state_.CreateJob(req, &job_).ok());
  EXPECT_EQ(Stats().reporting_nodes(), 0u);
}

TEST(JobStatsBookTest, KeepsABoundedNumberOfReportsPerNode) {
  JobStatsBook book(std::chrono::hours(1));
  common::FakeClock clock;
  for (size_t i = 0; i < JobStatsBook::kMaxSamplesPerNode + 10; ++i) {
    book.Record("a", Report(0, 1, 0, 0, 0), clock.Now());
  }
  tributary::v1::JobStats stats;
  book.Summarize("j", {"a"}, clock.Now(), &stats);
  EXPECT_EQ(stats.wire_bytes(), JobStatsBook::kMaxSamplesPerNode);
}

}  // namespace
}  // namespace tributary::controller
