#include "topology/sysfs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace tributary::topology {
namespace {

namespace fs = std::filesystem;

class SysfsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("tributary_sysfs_attr_" + std::to_string(getpid()));
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const std::string& rel, const std::string& text) {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text;
  }
  fs::path root_;
};

TEST_F(SysfsTest, ReadsTrimmedTextAndIntegers) {
  Write("a", "  mlx5_0 \n");
  Write("n", "-1\n");
  Write("h", "0x10de\n");
  Write("bad", "fast\n");
  EXPECT_EQ(ReadSysfsText(root_ / "a"), "mlx5_0");
  EXPECT_EQ(ReadSysfsText(root_ / "missing"), "");
  EXPECT_EQ(ReadSysfsInt(root_ / "n"), -1);
  EXPECT_EQ(ReadSysfsInt(root_ / "h"), 0x10de);
  EXPECT_EQ(ReadSysfsInt(root_ / "bad"), std::nullopt);
  EXPECT_EQ(ReadSysfsInt(root_ / "missing"), std::nullopt);
}

TEST_F(SysfsTest, NicSpeedFromEthernetOrInfiniBandAndUnknownForVirtual) {
  Write("class/net/eth0/speed", "25000\n");
  Write("class/net/veth1/speed", "-1\n");  // virtual interfaces: unknown
  Write("class/net/ib0/speed", "\n");      // IPoIB may refuse; the port rate is the truth
  Write("class/infiniband/ib0/ports/1/rate", "100 Gb/sec (4X EDR)\n");
  EXPECT_EQ(NicSpeedBitsPerSecond(root_, "eth0"), int64_t{25} * 1000 * 1000 * 1000);
  EXPECT_EQ(NicSpeedBitsPerSecond(root_, "ib0"), int64_t{100} * 1000 * 1000 * 1000);
  EXPECT_EQ(NicSpeedBitsPerSecond(root_, "veth1"), 0);
  EXPECT_EQ(NicSpeedBitsPerSecond(root_, "nope"), 0);
}

}  // namespace
}  // namespace tributary::topology
