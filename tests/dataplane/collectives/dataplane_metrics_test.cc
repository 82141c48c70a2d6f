#include "dataplane/collectives/dataplane_metrics.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <future>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/metrics/metrics.h"
#include "common/trace.h"
#include "dataplane/collectives/data_plane_node.h"
#include "dataplane/reduce/cpu/cpu_reducer.h"
#include "dataplane/transport/inprocess/inprocess_transport.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/util/cluster_harness.h"

namespace tributary::dataplane {
namespace {

using common::metrics::FindSample;

constexpr auto kMetricsGuard = std::chrono::seconds(20);

double Value(const std::vector<prometheus::MetricFamily>& families, const std::string& name,
             const std::vector<std::pair<std::string, std::string>>& labels = {}) {
  const prometheus::ClientMetric* m = FindSample(families, name, labels);
  if (m == nullptr) return -1;
  return name.ends_with("_total") ? m->counter.value : m->gauge.value;
}

// n push/pull worker nodes (each also a summation server), each with its own registry.
class MetricsCluster : public testing::Cluster {
 public:
  explicit MetricsCluster(int n) : Cluster(Options(n)) {}

  std::future<absl::Status> Start(int rank, std::vector<float>& data, uint64_t iteration = 0) {
    Operation op;
    op.tensor_name = "grad";
    op.iteration = iteration;
    op.dtype = common::DataType::kFloat32;
    op.count = data.size();
    op.buffers = {reinterpret_cast<std::byte*>(data.data())};
    return Cluster::Start(rank, std::move(op));
  }

  // Both ranks' all-reduce of `a` and `b`, waited for: the first error, or OK.
  absl::Status AllReduce(std::vector<float>& a, std::vector<float>& b) {
    auto fa = Start(0, a);
    auto fb = Start(1, b);
    if (fa.wait_for(kMetricsGuard) != std::future_status::ready ||
        fb.wait_for(kMetricsGuard) != std::future_status::ready) {
      return absl::DeadlineExceededError("the all-reduce did not finish in time");
    }
    const absl::Status sa = fa.get();
    const absl::Status sb = fb.get();
    return sa.ok() ? sb : sa;
  }

  std::vector<prometheus::MetricFamily> Collect(int rank) {
    node(rank).UpdatePendingMetrics();
    return registry(rank).Collect();
  }

