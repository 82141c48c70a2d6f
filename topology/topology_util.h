// Small helpers shared by the topology sources.
#pragma once

#include <string>
#include <string_view>

#include "tributary/v1/topology.pb.h"

namespace tributary::topology {

// "0000:06:00.0", "00000000:06:00.0" or "06:00.0" (any case) -> "0000:06:00.0"; "" if malformed.
std::string NormalizeBusId(std::string_view bus_id);

// Puts a topology in canonical order: sockets by id, switches by id, GPUs by index, NICs by name,
// NVLinks by (gpu_a, gpu_b) with gpu_a < gpu_b, NVSwitch GPUs ascending.
void SortTopology(tributary::v1::Topology& topology);

}  // namespace tributary::topology
