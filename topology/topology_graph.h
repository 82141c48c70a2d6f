// Turns a node topology into the GPU graph the intra-node planners work on (DESIGN.md §1.3).
//
// Model (bytes/s per direction; a bidirectional connection is two arcs):
// * NVLink bundle of c links between a and b: arcs a->b and b->a of c x nvlink_bytes_per_s,
//   link_count c.
// * NVSwitch fabric with L links per GPU, k of the chosen GPUs on it: a full mesh among those k
//   with L x nvlink_bytes_per_s / (k - 1) per arc (link_count L / (k - 1) when that divides,
//   else 0). Every single-GPU cut then carries exactly the GPU's L links, so broadcast/reduce
//   bounds are exact; cuts of larger groups are underestimated (a switch carries more).
// * kAll only, for each pair with neither: one PCIe path (link_count 0, kind kPcie) of
//   - pcie_same_switch_bytes_per_s when both GPUs hang below one top-level PCIe switch,
//   - pcie_cross_switch_bytes_per_s when they reach each other through one socket's root
//     complex,
//   - cross_socket_bytes_per_s (or, when 0, min(cross-switch, host)) across sockets.
//   Paths are priced independently: contention on a shared switch uplink is not modelled, so
//   the PCIe part is optimistic when many pairs are busy at once.
// Zero bandwidths in the topology take the defaults of topology_parsers.h.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "topology/gpu_graph.h"
#include "tributary/v1/topology.pb.h"

namespace tributary::topology {

enum class LinkMode {
  kNvLinkOnly,  // NVLink arcs (direct and NVSwitch) only
  kAll,         // plus PCIe / host paths between pairs that have no NVLink
};

// `gpus`: device indices to include, in the order of GpuGraph::gpus; empty = every GPU of the
// topology in index order. INVALID_ARGUMENT for an unknown or repeated index.
absl::StatusOr<GpuGraph> BuildGpuGraph(const tributary::v1::Topology& topology,
                                       const std::vector<int>& gpus, LinkMode mode);

// The selection resolved as BuildGpuGraph does it (empty = all), validated.
absl::StatusOr<std::vector<int>> SelectGpus(const tributary::v1::Topology& topology,
                                            const std::vector<int>& gpus);

// The id of the top-level switch (the one on a root port) above a device whose nearest switch is
// `switch_id`; "" if the device hangs directly off the root complex.
std::string TopLevelSwitch(const tributary::v1::Topology& topology, const std::string& switch_id);

}  // namespace tributary::topology