 private:
  static testing::ClusterOptions Options(int n) {
    testing::ClusterOptions o;
    o.workers = n;
    o.job_id = "job-m";
    o.plan_version = 3;
    o.algorithm = Algorithm::kPushPull;
    o.address_prefix = "addr-";
    o.node_ids = true;
    o.metrics = true;
    o.reducer_min_bytes_per_thread = 4096;
    return o;
  }
};

TEST(DataPlaneMetricsTest, SizeClassesAreBounded) {
  EXPECT_STREQ(SizeClass(0), "<64KiB");
  EXPECT_STREQ(SizeClass((64 << 10) - 1), "<64KiB");
  EXPECT_STREQ(SizeClass(64 << 10), "<1MiB");
  EXPECT_STREQ(SizeClass(1 << 20), "<16MiB");
  EXPECT_STREQ(SizeClass(16 << 20), ">=16MiB");
}

TEST(DataPlaneMetricsTest, SeriesStartAtZero) {
  prometheus::Registry registry;
  DataPlaneMetrics metrics(registry);
  const auto f = registry.Collect();
  EXPECT_EQ(Value(f, "tributary_dataplane_operations_started_total", {{"algorithm", "ring"}}), 0);
  EXPECT_EQ(Value(f, "tributary_dataplane_operations_failed_total",
                  {{"algorithm", "push_pull"}, {"reason", "DEADLINE_EXCEEDED"}}),
            0);
  EXPECT_NE(FindSample(f, "tributary_dataplane_operation_duration_seconds",
                       {{"algorithm", "halving_doubling"}, {"size_class", ">=16MiB"}}),
            nullptr);
}

TEST(DataPlaneMetricsTest, PushPullMovesByteAndOperationCounters) {
  MetricsCluster cluster(2);
  // 4096 floats = 16 KiB = 16 chunks of 1 KiB, split over two servers.
  std::vector<float> a(4096, 1.0f), b(4096, 2.0f);
  ASSERT_TRUE(cluster.AllReduce(a, b).ok());
  EXPECT_EQ(a[0], 3.0f);

  double pushed = 0, pulled = 0, summed_total = 0, served_total = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const auto f = cluster.Collect(rank);
    for (int peer = 0; peer < 2; ++peer) {
      const std::pair<std::string, std::string> job{"job", "job-m"};
      const std::pair<std::string, std::string> p{"peer_node", absl::StrCat("node-", peer)};
      pushed += Value(f, "tributary_dataplane_pushed_bytes_total", {job, p});
      pulled += Value(f, "tributary_dataplane_pulled_bytes_total", {job, p});
      summed_total += Value(f, "tributary_dataplane_summed_bytes_total", {job, p});
      served_total += Value(f, "tributary_dataplane_served_bytes_total", {job, p});
    }
    // Each worker pushed and pulled its whole tensor, over both servers.
    const double node_pushed =
        Value(f, "tributary_dataplane_pushed_bytes_total", {{"peer_node", "node-0"}}) +
        Value(f, "tributary_dataplane_pushed_bytes_total", {{"peer_node", "node-1"}});
    EXPECT_EQ(node_pushed, 4096 * 4);
    EXPECT_EQ(
        Value(f, "tributary_dataplane_operations_started_total", {{"algorithm", "push_pull"}}), 1);
    EXPECT_EQ(
        Value(f, "tributary_dataplane_operations_completed_total", {{"algorithm", "push_pull"}}),
        1);
    const prometheus::ClientMetric* h =
        FindSample(f, "tributary_dataplane_operation_duration_seconds",
                   {{"algorithm", "push_pull"}, {"size_class", "<64KiB"}});
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->histogram.sample_count, 1u);
    EXPECT_EQ(Value(f, "tributary_dataplane_pending_operations", {{"job", "job-m"}}), 0);
  }
  EXPECT_EQ(pushed, 2 * 4096 * 4);
  EXPECT_EQ(pulled, 2 * 4096 * 4);
  EXPECT_EQ(summed_total, 2 * 4096 * 4);  // every contribution of both workers
  EXPECT_EQ(served_total, 2 * 4096 * 4);  // the sum back to both workers

  // The scrape-time collector sees the same stats.
  DataPlaneStatsCollector collector(&cluster.node(0));
  const auto f = collector.Collect();
  EXPECT_EQ(Value(f, "tributary_dataplane_chunks_in_flight"), 0);
  EXPECT_EQ(Value(f, "tributary_dataplane_bytes_in_flight"), 0);
  EXPECT_EQ(Value(f, "tributary_dataplane_malformed_messages_total"), 0);
  // 16 KiB with a 4 KiB credit window: the worker waited for credit.
  EXPECT_GT(Value(f, "tributary_dataplane_credit_waits_total"), 0);

  const auto obs = cluster.node(0).TakeObservations();
  ASSERT_EQ(obs.count("job-m"), 1u);
  EXPECT_EQ(obs.at("job-m").bytes, 4096u * 4);
  EXPECT_TRUE(cluster.node(0).TakeObservations().empty());
}

