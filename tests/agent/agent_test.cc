// Agent assembled from fakes: plans from the controller client become jobs on the data plane
// and on the local service; heartbeat loads, plan-missing refreshes, ticks and stop.
#include "agent/agent.h"

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/fake_collective_runner.h"
#include "agent/fake_controller_client.h"
#include "agent/plan_view.h"
#include "dataplane/schedule/chunk_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/shm_test_util.h"

namespace tributary::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;
using namespace std::chrono_literals;

constexpr uint64_t kWeightTotal = uint64_t{1} << 32;

// A plan of `job_id` whose workers and summation servers are the given nodes (servers share
// the weight evenly).
tributary::v1::JobPlan Plan(const std::string& job_id, uint64_t version,
                            const std::vector<std::string>& workers,
                            const std::vector<std::string>& servers,
                            tributary::v1::Algorithm algorithm = tributary::v1::ALGORITHM_RING) {
  tributary::v1::JobPlan plan;
  plan.set_job_id(job_id);
  plan.set_version(version);
  for (size_t i = 0; i < workers.size(); ++i) {
    auto* w = plan.add_workers();
    w->set_node_id(workers[i]);
    w->set_data_plane_address("addr-" + workers[i]);
    w->set_rank(static_cast<uint32_t>(i));
  }
  for (size_t i = 0; i < servers.size(); ++i) {
    auto* s = plan.add_servers();
    s->set_node_id(servers[i]);
    s->set_data_plane_address("addr-" + servers[i]);
    s->set_weight(kWeightTotal / servers.size() + (i == 0 ? kWeightTotal % servers.size() : 0));
  }
  plan.set_procs_per_node(2);
  plan.set_op_timeout_ms(1500);
  plan.set_algorithm(algorithm);
  return plan;
}

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto runner = std::make_unique<FakeCollectiveRunner>();
    auto controller = std::make_unique<FakeControllerClient>();
    runner_ = runner.get();
    controller_ = controller.get();
    Agent::Parts parts;
    parts.node_id = "n1";
    parts.inventory.set_data_plane_address("addr-n1");
    parts.runner = std::move(runner);
    parts.controller = std::move(controller);
    parts.clock = &clock_;
    parts.tick = 0ms;  // the test ticks
    agent_ = Agent::Assemble(std::move(parts));
  }

  absl::StatusOr<tributary::v1::JoinJobResponse> JoinAs(const std::string& job_id,
                                                        uint32_t local_rank) {
    tributary::v1::JoinJobRequest req;
    req.set_job_id(job_id);
    req.set_local_rank(local_rank);
    req.set_local_size(2);
    tributary::v1::JoinJobResponse resp;
    absl::Status s = agent_->local().Join(req, &resp);
    if (!s.ok()) return s;
    return resp;
  }

  common::FakeClock clock_;
  FakeCollectiveRunner* runner_ = nullptr;
  FakeControllerClient* controller_ = nullptr;
  std::unique_ptr<Agent> agent_;
};

TEST_F(AgentTest, AssemblyStartsTheControllerLinkAndStopEndsEverything) {
  EXPECT_TRUE(controller_->started());
  EXPECT_EQ(agent_->node_id(), "n1");
  EXPECT_EQ(agent_->data_plane_address(), "addr-n1");
  agent_->Stop();
  EXPECT_TRUE(controller_->stopped());
  EXPECT_TRUE(runner_->shut_down());
  agent_->Stop();  // idempotent
}

TEST_F(AgentTest, PlansSetJobsOnTheDataPlaneAndTheLocalService) {
  controller_->DeliverPlans({Plan("a", 3, {"n0", "n1"}, {"n0", "n1"})});
  ASSERT_EQ(runner_->set_jobs().size(), 1u);
  const FakeCollectiveRunner::SetJobCall set = runner_->set_jobs()[0];
  EXPECT_EQ(set.view.job_id, "a");
  EXPECT_EQ(set.view.plan_version, 3u);
  EXPECT_EQ(set.view.my_worker_rank, 1);
  EXPECT_EQ(set.view.my_server_index, 1);
  EXPECT_THAT(set.view.worker_addresses, ElementsAre("addr-n0", "addr-n1"));
  EXPECT_EQ(set.view.procs_per_node, 2u);
  EXPECT_EQ(set.view.op_timeout, 1500ms);
  EXPECT_EQ(set.algorithm, dataplane::Algorithm::kRing);
  EXPECT_THAT(agent_->applied_plans(), ElementsAre(Pair("a", 3u)));

  // The local service now knows the job: worker 1 of 2 nodes, 2 processes each.
  auto joined = JoinAs("a", 1);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->global_rank(), 3u);
  EXPECT_EQ(joined->world_size(), 4u);
  EXPECT_EQ(joined->plan_version(), 3u);
}

