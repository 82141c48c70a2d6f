#include "topology/maxflow.h"

#include <algorithm>
#include <limits>
#include <queue>

namespace tributary::topology {
namespace {
// Residual capacities below this (relative to unit-scale inputs) count as saturated.
constexpr double kEps = 1e-12;
}  // namespace

FlowNetwork::FlowNetwork(int num_nodes) : head_(num_nodes, -1) {}

int FlowNetwork::AddArc(int u, int v, double capacity) {
  const int index = static_cast<int>(original_.size());
  arcs_.push_back({v, head_[u], capacity});
  head_[u] = static_cast<int>(arcs_.size()) - 1;
  arcs_.push_back({u, head_[v], 0.0});
  head_[v] = static_cast<int>(arcs_.size()) - 1;
  original_.push_back(capacity);
  return index;
}

double FlowNetwork::Flow(int arc) const { return original_[arc] - arcs_[2 * arc].cap; }

bool FlowNetwork::Bfs(int s, int t) {
  level_.assign(head_.size(), -1);
  std::queue<int> queue;
  level_[s] = 0;
  queue.push(s);
  while (!queue.empty()) {
    const int u = queue.front();
    queue.pop();
    for (int a = head_[u]; a != -1; a = arcs_[a].next) {
      if (arcs_[a].cap > kEps && level_[arcs_[a].to] < 0) {
        level_[arcs_[a].to] = level_[u] + 1;
        queue.push(arcs_[a].to);
      }
    }
  }
  return level_[t] >= 0;
}

double FlowNetwork::Dfs(int u, int t, double pushed) {
  if (u == t) return pushed;
  for (int& a = iter_[u]; a != -1; a = arcs_[a].next) {
    Arc& arc = arcs_[a];
    if (arc.cap > kEps && level_[arc.to] == level_[u] + 1) {
      const double got = Dfs(arc.to, t, std::min(pushed, arc.cap));
      if (got > 0) {
        arc.cap -= got;
        arcs_[a ^ 1].cap += got;
        return got;
      }
    }
  }
  return 0;
}

double FlowNetwork::MaxFlow(int s, int t) {
  if (s == t) return 0;
  double total = 0;
  while (Bfs(s, t)) {
    iter_ = head_;
    while (true) {
      const double pushed = Dfs(s, t, std::numeric_limits<double>::infinity());
      if (pushed <= 0) break;
      total += pushed;
    }
  }
  return total;
}

std::vector<bool> FlowNetwork::SourceSide(int s) const {
  std::vector<bool> seen(head_.size(), false);
  std::vector<int> stack = {s};
  seen[s] = true;
  while (!stack.empty()) {
    const int u = stack.back();
    stack.pop_back();
    for (int a = head_[u]; a != -1; a = arcs_[a].next) {
      if (arcs_[a].cap > kEps && !seen[arcs_[a].to]) {
        seen[arcs_[a].to] = true;
        stack.push_back(arcs_[a].to);
      }
    }
  }
  return seen;
}

FlowNetwork BuildFlowNetwork(const GpuGraph& graph) {
  FlowNetwork network(static_cast<int>(graph.gpus.size()));
  for (const GpuArc& arc : graph.arcs) {
    if (arc.from != arc.to && arc.bytes_per_s > 0)
      network.AddArc(arc.from, arc.to, arc.bytes_per_s);
  }
  return network;
}

double MaxFlow(const GpuGraph& graph, int s, int t) {
  FlowNetwork network = BuildFlowNetwork(graph);
  return network.MaxFlow(s, t);
}

}  // namespace tributary::topology