// With --trace, every operation the node runs is one span "<algorithm> <tensor>" from its start
// to its completion, with its bytes, iteration and outcome (which algorithm ran each tensor of
// an iteration, and when it finished).
TEST(DataPlaneMetricsTest, TracedOperationsAreSpansNamedByAlgorithmAndTensor) {
  const std::string path =
      ::testing::TempDir() + "/dataplane-ops-" + std::to_string(::getpid()) + ".json";
  ASSERT_TRUE(common::Trace::Start(path, "test").ok());
  {
    MetricsCluster cluster(2);
    std::vector<float> a(4096, 1.0f), b(4096, 2.0f);
    auto fa = cluster.Start(0, a, 5);
    auto fb = cluster.Start(1, b, 5);
    ASSERT_EQ(fa.wait_for(kMetricsGuard), std::future_status::ready);
    ASSERT_EQ(fb.wait_for(kMetricsGuard), std::future_status::ready);
    ASSERT_TRUE(fa.get().ok());
    ASSERT_TRUE(fb.get().ok());
  }
  ASSERT_TRUE(common::Trace::Stop().ok());
  std::ifstream in(path);
  const nlohmann::json events = nlohmann::json::parse(in);
  int begins = 0, ends = 0;
  for (const nlohmann::json& e : events) {
    if (e.value("name", "") != "push_pull grad") continue;
    if (e["ph"] == "b") {
      ++begins;
      EXPECT_EQ(e["args"]["bytes"], 4096 * 4);
      EXPECT_EQ(e["args"]["iteration"], 5);
      EXPECT_EQ(e["args"]["ok"], 1);
    }
    ends += e["ph"] == "e";
  }
  EXPECT_EQ(begins, 2);  // one per worker node (both record into this process's trace)
  EXPECT_EQ(ends, 2);
  std::remove(path.c_str());
}

TEST(DataPlaneMetricsTest, StuckOperationAgesAndFailsWithReason) {
  MetricsCluster cluster(2);
  std::vector<float> a(256, 1.0f);
  auto fa = cluster.Start(0, a);  // worker 1 never joins: stuck
  auto f = cluster.Collect(0);
  EXPECT_EQ(Value(f, "tributary_dataplane_pending_operations", {{"job", "job-m"}}), 1);
  EXPECT_EQ(
      Value(f, "tributary_dataplane_oldest_pending_operation_age_seconds", {{"job", "job-m"}}), 0);
  cluster.clock().Advance(std::chrono::seconds(2));
  f = cluster.Collect(0);
  EXPECT_DOUBLE_EQ(
      Value(f, "tributary_dataplane_oldest_pending_operation_age_seconds", {{"job", "job-m"}}),
      2.0);

  // Past the 5 s deadline the operation fails with DEADLINE_EXCEEDED.
  cluster.clock().Advance(std::chrono::seconds(4));
  cluster.node(0).push_pull().ExpireStale();
  ASSERT_EQ(fa.wait_for(kMetricsGuard), std::future_status::ready);
  EXPECT_EQ(fa.get().code(), absl::StatusCode::kDeadlineExceeded);
  f = cluster.Collect(0);
  EXPECT_EQ(
      Value(f, "tributary_dataplane_oldest_pending_operation_age_seconds", {{"job", "job-m"}}), 0);
  EXPECT_EQ(Value(f, "tributary_dataplane_pending_operations", {{"job", "job-m"}}), 0);
  EXPECT_EQ(Value(f, "tributary_dataplane_operations_failed_total",
                  {{"algorithm", "push_pull"}, {"reason", "DEADLINE_EXCEEDED"}}),
            1);
  EXPECT_EQ(
      Value(f, "tributary_dataplane_operations_completed_total", {{"algorithm", "push_pull"}}), 0);

  // 3 s later both workers run the next iteration: node 0's job works again, and the time from
  // its failure to this success is its recovery.
  cluster.clock().Advance(std::chrono::seconds(3));
  std::vector<float> b0(256, 1.0f), b1(256, 2.0f);
  auto f0 = cluster.Start(0, b0, 1);
  auto f1 = cluster.Start(1, b1, 1);
  ASSERT_EQ(f0.wait_for(kMetricsGuard), std::future_status::ready);
  ASSERT_EQ(f1.wait_for(kMetricsGuard), std::future_status::ready);
  ASSERT_TRUE(f0.get().ok());
  ASSERT_TRUE(f1.get().ok());
  f = cluster.Collect(0);
  const prometheus::ClientMetric* recovery = FindSample(f, "tributary_dataplane_recovery_seconds");
  ASSERT_NE(recovery, nullptr);
  EXPECT_EQ(recovery->histogram.sample_count, 1u);
  EXPECT_DOUBLE_EQ(recovery->histogram.sample_sum, 3.0);
  // FindSample points into the families: keep them alive (found by the TSan suite).
  const std::vector<prometheus::MetricFamily> f1_families = cluster.Collect(1);
  recovery = FindSample(f1_families, "tributary_dataplane_recovery_seconds");
  ASSERT_NE(recovery, nullptr);
  EXPECT_EQ(recovery->histogram.sample_count, 0u);  // nothing failed there
}

