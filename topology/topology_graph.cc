#include "topology/topology_graph.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "topology/topology_parsers.h"

namespace tributary::topology {

using tributary::v1::Topology;

absl::StatusOr<std::vector<int>> SelectGpus(const Topology& topology,
                                            const std::vector<int>& gpus) {
  std::vector<int> all;
  for (const auto& g : topology.gpus()) all.push_back(g.index());
  std::sort(all.begin(), all.end());
  if (gpus.empty()) return all;
  std::set<int> seen;
  for (int g : gpus) {
    if (!std::binary_search(all.begin(), all.end(), g)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GPU ", g,
          " is not in the topology (GPUs: ", all.empty() ? "none" : absl::StrJoin(all, ","), ")"));
    }
    if (!seen.insert(g).second) {
      return absl::InvalidArgumentError(absl::StrCat("GPU ", g, " is listed twice"));
    }
  }
  return gpus;
}

std::string TopLevelSwitch(const Topology& topology, const std::string& switch_id) {
  std::map<std::string, std::string> parent;
  for (const auto& s : topology.pcie_switches()) parent[s.id()] = s.parent_id();
  std::string at = switch_id;
  for (size_t steps = 0; steps <= parent.size(); ++steps) {
    auto it = parent.find(at);
    if (it == parent.end() || it->second.empty()) return at;
    at = it->second;
  }
  return at;  // a cycle; ValidateTopology rejects those
}

absl::StatusOr<GpuGraph> BuildGpuGraph(const Topology& topology, const std::vector<int>& gpus,
                                       LinkMode mode) {
  absl::StatusOr<std::vector<int>> selected = SelectGpus(topology, gpus);
  if (!selected.ok()) return selected.status();
  Topology defaults;
  *defaults.mutable_bandwidth() = topology.bandwidth();
  FillDefaultBandwidths(defaults);
  const auto& bw = defaults.bandwidth();

  GpuGraph graph;
  graph.gpus = *selected;
  graph.nvlink_bytes_per_s = bw.nvlink_bytes_per_s();
  std::map<int, int> node_of;
  for (size_t i = 0; i < graph.gpus.size(); ++i) node_of[graph.gpus[i]] = static_cast<int>(i);
  std::set<std::pair<int, int>> linked;  // node pairs (a < b) with an NVLink arc

  auto add_pair = [&](int a, int b, double bytes_per_s, int links, LinkKind kind) {
    graph.arcs.push_back(GpuArc{a, b, bytes_per_s, links, kind});
    graph.arcs.push_back(GpuArc{b, a, bytes_per_s, links, kind});
  };
  for (const auto& l : topology.nvlinks()) {
    auto a = node_of.find(l.gpu_a());
    auto b = node_of.find(l.gpu_b());
    if (a == node_of.end() || b == node_of.end()) continue;
    add_pair(a->second, b->second, l.link_count() * bw.nvlink_bytes_per_s(), l.link_count(),
             LinkKind::kNvLink);
    linked.insert(std::minmax(a->second, b->second));
  }
  if (topology.has_nvswitch() && topology.nvswitch().links_per_gpu() > 0) {
    std::vector<int> on_fabric;
    for (int g : topology.nvswitch().gpus()) {
      if (auto it = node_of.find(g); it != node_of.end()) on_fabric.push_back(it->second);
    }
    std::sort(on_fabric.begin(), on_fabric.end());
    const int k = static_cast<int>(on_fabric.size());
    const int links = topology.nvswitch().links_per_gpu();
    for (int i = 0; i < k; ++i) {
      for (int j = i + 1; j < k; ++j) {
        add_pair(on_fabric[i], on_fabric[j], links * bw.nvlink_bytes_per_s() / (k - 1),
                 links % (k - 1) == 0 ? links / (k - 1) : 0, LinkKind::kNvLink);
        linked.insert({on_fabric[i], on_fabric[j]});
      }
    }
  }
  if (mode == LinkMode::kNvLinkOnly) return graph;

  std::map<int, const tributary::v1::Gpu*> gpu_of;
  for (const auto& g : topology.gpus()) gpu_of[g.index()] = &g;
  std::map<std::string, int> switch_socket;
  for (const auto& s : topology.pcie_switches()) switch_socket[s.id()] = s.socket_id();
  auto socket_of = [&](const tributary::v1::Gpu& g) {
    if (g.numa_node() >= 0) return g.numa_node();
    auto it = switch_socket.find(TopLevelSwitch(topology, g.parent_switch_id()));
    return it == switch_socket.end() ? -1 : it->second;
  };
  const double cross_socket =
      bw.cross_socket_bytes_per_s() > 0
          ? bw.cross_socket_bytes_per_s()
          : std::min(bw.pcie_cross_switch_bytes_per_s(), bw.pcie_host_bytes_per_s());
  const int n = static_cast<int>(graph.gpus.size());
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      if (linked.count({i, j})) continue;
      const auto& a = *gpu_of[graph.gpus[i]];
      const auto& b = *gpu_of[graph.gpus[j]];
      std::string top_a = TopLevelSwitch(topology, a.parent_switch_id());
      std::string top_b = TopLevelSwitch(topology, b.parent_switch_id());
      double rate;
      if (!top_a.empty() && top_a == top_b) {
        rate = bw.pcie_same_switch_bytes_per_s();
      } else if (socket_of(a) == socket_of(b) || socket_of(a) < 0 || socket_of(b) < 0) {
        rate = bw.pcie_cross_switch_bytes_per_s();
      } else {
        rate = cross_socket;
      }
      add_pair(i, j, rate, 0, LinkKind::kPcie);
    }
  }
  return graph;
}

}  // namespace tributary::topology
