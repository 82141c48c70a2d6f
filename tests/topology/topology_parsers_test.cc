#include "topology/topology_parsers.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "tests/topology/fixture_path.h"
#include "topology/topology_file.h"
#include "topology/topology_util.h"

namespace tributary::topology {
namespace {

using ::testing::HasSubstr;
using tributary::v1::Topology;

std::string ReadFixture(const std::string& name) {
  std::ifstream in(FixturePath(name));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The DESIGN.md §1.3 reference list for the DGX-1 V100.
const std::map<std::pair<int, int>, int>& DgxV100Links() {
  static const auto* links = new std::map<std::pair<int, int>, int>{
      {{0, 1}, 1}, {{0, 2}, 1}, {{1, 3}, 1}, {{2, 6}, 1}, {{3, 7}, 1}, {{4, 5}, 1},
      {{4, 6}, 1}, {{5, 7}, 1}, {{0, 3}, 2}, {{0, 4}, 2}, {{1, 2}, 2}, {{1, 5}, 2},
      {{2, 3}, 2}, {{4, 7}, 2}, {{5, 6}, 2}, {{6, 7}, 2}};
  return *links;
}

std::map<std::pair<int, int>, int> LinksOf(const Topology& t) {
  std::map<std::pair<int, int>, int> out;
  for (const auto& l : t.nvlinks()) out[{l.gpu_a(), l.gpu_b()}] = l.link_count();
  return out;
}

void ExpectRoundTrip(const Topology& t) {
  absl::StatusOr<Topology> from_json = ParseTopologyJson(TopologyToJson(t), "roundtrip.json");
  ASSERT_TRUE(from_json.ok()) << from_json.status() << "\n" << TopologyToJson(t);
  std::string diff;
  google::protobuf::util::MessageDifferencer json_diff;
  json_diff.ReportDifferencesToString(&diff);
  EXPECT_TRUE(json_diff.Compare(t, *from_json)) << diff;

  absl::StatusOr<Topology> from_yaml = ParseTopologyYaml(TopologyToYaml(t), "roundtrip.yaml");
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status() << "\n" << TopologyToYaml(t);
  diff.clear();
  google::protobuf::util::MessageDifferencer yaml_diff;
  yaml_diff.ReportDifferencesToString(&diff);
  EXPECT_TRUE(yaml_diff.Compare(t, *from_yaml)) << diff << "\n" << TopologyToYaml(t);
}

TEST(NcclXmlTest, DgxV100MatchesTheReferenceLinks) {
  absl::StatusOr<Topology> t = LoadTopologyFile(FixturePath("dgx1v_nccl_topo.xml"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->gpus_size(), 8);
  EXPECT_EQ(t->sockets_size(), 2);
  EXPECT_EQ(t->pcie_switches_size(), 4);
  EXPECT_EQ(LinksOf(*t), DgxV100Links());
  EXPECT_EQ(t->bandwidth().nvlink_bytes_per_s(), 25e9);
  // GPU 4 sits in socket 1 below the switch 0000:85:00.0 (which shares the GPU's bus id).
  EXPECT_EQ(t->gpus(4).pci_bus_id(), "0000:85:00.0");
  EXPECT_EQ(t->gpus(4).numa_node(), 1);
  EXPECT_EQ(t->gpus(4).parent_switch_id(), "0000:85:00.0");
  EXPECT_EQ(t->gpus(0).parent_switch_id(), "0000:03:00.0");
  EXPECT_EQ(t->gpus(0).name(), "sm_70");
  EXPECT_THAT(t->source(), HasSubstr("dgx1v_nccl_topo.xml"));
}

TEST(NcclXmlTest, DgxP100HasSingleLinksAndNvLink1Bandwidth) {
  absl::StatusOr<Topology> t = LoadTopologyFile(FixturePath("dgx1p_nccl_topo.xml"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->nvlinks_size(), 16);
  for (const auto& l : t->nvlinks()) EXPECT_EQ(l.link_count(), 1);
  EXPECT_EQ(t->bandwidth().nvlink_bytes_per_s(), 20e9);
}

TEST(NcclXmlTest, NicsAndNvSwitch) {
  const char* xml = R"(<system version="1">
  <cpu numaid="0">
    <pci busid="0000:10:00.0" class="0x060400">
      <pci busid="0000:11:00.0" class="0x030200"><gpu dev="0" sm="80">
        <nvlink target="fffffff:ffff:ff" count="12" tclass="0x068000"/></gpu></pci>
      <pci busid="0000:12:00.0" class="0x020000">
        <nic><net name="mlx5_0" dev="0" speed="200000" port="1"/></nic></pci>
    </pci>
    <pci busid="0000:20:00.0" class="0x030200"><gpu dev="1" sm="80">
      <nvlink target="fffffff:ffff:ff" count="12" tclass="0x068000"/></gpu></pci>
  </cpu>
</system>)";
  absl::StatusOr<Topology> t = ParseNcclTopoXml(xml, "a100.xml");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->nics_size(), 1);
  EXPECT_EQ(t->nics(0).speed_bits_per_s(), 200000000000);
  EXPECT_EQ(t->nics(0).parent_switch_id(), "0000:10:00.0");
  EXPECT_EQ(t->nvswitch().links_per_gpu(), 12);
  EXPECT_EQ(t->nvswitch().gpus_size(), 2);
  EXPECT_EQ(t->gpus(1).parent_switch_id(), "");
  ExpectRoundTrip(*t);
}

struct BadInput {
  std::string name;
  std::string text;
  std::string expected;  // substring of the message
};

class NcclXmlErrorTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(NcclXmlErrorTest, NamesFileAndElement) {
  absl::StatusOr<Topology> t = ParseNcclTopoXml(GetParam().text, "bad.xml");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("bad.xml"));
  EXPECT_THAT(t.status().message(), HasSubstr(GetParam().expected));
}

std::string Dgx1vWith(const std::string& from, const std::string& to) {
  std::string xml = ReadFixture("dgx1v_nccl_topo.xml");
  size_t at = xml.find(from);
  if (at == std::string::npos) return "missing " + from;
  return xml.replace(at, from.size(), to);
}

INSTANTIATE_TEST_SUITE_P(
    Malformed, NcclXmlErrorTest,
    ::testing::Values(
        BadInput{"truncated", ReadFixture("dgx1v_nccl_topo.xml").substr(0, 900), "malformed XML"},
        BadInput{
            "bad_count",
            Dgx1vWith(R"(target="0000:07:00.0" count="1")", R"(target="0000:07:00.0" count="x")"),
            "line 6: <nvlink> count=\"x\" is not a positive integer"},
        BadInput{
            "zero_count",
            Dgx1vWith(R"(target="0000:07:00.0" count="1")", R"(target="0000:07:00.0" count="0")"),
            "line 6: <nvlink> count=\"0\""},
        BadInput{"unknown_target",
                 Dgx1vWith(R"(target="0000:07:00.0")", R"(target="0000:42:00.0")"),
                 "line 6: <nvlink> target=\"0000:42:00.0\" is not the bus id of any GPU"},
        BadInput{"bad_bus_id", Dgx1vWith(R"(busid="0000:06:00.0")", R"(busid="zz:06")"),
                 "line 4: <pci> busid=\"zz:06\" is not a PCI bus id"},
        BadInput{
            "asymmetric",
            Dgx1vWith(R"(target="0000:07:00.0" count="1")", R"(target="0000:07:00.0" count="3")"),
            "disagrees"},
        BadInput{"missing_dev", Dgx1vWith(R"(<gpu dev="0")", R"(<gpu)"),
                 "line 5: <gpu> lacks the attribute dev"},
        BadInput{"wrong_root", "<topology/>", "root element must be <system>"}),
    [](const ::testing::TestParamInfo<BadInput>& info) { return info.param.name; });

TEST(NvidiaSmiTest, MatchesTheXmlLinks) {
  for (const auto& [smi, xml] : {std::pair{"dgx1v_nvidia_smi_topo.txt", "dgx1v_nccl_topo.xml"},
                                 std::pair{"dgx1p_nvidia_smi_topo.txt", "dgx1p_nccl_topo.xml"}}) {
    absl::StatusOr<Topology> from_smi = LoadTopologyFile(FixturePath(smi));
    absl::StatusOr<Topology> from_xml = LoadTopologyFile(FixturePath(xml));
    ASSERT_TRUE(from_smi.ok()) << from_smi.status();
    ASSERT_TRUE(from_xml.ok()) << from_xml.status();
    EXPECT_EQ(from_smi->gpus_size(), 8);
    EXPECT_EQ(LinksOf(*from_smi), LinksOf(*from_xml)) << smi;
    EXPECT_EQ(from_smi->gpus(3).numa_node(), -1);  // hidden behind NV# and SYS cells
  }
}

TEST(NvidiaSmiTest, PcieMatrixWithNicsAndAffinity) {
  const std::string text =
      "\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\n"
      "GPU0\t X \tPIX\tSYS\tSYS\tPIX\t0-11\t0\n"
      "GPU1\tPIX\t X \tSYS\tSYS\tPIX\t0-11\t0\n"
      "GPU2\tSYS\tSYS\t X \tPXB\tSYS\t12-23\t1\n"
      "GPU3\tSYS\tSYS\tPXB\t X \tSYS\t12-23\t1\n"
      "NIC0\tPIX\tPIX\tSYS\tSYS\t X \t\t\n"
      "\n"
      "Legend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe\n\n"
      "NIC Legend:\n\n  NIC0: mlx5_0\n";
  absl::StatusOr<Topology> t = ParseNvidiaSmiTopo(text, "pcie.txt");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->gpus_size(), 4);
  EXPECT_EQ(t->pcie_switches_size(), 2);
  EXPECT_EQ(t->gpus(0).parent_switch_id(), t->gpus(1).parent_switch_id());
  EXPECT_NE(t->gpus(0).parent_switch_id(), t->gpus(2).parent_switch_id());
  EXPECT_EQ(t->gpus(2).numa_node(), 1);
  ASSERT_EQ(t->nics_size(), 1);
  EXPECT_EQ(t->nics(0).name(), "mlx5_0");
  EXPECT_EQ(t->nics(0).parent_switch_id(), t->gpus(0).parent_switch_id());
  EXPECT_EQ(t->sockets_size(), 2);
  ExpectRoundTrip(*t);
}

TEST(NvidiaSmiTest, AllPairsNvLinkIsAnNvSwitchFabric) {
  std::string text = "\tGPU0\tGPU1\tGPU2\tGPU3\n";
  for (int i = 0; i < 4; ++i) {
    text += "GPU" + std::to_string(i);
    for (int j = 0; j < 4; ++j) text += i == j ? "\t X " : "\tNV12";
    text += "\n";
  }
  absl::StatusOr<Topology> t = ParseNvidiaSmiTopo(text, "a100.txt");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->nvlinks_size(), 0);
  EXPECT_EQ(t->nvswitch().links_per_gpu(), 12);
  EXPECT_EQ(t->nvswitch().gpus_size(), 4);
}