TEST(DataPlaneMetricsTest, RefusedStartCountsAsFailed) {
  MetricsCluster cluster(2);
  std::vector<float> a(256, 1.0f);
  auto fa = cluster.Start(0, a, 0);
  auto dup = cluster.Start(0, a, 0);  // same tensor and iteration: ALREADY_EXISTS
  ASSERT_EQ(dup.wait_for(kMetricsGuard), std::future_status::ready);
  EXPECT_EQ(dup.get().code(), absl::StatusCode::kAlreadyExists);
  auto f = cluster.Collect(0);
  EXPECT_EQ(Value(f, "tributary_dataplane_operations_failed_total",
                  {{"algorithm", "push_pull"}, {"reason", "ALREADY_EXISTS"}}),
            1);
  EXPECT_EQ(Value(f, "tributary_dataplane_pending_operations", {{"job", "job-m"}}), 1);
  std::vector<float> b(256, 2.0f);
  auto fb = cluster.Start(1, b, 0);
  ASSERT_EQ(fa.wait_for(kMetricsGuard), std::future_status::ready);
  ASSERT_EQ(fb.wait_for(kMetricsGuard), std::future_status::ready);
  EXPECT_TRUE(fa.get().ok());
  EXPECT_TRUE(fb.get().ok());
}

