#include "topology/tree_packing.h"

#include <cmath>
#include <string>

#include "gtest/gtest.h"
#include "tests/topology/test_graphs.h"
#include "topology/bounds.h"

namespace tributary::topology {
namespace {

using testing::Dgx1P100;
using testing::Dgx1V100;
using testing::kLink;

double SumOfWeights(const Packing& packing) {
  double sum = 0;
  for (const Tree& tree : packing.trees) sum += tree.weight;
  return sum;
}

void ExpectGoodPlan(const GpuGraph& graph, const TreePlan& plan, bool allreduce,
                    const PackingOptions& options, const std::string& what) {
  const int n = static_cast<int>(graph.gpus.size());
  if (plan.bound <= 0) {
    EXPECT_TRUE(plan.weighted.trees.empty()) << what;
    return;
  }
  for (const Packing* packing : {&plan.weighted, &plan.reduced}) {
    EXPECT_TRUE(CheckFeasible(graph, *packing, allreduce).ok())
        << what << ": " << CheckFeasible(graph, *packing, allreduce);
    EXPECT_NEAR(packing->rate, SumOfWeights(*packing), 1e-6) << what;
    for (const Tree& tree : packing->trees) EXPECT_EQ(tree.edges.size(), size_t(n - 1)) << what;
  }
  EXPECT_GE(plan.weighted.rate, 0.99 * plan.bound) << what;
  EXPECT_LE(plan.weighted.rate, plan.bound * (1 + 1e-9)) << what;
  EXPECT_GE(plan.reduced.rate, (1 - options.tolerance) * plan.bound) << what;
  EXPECT_LE(static_cast<int>(plan.reduced.trees.size()), options.max_trees) << what;
}

TEST(TreePackingTest, Dgx1V100Reference) {
  const GpuGraph graph = Dgx1V100();
  const PackingOptions options;
  absl::StatusOr<TreePlan> broadcast = PlanBroadcast(graph, 0, options);
  ASSERT_TRUE(broadcast.ok()) << broadcast.status();
  EXPECT_NEAR(broadcast->bound, 6 * kLink, 1);
  ExpectGoodPlan(graph, *broadcast, false, options, "v100 broadcast");
  // Edmonds: six unit arborescences reach lambda exactly.
  EXPECT_NEAR(broadcast->reduced.rate, 6 * kLink, 1);
  EXPECT_LE(broadcast->reduced.trees.size(), 6u);

  absl::StatusOr<TreePlan> allreduce = PlanAllReduce(graph, options);
  ASSERT_TRUE(allreduce.ok()) << allreduce.status();
  EXPECT_NEAR(allreduce->bound, 24.0 / 7 * kLink, 1);
  ExpectGoodPlan(graph, *allreduce, true, options, "v100 allreduce");
  EXPECT_NEAR(allreduce->weighted.rate, 24.0 / 7 * kLink, 1e3);
}

TEST(TreePackingTest, V100Fragment0125ReachesTwoLinks) {
  const GpuGraph graph = InducedSubgraph(Dgx1V100(), {0, 1, 2, 5});
  absl::StatusOr<TreePlan> plan = PlanAllReduce(graph);
  ASSERT_TRUE(plan.ok());
  EXPECT_NEAR(plan->weighted.rate, 2 * kLink, 1e3);
  EXPECT_TRUE(CheckFeasible(graph, plan->weighted, true).ok());
}

// Every 3..8-GPU subset of both DGX-1 graphs: feasible packings at >= 99% of the bound, reduced
// sets within tolerance, and <= lambda / link unit trees for broadcast.
TEST(TreePackingTest, EverySubsetFeasibleAndNearBound) {
  const PackingOptions options;
  for (const GpuGraph& full : {Dgx1P100(), Dgx1V100()}) {
    for (const std::vector<int>& subset : testing::Subsets(8, 3)) {
      const GpuGraph graph = InducedSubgraph(full, subset);
      const int n = static_cast<int>(subset.size());
      for (int root = 0; root < n; ++root) {
        absl::StatusOr<TreePlan> plan = PlanBroadcast(graph, root, options);
        ASSERT_TRUE(plan.ok()) << plan.status();
        const std::string what =
            testing::SubsetName(subset) + " broadcast root " + std::to_string(root);
        EXPECT_NEAR(plan->bound, BroadcastBound(graph, root), 1e-3) << what;
        ExpectGoodPlan(graph, *plan, false, options, what);
        if (plan->bound > 0) {
          const int links = static_cast<int>(std::lround(plan->bound / kLink));
          EXPECT_LE(static_cast<int>(plan->reduced.trees.size()), links) << what;
          EXPECT_NEAR(plan->reduced.rate, plan->bound, 1e-3) << what;
          for (const Tree& tree : plan->reduced.trees) EXPECT_EQ(tree.root, root) << what;
        }
      }
      absl::StatusOr<TreePlan> plan = PlanAllReduce(graph, options);
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_NEAR(plan->bound, AllReduceBound(graph), 1e-3);
      ExpectGoodPlan(graph, *plan, true, options, testing::SubsetName(subset) + " allreduce");
    }
  }
}

TEST(TreePackingTest, TighterReductionOptions) {
  PackingOptions options;
  options.max_trees = 3;
  options.tolerance = 0.2;
  const GpuGraph graph = Dgx1V100();
  absl::StatusOr<TreePlan> plan = PlanAllReduce(graph, options);
  ASSERT_TRUE(plan.ok());
  EXPECT_LE(plan->reduced.trees.size(), 3u);
  EXPECT_TRUE(CheckFeasible(graph, plan->reduced, true).ok());
  // Record what 3 trees reach; must at least beat one tree.
  EXPECT_GT(plan->reduced.rate, kLink);
}

TEST(TreePackingTest, CheckFeasibleRejectsBadPackings) {
  const GpuGraph graph = InducedSubgraph(Dgx1V100(), {0, 1, 2});  // 0-1:1, 0-2:1, 1-2:2
  Packing packing;
  packing.trees.push_back({0, 1.5 * kLink, {{0, 1}, {1, 2}}});
  packing.rate = 1.5 * kLink;
  EXPECT_EQ(CheckFeasible(graph, packing, false).code(), absl::StatusCode::kFailedPrecondition);
  packing.trees[0].weight = kLink;
  EXPECT_FALSE(CheckFeasible(graph, packing, false).ok());  // rate no longer the sum
  packing.rate = kLink;
  EXPECT_TRUE(CheckFeasible(graph, packing, false).ok());
  packing.trees[0].edges = {{0, 1}, {0, 1}};
  EXPECT_EQ(CheckFeasible(graph, packing, false).code(), absl::StatusCode::kInvalidArgument);
  packing.trees[0].edges = {{0, 1}, {1, 2}};
  packing.trees.push_back({2, kLink, {{2, 1}, {1, 0}}});
  packing.rate = 2 * kLink;
  // Broadcast: arcs 0->1 and 1->0 each carry one tree. All-reduce: 0-1 carries two: too much.
  EXPECT_TRUE(CheckFeasible(graph, packing, false).ok());
  EXPECT_FALSE(CheckFeasible(graph, packing, true).ok());
}

TEST(TreePackingTest, InvalidRoot) {
  EXPECT_EQ(PlanBroadcast(Dgx1V100(), 8).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TreePackingTest, SixteenGpuNvSwitch) {
  const GpuGraph graph = testing::NvSwitchComplete(16);
  absl::StatusOr<TreePlan> allreduce = PlanAllReduce(graph);
  ASSERT_TRUE(allreduce.ok());
  EXPECT_TRUE(CheckFeasible(graph, allreduce->weighted, true).ok());
  EXPECT_TRUE(CheckFeasible(graph, allreduce->reduced, true).ok());
  EXPECT_GE(allreduce->weighted.rate, 0.99 * allreduce->bound);
  EXPECT_GE(allreduce->reduced.rate, 0.95 * allreduce->bound);
  absl::StatusOr<TreePlan> broadcast = PlanBroadcast(graph, 0);
  ASSERT_TRUE(broadcast.ok());
  EXPECT_TRUE(CheckFeasible(graph, broadcast->weighted, false).ok());
  EXPECT_TRUE(CheckFeasible(graph, broadcast->reduced, false).ok());
  EXPECT_GE(broadcast->weighted.rate, 0.99 * broadcast->bound);
  // Each GPU has 15 in-arcs of 10 GB/s and a tree uses one of them: 10 trees carry 10/15.
  EXPECT_LE(broadcast->reduced.trees.size(), 10u);
  EXPECT_NEAR(broadcast->reduced.rate, 100e9, 1e3);
}

TEST(RingTest, KnownCases) {
  const RingResult v100 = BestRing(Dgx1V100());
  ASSERT_TRUE(v100.exists);
  EXPECT_TRUE(v100.nvlink);
  EXPECT_EQ(v100.order.size(), 8u);
  // The double links form the cycle 0-3-2-1-5-6-7-4.
  EXPECT_NEAR(v100.bottleneck_bytes_per_s, 2 * kLink, 1);
  EXPECT_NEAR(v100.allreduce_rate, 2 * kLink * 8 / 14, 1);
  EXPECT_TRUE(HasNvLinkRing(Dgx1V100()));
  EXPECT_TRUE(HasNvLinkRing(Dgx1P100()));
  EXPECT_NEAR(BestRing(Dgx1P100()).bottleneck_bytes_per_s, kLink, 1);

  // {0,1,2,5}: GPU 5 hangs off GPU 1 only, so no NVLink ring.
  GpuGraph fragment = InducedSubgraph(Dgx1V100(), {0, 1, 2, 5});
  EXPECT_FALSE(HasNvLinkRing(fragment));
  EXPECT_FALSE(BestRing(fragment).exists);
  // With PCIe paths between every pair the ring falls back to them.
  for (int u = 0; u < 4; ++u) {
    for (int v = 0; v < 4; ++v) {
      if (u != v) fragment.arcs.push_back({u, v, 12e9, 0, LinkKind::kPcie});
    }
  }
  const RingResult fallback = BestRing(fragment);
  ASSERT_TRUE(fallback.exists);
  EXPECT_FALSE(fallback.nvlink);
  EXPECT_GE(fallback.bottleneck_bytes_per_s, 12e9);

  // Every ring found is a Hamiltonian cycle over existing connections.
  for (const std::vector<int>& subset : testing::Subsets(8, 3)) {
    const GpuGraph graph = InducedSubgraph(Dgx1V100(), subset);
    const RingResult ring = BestRing(graph);
    if (!ring.exists) continue;
    const auto cap = testing::DirectedMatrix(graph);
    const int n = static_cast<int>(subset.size());
    ASSERT_EQ(static_cast<int>(ring.order.size()), n);
    std::vector<bool> seen(n, false);
    for (int i = 0; i < n; ++i) {
      const int u = ring.order[i];
      const int v = ring.order[(i + 1) % n];
      EXPECT_FALSE(seen[u]);
      seen[u] = true;
      EXPECT_GE(std::min(cap[u][v], cap[v][u]), ring.bottleneck_bytes_per_s - 1)
          << testing::SubsetName(subset);
    }
  }
}

}  // namespace
}  // namespace tributary::topology
