// The assignments' form of a plan (tributary/v1/assigned_plan.h): what PackAssignedPlan leaves
// out and moves into the packed part, what ExpandAssignedPlan rebuilds, and packed parts that are
// corrupt, truncated or claim too much as errors that name the job.
#include "tributary/v1/assigned_plan.h"

#include <zlib.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tributary::v1 {
namespace {

using ::testing::HasSubstr;

// Workers w0..w{n-1} (also summation servers) and one spare s0, with everything a planner fills.
JobPlan Planned(int n) {
  JobPlan plan;
  plan.set_job_id("j");
  plan.set_version(7);
  plan.set_job_secret(std::string(32, 'k'));
  plan.set_generation(3);
  plan.set_procs_per_node(8);
  plan.set_partition_bytes(1 << 20);
  plan.set_credit_bytes(16 << 20);
  plan.set_op_timeout_ms(30000);
  plan.set_predicted_seconds_per_byte(1e-9);
  plan.set_ring_seconds_per_byte(2e-9);
  plan.set_model_bytes(uint64_t{1} << 26);
  plan.set_predicted_seconds(0.064);
  plan.set_ring_seconds(0.128);
  plan.set_algorithm(ALGORITHM_PUSH_PULL);
  plan.set_mode(JOB_MODE_SYNC);
  const uint64_t weight = (uint64_t{1} << 32) / (n + 1);
  for (int i = 0; i < n; ++i) {
    WorkerNode* w = plan.add_workers();
    w->set_node_id("w" + std::to_string(i));
    w->set_data_plane_address("10.0." + std::to_string(i / 256) + "." + std::to_string(i % 256) +
                              ":7000");
    w->set_rank(i);
    w->set_agent_instance(0x9e3779b97f4a7c15ULL * (i + 1));
    SummationServer* s = plan.add_servers();
    s->set_node_id(w->node_id());
    s->set_data_plane_address(w->data_plane_address());
    s->set_agent_instance(w->agent_instance());
    s->set_is_worker(true);
    s->set_weight(weight);
    s->set_share(static_cast<double>(weight) / 4294967296.0);
    s->set_nic_bytes_per_s(1.25e9);
    s->set_sum_bytes_per_s(1e11);
  }
  SummationServer* spare = plan.add_servers();
  spare->set_node_id("s0");
  spare->set_data_plane_address("10.1.0.1:7000");
  spare->set_agent_instance(42);
  spare->set_weight((uint64_t{1} << 32) - weight * n);
  spare->set_share(static_cast<double>(spare->weight()) / 4294967296.0);
  spare->set_nic_bytes_per_s(1.25e9);
  spare->set_sum_bytes_per_s(1e11);
  IntraNodePlan* intra = plan.add_intra_node();
  intra->set_node_id("w0");
  intra->set_strategy("direct");
  return plan;
}

TEST(AssignedPlanTest, PackKeepsTheHeadAndIntraNodeOutsideAndPacksTheRest) {
  JobPlan plan = Planned(3);
  PackAssignedPlan(plan);
  EXPECT_EQ(plan.job_id(), "j");
  EXPECT_EQ(plan.version(), 7u);
  EXPECT_EQ(plan.job_secret(), std::string(32, 'k'));
  EXPECT_EQ(plan.generation(), 3u);
  ASSERT_EQ(plan.intra_node_size(), 1);
  EXPECT_EQ(plan.intra_node(0).node_id(), "w0");
  EXPECT_EQ(plan.workers_size(), 0);
  EXPECT_EQ(plan.servers_size(), 0);
  EXPECT_EQ(plan.partition_bytes(), 0u);
  EXPECT_FALSE(plan.packed().empty());
  EXPECT_GT(plan.packed_size(), 0u);
}

TEST(AssignedPlanTest, ExpandGivesThePlanBackWithoutThePlannerOutputs) {
  const JobPlan original = Planned(3);
  JobPlan plan = original;
  PackAssignedPlan(plan);
  ASSERT_TRUE(ExpandAssignedPlan(plan).ok());
  EXPECT_TRUE(plan.packed().empty());
  EXPECT_EQ(plan.packed_size(), 0u);

  // Field by field: what the agent uses is the planner's; what it does not is gone.
  JobPlan expected = original;
  for (SummationServer& s : *expected.mutable_servers()) {
    s.clear_nic_bytes_per_s();
    s.clear_sum_bytes_per_s();
    s.set_share(static_cast<double>(s.weight()) / 4294967296.0);  // from the weight: the same
  }
  expected.clear_predicted_seconds_per_byte();
  expected.clear_ring_seconds_per_byte();
  expected.clear_model_bytes();
  expected.clear_predicted_seconds();
  expected.clear_ring_seconds();
  EXPECT_EQ(plan.DebugString(), expected.DebugString());
  // A worker's server entry gets its address and agent instance back from the worker entry.
  EXPECT_EQ(plan.servers(1).data_plane_address(), "10.0.0.1:7000");
  EXPECT_EQ(plan.servers(1).agent_instance(), original.workers(1).agent_instance());
  EXPECT_EQ(plan.servers(3).data_plane_address(), "10.1.0.1:7000");
}

TEST(AssignedPlanTest, AWorkerServerAtAnotherAddressKeepsItsOwn) {
  JobPlan plan = Planned(2);
  plan.mutable_servers(1)->set_data_plane_address("10.9.9.9:7001");
  PackAssignedPlan(plan);
  ASSERT_TRUE(ExpandAssignedPlan(plan).ok());
  EXPECT_EQ(plan.servers(1).data_plane_address(), "10.9.9.9:7001");
  EXPECT_EQ(plan.workers(1).data_plane_address(), "10.0.0.1:7000");
}

TEST(AssignedPlanTest, APlanThatWasNotPackedIsKept) {
  JobPlan plan = Planned(2);
  plan.mutable_servers(0)->set_share(0);
  ASSERT_TRUE(ExpandAssignedPlan(plan).ok());
  EXPECT_EQ(plan.workers_size(), 2);
  EXPECT_EQ(plan.servers(0).data_plane_address(), "10.0.0.0:7000");
  EXPECT_DOUBLE_EQ(plan.servers(0).share(), plan.servers(0).weight() / 4294967296.0);
}

TEST(AssignedPlanTest, AThousandWorkerPlanPacksToAFractionOfItsSize) {
  JobPlan plan = Planned(1024);
  plan.clear_intra_node();
  const size_t full = plan.ByteSizeLong();
  PackAssignedPlan(plan);
  // Deterministic (same input, same bytes): 110 KB of plan in 23 KB (the random agent instances,
  // 8 bytes a worker, do not compress).
  EXPECT_LT(plan.ByteSizeLong() * 4, full) << plan.ByteSizeLong() << " of " << full;
}

TEST(AssignedPlanTest, BadPackedPartsAreErrorsNamingTheJobAndChangeNothing) {
  JobPlan packed = Planned(8);
  PackAssignedPlan(packed);
  struct Case {
    const char* name;
    std::string bytes;
    uint64_t size;
    const char* message;
  };
  const std::string good = packed.packed();
  const Case cases[] = {
      {"garbage", "not deflate at all", packed.packed_size(), "does not inflate"},
      {"truncated", good.substr(0, good.size() / 2), packed.packed_size(), "does not inflate"},
      {"size too small", good, packed.packed_size() - 1, "does not inflate"},
      {"size too large", good, packed.packed_size() + 1, "does not inflate"},
      {"bomb", good, kMaxPackedPlanBytes + 1, "more than the"},
      {"size without bytes", "", 10, "does not inflate"},
  };
  for (const Case& c : cases) {
    JobPlan plan = packed;
    plan.set_packed(c.bytes);
    plan.set_packed_size(c.size);
    const JobPlan before = plan;
    const absl::Status s = ExpandAssignedPlan(plan);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(s.message(), HasSubstr("job 'j'")) << c.name;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.name;
    EXPECT_EQ(plan.SerializeAsString(), before.SerializeAsString()) << c.name;
  }
  // Inflates, but not to a JobPlan (a truncated varint).
  const std::string raw = "\x08\xff\xff";
  uLongf size = compressBound(raw.size());
  std::string deflated(size, '\0');
  ASSERT_EQ(compress2(reinterpret_cast<Bytef*>(deflated.data()), &size,
                      reinterpret_cast<const Bytef*>(raw.data()), raw.size(), Z_BEST_SPEED),
            Z_OK);
  deflated.resize(size);
  JobPlan plan = packed;
  plan.set_packed(deflated);
  plan.set_packed_size(raw.size());
  const absl::Status s = ExpandAssignedPlan(plan);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("does not parse as a JobPlan"));
}

}  // namespace
}  // namespace tributary::v1
