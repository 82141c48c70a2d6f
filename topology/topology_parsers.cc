#include "topology/topology_parsers.h"

#include <tinyxml2.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "topology/topology_util.h"

namespace tributary::topology {
namespace {

using tributary::v1::Topology;

absl::Status Invalid(std::string_view source, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(source), ": ", what));
}

bool IsUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= n) return false;
    for (size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and values beyond U+10FFFF are not UTF-8.
    constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return false;
    i += n + 1;
  }
  return true;
}

// Every string of `m` (recursively) is UTF-8, as protobuf's string type and the JSON writer
// require: a parser that passes raw bytes through (YAML, XML) must not produce a topology that
// cannot be sent or written (found by tests/fuzz/topology_yaml_fuzz.cc).
absl::Status CheckUtf8(const google::protobuf::Message& m, const std::string& path,
                       std::string_view source) {
  const google::protobuf::Reflection* refl = m.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  refl->ListFields(m, &fields);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    const std::string at = path.empty() ? f->name() : absl::StrCat(path, ".", f->name());
    const int n = f->is_repeated() ? refl->FieldSize(m, f) : 1;
    for (int i = 0; i < n; ++i) {
      const std::string where = f->is_repeated() ? absl::StrCat(at, "[", i, "]") : at;
      if (f->type() == google::protobuf::FieldDescriptor::TYPE_STRING) {
        const std::string v =
            f->is_repeated() ? refl->GetRepeatedString(m, f, i) : refl->GetString(m, f);
        if (!IsUtf8(v)) return Invalid(source, absl::StrCat(where, ": not valid UTF-8"));
      } else if (f->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE) {
        RETURN_IF_ERROR(
            CheckUtf8(f->is_repeated() ? refl->GetRepeatedMessage(m, f, i) : refl->GetMessage(m, f),
                      where, source));
      }
    }
  }
  return absl::OkStatus();
}

// ---- NCCL XML ----

struct PendingNvLink {
  int gpu = 0;
  std::string target;  // normalized bus id
  int count = 0;
  bool to_nvswitch = false;
  int line = 0;
};

class NcclXmlReader {
 public:
  explicit NcclXmlReader(std::string_view source) : source_(source) {}

  absl::StatusOr<Topology> Read(std::string_view xml) {
    tinyxml2::XMLDocument doc;
    if (doc.Parse(xml.data(), xml.size()) != tinyxml2::XML_SUCCESS) {
      return Invalid(
          source_, absl::StrCat("line ", doc.ErrorLineNum(), ": malformed XML: ", doc.ErrorStr()));
    }
    const tinyxml2::XMLElement* system = doc.RootElement();
    if (system == nullptr || std::string_view(system->Name()) != "system") {
      return Invalid(source_, "the root element must be <system>");
    }
    topology_.set_source(absl::StrCat("nccl-xml:", std::string(source_)));
    for (const auto* cpu = system->FirstChildElement(); cpu != nullptr;
         cpu = cpu->NextSiblingElement()) {
      if (std::string_view(cpu->Name()) != "cpu") continue;
      ASSIGN_OR_RETURN(int numa, IntAttr(cpu, "numaid"));
      auto* socket = topology_.add_sockets();
      socket->set_id(numa);
      RETURN_IF_ERROR(Walk(cpu, numa, ""));
    }
    RETURN_IF_ERROR(ResolveNvLinks());
    double per_link = min_sm_ > 0 && min_sm_ < 70 ? kNvLink1BytesPerS : kNvLink2BytesPerS;
    topology_.mutable_bandwidth()->set_nvlink_bytes_per_s(per_link);
    FillDefaultBandwidths(topology_);
    SortTopology(topology_);
    RETURN_IF_ERROR(ValidateTopology(topology_, source_));
    return std::move(topology_);
  }

 private:
  absl::Status Error(const tinyxml2::XMLElement* e, const std::string& what) {
    return Invalid(source_, absl::StrCat("line ", e->GetLineNum(), ": <", e->Name(), "> ", what));
  }