TEST(NvidiaSmiTest, BadCellNamesLineAndColumn) {
  std::string text = ReadFixture("dgx1v_nvidia_smi_topo.txt");
  text.replace(text.find("NV2"), 3, "QQQ");  // row GPU0 (line 2), column GPU3
  absl::StatusOr<Topology> t = ParseNvidiaSmiTopo(text, "bad.txt");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(),
              HasSubstr("bad.txt: line 2, column GPU3: unknown cell \"QQQ\""));
}

TEST(NvidiaSmiTest, AsymmetricAndShortRowsFail) {
  std::string text = ReadFixture("dgx1v_nvidia_smi_topo.txt");
  std::string asym = text;
  asym.replace(asym.find("NV1"), 3, "NV3");
  EXPECT_THAT(ParseNvidiaSmiTopo(asym, "a.txt").status().message(), HasSubstr("differs"));
  std::string shorter = text.substr(0, text.find("GPU7\tSYS"));
  EXPECT_THAT(ParseNvidiaSmiTopo(shorter, "s.txt").status().message(),
              HasSubstr("ends after 7 of 8 rows"));
  EXPECT_FALSE(ParseNvidiaSmiTopo("", "e.txt").ok());
}

TEST(JsonYamlTest, EveryFixtureLoadsAndRoundTrips) {
  for (const char* name :
       {"dgx1p_nccl_topo.xml", "dgx1v_nccl_topo.xml", "dgx1p_nvidia_smi_topo.txt",
        "dgx1v_nvidia_smi_topo.txt", "dgx2.json", "byteps_pcie_server.yaml",
        "byteps_nvlink_server.json", "single_gpu.yaml", "cpu_only.json"}) {
    SCOPED_TRACE(name);
    absl::StatusOr<Topology> t = LoadTopologyFile(FixturePath(name));
    ASSERT_TRUE(t.ok()) << t.status();
    ExpectRoundTrip(*t);
  }
}

