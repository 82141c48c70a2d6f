// The planner's intra-node plans, from real machines' topologies (tests/topology/fixtures: DGX-1
// P100 and V100 from NCCL's XML, a BytePS PCIe server, a DGX-2), turned into executors and run on
// HostGpuOps in random legal orders: every plan the planner makes for them runs and is exact;
// malformed plans are clear errors.
#include "dataplane/intranode/intra_node_execution.h"

#include <string>
#include <vector>

#include "common/dtype.h"
#include "dataplane/intranode/cpu_assisted_allreduce.h"
#include "dataplane/intranode/host_gpu_ops.h"
#include "dataplane/intranode/tree_allreduce.h"
#include "dataplane/reduce/cpu/scalar_reducer.h"
#include "gtest/gtest.h"
#include "tests/util/typed_values.h"
#include "topology/intra_node_planner.h"
#include "topology/topology_file.h"

namespace tributary::dataplane {
namespace {

using common::DataType;

tributary::v1::IntraNodePlan Plan(const std::string& file, const std::vector<int>& gpus) {
  absl::StatusOr<tributary::v1::Topology> t =
      topology::LoadTopologyFile(std::string(TRIBUTARY_TOPOLOGY_FIXTURES) + "/" + file);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  auto r = topology::PlanIntraNode(*t, gpus, topology::LinkMode::kAll);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? topology::ToProto(*r) : tributary::v1::IntraNodePlan{};
}

// Runs the execution on HostGpuOps (deferred, seeded) and checks every GPU's exact sum.
void RunExact(const tributary::v1::IntraNodePlan& plan, const IntraNodeExecution& e,
              uint64_t seed) {
  const int n = plan.gpus_size();
  constexpr size_t kCount = 3001;
  ScalarReducer reducer;
  HostGpuOps ops(n, reducer, {.deferred = true, .seed = seed});
  std::vector<std::vector<int32_t>> data(n, std::vector<int32_t>(kCount));
  std::vector<void*> pointers;
  for (int g = 0; g < n; ++g) {
    for (size_t i = 0; i < kCount; ++i) data[g][i] = static_cast<int32_t>((i * 5 + g * 7) % 13);
    ops.RegisterBuffer(g, data[g].data(), kCount * 4);
    pointers.push_back(data[g].data());
  }
  absl::Status s;
  if (e.kind == IntraNodeExecution::kTrees) {
    auto ar = TreeAllReduce::Create(ops, reducer, e.trees, {.chunk_bytes = 1024, .tune = false});
    ASSERT_TRUE(ar.ok()) << ar.status();
    s = (*ar)->AllReduce(DataType::kInt32, pointers, kCount, false);
  } else {
    auto ar = CpuAssistedAllReduce::Create(ops, reducer, e.groups, {.chunk_bytes = 1024});
    ASSERT_TRUE(ar.ok()) << ar.status();
    s = (*ar)->AllReduce(DataType::kInt32, pointers, kCount, false);
  }
  ASSERT_TRUE(s.ok()) << s;
  for (int g = 0; g < n; ++g) {
    for (size_t i = 0; i < kCount; ++i) {
      int32_t want = 0;
      for (int h = 0; h < n; ++h) want += static_cast<int32_t>((i * 5 + h * 7) % 13);
      ASSERT_EQ(data[g][i], want) << "GPU " << plan.gpus(g) << " element " << i;
    }
  }
  // Peer copies only between GPUs the plan connects: tree edges, or members of one group.
  for (const std::string& entry : ops.log()) {
    int from = -1, to = -1, queue = -1;
    if (std::sscanf(entry.c_str(), "peer %d->%d on %d", &from, &to, &queue) != 3) continue;
    bool planned = false;
    for (const GpuTree& t : e.trees) planned |= t.parent[from] == to || t.parent[to] == from;
    for (const std::vector<int>& g : e.groups) {
      planned |= std::count(g.begin(), g.end(), from) && std::count(g.begin(), g.end(), to);
    }
    ASSERT_TRUE(planned) << entry;
  }
}

TEST(ExecutionFromPlan, EveryPlanOfTheFixturesRunsExactly) {
  struct Case {
    std::string file;
    std::vector<int> gpus;
    std::string strategy;
  };
  const std::vector<Case> cases{
      {"dgx1v_nccl_topo.xml", {}, "nvlink-rooted-outside-nic-switch"},
      {"dgx1v_nccl_topo.xml", {0, 1, 2, 3}, "nvlink-rooted-outside-nic-switch"},
      {"dgx1v_nccl_topo.xml", {0, 1, 2, 5}, "packed-trees"},
      {"dgx1p_nccl_topo.xml", {}, "nvlink-rooted-outside-nic-switch"},
      {"dgx1p_nccl_topo.xml", {0, 1, 4}, ""},
      {"byteps_pcie_server.yaml", {}, "cpu-assisted-per-switch"},
      {"dgx2.json", {}, ""},
      {"single_gpu.yaml", {}, "direct"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file + " GPUs " + std::to_string(c.gpus.size()));
    const tributary::v1::IntraNodePlan plan = Plan(c.file, c.gpus);
    if (!c.strategy.empty()) {
      EXPECT_EQ(plan.strategy(), c.strategy);
    }
    absl::StatusOr<IntraNodeExecution> e = ExecutionFromPlan(plan);
    ASSERT_TRUE(e.ok()) << e.status() << " for " << plan.strategy();
    SCOPED_TRACE(e->description);
    if (plan.strategy() == "nvlink-rooted-outside-nic-switch") {
      ASSERT_EQ(e->kind, IntraNodeExecution::kTrees);
      ASSERT_EQ(e->trees.size(), 1u);
      // Rooted at the plan's root GPU.
      const int root = static_cast<int>(
          std::find(plan.gpus().begin(), plan.gpus().end(), plan.root_gpu()) - plan.gpus().begin());
      EXPECT_EQ(e->trees[0].parent[root], -1);
    }
    if (plan.strategy() == "packed-trees") {
      ASSERT_EQ(e->kind, IntraNodeExecution::kTrees);
      EXPECT_EQ(static_cast<int>(e->trees.size()), plan.allreduce_trees_size());
    }
    if (e->kind == IntraNodeExecution::kNone) {
      EXPECT_TRUE(plan.strategy() == "direct" || plan.gpus_size() < 2) << plan.strategy();
      continue;
    }
    for (uint64_t seed : {1, 2}) RunExact(plan, *e, seed);
  }
}

TEST(ExecutionFromPlan, MalformedPlansAreClearErrors) {
  const tributary::v1::IntraNodePlan good = Plan("dgx1v_nccl_topo.xml", {0, 1, 2, 3});
  ASSERT_EQ(good.strategy(), "nvlink-rooted-outside-nic-switch");
  ASSERT_EQ(good.ring_size(), 4);
  auto message = [](const tributary::v1::IntraNodePlan& p) {
    absl::StatusOr<IntraNodeExecution> e = ExecutionFromPlan(p);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(e.status().message());
  };
  tributary::v1::IntraNodePlan p = good;
  p.clear_ring();
  EXPECT_NE(message(p).find("re-plan the job"), std::string::npos);
  p = good;
  p.set_ring(2, 7);
  EXPECT_NE(message(p).find("the ring names GPU 7"), std::string::npos);
  p = good;
  p.set_ring(2, p.ring(1));
  EXPECT_NE(message(p).find("not a permutation"), std::string::npos);
  p = good;
  p.set_root_gpu(9);
  EXPECT_NE(message(p).find("the root names GPU 9"), std::string::npos);
  p = good;
  p.add_gpus(1);
  EXPECT_NE(message(p).find("lists GPU 1 twice"), std::string::npos);
  p = good;
  p.set_strategy("teleport");
  EXPECT_NE(message(p).find("unknown intra-node strategy"), std::string::npos);

  tributary::v1::IntraNodePlan trees = Plan("dgx1v_nccl_topo.xml", {0, 1, 2, 5});
  ASSERT_EQ(trees.strategy(), "packed-trees");
  p = trees;
  p.mutable_allreduce_trees(0)->mutable_edges()->RemoveLast();
  EXPECT_NE(message(p).find("does not reach GPU"), std::string::npos);
  p = trees;
  p.mutable_allreduce_trees(0)->set_weight_bytes_per_s(0);
  EXPECT_NE(message(p).find("bytes/s"), std::string::npos);
  p = trees;
  p.clear_allreduce_trees();
  EXPECT_NE(message(p).find("no all-reduce tree"), std::string::npos);

  tributary::v1::IntraNodePlan pcie = Plan("byteps_pcie_server.yaml", {});
  ASSERT_EQ(pcie.strategy(), "cpu-assisted-per-switch");
  p = pcie;
  p.mutable_groups(0)->add_gpus(pcie.groups(1).gpus(0));
  EXPECT_NE(message(p).find("in two groups"), std::string::npos);
  p = pcie;
  p.mutable_groups()->RemoveLast();
  EXPECT_NE(message(p).find("in none of the plan's groups"), std::string::npos);
}

}  // namespace
}  // namespace tributary::dataplane
