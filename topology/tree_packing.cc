#include "topology/tree_packing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <string>

#include "absl/strings/str_cat.h"
#include "topology/bounds.h"
#include "topology/maxflow.h"

namespace tributary::topology {
namespace {

using Matrix = std::vector<std::vector<double>>;
constexpr double kLpEps = 1e-9;

Matrix DirectedCapacities(const GpuGraph& graph, bool nvlink_only) {
  const int n = static_cast<int>(graph.gpus.size());
  Matrix cap(n, std::vector<double>(n, 0));
  for (const GpuArc& arc : graph.arcs) {
    if (arc.from == arc.to || arc.bytes_per_s <= 0) continue;
    if (nvlink_only && arc.kind != LinkKind::kNvLink) continue;
    cap[arc.from][arc.to] += arc.bytes_per_s;
  }
  return cap;
}

// max sum_j w_j  s.t.  sum_{j uses row r} w_j <= capacity_r,  w >= 0: the packing LP, solved by
// a dense primal simplex on the full tableau (the slack columns hold B^-1, so columns can be
// appended to a solved tableau: column generation warm-starts). The origin is feasible, so no
// phase 1. Dantzig's rule, Bland's rule after many pivots (no cycling).
class PackingLp {
 public:
  explicit PackingLp(std::vector<double> capacity)
      : m_(static_cast<int>(capacity.size())),
        rhs_(std::move(capacity)),
        obj_(m_, 0.0),
        basis_(m_),
        rows_(m_) {
    for (int i = 0; i < m_; ++i) {
      rows_[i].assign(m_, 0.0);
      rows_[i][i] = 1;
      basis_[i] = i;
    }
  }

  // Reduced cost of a column using `rows` at the current basis (negative: improving).
  double ReducedCost(const std::vector<int>& rows) const {
    double d = -1;
    for (int r : rows) d += obj_[r];
    return d;
  }
  // Dual price of row r (>= 0 at optimality).
  double Dual(int r) const { return obj_[r]; }

  void AddColumn(const std::vector<int>& rows) {
    for (int i = 0; i < m_; ++i) {
      double v = 0;
      for (int r : rows) v += rows_[i][r];
      rows_[i].push_back(v);
    }
    obj_.push_back(ReducedCost(rows));
    columns_.push_back(rows);
  }

  int num_columns() const { return static_cast<int>(columns_.size()); }
  const std::vector<int>& column(int j) const { return columns_[j]; }

  void Solve() {
    const int total = static_cast<int>(obj_.size());
    for (int pivots = 0; pivots < 50000; ++pivots) {
      const bool bland = pivots > 2000;
      int enter = -1;
      double best = -kLpEps;
      for (int j = 0; j < total; ++j) {
        if (obj_[j] < best) {
          enter = j;
          if (bland) break;
          best = obj_[j];
        }
      }
      if (enter < 0) return;
      int leave = -1;
      double ratio = std::numeric_limits<double>::infinity();
      for (int i = 0; i < m_; ++i) {
        const double a = rows_[i][enter];
        if (a <= kLpEps) continue;
        const double r = rhs_[i] / a;
        if (r < ratio - 1e-12 || (r <= ratio + 1e-12 && leave >= 0 && basis_[i] < basis_[leave])) {
          ratio = r;
          leave = i;
        }
      }
      if (leave < 0) return;  // unbounded: impossible for columns with a row
      Pivot(leave, enter);
    }
  }

  // Value of each appended column.
  std::vector<double> Values() const {
    std::vector<double> values(columns_.size(), 0.0);
    for (int i = 0; i < m_; ++i) {
      if (basis_[i] >= m_) values[basis_[i] - m_] = std::max(rhs_[i], 0.0);
    }
    return values;
  }

 private:
  void Pivot(int r, int c) {
    const int total = static_cast<int>(obj_.size());
    std::vector<double>& row = rows_[r];
    const double p = row[c];
    for (double& v : row) v /= p;
    rhs_[r] /= p;
    for (int i = 0; i < m_; ++i) {
      if (i == r) continue;
      const double f = rows_[i][c];
      if (f == 0) continue;
      for (int j = 0; j < total; ++j) rows_[i][j] -= f * row[j];
      rhs_[i] = std::max(rhs_[i] - f * rhs_[r], 0.0);
    }
    const double f = obj_[c];
    for (int j = 0; j < total; ++j) obj_[j] -= f * row[j];
    basis_[r] = c;
  }

