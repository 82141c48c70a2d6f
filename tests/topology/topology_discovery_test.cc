#include "topology/topology_discovery.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "topology/strategy.h"

namespace tributary::topology {
namespace {

namespace fs = std::filesystem;
using tributary::v1::Topology;

// A fake /sys: socket 0 has a PCIe switch (upstream 01:00.0) with two GPUs and a 100 Gbps NIC
// below its downstream ports; socket 1 has one GPU on a root port.
class FakeSysfs {
 public:
  FakeSysfs() {
    root_ = fs::temp_directory_path() /
            ("tributary_sysfs_" + std::to_string(getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(root_);
    fs::create_directories(root_ / "bus/pci/devices");
    const std::string s0 = "devices/pci0000:00/0000:00:01.0";
    Device(s0, "0x060400", "0x8086", 0);
    Device(s0 + "/0000:01:00.0", "0x060400", "0x10b5", 0);
    Device(s0 + "/0000:01:00.0/0000:02:08.0", "0x060400", "0x10b5", 0);
    Device(s0 + "/0000:01:00.0/0000:02:08.0/0000:03:00.0", "0x030200", "0x10de", 0);
    Device(s0 + "/0000:01:00.0/0000:02:10.0", "0x060400", "0x10b5", 0);
    Device(s0 + "/0000:01:00.0/0000:02:10.0/0000:04:00.0", "0x030000", "0x10de", 0);
    Device(s0 + "/0000:01:00.0/0000:02:14.0", "0x060400", "0x10b5", 0);
    const std::string nic = s0 + "/0000:01:00.0/0000:02:14.0/0000:05:00.0";
    Device(nic, "0x020000", "0x15b3", 0);
    fs::create_directories(root_ / nic / "net/eth2");
    Write("class/net/eth2/speed", "100000");
    const std::string s1 = "devices/pci0000:80/0000:80:01.0";
    Device(s1, "0x060400", "0x8086", 1);
    Device(s1 + "/0000:81:00.0", "0x030200", "0x10de", 1);
    Device(s1 + "/0000:82:00.0", "0x010802", "0x144d", 1);  // an NVMe drive: ignored
    Write("devices/system/node/node0/cpulist", "0-7,16-23");
    Write("devices/system/node/node1/cpulist", "8-15");
  }
  ~FakeSysfs() { fs::remove_all(root_); }
  std::string root() const { return root_.string(); }

 private:
  void Write(const std::string& rel, const std::string& text) {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text << "\n";
  }
  void Device(const std::string& rel, const std::string& cls, const std::string& vendor, int numa) {
    fs::create_directories(root_ / rel);
    Write(rel + "/class", cls);
    Write(rel + "/vendor", vendor);
    Write(rel + "/device", "0x1db5");
    Write(rel + "/numa_node", std::to_string(numa));
    std::string bdf = fs::path(rel).filename().string();
    fs::create_symlink(fs::path("../../..") / rel, root_ / "bus/pci/devices" / bdf);
  }

  static inline int counter_ = 0;
  fs::path root_;
};

class FakeNvLink : public NvLinkSource {
 public:
  explicit FakeNvLink(std::vector<NvmlGpu> gpus) : gpus_(std::move(gpus)) {}
  absl::StatusOr<std::vector<NvmlGpu>> Gpus() override { return gpus_; }

 private:
  std::vector<NvmlGpu> gpus_;
};

class NoNvml : public NvLinkSource {
 public:
  absl::StatusOr<std::vector<NvmlGpu>> Gpus() override {
    return absl::UnavailableError("dlopen libnvidia-ml.so.1: not found");
  }
};

TEST(DiscoverTopologyTest, ReadsThePciTree) {
  FakeSysfs sys;
  NoNvml nvml;
  absl::StatusOr<Topology> t = DiscoverTopology(sys.root(), &nvml);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->sockets_size(), 2);
  EXPECT_EQ(t->sockets(0).cpu_cores(), 16);
  EXPECT_EQ(t->sockets(1).cpu_cores(), 8);
  ASSERT_EQ(t->pcie_switches_size(), 1);
  EXPECT_EQ(t->pcie_switches(0).id(), "0000:01:00.0");
  EXPECT_EQ(t->pcie_switches(0).parent_id(), "");
  EXPECT_EQ(t->pcie_switches(0).socket_id(), 0);
  ASSERT_EQ(t->gpus_size(), 3);
  EXPECT_EQ(t->gpus(0).pci_bus_id(), "0000:03:00.0");
  EXPECT_EQ(t->gpus(0).parent_switch_id(), "0000:01:00.0");
  EXPECT_EQ(t->gpus(1).pci_bus_id(), "0000:04:00.0");
  EXPECT_EQ(t->gpus(2).pci_bus_id(), "0000:81:00.0");
  EXPECT_EQ(t->gpus(2).parent_switch_id(), "");
  EXPECT_EQ(t->gpus(2).numa_node(), 1);
  ASSERT_EQ(t->nics_size(), 1);
  EXPECT_EQ(t->nics(0).name(), "eth2");
  EXPECT_EQ(t->nics(0).speed_bits_per_s(), 100000000000);
  EXPECT_EQ(t->nics(0).parent_switch_id(), "0000:01:00.0");
  EXPECT_EQ(t->nvlinks_size(), 0);
  EXPECT_FALSE(t->has_nvswitch());
  EXPECT_GT(t->bandwidth().nvlink_bytes_per_s(), 0);

  // PCIe only: GPUs 0 and 1 share the NIC's switch, GPU 2 is alone on socket 1.
  absl::StatusOr<IntraNodeStrategy> s = ChooseStrategy(*t, {});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->kind, IntraNodeStrategy::kCpuAssistedPerSwitch);
  EXPECT_EQ(s->switch_groups, (std::vector<std::vector<int>>{{0, 1}, {2}}));
}

TEST(DiscoverTopologyTest, NvLinkFromNvmlNumbersAndLinksGpus) {
  FakeSysfs sys;
  FakeNvLink nvml({
      {1, "0000:03:00.0", "Tesla V100", {"0000:04:00.0", "0000:04:00.0", "0000:81:00.0"}},
      {0, "0000:04:00.0", "Tesla V100", {"0000:03:00.0", "0000:03:00.0"}},
      {2, "0000:81:00.0", "Tesla V100", {"0000:03:00.0"}},
  });
  absl::StatusOr<Topology> t = DiscoverTopology(sys.root(), &nvml);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->gpus_size(), 3);
  EXPECT_EQ(t->gpus(0).pci_bus_id(), "0000:04:00.0");  // NVML index 0
  EXPECT_EQ(t->gpus(0).name(), "Tesla V100");
  ASSERT_EQ(t->nvlinks_size(), 2);
  EXPECT_EQ(t->nvlinks(0).gpu_a(), 0);
  EXPECT_EQ(t->nvlinks(0).gpu_b(), 1);
  EXPECT_EQ(t->nvlinks(0).link_count(), 2);
  EXPECT_EQ(t->nvlinks(1).gpu_a(), 1);
  EXPECT_EQ(t->nvlinks(1).gpu_b(), 2);
  EXPECT_EQ(t->nvlinks(1).link_count(), 1);
}

TEST(DiscoverTopologyTest, LinksToANonGpuAreAnNvSwitch) {
  FakeSysfs sys;
  FakeNvLink nvml({
      {0, "0000:03:00.0", "A100", {"0000:c0:00.0", "0000:c1:00.0"}},
      {1, "0000:04:00.0", "A100", {"0000:c0:00.0", "0000:c1:00.0"}},
  });
  absl::StatusOr<Topology> t = DiscoverTopology(sys.root(), &nvml);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->nvswitch().links_per_gpu(), 2);
  EXPECT_EQ(t->nvswitch().gpus_size(), 2);
  EXPECT_EQ(t->nvlinks_size(), 0);
}

TEST(DiscoverTopologyTest, RealNvmlAbsentOrPresentIsNotAnError) {
  FakeSysfs sys;
  std::unique_ptr<NvLinkSource> nvml = MakeNvmlNvLinkSource();
  // Without a driver this is UNAVAILABLE; discovery carries on without NVLink.
  absl::StatusOr<Topology> t = DiscoverTopology(sys.root(), nvml.get());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->gpus_size(), 3);
  absl::StatusOr<Topology> bare = DiscoverTopology(sys.root(), nullptr);
  ASSERT_TRUE(bare.ok()) << bare.status();
}

TEST(DiscoverTopologyTest, NoPciTreeIsNotFound) {
  EXPECT_EQ(DiscoverTopology("/nonexistent-sys", nullptr).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(DiscoverTopologyTest, ThisMachine) {
  // Whatever the host has (a CPU-only CI box included) must come out valid.
  absl::StatusOr<Topology> t = DiscoverLocalTopology();
  if (!t.ok()) {
    EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound) << t.status();
    return;
  }
  EXPECT_TRUE(ChooseStrategy(*t, {}).ok());
}

}  // namespace
}  // namespace tributary::topology
