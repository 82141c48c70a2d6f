#include "topology/strategy.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "topology/topology_graph.h"

namespace tributary::topology {
namespace {

using tributary::v1::Topology;

// Symmetric NVLink capacity in links between selected nodes (NVSwitch: L / (k - 1) per pair).
std::vector<std::vector<double>> NvLinkMatrix(const Topology& t, const std::vector<int>& gpus) {
  const int n = static_cast<int>(gpus.size());
  std::vector<std::vector<double>> m(n, std::vector<double>(n, 0));
  absl::StatusOr<GpuGraph> graph = BuildGpuGraph(t, gpus, LinkMode::kNvLinkOnly);
  if (!graph.ok() || graph->nvlink_bytes_per_s <= 0) return m;
  for (const GpuArc& a : graph->arcs) m[a.from][a.to] += a.bytes_per_s / graph->nvlink_bytes_per_s;
  return m;
}

std::vector<int> Components(const std::vector<std::vector<bool>>& adj) {
  const int n = static_cast<int>(adj.size());
  std::vector<int> comp(n, -1);
  int next = 0;
  for (int s = 0; s < n; ++s) {
    if (comp[s] >= 0) continue;
    std::vector<int> stack = {s};
    comp[s] = next;
    while (!stack.empty()) {
      int u = stack.back();
      stack.pop_back();
      for (int v = 0; v < n; ++v) {
        if (adj[u][v] && comp[v] < 0) {
          comp[v] = next;
          stack.push_back(v);
        }
      }
    }
    ++next;
  }
  return comp;
}

bool Hamiltonian(const std::vector<std::vector<double>>& m) {
  const int n = static_cast<int>(m.size());
  if (n < 2) return false;
  if (n == 2) return m[0][1] > 0;
  if (n > 20) return false;  // beyond any single node
  // dp[mask] = bitset of end vertices of paths from 0 covering mask.
  std::vector<uint32_t> dp(1u << n, 0);
  dp[1] = 1;
  for (uint32_t mask = 1; mask < (1u << n); ++mask) {
    if (!(mask & 1) || dp[mask] == 0) continue;
    for (int u = 0; u < n; ++u) {
      if (!(dp[mask] >> u & 1)) continue;
      for (int v = 0; v < n; ++v) {
        if (!(mask >> v & 1) && m[u][v] > 0) dp[mask | (1u << v)] |= 1u << v;
      }
    }
  }
  uint32_t full = (1u << n) - 1;
  for (int u = 1; u < n; ++u) {
    if ((dp[full] >> u & 1) && m[u][0] > 0) return true;
  }
  return false;
}

const tributary::v1::Nic* FastestNic(const Topology& t) {
  const tributary::v1::Nic* best = nullptr;
  for (const auto& nic : t.nics()) {
    if (best == nullptr || nic.speed_bits_per_s() > best->speed_bits_per_s()) best = &nic;
  }
  return best;
}

std::string Join(const std::vector<int>& v) { return absl::StrJoin(v, ","); }

}  // namespace

const char* StrategyKindName(IntraNodeStrategy::Kind kind) {
  switch (kind) {
    case IntraNodeStrategy::kDirect:
      return "direct";
    case IntraNodeStrategy::kCpuAssistedPerSwitch:
      return "cpu-assisted-per-switch";
    case IntraNodeStrategy::kNvLinkRootedOutsideNicSwitch:
      return "nvlink-rooted-outside-nic-switch";
    case IntraNodeStrategy::kPackedTrees:
      return "packed-trees";
    case IntraNodeStrategy::kHostStaging:
      return "host-staging";
    case IntraNodeStrategy::kCpuOnly:
      return "cpu-only";
  }
  return "unknown";
}

bool HasNvLinkRing(const Topology& topology, const std::vector<int>& gpus) {
  absl::StatusOr<std::vector<int>> selected = SelectGpus(topology, gpus);
  return selected.ok() && Hamiltonian(NvLinkMatrix(topology, *selected));
}

absl::StatusOr<IntraNodeStrategy> ChooseStrategy(const Topology& topology,
                                                 const std::vector<int>& gpus) {
  IntraNodeStrategy s;
  const tributary::v1::Nic* nic = FastestNic(topology);
  if (nic != nullptr) s.nic = nic->name();
  if (topology.gpus_size() == 0 && gpus.empty()) {
    s.kind = IntraNodeStrategy::kCpuOnly;
    s.reason = "no GPUs: a CPU-only node runs the summation service only";
    return s;
  }
  absl::StatusOr<std::vector<int>> selected = SelectGpus(topology, gpus);
  if (!selected.ok()) return selected.status();
  const std::vector<int>& sel = *selected;
  const int n = static_cast<int>(sel.size());
  if (n == 1) {
    s.kind = IntraNodeStrategy::kDirect;
    s.root_gpu = sel[0];
    s.reason = absl::StrCat("one GPU (", sel[0], "): it copies to and from host memory directly");
    return s;
  }

  std::map<int, const tributary::v1::Gpu*> gpu_of;
  for (const auto& g : topology.gpus()) gpu_of[g.index()] = &g;
  std::vector<std::string> top(n);
  for (int i = 0; i < n; ++i) top[i] = TopLevelSwitch(topology, gpu_of[sel[i]]->parent_switch_id());
  const std::string nic_top =
      nic != nullptr ? TopLevelSwitch(topology, nic->parent_switch_id()) : "";
  const auto m = NvLinkMatrix(topology, sel);

  std::vector<std::vector<bool>> nv_adj(n, std::vector<bool>(n, false));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) nv_adj[i][j] = m[i][j] > 0;
  }
  std::vector<int> nv_comp = Components(nv_adj);
  const bool nv_connected =
      std::all_of(nv_comp.begin(), nv_comp.end(), [](int c) { return c == 0; });

  if (nv_connected) {
    // Root: outside the NIC's switch, then the NIC's NUMA node, then NVLink capacity, then index.
    int best = -1;
    std::tuple<int, int, double, int> best_key;
    for (int i = 0; i < n; ++i) {
      const bool outside = nic_top.empty() || top[i] != nic_top;
      const bool near = nic != nullptr && nic->numa_node() >= 0 &&
                        gpu_of[sel[i]]->numa_node() == nic->numa_node();
      const double cap = std::accumulate(m[i].begin(), m[i].end(), 0.0);
      auto key = std::make_tuple(outside ? 1 : 0, near ? 1 : 0, cap, -sel[i]);
      if (best < 0 || key > best_key) {
        best = i;
        best_key = key;
      }
    }
    s.root_gpu = sel[best];
    const bool ring = Hamiltonian(m);
    s.kind =
        ring ? IntraNodeStrategy::kNvLinkRootedOutsideNicSwitch : IntraNodeStrategy::kPackedTrees;
    std::string where;
    if (nic == nullptr) {
      where = "no NIC in the topology";
    } else if (nic_top.empty()) {
      where = absl::StrCat("NIC ", nic->name(), " is not below a PCIe switch");
    } else if (std::get<0>(best_key) == 1) {
      where = absl::StrCat("GPU ", s.root_gpu, " is not below switch ", nic_top, " of NIC ",
                           nic->name(), ", which stays free for the NIC");
    } else {
      where = absl::StrCat("every chosen GPU shares switch ", nic_top, " with NIC ", nic->name());
    }
    const std::string fabric = topology.has_nvswitch() && topology.nvswitch().gpus_size() > 0
                                   ? "NVSwitch/NVLink"
                                   : "NVLink";
    s.reason = ring ? absl::StrCat("GPUs ", Join(sel), " form an ", fabric,
                                   " ring: reduce and broadcast over NVLink rooted at GPU ",
                                   s.root_gpu, " (", where, ")")
                    : absl::StrCat("GPUs ", Join(sel), " are connected by ", fabric,
                                   " but have no NVLink ring: pack spanning trees; host copies at "
                                   "GPU ",
                                   s.root_gpu, " (", where, ")");
    return s;
  }

  // Groups: same top-level PCIe switch, or NVLink.
  std::vector<std::vector<bool>> adj = nv_adj;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i != j && !top[i].empty() && top[i] == top[j]) adj[i][j] = true;
    }
  }
  std::vector<int> comp = Components(adj);
  std::map<int, std::vector<int>> groups;
  for (int i = 0; i < n; ++i) groups[comp[i]].push_back(sel[i]);
  bool any_pair = false;
  for (auto& [c, g] : groups) {
    std::sort(g.begin(), g.end());
    any_pair |= g.size() > 1;
    s.switch_groups.push_back(g);
  }
  std::sort(s.switch_groups.begin(), s.switch_groups.end());
  std::vector<std::string> described;
  for (const auto& g : s.switch_groups) described.push_back(absl::StrCat("{", Join(g), "}"));
  const bool any_nv = std::any_of(m.begin(), m.end(), [](const std::vector<double>& row) {
    return std::any_of(row.begin(), row.end(), [](double x) { return x > 0; });
  });
  if (!any_pair) {
    s.kind = IntraNodeStrategy::kHostStaging;
    s.reason = absl::StrCat("GPUs ", Join(sel),
                            " share neither a PCIe switch nor NVLink: each copies to host memory "
                            "and the CPU sums");
    return s;
  }
  s.kind = IntraNodeStrategy::kCpuAssistedPerSwitch;
  s.reason = absl::StrCat(
      any_nv ? "NVLink does not connect all chosen GPUs" : "PCIe only",
      ": reduce inside each group ", absl::StrJoin(described, " "),
      ", copy each partial to host memory and let the CPU sum across groups (no GPU-to-GPU copy "
      "across PCIe switches)");
  if (!nic_top.empty()) {
    for (const auto& g : s.switch_groups) {
      for (int gpu : g) {
        if (TopLevelSwitch(topology, gpu_of[gpu]->parent_switch_id()) == nic_top) {
          absl::StrAppend(&s.reason, "; group {", Join(g), "} shares switch ", nic_top,
                          " with NIC ", nic->name(), " and sends it one partial only");
          break;
        }
      }
    }
  }
  return s;
}

}  // namespace tributary::topology