  absl::StatusOr<std::string> StrAttr(const tinyxml2::XMLElement* e, const char* name) {
    const char* v = e->Attribute(name);
    if (v == nullptr) return Error(e, absl::StrCat("lacks the attribute ", name));
    return std::string(v);
  }

  absl::StatusOr<int> IntAttr(const tinyxml2::XMLElement* e, const char* name) {
    ASSIGN_OR_RETURN(std::string v, StrAttr(e, name));
    int out = 0;
    if (!absl::SimpleAtoi(v, &out)) {
      return Error(e, absl::StrCat(name, "=\"", v, "\" is not an integer"));
    }
    return out;
  }

  absl::StatusOr<std::string> BusIdAttr(const tinyxml2::XMLElement* e, const char* name) {
    ASSIGN_OR_RETURN(std::string v, StrAttr(e, name));
    std::string bus = NormalizeBusId(v);
    if (bus.empty()) return Error(e, absl::StrCat(name, "=\"", v, "\" is not a PCI bus id"));
    return bus;
  }

  absl::Status Walk(const tinyxml2::XMLElement* parent, int numa, const std::string& sw) {
    for (const auto* e = parent->FirstChildElement(); e != nullptr; e = e->NextSiblingElement()) {
      std::string_view name = e->Name();
      if (name == "pci") {
        ASSIGN_OR_RETURN(std::string bus, BusIdAttr(e, "busid"));
        const char* cls = e->Attribute("class");
        std::string below = sw;
        if (cls != nullptr && absl::StartsWith(absl::AsciiStrToLower(cls), "0x0604")) {
          auto* s = topology_.add_pcie_switches();
          s->set_id(bus);
          s->set_bus_id(bus);
          s->set_parent_id(sw);
          s->set_socket_id(numa);
          below = bus;
        }
        if (const auto* gpu = e->FirstChildElement("gpu"); gpu != nullptr) {
          RETURN_IF_ERROR(AddGpu(gpu, bus, numa, below));
        }
        if (const auto* nic = e->FirstChildElement("nic"); nic != nullptr) {
          RETURN_IF_ERROR(AddNics(nic, bus, numa, below));
        }
        RETURN_IF_ERROR(Walk(e, numa, below));
      } else if (name == "nic" && std::string_view(parent->Name()) == "cpu") {
        RETURN_IF_ERROR(AddNics(e, "", numa, sw));
      }
    }
    return absl::OkStatus();
  }

  absl::Status AddGpu(const tinyxml2::XMLElement* e, const std::string& bus, int numa,
                      const std::string& sw) {
    ASSIGN_OR_RETURN(int dev, IntAttr(e, "dev"));
    if (dev < 0) return Error(e, absl::StrCat("dev=", dev, " is negative"));
    auto* gpu = topology_.add_gpus();
    gpu->set_index(dev);
    gpu->set_pci_bus_id(bus);
    gpu->set_numa_node(numa);
    gpu->set_parent_switch_id(sw);
    if (const char* sm = e->Attribute("sm"); sm != nullptr) {
      int sm_value = 0;
      if (!absl::SimpleAtoi(sm, &sm_value)) return Error(e, absl::StrCat("sm=\"", sm, "\" is bad"));
      gpu->set_name(absl::StrCat("sm_", sm_value));
      min_sm_ = min_sm_ == 0 ? sm_value : std::min(min_sm_, sm_value);
    }
    gpu_by_bus_[bus] = dev;
    for (const auto* l = e->FirstChildElement("nvlink"); l != nullptr;
         l = l->NextSiblingElement("nvlink")) {
      PendingNvLink link;
      link.gpu = dev;
      link.line = l->GetLineNum();
      const char* tclass = l->Attribute("tclass");
      link.to_nvswitch = tclass != nullptr && absl::AsciiStrToLower(tclass) == "0x068000";
      if (!link.to_nvswitch) {
        ASSIGN_OR_RETURN(link.target, BusIdAttr(l, "target"));
      }
      ASSIGN_OR_RETURN(std::string count, StrAttr(l, "count"));
      if (!absl::SimpleAtoi(count, &link.count) || link.count <= 0) {
        return Error(l, absl::StrCat("count=\"", count, "\" is not a positive integer"));
      }
      links_.push_back(std::move(link));
    }
    return absl::OkStatus();
  }