TEST_F(AgentTest, OnlyANewPlanVersionIsSetAgain) {
  controller_->DeliverPlans({Plan("a", 3, {"n0", "n1"}, {"n0"})});
  controller_->DeliverPlans({Plan("a", 3, {"n0", "n1"}, {"n0"})});
  EXPECT_EQ(runner_->set_jobs().size(), 1u);
  controller_->DeliverPlans(
      {Plan("a", 4, {"n0", "n1"}, {"n0"}, tributary::v1::ALGORITHM_HALVING_DOUBLING)});
  ASSERT_EQ(runner_->set_jobs().size(), 2u);
  EXPECT_EQ(runner_->set_jobs()[1].view.plan_version, 4u);
  EXPECT_EQ(runner_->set_jobs()[1].view.my_server_index, -1);
  EXPECT_EQ(runner_->set_jobs()[1].algorithm, dataplane::Algorithm::kHalvingDoubling);
  EXPECT_THAT(agent_->applied_plans(), ElementsAre(Pair("a", 4u)));
  EXPECT_THAT(runner_->removed_jobs(), IsEmpty());
}

TEST_F(AgentTest, JobsMissingFromTheNextPlansAreRemoved) {
  controller_->DeliverPlans(
      {Plan("a", 1, {"n0", "n1"}, {"n0"}), Plan("b", 2, {"n1", "n2"}, {"n2"})});
  EXPECT_THAT(agent_->applied_plans(), UnorderedElementsAre(Pair("a", 1u), Pair("b", 2u)));
  ASSERT_TRUE(JoinAs("a", 0).ok());

  controller_->DeliverPlans({Plan("b", 2, {"n1", "n2"}, {"n2"})});
  EXPECT_THAT(runner_->removed_jobs(), ElementsAre("a"));
  EXPECT_THAT(agent_->applied_plans(), ElementsAre(Pair("b", 2u)));
  EXPECT_EQ(JoinAs("a", 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(JoinAs("b", 1).ok());

  controller_->DeliverPlans({});
  EXPECT_THAT(runner_->removed_jobs(), ElementsAre("a", "b"));
  EXPECT_THAT(agent_->applied_plans(), IsEmpty());
}

TEST_F(AgentTest, ServerOnlyJobsRunOnTheDataPlaneButTakeNoLocalProcesses) {
  controller_->DeliverPlans({Plan("s", 1, {"n0", "n2"}, {"n1"})});
  ASSERT_EQ(runner_->set_jobs().size(), 1u);
  EXPECT_EQ(runner_->set_jobs()[0].view.my_worker_rank, -1);
  EXPECT_EQ(runner_->set_jobs()[0].view.my_server_index, 0);
  auto join = JoinAs("s", 0);
  EXPECT_EQ(join.status().code(), absl::StatusCode::kFailedPrecondition);
}

// Job "j" plan v3 with node n0 as its only worker and summation server.
tributary::v1::JobPlan OneNodePlan() {
  tributary::v1::JobPlan plan;
  plan.set_job_id("j");
  plan.set_version(3);
  auto* w = plan.add_workers();
  w->set_node_id("n0");
  w->set_data_plane_address("a0");
  auto* s = plan.add_servers();
  s->set_node_id("n0");
  s->set_data_plane_address("a0");
  s->set_weight(dataplane::ChunkMap::kWeightTotal);
  return plan;
}

TEST(PlanViewTest, EveryPlanAlgorithmHasOneDataPlaneAlgorithm) {
  EXPECT_EQ(*ToAlgorithm(tributary::v1::ALGORITHM_AUTO), dataplane::Algorithm::kAuto);
  EXPECT_EQ(*ToAlgorithm(tributary::v1::ALGORITHM_PUSH_PULL), dataplane::Algorithm::kPushPull);
  EXPECT_EQ(*ToAlgorithm(tributary::v1::ALGORITHM_RING), dataplane::Algorithm::kRing);
  EXPECT_EQ(*ToAlgorithm(tributary::v1::ALGORITHM_HALVING_DOUBLING),
            dataplane::Algorithm::kHalvingDoubling);
  absl::StatusOr<dataplane::Algorithm> unknown =
      ToAlgorithm(static_cast<tributary::v1::Algorithm>(7));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.status().message(), "unknown algorithm 7");
}

TEST(PlanViewTest, PartitionIsTunedUnlessThePlanFixesIt) {
  tributary::v1::JobPlan plan = OneNodePlan();
  plan.set_partition_bytes(1 << 20);
  absl::StatusOr<dataplane::JobView> tuned = ToJobView(plan, "n0");
  ASSERT_TRUE(tuned.ok()) << tuned.status();
  EXPECT_TRUE(tuned->tune_partition);
  EXPECT_EQ(tuned->partition_bytes, 1u << 20);
  plan.set_fixed_partition(true);
  absl::StatusOr<dataplane::JobView> fixed = ToJobView(plan, "n0");
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_FALSE(fixed->tune_partition);
}

TEST(PlanViewTest, AsyncModeStalenessAndScaleReachTheJobView) {
  tributary::v1::JobPlan plan = OneNodePlan();
  absl::StatusOr<dataplane::JobView> sync = ToJobView(plan, "n0");
  ASSERT_TRUE(sync.ok()) << sync.status();
  EXPECT_FALSE(sync->async_mode);
  EXPECT_EQ(sync->delta_scale, 1.0);  // unset in the plan: 1
  plan.set_mode(tributary::v1::JOB_MODE_ASYNC);
  plan.set_staleness(2);
  plan.set_delta_scale(0.25);
  absl::StatusOr<dataplane::JobView> async = ToJobView(plan, "n0");
  ASSERT_TRUE(async.ok()) << async.status();
  EXPECT_TRUE(async->async_mode);
  EXPECT_EQ(async->staleness, 2);
  EXPECT_EQ(async->delta_scale, 0.25);
}

TEST(PlanViewTest, TheSelectorsNicRateReachesTheJobView) {
  tributary::v1::JobPlan plan = OneNodePlan();
  absl::StatusOr<dataplane::JobView> unset = ToJobView(plan, "n0");
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_EQ(unset->selector_nic_bytes_per_s, 0);  // the node's own NIC
  plan.set_selector_nic_bytes_per_s(15625000);
  absl::StatusOr<dataplane::JobView> set = ToJobView(plan, "n0");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->selector_nic_bytes_per_s, 15625000);
}

