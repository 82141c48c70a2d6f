#include "topology/experimental/schedule.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/topology/test_graphs.h"
#include "topology/bounds.h"
#include "topology/experimental/schedule_executor.h"

namespace tributary::topology {
namespace {

// Small-integer inputs, so float sums are exact in any order.
std::vector<std::vector<float>> Inputs(int n, size_t elements) {
  std::vector<std::vector<float>> buffers(n, std::vector<float>(elements));
  for (int p = 0; p < n; ++p) {
    for (size_t i = 0; i < elements; ++i)
      buffers[p][i] = static_cast<float>((p + 1) * (i % 13 + 1));
  }
  return buffers;
}

void ExpectExactSums(const std::vector<std::vector<float>>& buffers, const std::string& what) {
  const int n = static_cast<int>(buffers.size());
  const std::vector<std::vector<float>> inputs = Inputs(n, buffers[0].size());
  for (size_t i = 0; i < buffers[0].size(); ++i) {
    float expected = 0;
    for (int p = 0; p < n; ++p) expected += inputs[p][i];
    for (int p = 0; p < n; ++p) {
      ASSERT_EQ(buffers[p][i], expected) << what << " position " << p << " element " << i;
    }
  }
}

void RunPacking(const Packing& packing, int n, size_t elements, size_t chunk,
                const std::string& what) {
  absl::StatusOr<Schedule> schedule = CompileAllReduceSchedule(packing, n, elements, chunk);
  ASSERT_TRUE(schedule.ok()) << what << ": " << schedule.status();
  size_t covered = 0;
  for (const ScheduleChunk& c : schedule->chunks) {
    EXPECT_GT(c.count, 0u);
    EXPECT_LE(c.count, chunk);
    covered += c.count;
  }
  EXPECT_EQ(covered, elements) << what;
  dataplane::InProcessNetwork network;
  dataplane::CpuReducer reducer(1);
  std::vector<std::vector<float>> buffers = Inputs(n, elements);
  absl::Status status = ExecuteAllReduce(*schedule, network, reducer, buffers);
  ASSERT_TRUE(status.ok()) << what << ": " << status;
  ExpectExactSums(buffers, what);
}

TEST(ScheduleTest, SharesFollowWeights) {
  Packing packing;
  packing.trees.push_back({0, 3, {{0, 1}, {1, 2}}});
  packing.trees.push_back({2, 1, {{2, 0}, {2, 1}}});
  packing.rate = 4;
  absl::StatusOr<Schedule> schedule = CompileAllReduceSchedule(packing, 3, 1000, 100);
  ASSERT_TRUE(schedule.ok());
  EXPECT_EQ(schedule->trees[0].count, 750u);
  EXPECT_EQ(schedule->trees[1].count, 250u);
  EXPECT_EQ(schedule->trees[1].offset, 750u);
  EXPECT_EQ(schedule->chunks.size(), 8u + 3u);
  // Round-robin issue order.
  EXPECT_EQ(schedule->chunks[0].tree, 0);
  EXPECT_EQ(schedule->chunks[1].tree, 1);
}

TEST(ScheduleTest, RejectsBadInput) {
  Packing packing;
  packing.trees.push_back({0, 1, {{0, 1}}});
  packing.rate = 1;
  EXPECT_FALSE(CompileAllReduceSchedule(packing, 3, 10, 4).ok());  // does not span
  EXPECT_FALSE(CompileAllReduceSchedule(packing, 2, 10, 0).ok());  // no chunk size
  EXPECT_TRUE(CompileAllReduceSchedule(packing, 2, 10, 4).ok());
  EXPECT_FALSE(CompileAllReduceSchedule(Packing{}, 2, 10, 4).ok());
}

TEST(ScheduleTest, V100AllReducePackingsSumExactly) {
  const GpuGraph graph = testing::Dgx1V100();
  absl::StatusOr<TreePlan> plan = PlanAllReduce(graph);
  ASSERT_TRUE(plan.ok());
  RunPacking(plan->weighted, 8, 4099, 64, "v100 weighted");
  RunPacking(plan->reduced, 8, 4099, 64, "v100 reduced");
  absl::StatusOr<TreePlan> broadcast = PlanBroadcast(graph, 3);
  ASSERT_TRUE(broadcast.ok());
  RunPacking(broadcast->reduced, 8, 1000, 33, "v100 broadcast trees as all-reduce");
}

// A sample of fragments of both machines (every 5th connected subset).
TEST(ScheduleTest, SampledFragmentsSumExactly) {
  int index = 0;
  for (const GpuGraph& full : {testing::Dgx1P100(), testing::Dgx1V100()}) {
    for (const std::vector<int>& subset : testing::Subsets(8, 3)) {
      const GpuGraph graph = InducedSubgraph(full, subset);
      if (AllReduceBound(graph) <= 0 || index++ % 5 != 0) continue;
      absl::StatusOr<TreePlan> plan = PlanAllReduce(graph);
      ASSERT_TRUE(plan.ok());
      const int n = static_cast<int>(subset.size());
      RunPacking(plan->reduced, n, 777, 50, "fragment of " + std::to_string(n));
    }
  }
}

TEST(ScheduleTest, SinglePosition) {
  Packing packing;
  packing.trees.push_back({0, 1, {}});
  packing.rate = 1;
  RunPacking(packing, 1, 10, 3, "single");
}

}  // namespace
}  // namespace tributary::topology