  absl::Status AddNics(const tinyxml2::XMLElement* nic, const std::string& bus, int numa,
                       const std::string& sw) {
    for (const auto* net = nic->FirstChildElement("net"); net != nullptr;
         net = net->NextSiblingElement("net")) {
      ASSIGN_OR_RETURN(std::string name, StrAttr(net, "name"));
      auto* n = topology_.add_nics();
      n->set_name(name);
      n->set_pci_bus_id(bus);
      n->set_numa_node(numa);
      n->set_parent_switch_id(sw);
      if (net->Attribute("speed") != nullptr) {
        ASSIGN_OR_RETURN(int mbps, IntAttr(net, "speed"));  // NCCL writes Mbit/s
        n->set_speed_bits_per_s(static_cast<int64_t>(mbps) * 1000000);
      }
    }
    return absl::OkStatus();
  }

  absl::Status ResolveNvLinks() {
    std::map<std::pair<int, int>, std::pair<int, int>> pairs;  // (a,b) -> (count, line)
    std::map<int, int> to_switch;
    for (const PendingNvLink& l : links_) {
      if (l.to_nvswitch) {
        to_switch[l.gpu] += l.count;
        continue;
      }
      auto it = gpu_by_bus_.find(l.target);
      if (it == gpu_by_bus_.end()) {
        return Invalid(source_, absl::StrCat("line ", l.line, ": <nvlink> target=\"", l.target,
                                             "\" is not the bus id of any GPU"));
      }
      if (it->second == l.gpu) {
        return Invalid(source_, absl::StrCat("line ", l.line, ": <nvlink> of GPU ", l.gpu,
                                             " targets the GPU itself"));
      }
      std::pair<int, int> key = std::minmax(l.gpu, it->second);
      auto [pos, inserted] = pairs.emplace(key, std::make_pair(l.count, l.line));
      if (!inserted && pos->second.first != l.count) {
        return Invalid(source_, absl::StrCat("line ", l.line, ": <nvlink> count=", l.count,
                                             " between GPUs ", key.first, " and ", key.second,
                                             " disagrees with count=", pos->second.first,
                                             " at line ", pos->second.second));
      }
    }
    for (const auto& [key, value] : pairs) {
      auto* c = topology_.add_nvlinks();
      c->set_gpu_a(key.first);
      c->set_gpu_b(key.second);
      c->set_link_count(value.first);
    }
    if (!to_switch.empty()) {
      auto* fabric = topology_.mutable_nvswitch();
      int links = 0;
      for (const auto& [gpu, count] : to_switch) {
        fabric->add_gpus(gpu);
        links = links == 0 ? count : std::min(links, count);
      }
      fabric->set_links_per_gpu(links);
    }
    return absl::OkStatus();
  }

  std::string_view source_;
  Topology topology_;
  std::map<std::string, int> gpu_by_bus_;
  std::vector<PendingNvLink> links_;
  int min_sm_ = 0;
};

// ---- nvidia-smi topo -m ----

enum class SmiCell { kSelf, kNvLink, kPix, kPxb, kPhb, kNode, kSys };

std::string StripAnsi(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\x1b') {
      while (i < s.size() && !absl::ascii_isalpha(static_cast<unsigned char>(s[i]))) ++i;
      continue;
    }
    out.push_back(s[i]);
  }
  return out;
}

class UnionFind {
 public:
  explicit UnionFind(int n) : parent_(n) { std::iota(parent_.begin(), parent_.end(), 0); }
  int Find(int x) { return parent_[x] == x ? x : parent_[x] = Find(parent_[x]); }
  void Union(int a, int b) { parent_[Find(a)] = Find(b); }

 private:
  std::vector<int> parent_;
};