TEST(JsonYamlTest, HandWrittenFixturesHaveTheirShape) {
  absl::StatusOr<Topology> dgx2 = LoadTopologyFile(FixturePath("dgx2.json"));
  ASSERT_TRUE(dgx2.ok()) << dgx2.status();
  EXPECT_EQ(dgx2->gpus_size(), 16);
  EXPECT_EQ(dgx2->nvswitch().links_per_gpu(), 6);
  absl::StatusOr<Topology> pcie = LoadTopologyFile(FixturePath("byteps_pcie_server.yaml"));
  ASSERT_TRUE(pcie.ok()) << pcie.status();
  EXPECT_EQ(pcie->gpus_size(), 8);
  EXPECT_EQ(pcie->bandwidth().pcie_same_switch_bytes_per_s(), 105e9 / 8);
  EXPECT_EQ(pcie->nics(0).parent_switch_id(), "");
  EXPECT_EQ(pcie->gpus(5).numa_node(), 1);
  absl::StatusOr<Topology> cpu = LoadTopologyFile(FixturePath("cpu_only.json"));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->gpus_size(), 0);
  EXPECT_EQ(cpu->nics(0).numa_node(), 0);
  absl::StatusOr<Topology> one = LoadTopologyFile(FixturePath("single_gpu.yaml"));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->gpus(0).pci_bus_id(), "0000:3b:00.0");
}

