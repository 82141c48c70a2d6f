#include "topology/topology_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "topology/topology_parsers.h"

namespace tributary::topology {

using tributary::v1::Topology;

absl::StatusOr<Topology> LoadTopologyFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read topology file ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string content = buffer.str();
  switch (DetectTopologyFormat(path, content)) {
    case TopologyFormat::kNcclXml:
      return ParseNcclTopoXml(content, path);
    case TopologyFormat::kNvidiaSmi:
      return ParseNvidiaSmiTopo(content, path);
    case TopologyFormat::kJson:
      return ParseTopologyJson(content, path);
    case TopologyFormat::kYaml:
      return ParseTopologyYaml(content, path);
  }
  return absl::InternalError("unreachable");
}

}  // namespace tributary::topology