absl::StatusOr<Topology> ParseSmi(std::string_view text, std::string_view source) {
  std::vector<std::string> lines = absl::StrSplit(StripAnsi(text), '\n');
  auto split_cells = [](const std::string& line) {
    std::vector<std::string> cells = absl::StrSplit(line, '\t');
    for (auto& c : cells) c = std::string(absl::StripAsciiWhitespace(c));
    return cells;
  };
  size_t li = 0;
  while (li < lines.size() && absl::StripAsciiWhitespace(lines[li]).empty()) ++li;
  if (li == lines.size()) return Invalid(source, "empty nvidia-smi topology");
  std::vector<std::string> header;
  for (std::string& c : split_cells(lines[li])) {
    if (!c.empty()) header.push_back(c);
  }
  std::vector<std::string> devices;
  int numa_column = -1;
  for (size_t i = 0; i < header.size(); ++i) {
    if (absl::StrContains(header[i], "Affinity") || absl::StrContains(header[i], "NUMA ID")) {
      if (header[i] == "NUMA Affinity") numa_column = static_cast<int>(i);
      continue;
    }
    if (numa_column < 0 && devices.size() == i) devices.push_back(header[i]);
  }
  if (devices.empty() || !absl::StartsWith(devices[0], "GPU")) {
    return Invalid(source, absl::StrCat("line ", li + 1, ": expected a header of GPU<n> columns"));
  }
  const int n = static_cast<int>(devices.size());
  std::vector<std::vector<SmiCell>> cell(n, std::vector<SmiCell>(n, SmiCell::kSys));
  std::vector<std::vector<int>> nv(n, std::vector<int>(n, 0));
  std::vector<int> numa(n, -1);
  std::vector<int> row_line(n, 0);
  int rows = 0;
  std::map<std::string, std::string> nic_legend;
  bool in_legend = false;
  for (++li; li < lines.size(); ++li) {
    absl::string_view raw = absl::StripAsciiWhitespace(lines[li]);
    if (raw.empty()) {
      if (rows == n) in_legend = true;
      continue;
    }
    if (absl::StartsWith(raw, "Legend") || absl::StartsWith(raw, "NIC Legend")) {
      in_legend = true;
      continue;
    }
    if (in_legend || rows == n) {
      // "NIC0: mlx5_0" lines of the NIC legend rename the NIC columns.
      std::pair<std::string, std::string> kv = absl::StrSplit(raw, absl::MaxSplits(':', 1));
      std::string key(absl::StripAsciiWhitespace(kv.first));
      if (absl::StartsWith(key, "NIC")) {
        nic_legend[key] = std::string(absl::StripAsciiWhitespace(kv.second));
      }
      continue;
    }
    std::vector<std::string> cells = split_cells(lines[li]);
    const int line_no = static_cast<int>(li) + 1;
    if (cells[0] != devices[rows]) {
      return Invalid(source, absl::StrCat("line ", line_no, ": expected the row of ", devices[rows],
                                          ", got \"", cells[0], "\""));
    }
    if (static_cast<int>(cells.size()) < n + 1) {
      return Invalid(source, absl::StrCat("line ", line_no, ": row ", cells[0], " has ",
                                          cells.size() - 1, " cells, expected ", n));
    }
    for (int j = 0; j < n; ++j) {
      const std::string& c = cells[j + 1];
      SmiCell kind;
      if (c == "X") {
        kind = SmiCell::kSelf;
      } else if (c == "PIX") {
        kind = SmiCell::kPix;
      } else if (c == "PXB") {
        kind = SmiCell::kPxb;
      } else if (c == "PHB") {
        kind = SmiCell::kPhb;
      } else if (c == "NODE") {
        kind = SmiCell::kNode;
      } else if (c == "SYS" || c == "SOC") {
        kind = SmiCell::kSys;
      } else if (absl::StartsWith(c, "NV") && absl::SimpleAtoi(c.substr(2), &nv[rows][j]) &&
                 nv[rows][j] > 0) {
        kind = SmiCell::kNvLink;
      } else {
        return Invalid(source, absl::StrCat("line ", line_no, ", column ", devices[j],
                                            ": unknown cell \"", c, "\""));
      }
      if ((kind == SmiCell::kSelf) != (j == rows)) {
        return Invalid(source, absl::StrCat("line ", line_no, ", column ", devices[j], ": \"", c,
                                            "\" ", j == rows ? "must be X" : "cannot be X"));
      }
      cell[rows][j] = kind;
    }
    if (numa_column >= 0 && numa_column + 1 < static_cast<int>(cells.size())) {
      int v = -1;
      if (absl::SimpleAtoi(cells[numa_column + 1], &v)) numa[rows] = v;
    }
    row_line[rows] = line_no;
    ++rows;
  }
  if (rows < n) {
    return Invalid(source, absl::StrCat("the matrix ends after ", rows, " of ", n, " rows"));
  }
  // Symmetry.
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < i; ++j) {
      if (cell[i][j] != cell[j][i] || nv[i][j] != nv[j][i]) {
        return Invalid(source, absl::StrCat("line ", row_line[i], ", column ", devices[j],
                                            ": differs from the row of ", devices[j], " (line ",
                                            row_line[j], ")"));
      }
    }
  }
  Topology t;
  t.set_source(absl::StrCat("nvidia-smi:", std::string(source)));
  // PCIe switches: PIX/PXB pairs share one (PXB: several bridges, approximated by one switch).
  UnionFind sw(n), node(n);
  bool any_nv = false;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (cell[i][j] == SmiCell::kPix || cell[i][j] == SmiCell::kPxb) sw.Union(i, j);
      if (cell[i][j] != SmiCell::kSys && cell[i][j] != SmiCell::kNvLink) node.Union(i, j);
      if (cell[i][j] == SmiCell::kNvLink) any_nv = true;
    }
  }
  bool have_numa = std::all_of(numa.begin(), numa.end(), [](int v) { return v >= 0; });
  if (!have_numa && !any_nv) {
    // Every pair's PCIe relation is visible: sockets are the classes of "not SYS".
    std::map<int, int> socket_of_root;
    for (int i = 0; i < n; ++i) {
      numa[i] = socket_of_root.emplace(node.Find(i), socket_of_root.size()).first->second;
    }
    have_numa = true;
  }
  if (have_numa) {
    std::set<int> sockets(numa.begin(), numa.end());
    for (int s : sockets) t.add_sockets()->set_id(s);
  }
  std::map<int, std::string> switch_of_root;
  std::vector<int> members(n, 0);
  for (int i = 0; i < n; ++i) ++members[sw.Find(i)];
  auto switch_of = [&](int i) -> std::string {
    int root = sw.Find(i);
    if (members[root] < 2) return "";
    auto it = switch_of_root.find(root);
    if (it != switch_of_root.end()) return it->second;
    std::string id = absl::StrCat("sw", switch_of_root.size());
    switch_of_root[root] = id;
    auto* s = t.add_pcie_switches();
    s->set_id(id);
    s->set_socket_id(numa[i]);
    return id;
  };
  std::map<int, int> gpu_index_of_row;
  for (int i = 0; i < n; ++i) {
    const std::string& name = devices[i];
    int index = 0;
    if (absl::StartsWith(name, "GPU") && absl::SimpleAtoi(name.substr(3), &index)) {
      auto* gpu = t.add_gpus();
      gpu->set_index(index);
      gpu->set_numa_node(numa[i]);
      gpu->set_parent_switch_id(switch_of(i));
      gpu_index_of_row[i] = index;
    } else {
      auto* nic = t.add_nics();
      auto it = nic_legend.find(name);
      nic->set_name(it != nic_legend.end() ? it->second : name);
      nic->set_numa_node(numa[i]);
      nic->set_parent_switch_id(switch_of(i));
    }
  }
  // NVLink, or an NVSwitch fabric when a GPU's NV counts exceed what a GPU has (18 links).
  bool fabric = false;
  for (const auto& [i, gi] : gpu_index_of_row) {
    int total = 0;
    for (const auto& [j, gj] : gpu_index_of_row) total += nv[i][j];
    if (total > 18) fabric = true;
  }
  if (fabric) {
    int links = 0;
    for (const auto& [i, gi] : gpu_index_of_row) {
      t.mutable_nvswitch()->add_gpus(gi);
      for (const auto& [j, gj] : gpu_index_of_row) {
        if (nv[i][j] > 0) links = links == 0 ? nv[i][j] : std::min(links, nv[i][j]);
      }
    }
    t.mutable_nvswitch()->set_links_per_gpu(links);
  } else {
    for (const auto& [i, gi] : gpu_index_of_row) {
      for (const auto& [j, gj] : gpu_index_of_row) {
        if (j <= i || nv[i][j] == 0) continue;
        auto* c = t.add_nvlinks();
        c->set_gpu_a(std::min(gi, gj));
        c->set_gpu_b(std::max(gi, gj));
        c->set_link_count(nv[i][j]);
      }
    }
  }
  FillDefaultBandwidths(t);
  SortTopology(t);
  RETURN_IF_ERROR(ValidateTopology(t, source));
  return t;
}

}  // namespace

