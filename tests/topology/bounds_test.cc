#include "topology/bounds.h"

#include <chrono>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "tests/topology/test_graphs.h"
#include "topology/maxflow.h"

namespace tributary::topology {
namespace {

using testing::BruteForceBroadcastBound;
using testing::BruteForceStrength;
using testing::Dgx1P100;
using testing::Dgx1V100;
using testing::kLink;

TEST(MaxFlowTest, SmallNetwork) {
  FlowNetwork network(4);
  network.AddArc(0, 1, 3);
  network.AddArc(0, 2, 2);
  network.AddArc(1, 2, 5);
  network.AddArc(1, 3, 2);
  network.AddArc(2, 3, 3);
  EXPECT_DOUBLE_EQ(network.MaxFlow(0, 3), 5);
  const std::vector<bool> side = network.SourceSide(0);
  EXPECT_TRUE(side[0]);
  EXPECT_FALSE(side[3]);
}

TEST(BoundsTest, Dgx1V100ReferenceValues) {
  const GpuGraph graph = Dgx1V100();
  for (int root = 0; root < 8; ++root) {
    EXPECT_NEAR(BroadcastBound(graph, root), 6 * kLink, 1) << "root " << root;
  }
  EXPECT_NEAR(AllReduceBound(graph), 24.0 / 7 * kLink, 1);
  const GpuGraph sub = InducedSubgraph(graph, {0, 1, 2, 5});
  EXPECT_NEAR(AllReduceBound(sub), 2 * kLink, 1);
  EXPECT_NEAR(BestBroadcastBound(sub).rate, 2 * kLink, 1);
}

TEST(BoundsTest, Dgx1P100ReferenceValues) {
  const GpuGraph graph = Dgx1P100();
  EXPECT_NEAR(BroadcastBound(graph, 0), 4 * kLink, 1);
  // 16 links over 7: the singletons partition is tight.
  EXPECT_NEAR(AllReduceBound(graph), 16.0 / 7 * kLink, 1);
}

// Every 3..8-GPU subset of both DGX-1 graphs (NVLink only) against brute force. Disconnected
// subsets (e.g. {0,5,6} on P100 has no 0-{5,6} link) have both bounds 0.
TEST(BoundsTest, EverySubsetMatchesBruteForce) {
  for (const GpuGraph& full : {Dgx1P100(), Dgx1V100()}) {
    for (const std::vector<int>& subset : testing::Subsets(8, 3)) {
      const GpuGraph graph = InducedSubgraph(full, subset);
      const int n = static_cast<int>(subset.size());
      double min_lambda = 1e300;
      for (int root = 0; root < n; ++root) {
        const double lambda = BroadcastBound(graph, root);
        EXPECT_NEAR(lambda, BruteForceBroadcastBound(graph, root), 1e-3)
            << testing::SubsetName(subset) << " root " << root;
        min_lambda = std::min(min_lambda, lambda);
      }
      const StrengthResult strength = GraphStrength(graph);
      const double sigma = BruteForceStrength(graph);
      EXPECT_NEAR(strength.rate, sigma, 1e-3) << testing::SubsetName(subset);
      // Bounds of DESIGN: lambda / 2 <= sigma <= lambda (every root).
      EXPECT_LE(strength.rate, min_lambda + 1e-3) << testing::SubsetName(subset);
      EXPECT_GE(strength.rate, min_lambda / 2 - 1e-3) << testing::SubsetName(subset);
      // The reported partition attains sigma.
      if (strength.rate > 0) {
        ASSERT_GE(strength.num_parts, 2);
        const auto cap = UndirectedCapacities(graph);
        double crossing = 0;
        for (int u = 0; u < n; ++u) {
          for (int v = u + 1; v < n; ++v) {
            if (strength.part[u] != strength.part[v]) crossing += cap[u][v];
          }
        }
        EXPECT_NEAR(crossing / (strength.num_parts - 1), strength.rate, 1e-3)
            << testing::SubsetName(subset);
      }
    }
  }
}

// Random capacities (not link multiples) exercise the partition search beyond the symmetric
// DGX-1 cases.
TEST(BoundsTest, RandomGraphsMatchBruteForce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 2 + trial % 7;
    GpuGraph graph;
    for (int i = 0; i < n; ++i) graph.gpus.push_back(i);
    std::uniform_real_distribution<double> capacity(0, 10);
    std::bernoulli_distribution present(0.6);
    for (int u = 0; u < n; ++u) {
      for (int v = u + 1; v < n; ++v) {
        if (!present(rng)) continue;
        graph.arcs.push_back({u, v, capacity(rng)});
        graph.arcs.push_back({v, u, capacity(rng)});  // asymmetric: sigma uses the min
      }
    }
    EXPECT_NEAR(AllReduceBound(graph), BruteForceStrength(graph), 1e-9) << "trial " << trial;
    EXPECT_NEAR(BroadcastBound(graph, 0), BruteForceBroadcastBound(graph, 0), 1e-9)
        << "trial " << trial;
  }
}

TEST(BoundsTest, SixteenGpusWithinTwoSeconds) {
  const auto start = std::chrono::steady_clock::now();
  const GpuGraph graph = testing::NvSwitchComplete(16);
  const double sigma = AllReduceBound(graph);
  const RootedBound lambda = BestBroadcastBound(graph);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // 120 connections of 10 GB/s over 15: 80 GB/s; broadcast: 15 x 10 GB/s into each GPU.
  EXPECT_NEAR(sigma, 120 * 10e9 / 15, 1);
  EXPECT_NEAR(lambda.rate, 150e9, 1);
  EXPECT_LT(seconds, 2.0);
}

TEST(BoundsTest, DegenerateGraphs) {
  GpuGraph one;
  one.gpus = {0};
  EXPECT_EQ(BroadcastBound(one, 0), 0);
  EXPECT_EQ(AllReduceBound(one), 0);
  GpuGraph two;
  two.gpus = {0, 1};
  EXPECT_EQ(AllReduceBound(two), 0);
  two.arcs = {{0, 1, 5}, {1, 0, 3}};
  EXPECT_DOUBLE_EQ(AllReduceBound(two), 3);
  EXPECT_DOUBLE_EQ(BroadcastBound(two, 0), 5);
}

}  // namespace
}  // namespace tributary::topology