  int m_;
  std::vector<double> rhs_;
  std::vector<double> obj_;  // reduced costs z_j - c_j; for slack r it is the dual y_r
  std::vector<int> basis_;
  std::vector<std::vector<double>> rows_;
  std::vector<std::vector<int>> columns_;
};

struct WArc {
  int u;
  int v;
  double w;
  int id;
};

// Chu-Liu/Edmonds minimum-cost arborescence rooted at `root` over nodes 0..n-1. Returns false if
// some node is unreachable; else the ids of the chosen arcs.
bool MinArborescence(int n, int root, const std::vector<WArc>& arcs, std::vector<int>* chosen) {
  std::vector<int> in(n, -1);
  for (int k = 0; k < static_cast<int>(arcs.size()); ++k) {
    const WArc& a = arcs[k];
    if (a.u == a.v || a.v == root) continue;
    if (in[a.v] < 0 || a.w < arcs[in[a.v]].w) in[a.v] = k;
  }
  for (int v = 0; v < n; ++v) {
    if (v != root && in[v] < 0) return false;
  }
  std::vector<int> color(n, -1);
  int cycle_node = -1;
  for (int v = 0; v < n && cycle_node < 0; ++v) {
    int x = v;
    while (x != root && color[x] == -1) {
      color[x] = v;
      x = arcs[in[x]].u;
    }
    if (x != root && color[x] == v) cycle_node = x;
  }
  chosen->clear();
  if (cycle_node < 0) {
    for (int v = 0; v < n; ++v) {
      if (v != root) chosen->push_back(arcs[in[v]].id);
    }
    return true;
  }
  std::vector<bool> on_cycle(n, false);
  int x = cycle_node;
  do {
    on_cycle[x] = true;
    x = arcs[in[x]].u;
  } while (x != cycle_node);
  std::vector<int> map(n);
  int count = 0;
  for (int v = 0; v < n; ++v) {
    if (!on_cycle[v]) map[v] = count++;
  }
  const int contracted = count++;
  for (int v = 0; v < n; ++v) {
    if (on_cycle[v]) map[v] = contracted;
  }
  std::vector<WArc> sub;
  for (int k = 0; k < static_cast<int>(arcs.size()); ++k) {
    const WArc& a = arcs[k];
    const int mu = map[a.u];
    const int mv = map[a.v];
    if (mu == mv) continue;
    sub.push_back({mu, mv, a.w - (on_cycle[a.v] ? arcs[in[a.v]].w : 0.0), k});
  }
  std::vector<int> sub_chosen;
  if (!MinArborescence(count, map[root], sub, &sub_chosen)) return false;
  int entering = -1;
  for (int k : sub_chosen) {
    chosen->push_back(arcs[k].id);
    if (on_cycle[arcs[k].v]) entering = arcs[k].v;
  }
  for (int v = 0; v < n; ++v) {
    if (on_cycle[v] && v != entering) chosen->push_back(arcs[in[v]].id);
  }
  return true;
}

int Find(std::vector<int>& parent, int x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

// Kruskal minimum spanning tree over `edges` (u, v pairs) with `cost`; false if disconnected.
bool MinSpanningTree(int n, const std::vector<std::pair<int, int>>& edges,
                     const std::vector<double>& cost, std::vector<int>* chosen) {
  std::vector<int> order(edges.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return cost[a] < cost[b]; });
  std::vector<int> uf(n);
  std::iota(uf.begin(), uf.end(), 0);
  chosen->clear();
  for (int e : order) {
    const int a = Find(uf, edges[e].first);
    const int b = Find(uf, edges[e].second);
    if (a == b) continue;
    uf[a] = b;
    chosen->push_back(e);
  }
  return static_cast<int>(chosen->size()) == n - 1;
}

// A capacity unit such that every capacity is a small integer multiple of it, or 0.
double CapacityUnit(const Matrix& cap, double hint) {
  std::vector<double> values;
  for (const auto& row : cap) {
    for (double c : row) {
      if (c > 0) values.push_back(c);
    }
  }
  if (values.empty()) return 0;
  auto fits = [&](double unit) {
    if (unit <= 0) return false;
    for (double c : values) {
      const double m = c / unit;
      if (m > 64 || std::fabs(m - std::round(m)) > 1e-6 * std::max(1.0, m)) return false;
    }
    return true;
  };
  if (fits(hint)) return hint;
  double g = values[0];
  const double tol = 1e-7 * *std::max_element(values.begin(), values.end());
  for (double c : values) {
    double a = std::max(g, c);
    double b = std::min(g, c);
    while (b > tol) {
      const double r = std::fmod(a, b);
      a = b;
      b = r;
    }
    g = a;
  }
  return fits(g) ? g : 0;
}

bool RootConnectivityAtLeast(const std::vector<std::vector<int>>& mult, int root, int need) {
  if (need <= 0) return true;
  const int n = static_cast<int>(mult.size());
  FlowNetwork base(n);
  for (int u = 0; u < n; ++u) {
    for (int v = 0; v < n; ++v) {
      if (mult[u][v] > 0) base.AddArc(u, v, mult[u][v]);
    }
  }
  for (int w = 0; w < n; ++w) {
    if (w == root) continue;
    FlowNetwork network = base;
    if (network.MaxFlow(root, w) < need - 0.5) return false;
  }
  return true;
}

// k arc-disjoint spanning arborescences from `root` in the multigraph `mult` (Lovász's
// constructive proof of Edmonds' branching theorem): grow one tree at a time, adding an arc
// only if the unused arcs keep root connectivity >= (trees still to build after this one).
// Shallow tails first, so the trees stay short. False if an extension is not found.
bool UnitArborescences(std::vector<std::vector<int>> mult, int root, int k,
                       std::vector<std::vector<std::pair<int, int>>>* trees) {
  const int n = static_cast<int>(mult.size());
  trees->clear();
  for (int t = 0; t < k; ++t) {
    const int after = k - t - 1;
    std::vector<int> depth(n, -1);
    depth[root] = 0;
    std::vector<std::pair<int, int>> edges;
    for (int step = 1; step < n; ++step) {
      std::vector<std::pair<int, int>> candidates;
      for (int u = 0; u < n; ++u) {
        if (depth[u] < 0) continue;
        for (int v = 0; v < n; ++v) {
          if (depth[v] < 0 && mult[u][v] > 0) candidates.push_back({u, v});
        }
      }
      std::stable_sort(candidates.begin(), candidates.end(), [&](const auto& a, const auto& b) {
        return depth[a.first] < depth[b.first];
      });
      bool extended = false;
      for (const auto& [u, v] : candidates) {
        --mult[u][v];
        if (RootConnectivityAtLeast(mult, root, after)) {
          depth[v] = depth[u] + 1;
          edges.push_back({u, v});
          extended = true;
          break;
        }
        ++mult[u][v];
      }
      if (!extended) return false;
    }
    trees->push_back(std::move(edges));
  }
  return true;
}

// Orients an undirected spanning tree from a centre (least eccentricity, lowest index on ties).
Tree OrientFromCentre(int n, const std::vector<std::pair<int, int>>& undirected, double weight) {
  std::vector<std::vector<int>> adj(n);
  for (const auto& [u, v] : undirected) {
    adj[u].push_back(v);
    adj[v].push_back(u);
  }
  auto bfs = [&](int root, std::vector<int>* parent) {
    std::vector<int> dist(n, -1);
    parent->assign(n, -1);
    std::queue<int> queue;
    dist[root] = 0;
    queue.push(root);
    int ecc = 0;
    std::vector<int> order;
    while (!queue.empty()) {
      const int u = queue.front();
      queue.pop();
      order.push_back(u);
      ecc = std::max(ecc, dist[u]);
      for (int v : adj[u]) {
        if (dist[v] < 0) {
          dist[v] = dist[u] + 1;
          (*parent)[v] = u;
          queue.push(v);
        }
      }
    }
    return std::make_pair(ecc, order);
  };
  int best_root = 0;
  int best_ecc = std::numeric_limits<int>::max();
  std::vector<int> parent;
  for (int r = 0; r < n; ++r) {
    const int ecc = bfs(r, &parent).first;
    if (ecc < best_ecc) {
      best_ecc = ecc;
      best_root = r;
    }
  }
  Tree tree;
  tree.root = best_root;
  tree.weight = weight;
  const std::vector<int> order = bfs(best_root, &parent).second;
  for (int v : order) {
    if (v != best_root) tree.edges.push_back({parent[v], v});
  }
  return tree;
}

// The rows (connections) of the LP and a column = the rows a tree uses.
struct LpModel {
  bool allreduce = false;
  int n = 0;
  int root = 0;                           // broadcast only
  std::vector<std::pair<int, int>> rows;  // directed (u,v) or undirected u<v
  std::vector<std::vector<int>> row_of;   // n x n -> row or -1 (both orders when undirected)
  std::vector<double> capacity;           // per row, in units of `scale`
  double scale = 1;                       // bytes/s per LP unit
};

LpModel BuildModel(const GpuGraph& graph, bool allreduce, int root) {
  LpModel model;
  model.allreduce = allreduce;
  model.n = static_cast<int>(graph.gpus.size());
  model.root = root;
  const Matrix cap = allreduce ? UndirectedCapacities(graph) : DirectedCapacities(graph, false);
  model.row_of.assign(model.n, std::vector<int>(model.n, -1));
  double scale = 0;
  for (int u = 0; u < model.n; ++u) {
    for (int v = 0; v < model.n; ++v) {
      if (cap[u][v] <= 0 || (allreduce && v < u)) continue;
      model.row_of[u][v] = static_cast<int>(model.rows.size());
      if (allreduce) model.row_of[v][u] = model.row_of[u][v];
      model.rows.push_back({u, v});
      model.capacity.push_back(cap[u][v]);
      scale = std::max(scale, cap[u][v]);
    }
  }
  model.scale = scale > 0 ? scale : 1;
  for (double& c : model.capacity) c /= model.scale;
  return model;
}

std::vector<int> ColumnOf(const LpModel& model, const std::vector<std::pair<int, int>>& edges) {
  std::vector<int> column;
  for (const auto& [u, v] : edges) column.push_back(model.row_of[u][v]);
  std::sort(column.begin(), column.end());
  return column;
}

Tree TreeOf(const LpModel& model, const std::vector<int>& column, double weight) {
  std::vector<std::pair<int, int>> edges;
  for (int r : column) edges.push_back(model.rows[r]);
  if (model.allreduce) return OrientFromCentre(model.n, edges, weight);
  // Arcs are already parent -> child; order them breadth-first from the root.
  Tree tree;
  tree.root = model.root;
  tree.weight = weight;
  std::vector<std::vector<int>> children(model.n);
  for (const auto& [u, v] : edges) children[u].push_back(v);
  std::queue<int> queue;
  queue.push(model.root);
  while (!queue.empty()) {
    const int u = queue.front();
    queue.pop();
    for (int v : children[u]) {
      tree.edges.push_back({u, v});
      queue.push(v);
    }
  }
  return tree;
}

// The cheapest tree under the LP's duals (arborescence or spanning tree); false if none.
bool PriceColumn(const LpModel& model, const PackingLp& lp, std::vector<int>* column) {
  column->clear();
  if (model.allreduce) {
    std::vector<double> cost(model.rows.size());
    for (int r = 0; r < static_cast<int>(model.rows.size()); ++r) cost[r] = lp.Dual(r);
    if (!MinSpanningTree(model.n, model.rows, cost, column)) return false;
  } else {
    std::vector<WArc> arcs;
    for (int r = 0; r < static_cast<int>(model.rows.size()); ++r) {
      arcs.push_back({model.rows[r].first, model.rows[r].second, lp.Dual(r), r});
    }
    if (!MinArborescence(model.n, model.root, arcs, column)) return false;
  }
  std::sort(column->begin(), column->end());
  return true;
}

struct WeightedColumns {
  std::vector<std::vector<int>> columns;
  std::vector<double> weights;  // LP units
  double rate = 0;              // LP units
};

WeightedColumns Positive(const PackingLp& lp) {
  WeightedColumns out;
  const std::vector<double> values = lp.Values();
  for (int j = 0; j < lp.num_columns(); ++j) {
    if (values[j] > 1e-10) {
      out.columns.push_back(lp.column(j));
      out.weights.push_back(values[j]);
      out.rate += values[j];
    }
  }
  return out;
}

// Exact column generation from `seeds`.
WeightedColumns SolvePacking(const LpModel& model, const std::vector<std::vector<int>>& seeds,
                             int max_columns) {
  PackingLp lp(model.capacity);
  for (const auto& column : seeds) lp.AddColumn(column);
  lp.Solve();
  while (lp.num_columns() < max_columns) {
    std::vector<int> column;
    if (!PriceColumn(model, lp, &column)) break;
    if (lp.ReducedCost(column) >= -1e-9) break;
    lp.AddColumn(column);
    lp.Solve();
  }
  return Positive(lp);
}

WeightedColumns Reoptimise(const LpModel& model, const std::vector<std::vector<int>>& columns) {
  PackingLp lp(model.capacity);
  for (const auto& column : columns) lp.AddColumn(column);
  lp.Solve();
  return Positive(lp);
}

// Cuts `full` to <= max_trees columns, then keeps dropping the column whose loss hurts least
// while the re-optimised rate stays >= (1 - tolerance) * bound.
WeightedColumns ReduceColumns(const LpModel& model, WeightedColumns full, double bound,
                              const PackingOptions& options) {
  WeightedColumns current = std::move(full);
  while (static_cast<int>(current.columns.size()) > std::max(options.max_trees, 1)) {
    const int excess = static_cast<int>(current.columns.size()) - options.max_trees;
    const int drop = std::max(1, excess / 2);
    std::vector<int> order(current.columns.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return current.weights[a] > current.weights[b]; });
    std::vector<std::vector<int>> kept;
    for (int i = 0; i < static_cast<int>(order.size()) - drop; ++i) {
      kept.push_back(current.columns[order[i]]);
    }
    current = Reoptimise(model, kept);
  }
  const double floor = (1 - options.tolerance) * bound;
  while (current.columns.size() > 1) {
    WeightedColumns best;
    for (int skip = 0; skip < static_cast<int>(current.columns.size()); ++skip) {
      std::vector<std::vector<int>> kept;
      for (int i = 0; i < static_cast<int>(current.columns.size()); ++i) {
        if (i != skip) kept.push_back(current.columns[i]);
      }
      WeightedColumns candidate = Reoptimise(model, kept);
      if (candidate.rate > best.rate) best = std::move(candidate);
    }
    if (best.rate < floor) break;
    current = std::move(best);
  }
  return current;
}

// Edge-disjoint spanning trees in a multigraph (`edges` lists every copy) by matroid
// partitioning (Edmonds): each edge is inserted along a shortest exchange path through the k
// forests. True when k spanning trees were formed; `trees` then holds edge indices per tree.
bool DisjointSpanningTrees(int n, const std::vector<std::pair<int, int>>& edges, int k,
                           std::vector<std::vector<int>>* trees) {
  const int m = static_cast<int>(edges.size());
  if (k <= 0 || m < k * (n - 1)) return false;
  std::vector<int> forest_of(m, -1);
  std::vector<int> size(k, 0);
  int full = 0;
  // Edges on the forest-i path between a and b; `connected` false when none.
  auto forest_path = [&](int i, int a, int b, bool* connected) {
    std::vector<std::vector<std::pair<int, int>>> adj(n);  // (neighbour, edge)
    for (int e = 0; e < m; ++e) {
      if (forest_of[e] != i) continue;
      adj[edges[e].first].push_back({edges[e].second, e});
      adj[edges[e].second].push_back({edges[e].first, e});
    }
    std::vector<int> via(n, -2);
    std::vector<int> queue = {a};
    via[a] = -1;
    for (size_t q = 0; q < queue.size(); ++q) {
      for (const auto& [w, e] : adj[queue[q]]) {
        if (via[w] == -2) {
          via[w] = e;
          queue.push_back(w);
        }
      }
    }
    std::vector<int> path;
    *connected = via[b] != -2;
    for (int x = b; *connected && x != a;) {
      const int e = via[x];
      path.push_back(e);
      x = edges[e].first == x ? edges[e].second : edges[e].first;
    }
    return path;
  };
  for (int start = 0; start < m && full < k; ++start) {
    if (edges[start].first == edges[start].second) continue;
    std::vector<int> parent(m, -1);
    std::vector<bool> labelled(m, false);
    std::vector<int> queue = {start};
    labelled[start] = true;
    bool augmented = false;
    for (size_t q = 0; q < queue.size() && !augmented; ++q) {
      const int x = queue[q];
      for (int i = 0; i < k && !augmented; ++i) {
        if (forest_of[x] == i) continue;
        bool connected = false;
        const std::vector<int> cycle = forest_path(i, edges[x].first, edges[x].second, &connected);
        if (!connected) {
          int cur = x;
          int target = i;
          if (++size[i] == n - 1) ++full;
          while (cur != -1) {
            const int old = forest_of[cur];
            forest_of[cur] = target;
            target = old;
            cur = parent[cur];
          }
          augmented = true;
          break;
        }
        for (int y : cycle) {
          if (!labelled[y]) {
            labelled[y] = true;
            parent[y] = x;
            queue.push_back(y);
          }
        }
      }
    }
  }
  if (full < k) return false;
  trees->assign(k, {});
  for (int e = 0; e < m; ++e) {
    if (forest_of[e] >= 0) (*trees)[forest_of[e]].push_back(e);
  }
  return true;
}

// All-reduce packings of K <= max_trees equal-weight trees: for each K, the largest weight w
// (among the breakpoints c_e / j, by bisection: feasibility falls as w grows) such that the
// multigraph with floor(c_e / w) copies of each connection holds K edge-disjoint spanning
// trees; weights then re-optimised by the LP. Returns the candidate with the fewest trees within
// the tolerance, else the highest rate.
WeightedColumns EqualWeightTrees(const LpModel& model, double bound,
                                 const PackingOptions& options) {
  WeightedColumns best;
  const double floor_rate = (1 - options.tolerance) * bound;
  for (int k = 1; k <= options.max_trees; ++k) {
    const double top = bound / k;
    std::vector<double> candidates;
    for (double c : model.capacity) {
      for (int j = 1; c / j >= 0.5 * top; ++j) {
        if (c / j <= top * (1 + 1e-12)) candidates.push_back(c / j);
      }
    }
    std::sort(candidates.rbegin(), candidates.rend());
    candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
    std::vector<std::vector<int>> found;
    auto feasible = [&](double w, std::vector<std::vector<int>>* columns) {
      std::vector<std::pair<int, int>> copies;
      std::vector<int> row_of_copy;
      int round = 0;
      bool more = true;
      while (more) {  // interleave the copies so that the trees spread over connections
        more = false;
        for (int r = 0; r < static_cast<int>(model.rows.size()); ++r) {
          const int mult = static_cast<int>(std::floor(model.capacity[r] / w + 1e-9));
          if (round < mult) {
            copies.push_back(model.rows[r]);
            row_of_copy.push_back(r);
            more = true;
          }
        }
        ++round;
      }
      std::vector<std::vector<int>> trees;
      if (!DisjointSpanningTrees(model.n, copies, k, &trees)) return false;
      columns->clear();
      for (const auto& tree : trees) {
        std::vector<int> column;
        for (int e : tree) column.push_back(row_of_copy[e]);
        std::sort(column.begin(), column.end());
        columns->push_back(column);
      }
      return true;
    };
    int lo = 0;
    int hi = static_cast<int>(candidates.size()) - 1;
    int best_index = -1;
    while (lo <= hi) {  // candidates descend: find the first feasible one
      const int mid = (lo + hi) / 2;
      std::vector<std::vector<int>> columns;
      if (feasible(candidates[mid], &columns)) {
        best_index = mid;
        found = std::move(columns);
        hi = mid - 1;
      } else {
        lo = mid + 1;
      }
    }
    if (best_index < 0) continue;
    std::sort(found.begin(), found.end());
    found.erase(std::unique(found.begin(), found.end()), found.end());
    WeightedColumns candidate = Reoptimise(model, found);
    const bool in = candidate.rate >= floor_rate;
    if (in) return candidate;  // fewest trees within tolerance
    if (candidate.rate > best.rate) best = std::move(candidate);
  }
  return best;
}

// The better reduced packing: within tolerance first, then fewer trees, then higher rate.
WeightedColumns Better(WeightedColumns a, WeightedColumns b, double bound,
                       const PackingOptions& options) {
  const double floor_rate = (1 - options.tolerance) * bound;
  const bool a_in = a.rate >= floor_rate;
  const bool b_in = b.rate >= floor_rate;
  if (a_in != b_in) return a_in ? a : b;
  if (a_in && a.columns.size() != b.columns.size()) {
    return a.columns.size() < b.columns.size() ? a : b;
  }
  return a.rate >= b.rate ? a : b;
}

Packing ToPacking(const LpModel& model, const WeightedColumns& columns) {
  Packing packing;
  for (int j = 0; j < static_cast<int>(columns.columns.size()); ++j) {
    packing.trees.push_back(TreeOf(model, columns.columns[j], columns.weights[j] * model.scale));
  }
  packing.rate = 0;
  for (const Tree& tree : packing.trees) packing.rate += tree.weight;
  return packing;
}

absl::Status ValidateRoot(const GpuGraph& graph, int root) {
  if (root < 0 || root >= static_cast<int>(graph.gpus.size())) {
    return absl::InvalidArgumentError(absl::StrCat("root ", root, " is not a gpu index (graph has ",
                                                   graph.gpus.size(), " gpus)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateArcs(const GpuGraph& graph) {
  const int n = static_cast<int>(graph.gpus.size());
  for (const GpuArc& arc : graph.arcs) {
    if (arc.from < 0 || arc.from >= n || arc.to < 0 || arc.to >= n || arc.bytes_per_s < 0) {
      return absl::InvalidArgumentError(absl::StrCat("arc ", arc.from, "->", arc.to,
                                                     " is out of range or has negative capacity"));
    }
  }
  return absl::OkStatus();
}

// Hamiltonian cycle over `allowed` (n <= 20) by DP over subsets of paths from node 0.
bool HamiltonianCycle(const std::vector<uint32_t>& allowed, std::vector<int>* order) {
  const int n = static_cast<int>(allowed.size());
  if (n < 2 || n > 20) return false;
  const uint32_t full = (1u << n) - 1;
  std::vector<uint32_t> ends(size_t{1} << n, 0);  // ends[mask]: v such that a 0..v path covers mask
  ends[1] = 1;
  for (uint32_t mask = 1; mask <= full; mask += 2) {
    uint32_t e = ends[mask];
    while (e) {
      const int v = __builtin_ctz(e);
      e &= e - 1;
      uint32_t next = allowed[v] & ~mask;
      while (next) {
        const int w = __builtin_ctz(next);
        next &= next - 1;
        ends[mask | (1u << w)] |= 1u << w;
      }
    }
  }
  int last = -1;
  for (int v = 1; v < n; ++v) {
    if ((ends[full] >> v & 1) && (allowed[v] & 1)) last = v;
  }
  if (n == 2 && (ends[full] >> 1 & 1) && (allowed[1] & 1)) last = 1;
  if (last < 0) return false;
  order->assign(n, 0);
  uint32_t mask = full;
  int v = last;
  for (int pos = n - 1; pos >= 1; --pos) {
    (*order)[pos] = v;
    const uint32_t prev_mask = mask & ~(1u << v);
    int prev = -1;
    for (int u = 0; u < n && prev < 0; ++u) {
      if ((ends[prev_mask] >> u & 1) && (allowed[u] >> v & 1)) prev = u;
    }
    mask = prev_mask;
    v = prev;
  }
  (*order)[0] = 0;
  return true;
}

RingResult BestRingOver(const Matrix& directed) {
  RingResult result;
  const int n = static_cast<int>(directed.size());
  Matrix cap(n, std::vector<double>(n, 0));
  std::vector<double> levels;
  for (int u = 0; u < n; ++u) {
    for (int v = 0; v < n; ++v) {
      cap[u][v] = std::min(directed[u][v], directed[v][u]);
      if (u != v && cap[u][v] > 0) levels.push_back(cap[u][v]);
    }
  }
  std::sort(levels.rbegin(), levels.rend());
  levels.erase(std::unique(levels.begin(), levels.end()), levels.end());
  for (double level : levels) {
    std::vector<uint32_t> allowed(n, 0);
    for (int u = 0; u < n; ++u) {
      for (int v = 0; v < n; ++v) {
        if (u != v && cap[u][v] >= level) allowed[u] |= 1u << v;
      }
    }
    std::vector<int> order;
    if (!HamiltonianCycle(allowed, &order)) continue;
    result.exists = true;
    result.order = order;
    result.bottleneck_bytes_per_s = level;
    result.allreduce_rate = level * n / (2.0 * (n - 1));
    result.bidirectional_allreduce_rate = level * n / (n - 1.0);
    return result;
  }
  return result;
}

}  // namespace

absl::StatusOr<TreePlan> PlanBroadcast(const GpuGraph& graph, int root,
                                       const PackingOptions& options) {
  if (absl::Status s = ValidateRoot(graph, root); !s.ok()) return s;
  if (absl::Status s = ValidateArcs(graph); !s.ok()) return s;
  TreePlan plan;
  plan.bound = BroadcastBound(graph, root);
  if (plan.bound <= 0) return plan;
  const LpModel model = BuildModel(graph, /*allreduce=*/false, root);
  const Matrix directed = DirectedCapacities(graph, false);

  // Unit trees (Edmonds) when capacities are integer multiples of a unit.
  std::vector<std::vector<int>> seeds;
  Packing unit_packing;
  const double unit = CapacityUnit(directed, graph.nvlink_bytes_per_s);
  if (unit > 0) {
    const int n = model.n;
    std::vector<std::vector<int>> mult(n, std::vector<int>(n, 0));
    for (int u = 0; u < n; ++u) {
      for (int v = 0; v < n; ++v) mult[u][v] = static_cast<int>(std::lround(directed[u][v] / unit));
    }
    const int k = static_cast<int>(std::lround(plan.bound / unit));
    std::vector<std::vector<std::pair<int, int>>> trees;
    if (k <= 64 && UnitArborescences(mult, root, k, &trees)) {
      std::map<std::vector<int>, int> merged;  // column -> multiplicity
      for (const auto& edges : trees) ++merged[ColumnOf(model, edges)];
      for (const auto& [column, count] : merged) {
        seeds.push_back(column);
        unit_packing.trees.push_back(TreeOf(model, column, count * unit));
        unit_packing.rate += count * unit;
      }
    }
  }
  if (seeds.empty()) {
    // A breadth-first arborescence to start from.
    std::vector<WArc> arcs;
    for (int r = 0; r < static_cast<int>(model.rows.size()); ++r) {
      arcs.push_back({model.rows[r].first, model.rows[r].second, 1.0, r});
    }
    std::vector<int> column;
    if (MinArborescence(model.n, root, arcs, &column)) {
      std::sort(column.begin(), column.end());
      seeds.push_back(column);
    }
  }
  const WeightedColumns weighted = SolvePacking(model, seeds, options.max_columns);
  plan.weighted = ToPacking(model, weighted);
  if (!unit_packing.trees.empty() &&
      static_cast<int>(unit_packing.trees.size()) <= options.max_trees) {
    plan.reduced = std::move(unit_packing);
  } else {
    plan.reduced =
        ToPacking(model, ReduceColumns(model, weighted, plan.bound / model.scale, options));
  }
  return plan;
}

absl::StatusOr<TreePlan> PlanAllReduce(const GpuGraph& graph, const PackingOptions& options) {
  if (absl::Status s = ValidateArcs(graph); !s.ok()) return s;
  TreePlan plan;
  plan.bound = AllReduceBound(graph);
  if (plan.bound <= 0) return plan;
  const LpModel model = BuildModel(graph, /*allreduce=*/true, 0);
  // Seeds: a maximum spanning tree (by capacity) and breadth-first trees from each GPU.
  std::vector<std::vector<int>> seeds;
  std::vector<double> cost;
  for (double c : model.capacity) cost.push_back(-c);
  std::vector<int> column;
  if (MinSpanningTree(model.n, model.rows, cost, &column)) {
    std::sort(column.begin(), column.end());
    seeds.push_back(column);
  }
  const WeightedColumns weighted = SolvePacking(model, seeds, options.max_columns);
  plan.weighted = ToPacking(model, weighted);
  const double bound = plan.bound / model.scale;
  plan.reduced = ToPacking(model, Better(ReduceColumns(model, weighted, bound, options),
                                         EqualWeightTrees(model, bound, options), bound, options));
  return plan;
}

absl::Status CheckFeasible(const GpuGraph& graph, const Packing& packing, bool allreduce) {
  const int n = static_cast<int>(graph.gpus.size());
  const Matrix cap = DirectedCapacities(graph, false);
  Matrix load(n, std::vector<double>(n, 0));
  double sum = 0;
  for (size_t t = 0; t < packing.trees.size(); ++t) {
    const Tree& tree = packing.trees[t];
    if (tree.root < 0 || tree.root >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("tree ", t, ": root ", tree.root, " out of range"));
    }
    if (!(tree.weight >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat("tree ", t, ": negative weight"));
    }
    if (static_cast<int>(tree.edges.size()) != n - 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("tree ", t, ": ", tree.edges.size(), " edges for ", n, " gpus"));
    }
    std::vector<int> parent(n, -1);
    std::vector<std::vector<int>> children(n);
    for (const auto& [u, v] : tree.edges) {
      if (u < 0 || u >= n || v < 0 || v >= n || v == tree.root || parent[v] >= 0 || u == v) {
        return absl::InvalidArgumentError(
            absl::StrCat("tree ", t, ": edge ", u, "->", v, " breaks the arborescence"));
      }
      parent[v] = u;
      children[u].push_back(v);
      load[u][v] += tree.weight;
      if (allreduce) load[v][u] += tree.weight;
    }
    std::vector<int> stack = {tree.root};
    int reached = 0;
    while (!stack.empty()) {
      const int u = stack.back();
      stack.pop_back();
      ++reached;
      for (int v : children[u]) stack.push_back(v);
    }
    if (reached != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("tree ", t, ": reaches ", reached, " of ", n, " gpus from its root"));
    }
    sum += tree.weight;
  }
  if (std::fabs(sum - packing.rate) > 1e-9 * std::max(1.0, std::fabs(sum))) {
    return absl::InvalidArgumentError(
        absl::StrCat("claimed rate ", packing.rate, " differs from the sum of weights ", sum));
  }
  for (int u = 0; u < n; ++u) {
    for (int v = 0; v < n; ++v) {
      if (load[u][v] > cap[u][v] * (1 + 1e-9) + 1e-9 * std::max(1.0, packing.rate)) {
        return absl::FailedPreconditionError(absl::StrCat("arc ", u, "->", v, " loaded with ",
                                                          load[u][v], " B/s over its capacity ",
                                                          cap[u][v], " B/s"));
      }
    }
  }
  return absl::OkStatus();
}

bool HasNvLinkRing(const GpuGraph& graph) {
  return BestRingOver(DirectedCapacities(graph, /*nvlink_only=*/true)).exists;
}

RingResult BestRing(const GpuGraph& graph) {
  RingResult ring = BestRingOver(DirectedCapacities(graph, /*nvlink_only=*/true));
  if (ring.exists) {
    ring.nvlink = true;
    return ring;
  }
  return BestRingOver(DirectedCapacities(graph, /*nvlink_only=*/false));
}

}  // namespace tributary::topology