void FillDefaultBandwidths(Topology& topology) {
  auto* b = topology.mutable_bandwidth();
  if (b->nvlink_bytes_per_s() <= 0) b->set_nvlink_bytes_per_s(kNvLink2BytesPerS);
  if (b->pcie_same_switch_bytes_per_s() <= 0) {
    b->set_pcie_same_switch_bytes_per_s(kPcieSameSwitchBytesPerS);
  }
  if (b->pcie_cross_switch_bytes_per_s() <= 0) {
    b->set_pcie_cross_switch_bytes_per_s(kPcieCrossSwitchBytesPerS);
  }
  if (b->pcie_host_bytes_per_s() <= 0) b->set_pcie_host_bytes_per_s(kPcieHostBytesPerS);
}

absl::Status ValidateTopology(const Topology& t, std::string_view source) {
  RETURN_IF_ERROR(CheckUtf8(t, "", source));
  std::set<int> gpus;
  std::set<std::string> buses;
  for (int i = 0; i < t.gpus_size(); ++i) {
    const auto& g = t.gpus(i);
    if (g.index() < 0 || !gpus.insert(g.index()).second) {
      return Invalid(source,
                     absl::StrCat("gpus[", i, "].index: ", g.index(), " is negative or repeated"));
    }
    if (!g.pci_bus_id().empty() && !buses.insert(g.pci_bus_id()).second) {
      return Invalid(source,
                     absl::StrCat("gpus[", i, "].pci_bus_id: ", g.pci_bus_id(), " is repeated"));
    }
  }
  std::map<std::string, std::string> parent;
  for (int i = 0; i < t.pcie_switches_size(); ++i) {
    const auto& s = t.pcie_switches(i);
    if (s.id().empty() || !parent.emplace(s.id(), s.parent_id()).second) {
      return Invalid(
          source, absl::StrCat("pcie_switches[", i, "].id: \"", s.id(), "\" is empty or repeated"));
    }
  }
  for (int i = 0; i < t.pcie_switches_size(); ++i) {
    const auto& s = t.pcie_switches(i);
    if (!s.parent_id().empty() && !parent.count(s.parent_id())) {
      return Invalid(source, absl::StrCat("pcie_switches[", i, "].parent_id: no switch \"",
                                          s.parent_id(), "\""));
    }
    // Walk up: a cycle would never reach an empty parent.
    std::string at = s.id();
    for (size_t steps = 0; !at.empty(); ++steps) {
      if (steps > parent.size()) {
        return Invalid(source, absl::StrCat("pcie_switches[", i, "]: the switch tree has a cycle"));
      }
      at = parent[at];
    }
  }
  for (int i = 0; i < t.gpus_size(); ++i) {
    const auto& sw = t.gpus(i).parent_switch_id();
    if (!sw.empty() && !parent.count(sw)) {
      return Invalid(source,
                     absl::StrCat("gpus[", i, "].parent_switch_id: no switch \"", sw, "\""));
    }
  }
  std::set<std::string> nics;
  for (int i = 0; i < t.nics_size(); ++i) {
    const auto& n = t.nics(i);
    if (n.name().empty() || !nics.insert(n.name()).second) {
      return Invalid(source,
                     absl::StrCat("nics[", i, "].name: \"", n.name(), "\" is empty or repeated"));
    }
    if (!n.parent_switch_id().empty() && !parent.count(n.parent_switch_id())) {
      return Invalid(source, absl::StrCat("nics[", i, "].parent_switch_id: no switch \"",
                                          n.parent_switch_id(), "\""));
    }
    if (n.speed_bits_per_s() < 0) {
      return Invalid(source, absl::StrCat("nics[", i, "].speed_bits_per_s: negative"));
    }
  }
  std::set<std::pair<int, int>> pairs;
  for (int i = 0; i < t.nvlinks_size(); ++i) {
    const auto& l = t.nvlinks(i);
    std::string at = absl::StrCat("nvlinks[", i, "]");
    if (!gpus.count(l.gpu_a()) || !gpus.count(l.gpu_b())) {
      return Invalid(source,
                     absl::StrCat(at, ": GPU ", gpus.count(l.gpu_a()) ? l.gpu_b() : l.gpu_a(),
                                  " does not exist"));
    }
    if (l.gpu_a() == l.gpu_b()) return Invalid(source, absl::StrCat(at, ": a link to itself"));
    if (l.link_count() <= 0) {
      return Invalid(source, absl::StrCat(at, ".link_count: ", l.link_count(), " is not positive"));
    }
    if (!pairs.insert(std::minmax(l.gpu_a(), l.gpu_b())).second) {
      return Invalid(
          source, absl::StrCat(at, ": GPUs ", l.gpu_a(), " and ", l.gpu_b(), " are listed twice"));
    }
  }
  if (t.has_nvswitch()) {
    for (int g : t.nvswitch().gpus()) {
      if (!gpus.count(g)) {
        return Invalid(source, absl::StrCat("nvswitch.gpus: GPU ", g, " does not exist"));
      }
    }
    if (t.nvswitch().gpus_size() > 0 && t.nvswitch().links_per_gpu() <= 0) {
      return Invalid(source, "nvswitch.links_per_gpu: must be positive");
    }
  }
  const auto& b = t.bandwidth();
  for (double v :
       {b.nvlink_bytes_per_s(), b.pcie_same_switch_bytes_per_s(), b.pcie_cross_switch_bytes_per_s(),
        b.pcie_host_bytes_per_s(), b.cross_socket_bytes_per_s()}) {
    if (v < 0) return Invalid(source, "bandwidth: negative bandwidth");
  }
  return absl::OkStatus();
}

