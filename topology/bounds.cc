#include "topology/bounds.h"

#include <algorithm>
#include <numeric>

#include "topology/maxflow.h"

namespace tributary::topology {
namespace {

int Find(std::vector<int>& parent, int x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

// c(delta P) for a partition given as part ids, over the symmetric matrix `cap`.
double CrossingCapacity(const std::vector<std::vector<double>>& cap, const std::vector<int>& part) {
  double total = 0;
  const int n = static_cast<int>(part.size());
  for (int u = 0; u < n; ++u) {
    for (int v = u + 1; v < n; ++v) {
      if (part[u] != part[v]) total += cap[u][v];
    }
  }
  return total;
}

// min over partitions P of c(delta P) - k |P| (Dilworth truncation of f(S) = d(S)/2 - k, greedy
// over the GPUs in index order); writes a minimising partition into `part` (ids 0..parts-1).
double MinPartitionValue(const std::vector<std::vector<double>>& cap, double k,
                         std::vector<int>* part, int* num_parts) {
  const int n = static_cast<int>(cap.size());
  std::vector<double> x(n, 0);
  std::vector<int> uf(n);
  std::iota(uf.begin(), uf.end(), 0);
  for (int i = 0; i < n; ++i) {
    // min over S with i in S, S subset of {0..i} of d(S)/2 - x(S - i): a minimum i-t cut where
    // GPUs > i are tied to t, GPU u < i with x(u) > 0 pays x(u) when left out of S (arc i->u)
    // and with x(u) < 0 pays -x(u) when put into S (arc u->t).
    const int t = n;
    FlowNetwork network(n + 1);
    for (int u = 0; u < n; ++u) {
      for (int v = u + 1; v < n; ++v) {
        if (cap[u][v] > 0) {
          network.AddArc(u, v, cap[u][v] / 2);
          network.AddArc(v, u, cap[u][v] / 2);
        }
      }
    }
    double positive = 0;
    for (int u = 0; u < i; ++u) {
      if (x[u] > 0) {
        network.AddArc(i, u, x[u]);
        positive += x[u];
      } else if (x[u] < 0) {
        network.AddArc(u, t, -x[u]);
      }
    }
    for (int u = i + 1; u < n; ++u) network.AddArc(u, t, 1e300);
    const double cut = network.MaxFlow(i, t);
    x[i] = cut - positive - k;
    const std::vector<bool> side = network.SourceSide(i);
    for (int u = 0; u < i; ++u) {
      if (side[u]) uf[Find(uf, u)] = Find(uf, i);
    }
  }
  // The union of intersecting tight sets is tight, so the classes are a minimising partition.
  part->assign(n, -1);
  std::vector<int> id(n, -1);
  *num_parts = 0;
  for (int v = 0; v < n; ++v) {
    const int r = Find(uf, v);
    if (id[r] < 0) id[r] = (*num_parts)++;
    (*part)[v] = id[r];
  }
  return std::accumulate(x.begin(), x.end(), 0.0);
}

}  // namespace

double BroadcastBound(const GpuGraph& graph, int root) {
  const int n = static_cast<int>(graph.gpus.size());
  if (n < 2) return 0;
  const FlowNetwork base = BuildFlowNetwork(graph);
  double best = -1;
  for (int v = 0; v < n; ++v) {
    if (v == root) continue;
    FlowNetwork network = base;
    const double flow = network.MaxFlow(root, v);
    if (best < 0 || flow < best) best = flow;
  }
  return std::max(best, 0.0);
}

RootedBound BestBroadcastBound(const GpuGraph& graph) {
  RootedBound best;
  for (int r = 0; r < static_cast<int>(graph.gpus.size()); ++r) {
    const double rate = BroadcastBound(graph, r);
    if (rate > best.rate) best = {r, rate};
  }
  return best;
}

std::vector<std::vector<double>> UndirectedCapacities(const GpuGraph& graph) {
  const int n = static_cast<int>(graph.gpus.size());
  std::vector<std::vector<double>> directed(n, std::vector<double>(n, 0));
  for (const GpuArc& arc : graph.arcs) {
    if (arc.from != arc.to && arc.bytes_per_s > 0) directed[arc.from][arc.to] += arc.bytes_per_s;
  }
  std::vector<std::vector<double>> cap(n, std::vector<double>(n, 0));
  for (int u = 0; u < n; ++u) {
    for (int v = 0; v < n; ++v) {
      if (u != v) cap[u][v] = std::min(directed[u][v], directed[v][u]);
    }
  }
  return cap;
}

StrengthResult GraphStrength(const GpuGraph& graph) {
  StrengthResult result;
  const int n = static_cast<int>(graph.gpus.size());
  result.part.assign(n, 0);
  if (n < 2) return result;
  std::vector<std::vector<double>> cap = UndirectedCapacities(graph);
  // Work in units of the largest capacity so that the tolerances below are relative.
  double scale = 0;
  for (const auto& row : cap) {
    for (double c : row) scale = std::max(scale, c);
  }
  if (scale <= 0) {
    std::iota(result.part.begin(), result.part.end(), 0);
    result.num_parts = n;
    return result;
  }
  for (auto& row : cap) {
    for (double& c : row) c /= scale;
  }
  // Start from the partition into singletons.
  std::vector<int> part(n);
  std::iota(part.begin(), part.end(), 0);
  int num_parts = n;
  double k = CrossingCapacity(cap, part) / (n - 1);
  for (int iteration = 0; iteration < 4 * n + 8; ++iteration) {
    std::vector<int> candidate;
    int candidate_parts = 0;
    const double h = MinPartitionValue(cap, k, &candidate, &candidate_parts) + k;
    if (h >= -1e-10 || candidate_parts < 2) break;
    const double ratio = CrossingCapacity(cap, candidate) / (candidate_parts - 1);
    if (ratio >= k) break;  // no progress (numerical noise)
    k = ratio;
    part = candidate;
    num_parts = candidate_parts;
  }
  result.rate = std::max(k, 0.0) * scale;
  result.part = part;
  result.num_parts = num_parts;
  return result;
}

double AllReduceBound(const GpuGraph& graph) { return GraphStrength(graph).rate; }

GpuGraph InducedSubgraph(const GpuGraph& graph, const std::vector<int>& gpus) {
  GpuGraph sub;
  sub.nvlink_bytes_per_s = graph.nvlink_bytes_per_s;
  std::vector<int> index(graph.gpus.size(), -1);
  for (int i = 0; i < static_cast<int>(gpus.size()); ++i) {
    index[gpus[i]] = i;
    sub.gpus.push_back(graph.gpus[gpus[i]]);
  }
  for (const GpuArc& arc : graph.arcs) {
    if (index[arc.from] >= 0 && index[arc.to] >= 0) {
      GpuArc copy = arc;
      copy.from = index[arc.from];
      copy.to = index[arc.to];
      sub.arcs.push_back(copy);
    }
  }
  return sub;
}

GpuGraph NvLinkOnly(const GpuGraph& graph) {
  GpuGraph out = graph;
  out.arcs.clear();
  for (const GpuArc& arc : graph.arcs) {
    if (arc.kind == LinkKind::kNvLink) out.arcs.push_back(arc);
  }
  return out;
}

}  // namespace tributary::topology