// The per-job activity behind the controller's job statistics: busy time is the union of the
// operations' intervals (not their sum), iterations are successive starts of the first tensor
// name, timed by the injected clock.
TEST(DataPlaneMetricsTest, ObservationsCountBusyTimeAsAUnionAndIterationsOfTheFirstName) {
  MetricsCluster cluster(2);
  common::FakeClock& clock = cluster.clock();
  auto start = [&](int rank, const std::string& name, uint64_t iteration,
                   std::vector<float>& data) {
    Operation op;
    op.tensor_name = name;
    op.iteration = iteration;
    op.dtype = common::DataType::kFloat32;
    op.count = data.size();
    op.buffers = {reinterpret_cast<std::byte*>(data.data())};
    return cluster.Cluster::Start(rank, std::move(op));
  };
  std::vector<float> g0(1024, 1.0f), g1(1024, 2.0f), o0(1024, 1.0f), o1(1024, 2.0f);
  // t = 0: rank 0 starts "grad" (its first name); it waits for rank 1.
  auto f_grad = start(0, "grad", 0, g0);
  clock.Advance(std::chrono::milliseconds(1000));
  // t = 1 s: rank 0 starts "other" too: two in flight, overlapping.
  auto f_other = start(0, "other", 0, o0);
  clock.Advance(std::chrono::milliseconds(500));
  // t = 1.5 s: rank 1 joins both; everything completes at 1.5 s.
  auto f_grad1 = start(1, "grad", 0, g1);
  auto f_other1 = start(1, "other", 0, o1);
  for (auto* f : {&f_grad, &f_other, &f_grad1, &f_other1}) {
    ASSERT_EQ(f->wait_for(kMetricsGuard), std::future_status::ready);
    ASSERT_TRUE(f->get().ok());
  }
  EXPECT_EQ(g0[0], 3.0f);
  EXPECT_EQ(o0[1023], 3.0f);
  // t = 4 s: the next iteration of "grad" ends rank 0's first iteration (4 s, 1.5 s busy).
  clock.Advance(std::chrono::milliseconds(2500));
  std::fill(g0.begin(), g0.end(), 1.0f);
  std::fill(g1.begin(), g1.end(), 2.0f);
  auto f_next = start(0, "grad", 1, g0);
  auto f_next1 = start(1, "grad", 1, g1);
  for (auto* f : {&f_next, &f_next1}) {
    ASSERT_EQ(f->wait_for(kMetricsGuard), std::future_status::ready);
    ASSERT_TRUE(f->get().ok());
  }
  const auto obs = cluster.node(0).TakeObservations();
  ASSERT_EQ(obs.count("job-m"), 1u);
  const DataPlaneNode::Observation& o = obs.at("job-m");
  EXPECT_EQ(o.collectives, 3u);
  EXPECT_EQ(o.bytes, 3u * 1024 * 4);
  EXPECT_DOUBLE_EQ(o.seconds, 1.5 + 0.5);  // summed durations
  EXPECT_DOUBLE_EQ(o.busy_seconds, 1.5);   // their union
  EXPECT_EQ(o.iterations, 1u);
  EXPECT_DOUBLE_EQ(o.iteration_seconds, 4.0);
  EXPECT_DOUBLE_EQ(o.iteration_max_seconds, 4.0);
  EXPECT_DOUBLE_EQ(o.iteration_busy_seconds, 1.5);
  // Rank 1 was never waiting: its operations completed as they started (no busy time), and its
  // iteration is its own: from 1.5 s to 4 s.
  const auto obs1 = cluster.node(1).TakeObservations();
  ASSERT_EQ(obs1.count("job-m"), 1u);
  EXPECT_EQ(obs1.at("job-m").collectives, 3u);
  EXPECT_DOUBLE_EQ(obs1.at("job-m").busy_seconds, 0.0);
  EXPECT_EQ(obs1.at("job-m").iterations, 1u);
  EXPECT_DOUBLE_EQ(obs1.at("job-m").iteration_seconds, 2.5);
  EXPECT_DOUBLE_EQ(obs1.at("job-m").iteration_busy_seconds, 0.0);

  // An operation in flight across two takes is split between them; a retried iteration number
  // (the same one again) is no new iteration.
  std::fill(g0.begin(), g0.end(), 1.0f);
  std::fill(g1.begin(), g1.end(), 2.0f);
  auto f_slow = start(0, "grad", 2, g0);
  clock.Advance(std::chrono::milliseconds(300));
  auto mid = cluster.node(0).TakeObservations();
  ASSERT_EQ(mid.count("job-m"), 1u);
  EXPECT_EQ(mid.at("job-m").collectives, 0u);
  EXPECT_DOUBLE_EQ(mid.at("job-m").busy_seconds, 0.3);
  EXPECT_EQ(mid.at("job-m").iterations, 1u);  // 4 s -> 4 s: the "grad" of iteration 1 -> 2
  clock.Advance(std::chrono::milliseconds(200));
  auto f_slow1 = start(1, "grad", 2, g1);
  for (auto* f : {&f_slow, &f_slow1}) {
    ASSERT_EQ(f->wait_for(kMetricsGuard), std::future_status::ready);
    ASSERT_TRUE(f->get().ok());
  }
  auto last = cluster.node(0).TakeObservations();
  ASSERT_EQ(last.count("job-m"), 1u);
  EXPECT_EQ(last.at("job-m").collectives, 1u);
  EXPECT_NEAR(last.at("job-m").busy_seconds, 0.2, 1e-12);
  EXPECT_EQ(last.at("job-m").iterations, 0u);
  EXPECT_TRUE(cluster.node(0).TakeObservations().empty());
}

