#include "topology/strategy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/topology/fixture_path.h"
#include "topology/topology_file.h"
#include "topology/topology_parsers.h"

namespace tributary::topology {
namespace {

using ::testing::HasSubstr;
using tributary::v1::Topology;
using Kind = IntraNodeStrategy::Kind;

IntraNodeStrategy Choose(const std::string& file, const std::vector<int>& gpus) {
  absl::StatusOr<Topology> t = LoadTopologyFile(FixturePath(file));
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  absl::StatusOr<IntraNodeStrategy> s = ChooseStrategy(*t, gpus);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : IntraNodeStrategy{};
}

TEST(ChooseStrategyTest, PcieServerIsCpuAssistedPerSwitch) {
  IntraNodeStrategy s = Choose("byteps_pcie_server.yaml", {});
  EXPECT_EQ(s.kind, Kind::kCpuAssistedPerSwitch);
  EXPECT_EQ(s.switch_groups, (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(s.root_gpu, -1);
  EXPECT_THAT(s.reason, HasSubstr("PCIe only"));
  EXPECT_THAT(s.reason, HasSubstr("no GPU-to-GPU copy across PCIe switches"));
  EXPECT_EQ(s.nic, "eth0");
}

TEST(ChooseStrategyTest, NvLinkServerRootsOutsideTheNicSwitch) {
  IntraNodeStrategy s = Choose("byteps_nvlink_server.json", {});
  EXPECT_EQ(s.kind, Kind::kNvLinkRootedOutsideNicSwitch);
  // GPUs 0 and 1 share sw0 with the NIC; 2 is the first GPU outside it on the NIC's socket.
  EXPECT_EQ(s.root_gpu, 2);
  EXPECT_THAT(s.reason, HasSubstr("not below switch sw0 of NIC mlx5_0"));
  // The NIC's switch GPUs alone still get a root, with the reason saying so.
  IntraNodeStrategy pair = Choose("byteps_nvlink_server.json", {0, 1});
  EXPECT_EQ(pair.kind, Kind::kNvLinkRootedOutsideNicSwitch);
  EXPECT_THAT(pair.reason, HasSubstr("every chosen GPU shares switch sw0"));
}

TEST(ChooseStrategyTest, DgxFullBoxHasARing) {
  IntraNodeStrategy s = Choose("dgx1v_nccl_topo.xml", {});
  EXPECT_EQ(s.kind, Kind::kNvLinkRootedOutsideNicSwitch);
  EXPECT_EQ(s.root_gpu, 0);
  EXPECT_THAT(s.reason, HasSubstr("no NIC in the topology"));
  EXPECT_EQ(Choose("dgx1p_nvidia_smi_topo.txt", {}).kind, Kind::kNvLinkRootedOutsideNicSwitch);
}

TEST(ChooseStrategyTest, FragmentWithoutRingPacksTrees) {
  IntraNodeStrategy s = Choose("dgx1v_nccl_topo.xml", {0, 1, 2, 5});
  EXPECT_EQ(s.kind, Kind::kPackedTrees);
  EXPECT_EQ(s.root_gpu, 1);  // the most NVLink inside the fragment (5 links)
  EXPECT_THAT(s.reason, HasSubstr("no NVLink ring"));
  // {0,1,2,3} has the ring 0-1-3-2.
  EXPECT_EQ(Choose("dgx1v_nccl_topo.xml", {0, 1, 2, 3}).kind, Kind::kNvLinkRootedOutsideNicSwitch);
  EXPECT_TRUE(HasNvLinkRing(*LoadTopologyFile(FixturePath("dgx1v_nccl_topo.xml")), {0, 1, 3, 2}));
  EXPECT_FALSE(HasNvLinkRing(*LoadTopologyFile(FixturePath("dgx1v_nccl_topo.xml")), {0, 1, 2, 5}));
}

TEST(ChooseStrategyTest, NoNvLinkPathGroupsBySwitch) {
  // 0 and 5 share no NVLink, switch or socket: host staging.
  IntraNodeStrategy s = Choose("dgx1v_nccl_topo.xml", {0, 5});
  EXPECT_EQ(s.kind, Kind::kHostStaging);
  EXPECT_EQ(s.switch_groups, (std::vector<std::vector<int>>{{0}, {5}}));
  // {0,1} are NVLink-joined, 7 stands alone: CPU-assisted over the groups.
  IntraNodeStrategy mixed = Choose("dgx1v_nccl_topo.xml", {0, 1, 7});
  EXPECT_EQ(mixed.kind, Kind::kCpuAssistedPerSwitch);
  EXPECT_EQ(mixed.switch_groups, (std::vector<std::vector<int>>{{0, 1}, {7}}));
  EXPECT_THAT(mixed.reason, HasSubstr("NVLink does not connect all chosen GPUs"));
}

TEST(ChooseStrategyTest, Dgx2IsOneNvSwitchRing) {
  IntraNodeStrategy s = Choose("dgx2.json", {});
  EXPECT_EQ(s.kind, Kind::kNvLinkRootedOutsideNicSwitch);
  EXPECT_EQ(s.root_gpu, 4);  // outside sw0 (mlx5_0's), socket 0
  EXPECT_THAT(s.reason, HasSubstr("NVSwitch"));
  EXPECT_EQ(Choose("dgx2.json", {3, 11, 12}).kind, Kind::kNvLinkRootedOutsideNicSwitch);
}

TEST(ChooseStrategyTest, SingleGpuAndCpuOnly) {
  IntraNodeStrategy one = Choose("single_gpu.yaml", {});
  EXPECT_EQ(one.kind, Kind::kDirect);
  EXPECT_EQ(one.root_gpu, 0);
  EXPECT_THAT(one.reason, HasSubstr("one GPU"));
  EXPECT_EQ(Choose("dgx1v_nccl_topo.xml", {6}).kind, Kind::kDirect);
  IntraNodeStrategy cpu = Choose("cpu_only.json", {});
  EXPECT_EQ(cpu.kind, Kind::kCpuOnly);
  EXPECT_EQ(cpu.root_gpu, -1);
  EXPECT_THAT(cpu.reason, HasSubstr("CPU-only"));
  EXPECT_STREQ(StrategyKindName(cpu.kind), "cpu-only");
}

TEST(ChooseStrategyTest, UnknownGpuIsInvalid) {
  absl::StatusOr<Topology> t = LoadTopologyFile(FixturePath("single_gpu.yaml"));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(ChooseStrategy(*t, {1}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tributary::topology
