// Planning time of the intra-node tree planner (DESIGN.md §1.3): bounds + weighted packing +
// reduction, for DGX-1 V100 / P100 (8 GPUs) and a DGX-2-like 16-GPU NVSwitch box, plus the
// achieved rates on sample fragments.
//
// The NVSwitch box is modelled as a complete graph: each GPU's 6 x 25 GB/s is split evenly over
// its 15 peers (10 GB/s per arc). A switch node would model non-uniform traffic better; the
// complete graph is the worst case for the planner (240 arcs).
//
// Flags: --reps=N (repetitions per row, best reported; default 5).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "topology/bounds.h"
#include "topology/tree_packing.h"

namespace tributary::topology {
namespace {

constexpr double kLink = 25e9;

GpuGraph FromLinks(int n, const std::vector<std::tuple<int, int, int>>& links) {
  GpuGraph graph;
  graph.nvlink_bytes_per_s = kLink;
  for (int i = 0; i < n; ++i) graph.gpus.push_back(i);
  for (const auto& [u, v, count] : links) {
    graph.arcs.push_back({u, v, count * kLink, count, LinkKind::kNvLink});
    graph.arcs.push_back({v, u, count * kLink, count, LinkKind::kNvLink});
  }
  return graph;
}

GpuGraph V100() {
  return FromLinks(8, {{0, 1, 1},
                       {0, 2, 1},
                       {1, 3, 1},
                       {2, 6, 1},
                       {3, 7, 1},
                       {4, 5, 1},
                       {4, 6, 1},
                       {5, 7, 1},
                       {0, 3, 2},
                       {0, 4, 2},
                       {1, 2, 2},
                       {1, 5, 2},
                       {2, 3, 2},
                       {4, 7, 2},
                       {5, 6, 2},
                       {6, 7, 2}});
}

GpuGraph P100() {
  return FromLinks(8, {{0, 1, 1},
                       {0, 2, 1},
                       {0, 3, 1},
                       {0, 4, 1},
                       {1, 2, 1},
                       {1, 3, 1},
                       {1, 5, 1},
                       {2, 3, 1},
                       {2, 6, 1},
                       {3, 7, 1},
                       {4, 5, 1},
                       {4, 6, 1},
                       {4, 7, 1},
                       {5, 6, 1},
                       {5, 7, 1},
                       {6, 7, 1}});
}

GpuGraph NvSwitch16() {
  GpuGraph graph;
  graph.nvlink_bytes_per_s = kLink;
  for (int i = 0; i < 16; ++i) graph.gpus.push_back(i);
  for (int u = 0; u < 16; ++u) {
    for (int v = 0; v < 16; ++v) {
      if (u != v) graph.arcs.push_back({u, v, 6 * kLink / 15, 0, LinkKind::kNvLink});
    }
  }
  return graph;
}

double BestMs(int reps, const std::function<void()>& fn) {
  double best = 1e300;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    best = std::min(best, ms);
  }
  return best;
}

struct Row {
  std::string name;
  GpuGraph graph;
};

int Main(int argc, char** argv) {
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--reps=", 7) == 0) reps = std::max(1, std::atoi(argv[i] + 7));
  }
  std::vector<Row> rows = {{"dgx1-v100 (8)", V100()},
                           {"dgx1-p100 (8)", P100()},
                           {"v100 {0,1,2,5}", InducedSubgraph(V100(), {0, 1, 2, 5})},
                           {"v100 {0,1,2,3,4}", InducedSubgraph(V100(), {0, 1, 2, 3, 4})},
                           {"v100 {1,2,5,6,7}", InducedSubgraph(V100(), {1, 2, 5, 6, 7})},
                           {"p100 {0,1,2,4,5,6}", InducedSubgraph(P100(), {0, 1, 2, 4, 5, 6})},
                           {"nvswitch (16)", NvSwitch16()}};
  std::printf("%-20s %8s %8s | %9s %9s %5s | %9s %9s %5s %5s | %8s | %9s %9s %9s\n", "graph",
              "lambda", "sigma", "bc-wtd", "bc-red", "#t", "ar-wtd", "ar-red", "#tw", "#tr",
              "ring-bi", "bounds-ms", "bc-ms", "ar-ms");
  std::printf("%s\n", std::string(150, '-').c_str());
  for (const Row& row : rows) {
    const double link = kLink;
    RootedBound lambda;
    double sigma = 0;
    const double bounds_ms = BestMs(reps, [&] {
      lambda = BestBroadcastBound(row.graph);
      sigma = AllReduceBound(row.graph);
    });
    TreePlan broadcast;
    TreePlan allreduce;
    const double bc_ms = BestMs(reps, [&] { broadcast = *PlanBroadcast(row.graph, lambda.root); });
    const double ar_ms = BestMs(reps, [&] { allreduce = *PlanAllReduce(row.graph); });
    const RingResult ring = BestRing(row.graph);
    std::printf(
        "%-20s %8.3f %8.3f | %9.3f %9.3f %5zu | %9.3f %9.3f %5zu %5zu | %8.3f | %9.2f %9.2f "
        "%9.2f\n",
        row.name.c_str(), lambda.rate / link, sigma / link, broadcast.weighted.rate / link,
        broadcast.reduced.rate / link, broadcast.reduced.trees.size(),
        allreduce.weighted.rate / link, allreduce.reduced.rate / link,
        allreduce.weighted.trees.size(), allreduce.reduced.trees.size(),
        ring.exists ? ring.bidirectional_allreduce_rate / link : 0.0, bounds_ms, bc_ms, ar_ms);
  }
  std::printf(
      "\nrates in NVLinks (25 GB/s); lambda at the best root; bc = broadcast from that root, ar = "
      "all-reduce;\nwtd = optimal weighted packing, red = reduced (<= 10 trees, within 5%%); "
      "ring-bi = best NVLink ring, both directions (0 = none).\n");
  return 0;
}

}  // namespace
}  // namespace tributary::topology

int main(int argc, char** argv) { return tributary::topology::Main(argc, argv); }
