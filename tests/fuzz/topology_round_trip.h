// Shared by the topology parsers' fuzz targets: what a parser accepts is a valid topology that
// the JSON and YAML writers turn into text the parsers read back as an equal message (the
// writers' contract in topology/topology_parsers.h). Traps otherwise.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "google/protobuf/util/message_differencer.h"
#include "topology/topology_parsers.h"

namespace tributary::fuzz {

inline void CheckAccepted(const absl::StatusOr<tributary::v1::Topology>& parsed) {
  using tributary::topology::ParseTopologyJson;
  using tributary::topology::ParseTopologyYaml;
  if (!parsed.ok()) {
    if (parsed.status().message().empty()) __builtin_trap();
    return;
  }
  if (!tributary::topology::ValidateTopology(*parsed, "fuzz").ok()) __builtin_trap();
  for (bool yaml : {false, true}) {
    const std::string text = yaml ? tributary::topology::TopologyToYaml(*parsed)
                                  : tributary::topology::TopologyToJson(*parsed);
    absl::StatusOr<tributary::v1::Topology> again =
        yaml ? ParseTopologyYaml(text, "fuzz") : ParseTopologyJson(text, "fuzz");
    if (!again.ok()) __builtin_trap();
    tributary::v1::Topology expected = *parsed;
    expected.set_source(again->source());
    if (!google::protobuf::util::MessageDifferencer::Equals(expected, *again)) __builtin_trap();
  }
}

}  // namespace tributary::fuzz