// The agent's own coordination (Operation::control, tensor fusion's broadcasts) runs but is no
// operation of the job's: not in the counters, the pending gauges or the observations. It runs
// among the workers on the collective engine even in this push/pull job: no summation server
// sees it.
TEST(DataPlaneMetricsTest, ControlOperationsStayOutOfTheMetrics) {
  MetricsCluster cluster(2);
  std::vector<std::vector<float>> data = {std::vector<float>(64, 1.0f),
                                          std::vector<float>(64, 2.0f)};
  std::vector<std::future<absl::Status>> futures;
  for (int rank = 0; rank < 2; ++rank) {
    Operation op;
    op.tensor_name = "__tributary/fusion-decision";
    op.dtype = common::DataType::kFloat32;
    op.count = 64;
    op.buffers = {reinterpret_cast<std::byte*>(data[rank].data())};
    op.control = true;
    futures.push_back(cluster.Cluster::Start(rank, std::move(op)));
  }
  for (auto& f : futures) {
    ASSERT_EQ(f.wait_for(kMetricsGuard), std::future_status::ready);
    ASSERT_TRUE(f.get().ok());
  }
  EXPECT_EQ(data[1][63], 3.0f);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(cluster.node(rank).push_pull().stats().chunks_pushed.load(), 0u) << rank;
    EXPECT_EQ(cluster.node(rank).engine().stats().ops_completed.load(), 1u) << rank;
  }
  EXPECT_TRUE(cluster.node(0).TakeObservations().empty());
  EXPECT_EQ(Value(cluster.Collect(0), "tributary_dataplane_operations_started_total",
                  {{"algorithm", "push_pull"}}),
            0);
  // An ordinary one counts.
  std::vector<float> a(64, 1.0f), b(64, 2.0f);
  auto fa = cluster.Start(0, a);
  auto fb = cluster.Start(1, b);
  ASSERT_EQ(fa.wait_for(kMetricsGuard), std::future_status::ready);
  ASSERT_EQ(fb.wait_for(kMetricsGuard), std::future_status::ready);
  EXPECT_EQ(cluster.node(0).TakeObservations().at("job-m").collectives, 1u);
}

// Series labelled by job end with the job: an agent that has run many jobs exports the live
// ones only. The byte counters outlive RemoveJob while a collective still holds the job's view
// (it keeps counting into them), and end with the last holder.
TEST(DataPlaneMetricsTest, RemovedJobsSeriesLeaveTheRegistry) {
  MetricsCluster cluster(2);
  std::vector<float> a(4096, 1.0f), b(4096, 2.0f);
  ASSERT_TRUE(cluster.AllReduce(a, b).ok());
  // The last send completions (which hold the job's view until they have run) are done: they
  // come on the senders' threads after the results, and a CI run once saw the series still held.
  ASSERT_TRUE(cluster.Settle(kMetricsGuard));
  const std::pair<std::string, std::string> job{"job", "job-m"};
  const char* kJobFamilies[] = {"tributary_dataplane_pushed_bytes_total",
                                "tributary_dataplane_pulled_bytes_total",
                                "tributary_dataplane_summed_bytes_total",
                                "tributary_dataplane_served_bytes_total",
                                "tributary_dataplane_pending_operations",
                                "tributary_dataplane_oldest_pending_operation_age_seconds"};
  for (const char* family : kJobFamilies) {
    EXPECT_NE(FindSample(cluster.Collect(0), family, {job}), nullptr) << family;
  }
  cluster.node(0).RemoveJob("job-m");
  for (const char* family : kJobFamilies) {
    EXPECT_EQ(FindSample(cluster.Collect(0), family, {job}), nullptr) << family;
  }
  // The node-level series stay.
  EXPECT_EQ(Value(cluster.Collect(0), "tributary_dataplane_operations_completed_total",
                  {{"algorithm", "push_pull"}}),
            1);
  // The other node still has the job.
  EXPECT_EQ(Value(cluster.Collect(1), "tributary_dataplane_pushed_bytes_total",
                  {job, {"peer_node", "node-0"}}) +
                Value(cluster.Collect(1), "tributary_dataplane_pushed_bytes_total",
                      {job, {"peer_node", "node-1"}}),
            4096 * 4);
}

