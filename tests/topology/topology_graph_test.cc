#include "topology/topology_graph.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "tests/topology/fixture_path.h"
#include "topology/topology_file.h"
#include "topology/topology_parsers.h"

namespace tributary::topology {
namespace {

using ::testing::HasSubstr;
using tributary::v1::Topology;

Topology Load(const std::string& name) {
  absl::StatusOr<Topology> t = LoadTopologyFile(FixturePath(name));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : Topology();
}

int TotalLinks(const GpuGraph& g) {
  int links = 0;
  for (const GpuArc& a : g.arcs) links += a.link_count;
  return links / 2;
}

TEST(BuildGpuGraphTest, DgxV100AllGpus) {
  for (const char* file : {"dgx1v_nccl_topo.xml", "dgx1v_nvidia_smi_topo.txt"}) {
    SCOPED_TRACE(file);
    absl::StatusOr<GpuGraph> g = BuildGpuGraph(Load(file), {}, LinkMode::kNvLinkOnly);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->gpus, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
    EXPECT_EQ(g->arcs.size(), 32u);  // 16 connections, both directions
    EXPECT_EQ(TotalLinks(*g), 24);
    EXPECT_EQ(g->nvlink_bytes_per_s, 25e9);
    std::map<std::pair<int, int>, double> cap;
    for (const GpuArc& a : g->arcs) {
      EXPECT_EQ(a.kind, LinkKind::kNvLink);
      EXPECT_EQ(a.bytes_per_s, a.link_count * 25e9);
      cap[{g->gpus[a.from], g->gpus[a.to]}] += a.link_count;
    }
    for (auto [a, b] : {std::pair{0, 1}, {0, 2}, {1, 3}, {2, 6}, {3, 7}, {4, 5}, {4, 6}, {5, 7}}) {
      EXPECT_EQ(cap[std::make_pair(a, b)], 1) << a << "-" << b;
      EXPECT_EQ(cap[std::make_pair(b, a)], 1) << b << "-" << a;
    }
    for (auto [a, b] : {std::pair{0, 3}, {0, 4}, {1, 2}, {1, 5}, {2, 3}, {4, 7}, {5, 6}, {6, 7}}) {
      EXPECT_EQ(cap[std::make_pair(a, b)], 2) << a << "-" << b;
      EXPECT_EQ(cap[std::make_pair(b, a)], 2) << b << "-" << a;
    }
    // Every GPU has 6 links.
    std::vector<int> out(8, 0);
    for (const GpuArc& a : g->arcs) out[a.from] += a.link_count;
    EXPECT_EQ(out, std::vector<int>(8, 6));
  }
}

TEST(BuildGpuGraphTest, FragmentKeepsOrderAndInducedLinks) {
  absl::StatusOr<GpuGraph> g =
      BuildGpuGraph(Load("dgx1v_nccl_topo.xml"), {5, 0, 1, 2}, LinkMode::kNvLinkOnly);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->gpus, (std::vector<int>{5, 0, 1, 2}));
  // 0-1 (1), 0-2 (1), 1-2 (2), 1-5 (2).
  EXPECT_EQ(g->arcs.size(), 8u);
  EXPECT_EQ(TotalLinks(*g), 6);
}

TEST(BuildGpuGraphTest, AllModeConnectsGpusWithoutNvLink) {
  Topology t = Load("dgx1v_nccl_topo.xml");
  absl::StatusOr<GpuGraph> nv = BuildGpuGraph(t, {0, 5}, LinkMode::kNvLinkOnly);
  ASSERT_TRUE(nv.ok());
  EXPECT_TRUE(nv->arcs.empty());
  absl::StatusOr<GpuGraph> all = BuildGpuGraph(t, {0, 5}, LinkMode::kAll);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->arcs.size(), 2u);
  EXPECT_EQ(all->arcs[0].kind, LinkKind::kPcie);
  EXPECT_EQ(all->arcs[0].link_count, 0);
  // Sockets 0 and 1: min(cross-switch, host) by default.
  EXPECT_EQ(all->arcs[0].bytes_per_s, kPcieCrossSwitchBytesPerS);
  // Full box in kAll: NVLink pairs keep only their NVLink arcs; 12 pairs lack NVLink.
  absl::StatusOr<GpuGraph> box = BuildGpuGraph(t, {}, LinkMode::kAll);
  ASSERT_TRUE(box.ok());
  EXPECT_EQ(box->arcs.size(), 32u + 24u);
}

TEST(BuildGpuGraphTest, PcieServerUsesSwitchBandwidths) {
  absl::StatusOr<GpuGraph> g =
      BuildGpuGraph(Load("byteps_pcie_server.yaml"), {0, 1, 4}, LinkMode::kAll);
  ASSERT_TRUE(g.ok()) << g.status();
  std::map<std::pair<int, int>, double> rate;
  for (const GpuArc& a : g->arcs) rate[{g->gpus[a.from], g->gpus[a.to]}] = a.bytes_per_s;
  EXPECT_EQ(rate[std::make_pair(0, 1)], 105e9 / 8);  // same switch
  EXPECT_EQ(rate[std::make_pair(0, 4)], 80e9 / 8);  // across switches and sockets: min(cross, host)
  EXPECT_EQ(rate[std::make_pair(4, 1)], 80e9 / 8);
  absl::StatusOr<GpuGraph> nv =
      BuildGpuGraph(Load("byteps_pcie_server.yaml"), {}, LinkMode::kNvLinkOnly);
  ASSERT_TRUE(nv.ok());
  EXPECT_TRUE(nv->arcs.empty());
}

TEST(BuildGpuGraphTest, NvSwitchIsAMeshWithTheGpuInjectionRate) {
  Topology t = Load("dgx2.json");
  absl::StatusOr<GpuGraph> g = BuildGpuGraph(t, {}, LinkMode::kNvLinkOnly);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->arcs.size(), 16u * 15u);
  std::vector<double> out(16, 0);
  for (const GpuArc& a : g->arcs) out[a.from] += a.bytes_per_s;
  for (double v : out) EXPECT_NEAR(v, 6 * 25e9, 1);
  // A 4-GPU fragment: 6 links over 3 peers = 2 whole links each.
  absl::StatusOr<GpuGraph> frag = BuildGpuGraph(t, {0, 5, 9, 14}, LinkMode::kAll);
  ASSERT_TRUE(frag.ok());
  EXPECT_EQ(frag->arcs.size(), 12u);
  for (const GpuArc& a : frag->arcs) {
    EXPECT_EQ(a.link_count, 2);
    EXPECT_EQ(a.bytes_per_s, 50e9);
  }
}

TEST(BuildGpuGraphTest, UnknownOrRepeatedGpuIsInvalid) {
  Topology t = Load("dgx1v_nccl_topo.xml");
  absl::StatusOr<GpuGraph> g = BuildGpuGraph(t, {0, 8}, LinkMode::kAll);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(g.status().message(), HasSubstr("GPU 8 is not in the topology"));
  EXPECT_EQ(BuildGpuGraph(t, {1, 1}, LinkMode::kAll).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<GpuGraph> none = BuildGpuGraph(Load("cpu_only.json"), {}, LinkMode::kAll);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->gpus.empty());
}

}  // namespace
}  // namespace tributary::topology
