#include <chrono>
#include <memory>

#include "common/clock.h"
#include "common/metrics/metrics.h"
#include "controller/cluster_state.h"
#include "controller/controller_service.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace tributary::controller {
namespace {

using common::metrics::FindSample;

double Value(const std::vector<prometheus::MetricFamily>& families, const std::string& name,
             const std::vector<std::pair<std::string, std::string>>& labels = {}) {
  const prometheus::ClientMetric* m = FindSample(families, name, labels);
  if (m == nullptr) return -1;
  return name.ends_with("_total") ? m->counter.value : m->gauge.value;
}

class ControllerMetricsTest : public ::testing::Test {
 protected:
  ControllerMetricsTest()
      : state_(&clock_, {std::chrono::milliseconds(100), std::chrono::seconds(1)}, 1, &registry_) {}

  void Register(const std::string& id) {
    tributary::v1::RegisterNodeRequest req;
    req.set_node_id(id);
    req.mutable_inventory()->set_data_plane_address("127.0.0.1:" + std::to_string(1000 + n_++));
    req.mutable_inventory()->set_nic_bytes_per_s(10e9 / 8);
    req.mutable_inventory()->set_sum_bytes_per_s(100e9);
    req.mutable_inventory()->set_offers_summation(true);
    tributary::v1::RegisterNodeResponse resp;
    ASSERT_TRUE(state_.RegisterNode(req, &resp).ok());
    incarnations_[id] = resp.incarnation();
  }
  absl::Status Heartbeat(const std::string& id, const tributary::v1::NodeLoad& load = {}) {
    tributary::v1::HeartbeatRequest req;
    req.set_node_id(id);
    req.set_incarnation(incarnations_[id]);
    *req.mutable_load() = load;
    tributary::v1::HeartbeatResponse resp;
    return state_.Heartbeat(req, &resp);
  }
  std::vector<prometheus::MetricFamily> Collect() {
    std::vector<prometheus::MetricFamily> f = registry_.Collect();
    for (auto& m : state_.CollectMetrics()) f.push_back(std::move(m));
    return f;
  }

  prometheus::Registry registry_;
  common::FakeClock clock_;
  ClusterState state_;
  int n_ = 0;
  std::map<std::string, uint64_t> incarnations_;
};

TEST_F(ControllerMetricsTest, NodesByStateFollowRegistrationAndDeath) {
  auto f = Collect();
  EXPECT_EQ(Value(f, "tributary_controller_nodes", {{"state", "alive"}}), 0);
  EXPECT_EQ(Value(f, "tributary_controller_nodes", {{"state", "dead"}}), 0);
  EXPECT_EQ(Value(f, "tributary_controller_jobs", {{"state", "running"}}), 0);
  for (const char* id : {"a", "b", "c"}) Register(id);
  tributary::v1::CreateJobRequest req;
  req.set_job_id("j");
  req.mutable_spec()->add_worker_nodes("a");
  req.mutable_spec()->add_worker_nodes("b");
  tributary::v1::Job job;
  ASSERT_TRUE(state_.CreateJob(req, &job).ok());
  f = Collect();
  EXPECT_EQ(Value(f, "tributary_controller_nodes", {{"state", "alive"}}), 3);
  EXPECT_EQ(Value(f, "tributary_controller_nodes", {{"state", "spare"}}), 1);  // c
  EXPECT_EQ(Value(f, "tributary_controller_jobs", {{"state", "running"}}), 1);
  EXPECT_GT(Value(f, "tributary_controller_predicted_seconds_per_byte", {{"job", "j"}}), 0);
  EXPECT_GE(Value(f, "tributary_controller_plan_computations_total", {{"result", "ok"}}), 1);
  const prometheus::ClientMetric* h = FindSample(f, "tributary_controller_plan_duration_seconds");
  ASSERT_NE(h, nullptr);
  EXPECT_GE(h->histogram.sample_count, 1u);

  // c goes silent: dead, and no longer spare.
  clock_.Advance(std::chrono::milliseconds(600));
  ASSERT_TRUE(Heartbeat("a").ok());
  ASSERT_TRUE(Heartbeat("b").ok());
  clock_.Advance(std::chrono::milliseconds(600));
  state_.CheckLiveness();
  f = Collect();
  EXPECT_EQ(Value(f, "tributary_controller_nodes", {{"state", "alive"}}), 2);
  EXPECT_EQ(Value(f, "tributary_controller_nodes", {{"state", "dead"}}), 1);
  EXPECT_EQ(Value(f, "tributary_controller_nodes", {{"state", "spare"}}), 0);
}

TEST_F(ControllerMetricsTest, ObservationsFromHeartbeats) {
  Register("a");
  tributary::v1::CreateJobRequest req;
  req.set_job_id("j");
  req.mutable_spec()->add_worker_nodes("a");
  tributary::v1::Job job;
  ASSERT_TRUE(state_.CreateJob(req, &job).ok());
  tributary::v1::NodeLoad load;
  auto* o = load.add_jobs();
  o->set_job_id("j");
  o->set_bytes(1000);
  o->set_seconds(0.5);
  auto* unknown = load.add_jobs();  // not a job of this controller: no series
  unknown->set_job_id("nope");
  unknown->set_bytes(1);
  ASSERT_TRUE(Heartbeat("a", load).ok());
  auto f = Collect();
  EXPECT_EQ(Value(f, "tributary_controller_observed_bytes_total", {{"job", "j"}}), 1000);
  EXPECT_EQ(Value(f, "tributary_controller_observed_seconds_total", {{"job", "j"}}), 0.5);
  EXPECT_DOUBLE_EQ(Value(f, "tributary_controller_observed_seconds_per_byte", {{"job", "j"}}),
                   0.0005);
  EXPECT_EQ(FindSample(f, "tributary_controller_observed_bytes_total", {{"job", "nope"}}), nullptr);
}

TEST_F(ControllerMetricsTest, RpcCountersByMethodAndCode) {
  ControllerService service(&state_, &registry_);
  auto f = Collect();
  EXPECT_EQ(Value(f, "tributary_controller_rpcs_total", {{"method", "GetJob"}, {"code", "OK"}}), 0);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto stub = tributary::v1::Controller::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    tributary::v1::GetJobRequest req;
    req.set_job_id("missing");
    tributary::v1::Job job;
    EXPECT_EQ(stub->GetJob(&ctx, req, &job).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    tributary::v1::ListNodesResponse resp;
    EXPECT_TRUE(stub->ListNodes(&ctx, {}, &resp).ok());
  }
  server->Shutdown();
  f = Collect();
  EXPECT_EQ(
      Value(f, "tributary_controller_rpcs_total", {{"method", "GetJob"}, {"code", "NOT_FOUND"}}),
      1);
  EXPECT_EQ(Value(f, "tributary_controller_rpcs_total", {{"method", "ListNodes"}, {"code", "OK"}}),
            1);
  const prometheus::ClientMetric* h =
      FindSample(f, "tributary_controller_rpc_duration_seconds", {{"method", "ListNodes"}});
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->histogram.sample_count, 1u);
}

}  // namespace
}  // namespace tributary::controller