TEST(DataPlaneMetricsTest, ARemovedJobsCountersLiveOnWhileAViewHoldsThem) {
  prometheus::Registry registry;
  DataPlaneMetrics metrics(registry);
  JobView view;
  view.job_id = "j";
  view.server_addresses = {"a:1", "b:1"};
  view.server_node_ids = {"node-a", "node-b"};
  view.worker_addresses = {"a:1"};
  view.worker_node_ids = {"node-a"};
  const std::pair<std::string, std::string> job{"job", "j"};
  const std::pair<std::string, std::string> b{"peer_node", "node-b"};
  std::shared_ptr<const JobPeerCounters> first = metrics.ForJob(view);
  // A re-plan of the same job continues its series.
  std::shared_ptr<const JobPeerCounters> second = metrics.ForJob(view);
  EXPECT_EQ(first->pushed[1], second->pushed[1]);
  first->pushed[1]->Increment(100);
  metrics.SetPending("j", 2, 0.5);
  EXPECT_EQ(Value(registry.Collect(), "tributary_dataplane_pending_operations", {job}), 2);

  metrics.RemoveJob("j");
  // Gauges at once; a late update does not bring them back.
  metrics.SetPending("j", 1, 0.25);
  EXPECT_EQ(FindSample(registry.Collect(), "tributary_dataplane_pending_operations", {job}),
            nullptr);
  // The counters while views hold them: a collective of the removed job still counts.
  second.reset();
  first->pushed[1]->Increment(28);
  EXPECT_EQ(Value(registry.Collect(), "tributary_dataplane_pushed_bytes_total", {job, b}), 128);
  // Planned again while the old view lives: the shared series is counted twice, so the old
  // view's end does not take it from the new one.
  std::shared_ptr<const JobPeerCounters> again = metrics.ForJob(view);
  first.reset();
  again->pushed[1]->Increment(1);
  EXPECT_EQ(Value(registry.Collect(), "tributary_dataplane_pushed_bytes_total", {job, b}), 129);
  metrics.RemoveJob("j");
  again.reset();
  for (const auto& family : registry.Collect()) {
    for (const auto& metric : family.metric) {
      for (const auto& label : metric.label) EXPECT_NE(label.name, "job") << family.name;
    }
  }
  // A new life of the job starts at zero.
  std::shared_ptr<const JobPeerCounters> fresh = metrics.ForJob(view);
  EXPECT_EQ(Value(registry.Collect(), "tributary_dataplane_pushed_bytes_total", {job, b}), 0);
  // Removing a job never planned here is a no-op.
  metrics.RemoveJob("other");
}

// Nodes that share one registry (tests and benches run several in a process) share the series
// of a job they both plan: one node removing the job leaves the other's counters registered.
TEST(DataPlaneMetricsTest, NodesSharingARegistryKeepEachOthersSeries) {
  prometheus::Registry registry;
  auto first = std::make_unique<DataPlaneMetrics>(registry);
  DataPlaneMetrics second(registry);
  JobView view;
  view.job_id = "j";
  view.server_addresses = {"s:1"};
  view.server_node_ids = {"node-s"};
  const std::pair<std::string, std::string> job{"job", "j"};
  const std::pair<std::string, std::string> s{"peer_node", "node-s"};
  std::shared_ptr<const JobPeerCounters> a = first->ForJob(view);
  std::shared_ptr<const JobPeerCounters> b = second.ForJob(view);
  EXPECT_EQ(a->pushed[0], b->pushed[0]);
  first->RemoveJob("j");
  a.reset();
  b->pushed[0]->Increment(5);
  EXPECT_EQ(Value(registry.Collect(), "tributary_dataplane_pushed_bytes_total", {job, s}), 5);
  // A node's metrics destroyed with a job still planned end its holds too.
  std::shared_ptr<const JobPeerCounters> again = first->ForJob(view);
  again.reset();
  first.reset();
  b->pushed[0]->Increment(1);
  EXPECT_EQ(Value(registry.Collect(), "tributary_dataplane_pushed_bytes_total", {job, s}), 6);
  second.RemoveJob("j");
  b.reset();
  EXPECT_EQ(FindSample(registry.Collect(), "tributary_dataplane_pushed_bytes_total", {job, s}),
            nullptr);
}

}  // namespace
}  // namespace tributary::dataplane