TEST_F(AgentTest, UnusablePlansAreIgnored) {
  tributary::v1::JobPlan bad = Plan("bad", 1, {"n0", "n1"}, {"n0"});
  bad.mutable_servers(0)->set_weight(12);
  tributary::v1::JobPlan newer = Plan("newer", 1, {"n0", "n1"}, {"n0"});
  newer.set_algorithm(static_cast<tributary::v1::Algorithm>(7));  // from a newer controller
  controller_->DeliverPlans({bad, newer, Plan("good", 1, {"n1"}, {"n1"})});
  ASSERT_EQ(runner_->set_jobs().size(), 1u);
  EXPECT_EQ(runner_->set_jobs()[0].view.job_id, "good");
  EXPECT_THAT(agent_->applied_plans(), ElementsAre(Pair("good", 1u)));
  EXPECT_EQ(JoinAs("bad", 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(JoinAs("newer", 0).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(AgentTest, HeartbeatLoadCarriesDataPlaneRatesAndJobObservations) {
  runner_->SetTraffic(/*sent=*/1000, /*received=*/500);
  runner_->AddObservation("a", JobObservation{.bytes = 4096, .seconds = 0.5});
  tributary::v1::NodeLoad first = controller_->SampleLoad(2.0);
  EXPECT_EQ(first.dataplane_tx_bytes_per_s(), 500.0);
  EXPECT_EQ(first.dataplane_rx_bytes_per_s(), 250.0);
  ASSERT_EQ(first.jobs_size(), 1);
  EXPECT_EQ(first.jobs(0).job_id(), "a");
  EXPECT_EQ(first.jobs(0).bytes(), 4096u);
  EXPECT_EQ(first.jobs(0).seconds(), 0.5);

  runner_->SetTraffic(3000, 500);
  tributary::v1::NodeLoad second = controller_->SampleLoad(4.0);
  EXPECT_EQ(second.dataplane_tx_bytes_per_s(), 500.0);  // (3000 - 1000) / 4
  EXPECT_EQ(second.dataplane_rx_bytes_per_s(), 0.0);
  EXPECT_EQ(second.jobs_size(), 0);  // observations are taken once
}

TEST_F(AgentTest, PeerNamingAnUnknownJobRefreshesThePlans) {
  EXPECT_EQ(controller_->refreshes(), 0);
  runner_->ReportPlanMissing();
  EXPECT_EQ(controller_->refreshes(), 1);
}

TEST_F(AgentTest, TickSweepsTheDataPlaneAndTheLocalGathers) {
  controller_->DeliverPlans({Plan("a", 1, {"n0", "n1"}, {"n0"})});
  auto joined = JoinAs("a", 0);
  ASSERT_TRUE(joined.ok());
  agent_->Tick();
  EXPECT_EQ(runner_->ticks(), 1);
  // A submission whose partner never comes fails at the plan's op timeout (1500 ms).
  testing::ScopedShm shm(64);
  absl::StatusOr<uint64_t> buffer =
      testing::RegisterShm(agent_->local(), joined->session_id(), shm);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  tributary::v1::SubmitRequest req;
  req.set_session_id(joined->session_id());
  req.set_tensor_name("grad");
  req.set_buffer_id(*buffer);
  req.set_count(16);
  req.set_dtype(tributary::v1::DATA_TYPE_FLOAT32);
  req.set_op(tributary::v1::COLLECTIVE_OP_SUM);
  tributary::v1::SubmitResponse submitted;
  ASSERT_TRUE(agent_->local().Submit(req, &submitted).ok());
  clock_.Advance(1500ms);
  agent_->Tick();
  EXPECT_EQ(runner_->ticks(), 2);
  ASSERT_EQ(runner_->aborts().size(), 1u);
  EXPECT_EQ(runner_->aborts()[0].reason.code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(AgentTest, ControlMetricsReportRegistrationSessionsAndPlanVersions) {
  controller_->set_registered(true);
  controller_->set_heartbeats(12, 3);
  controller_->DeliverPlans({Plan("a", 5, {"n0", "n1"}, {"n0"})});
  ASSERT_TRUE(JoinAs("a", 0).ok());
  std::map<std::string, std::vector<std::pair<std::string, double>>> seen;
  for (const auto& weak : agent_->collectables()) {
    auto collectable = weak.lock();
    ASSERT_NE(collectable, nullptr);
    for (const auto& family : collectable->Collect()) {
      for (const auto& metric : family.metric) {
        const double value = family.type == prometheus::MetricType::Counter ? metric.counter.value
                                                                            : metric.gauge.value;
        seen[family.name].push_back({metric.label.empty() ? "" : metric.label[0].value, value});
      }
    }
  }
  EXPECT_THAT(seen["tributary_agent_registered"], ElementsAre(Pair("", 1.0)));
  EXPECT_THAT(seen["tributary_agent_heartbeats_sent_total"], ElementsAre(Pair("", 12.0)));
  EXPECT_THAT(seen["tributary_agent_heartbeats_failed_total"], ElementsAre(Pair("", 3.0)));
  EXPECT_THAT(seen["tributary_agent_local_sessions"], ElementsAre(Pair("", 1.0)));
  EXPECT_THAT(seen["tributary_agent_plan_version"], ElementsAre(Pair("a", 5.0)));
}

}  // namespace
}  // namespace tributary::agent
