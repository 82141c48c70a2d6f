// The GPUs of one node (or the fragment a job holds) as a capacitated directed graph: the input of
// the intra-node planners (bounds, tree packing, rings). Pure data; built from a node topology.
#pragma once

#include <string>
#include <vector>

namespace tributary::topology {

enum class LinkKind { kNvLink, kPcie };

// One direction of a connection between two GPUs.
struct GpuArc {
  int from = 0;  // index into GpuGraph::gpus
  int to = 0;
  // Capacity in this direction, bytes/s (link count x per-link bandwidth for NVLink).
  double bytes_per_s = 0;
  // NVLink: the number of links bundled in this connection; PCIe/host paths: 0.
  int link_count = 0;
  LinkKind kind = LinkKind::kNvLink;
};

struct GpuGraph {
  // Device indices (the topology's own numbering, e.g. `dev` in NCCL's XML), in node order.
  std::vector<int> gpus;
  // Directed arcs; a bidirectional link is two arcs. Parallel arcs between the same pair are
  // allowed (e.g. an NVLink bundle and a PCIe path).
  std::vector<GpuArc> arcs;
  // Bandwidth of one NVLink per direction, bytes/s (for reporting rates in "links").
  double nvlink_bytes_per_s = 0;
};

}  // namespace tributary::topology