TEST(JsonYamlTest, MissingNumaNodeMeansUnknown) {
  absl::StatusOr<Topology> t = ParseTopologyJson(R"({"gpus": [{"index": 3}]})", "x.json");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->gpus(0).numa_node(), -1);
}

TEST(JsonYamlTest, BadJsonNamesFileAndField) {
  auto message = [](const std::string& text) {
    absl::StatusOr<Topology> t = ParseTopologyJson(text, "m.json");
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(t.status().message());
  };
  EXPECT_THAT(message(R"({"gpus": [{"index": 0}, {"index": "one"}]})"),
              HasSubstr("m.json: gpus[1].index: expected an integer"));
  EXPECT_THAT(message(R"({"gpus": [{"index": 0, "colour": 1}]})"),
              HasSubstr("m.json: gpus[0].colour: unknown field"));
  EXPECT_THAT(message("{\"gpus\": [\n{\"index\": 0},\n"),
              HasSubstr("m.json: line 3: malformed JSON"));
  EXPECT_THAT(
      message(
          R"({"gpus": [{"index": 0}], "nvlinks": [{"gpu_a": 0, "gpu_b": 5, "link_count": 1}]})"),
      HasSubstr("m.json: nvlinks[0]: GPU 5 does not exist"));
  EXPECT_THAT(
      message(R"({"gpus": [{"index": 0}, {"index": 1}], "nvlinks": [{"gpu_a": 0, "gpu_b": 1}]})"),
      HasSubstr("nvlinks[0].link_count: 0 is not positive"));
  EXPECT_THAT(message(R"({"gpus": [{"index": 0, "parent_switch_id": "sw9"}]})"),
              HasSubstr("gpus[0].parent_switch_id: no switch \"sw9\""));
  EXPECT_THAT(
      message(
          R"({"pcie_switches": [{"id": "a", "parent_id": "b"}, {"id": "b", "parent_id": "a"}]})"),
      HasSubstr("cycle"));
  EXPECT_THAT(message(R"({"gpus": [{"index": 1}, {"index": 1}]})"),
              HasSubstr("gpus[1].index: 1 is negative or repeated"));
  EXPECT_THAT(message("[1, 2]"), HasSubstr("top level: expected an object"));
}