absl::StatusOr<Topology> ParseNcclTopoXml(std::string_view xml, std::string_view source) {
  return NcclXmlReader(source).Read(xml);
}

absl::StatusOr<Topology> ParseNvidiaSmiTopo(std::string_view text, std::string_view source) {
  return ParseSmi(text, source);
}

TopologyFormat DetectTopologyFormat(std::string_view path_std, std::string_view content_std) {
  absl::string_view path(path_std.data(), path_std.size());
  absl::string_view content(content_std.data(), content_std.size());
  std::string lower = absl::AsciiStrToLower(path);
  if (absl::EndsWith(lower, ".xml")) return TopologyFormat::kNcclXml;
  if (absl::EndsWith(lower, ".json")) return TopologyFormat::kJson;
  if (absl::EndsWith(lower, ".yaml") || absl::EndsWith(lower, ".yml")) {
    return TopologyFormat::kYaml;
  }
  absl::string_view body = absl::StripLeadingAsciiWhitespace(content);
  if (absl::StartsWith(body, "<")) return TopologyFormat::kNcclXml;
  if (absl::StartsWith(body, "{")) return TopologyFormat::kJson;
  if (absl::StartsWith(body, "GPU") || absl::StartsWith(content, "\t") ||
      absl::StartsWith(content, " \t") || absl::StrContains(content, "\x1b[")) {
    return TopologyFormat::kNvidiaSmi;
  }
  return TopologyFormat::kYaml;
}

}  // namespace tributary::topology
