// Test topologies: DGX-1 P100 and V100 NVLink graphs, transcribed by hand from
// /work/shared/fixtures/topology/dgx1{p,v}_nccl_topo.xml (<nvlink target=BUSID count=N> under
// <gpu dev=D>; bus ids 06,07,0a,0b,85,86,89,8a are GPUs 0..7), and brute-force references.
#pragma once

#include <algorithm>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "topology/gpu_graph.h"

namespace tributary::topology::testing {

inline constexpr double kLink = 25e9;  // bytes/s per NVLink per direction

// {u, v, link count}, each listed once.
using LinkList = std::vector<std::tuple<int, int, int>>;

// DGX-1 P100: every GPU has four single NVLinks (two K4 joined by a matching).
inline const LinkList kDgx1P100Links = {
    {0, 1, 1}, {0, 2, 1}, {0, 3, 1}, {0, 4, 1}, {1, 2, 1}, {1, 3, 1}, {1, 5, 1}, {2, 3, 1},
    {2, 6, 1}, {3, 7, 1}, {4, 5, 1}, {4, 6, 1}, {4, 7, 1}, {5, 6, 1}, {5, 7, 1}, {6, 7, 1}};

// DGX-1 V100: six NVLinks per GPU; eight single and eight double connections.
inline const LinkList kDgx1V100Links = {
    {0, 1, 1}, {0, 2, 1}, {1, 3, 1}, {2, 6, 1}, {3, 7, 1}, {4, 5, 1}, {4, 6, 1}, {5, 7, 1},
    {0, 3, 2}, {0, 4, 2}, {1, 2, 2}, {1, 5, 2}, {2, 3, 2}, {4, 7, 2}, {5, 6, 2}, {6, 7, 2}};

inline GpuGraph MakeGraph(int n, const LinkList& links, double link_bytes_per_s = kLink) {
  GpuGraph graph;
  graph.nvlink_bytes_per_s = link_bytes_per_s;
  for (int i = 0; i < n; ++i) graph.gpus.push_back(i);
  for (const auto& [u, v, count] : links) {
    graph.arcs.push_back({u, v, count * link_bytes_per_s, count, LinkKind::kNvLink});
    graph.arcs.push_back({v, u, count * link_bytes_per_s, count, LinkKind::kNvLink});
  }
  return graph;
}

// "{0,1,2,5,}" for messages.
inline std::string SubsetName(const std::vector<int>& subset) {
  std::string s = "{";
  for (int v : subset) s += std::to_string(v) + ",";
  return s + "}";
}

inline GpuGraph Dgx1P100() { return MakeGraph(8, kDgx1P100Links); }
inline GpuGraph Dgx1V100() { return MakeGraph(8, kDgx1V100Links); }

// NVSwitch box modelled as a complete graph: each GPU's 6 x 25 GB/s split evenly over its
// n - 1 peers (10 GB/s per arc for 16 GPUs).
inline GpuGraph NvSwitchComplete(int n) {
  GpuGraph graph;
  graph.nvlink_bytes_per_s = kLink;
  for (int i = 0; i < n; ++i) graph.gpus.push_back(i);
  for (int u = 0; u < n; ++u) {
    for (int v = 0; v < n; ++v) {
      if (u != v) graph.arcs.push_back({u, v, 6 * kLink / (n - 1), 0, LinkKind::kNvLink});
    }
  }
  return graph;
}

inline std::vector<std::vector<double>> DirectedMatrix(const GpuGraph& graph) {
  const int n = static_cast<int>(graph.gpus.size());
  std::vector<std::vector<double>> cap(n, std::vector<double>(n, 0));
  for (const GpuArc& arc : graph.arcs) cap[arc.from][arc.to] += arc.bytes_per_s;
  return cap;
}

// lambda(root) by enumerating every cut S with root in S: min out-capacity of S.
inline double BruteForceBroadcastBound(const GpuGraph& graph, int root) {
  const int n = static_cast<int>(graph.gpus.size());
  const auto cap = DirectedMatrix(graph);
  double best = std::numeric_limits<double>::infinity();
  for (int mask = 0; mask < (1 << n); ++mask) {
    if (!(mask >> root & 1) || mask == (1 << n) - 1) continue;
    double out = 0;
    for (int u = 0; u < n; ++u) {
      for (int v = 0; v < n; ++v) {
        if ((mask >> u & 1) && !(mask >> v & 1)) out += cap[u][v];
      }
    }
    best = std::min(best, out);
  }
  return n < 2 ? 0 : best;
}

// sigma by enumerating every partition (restricted growth strings) over the undirected
// capacities min(c(u->v), c(v->u)).
inline double BruteForceStrength(const GpuGraph& graph) {
  const int n = static_cast<int>(graph.gpus.size());
  if (n < 2) return 0;
  const auto cap = DirectedMatrix(graph);
  std::vector<int> part(n, 0);
  double best = std::numeric_limits<double>::infinity();
  while (true) {
    int parts = *std::max_element(part.begin(), part.end()) + 1;
    if (parts >= 2) {
      double crossing = 0;
      for (int u = 0; u < n; ++u) {
        for (int v = u + 1; v < n; ++v) {
          if (part[u] != part[v]) crossing += std::min(cap[u][v], cap[v][u]);
        }
      }
      best = std::min(best, crossing / (parts - 1));
    }
    // Next restricted growth string.
    int i = n - 1;
    while (i > 0) {
      int max_prefix = 0;
      for (int j = 0; j < i; ++j) max_prefix = std::max(max_prefix, part[j]);
      if (part[i] <= max_prefix) {
        ++part[i];
        for (int j = i + 1; j < n; ++j) part[j] = 0;
        break;
      }
      --i;
    }
    if (i == 0) break;
  }
  return best;
}

// Every subset of {0..n-1} with at least `min_size` members, as sorted index lists.
inline std::vector<std::vector<int>> Subsets(int n, int min_size) {
  std::vector<std::vector<int>> out;
  for (int mask = 0; mask < (1 << n); ++mask) {
    if (__builtin_popcount(mask) < min_size) continue;
    std::vector<int> subset;
    for (int i = 0; i < n; ++i) {
      if (mask >> i & 1) subset.push_back(i);
    }
    out.push_back(subset);
  }
  return out;
}

}  // namespace tributary::topology::testing