TEST(JsonYamlTest, BadYamlNamesFileLineAndField) {
  absl::StatusOr<Topology> t =
      ParseTopologyYaml("gpus:\n  - index: 0\n  - index: 1\n    numa_node: zero\n", "m.yaml");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(),
              HasSubstr("m.yaml: line 4: gpus[1].numa_node: expected an integer"));
  t = ParseTopologyYaml("gpus: [\n  {index: 0\n", "broken.yaml");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("broken.yaml: line"));
  EXPECT_THAT(t.status().message(), HasSubstr("malformed YAML"));
}

// Found by tests/fuzz/topology_yaml_fuzz.cc: YAML passes raw bytes through, and a name that is
// not UTF-8 was accepted, then aborted TopologyToJson (nlohmann::json throws on it).
TEST(JsonYamlTest, StringsThatAreNotUtf8AreRejected) {
  for (std::string bad : {std::string("\xff"), std::string("a\xc3"), std::string("\xc0\xaf"),
                          std::string("\xed\xa0\x80")}) {
    absl::StatusOr<Topology> t = ParseTopologyYaml(
        "hostname: h\nnics:\n  - name: \"" + bad + "\"\n    speed_bits_per_s: 1e9\n", "u.yaml");
    ASSERT_FALSE(t.ok()) << bad.size();
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr("u.yaml: nics[0].name: not valid UTF-8"));
  }
  absl::StatusOr<Topology> t =
      ParseTopologyYaml("hostname: \"h\xc3\xa9\xe2\x82\xac\xf0\x9f\x99\x82\"\n", "ok.yaml");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(ParseTopologyJson(TopologyToJson(*t), "back.json").ok());
}

// Found by tests/fuzz/topology_json_fuzz.cc (a 10-minute run): a number that overflows a double
// made nlohmann::json throw out_of_range, which ParseTopologyJson did not catch (abort).
TEST(JsonYamlTest, NumbersThatOverflowAreRejected) {
  for (std::string text :
       {std::string("5.555E55000"), std::string("{\"hostname\": \"h\", \"nics\": [{\"name\": "
                                                "\"a\", \"speed_bits_per_s\": 1e999}]}")}) {
    absl::StatusOr<Topology> t = ParseTopologyJson(text, "big.json");
    ASSERT_FALSE(t.ok()) << text;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr("big.json: malformed JSON"));
    EXPECT_THAT(t.status().message(), HasSubstr("number overflow"));
  }
  absl::StatusOr<Topology> y = ParseTopologyYaml(
      "hostname: h\nnics:\n  - name: a\n    speed_bits_per_s: 1e999\n", "big.yaml");
  ASSERT_FALSE(y.ok());
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoadTopologyFileTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadTopologyFile("/nonexistent/topo.json").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(LoadTopologyFileTest, DetectsFormatByContent) {
  EXPECT_EQ(DetectTopologyFormat("t", "  <system>"), TopologyFormat::kNcclXml);
  EXPECT_EQ(DetectTopologyFormat("t", "{}"), TopologyFormat::kJson);
  EXPECT_EQ(DetectTopologyFormat("t", "\tGPU0\tGPU1\n"), TopologyFormat::kNvidiaSmi);
  EXPECT_EQ(DetectTopologyFormat("t", "gpus: []"), TopologyFormat::kYaml);
  EXPECT_EQ(DetectTopologyFormat("a.YML", "{}"), TopologyFormat::kYaml);
}

TEST(BusIdTest, Normalizes) {
  EXPECT_EQ(NormalizeBusId("00000000:0A:00.0"), "0000:0a:00.0");
  EXPECT_EQ(NormalizeBusId("3b:00.1"), "0000:3b:00.1");
  EXPECT_EQ(NormalizeBusId("0000:3b:00"), "");
  EXPECT_EQ(NormalizeBusId("fffffff:ffff:ff"), "");
}

}  // namespace
}  // namespace tributary::topology
