// Reading a topology file from disk (the parsers in topology_parsers.h work on text and do no
// I/O, so the planner can use them).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "tributary/v1/topology.pb.h"

namespace tributary::topology {

// Reads and parses a topology file of any format DetectTopologyFormat knows (NCCL XML,
// nvidia-smi topo -m, JSON, YAML). NOT_FOUND if it cannot be read; INVALID_ARGUMENT naming the
// file and line if it does not parse.
absl::StatusOr<tributary::v1::Topology> LoadTopologyFile(const std::string& path);

}  // namespace tributary::topology
