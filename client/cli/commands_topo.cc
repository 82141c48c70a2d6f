// `tributary topo`: a node's topology (a file, or this machine), the intra-node strategy chosen
// for a set of its GPUs, and the tree/ring plans with their bounds (DESIGN.md §1.2, §1.3).
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/commands.h"
#include "common/status_macros.h"
#include "topology/bounds.h"
#include "topology/intra_node_planner.h"
#include "topology/strategy.h"
#include "topology/topology_discovery.h"
#include "topology/topology_file.h"
#include "topology/topology_graph.h"
#include "topology/topology_parsers.h"
#include "topology/tree_packing.h"

namespace tributary::client::cli {
namespace {

namespace topo = tributary::topology;
using json = nlohmann::ordered_json;

struct TopoOptions {
  std::string topology_file;
  std::string gpus;
  std::string links = "all";
  bool json = false;
};

absl::StatusOr<std::vector<int>> ParseGpuList(const std::string& text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus: \"", std::string(part), "\" is not a GPU index"));
    }
    out.push_back(v);
  }
  return out;
}

std::string Gbs(double bytes_per_s) { return absl::StrFormat("%.1f GB/s", bytes_per_s / 1e9); }

json TreesJson(const topo::GpuGraph& graph, const topo::Packing& packing) {
  json trees = json::array();
  for (const topo::Tree& t : packing.trees) {
    json edges = json::array();
    for (const auto& [from, to] : t.edges) edges.push_back({graph.gpus[from], graph.gpus[to]});
    trees.push_back(
        {{"root", graph.gpus[t.root]}, {"weight_bytes_per_s", t.weight}, {"edges", edges}});
  }
  return trees;
}

void PrintTrees(const topo::GpuGraph& graph, const topo::Packing& packing) {
  for (size_t i = 0; i < packing.trees.size(); ++i) {
    const topo::Tree& t = packing.trees[i];
    std::vector<std::string> edges;
    for (const auto& [from, to] : t.edges) {
      edges.push_back(absl::StrCat(graph.gpus[from], "->", graph.gpus[to]));
    }
    std::cout << absl::StrFormat("    tree %d: root %d, weight %s: %s\n", i + 1, graph.gpus[t.root],
                                 Gbs(t.weight), absl::StrJoin(edges, " "));
  }
}

void PrintTopology(const v1::Topology& t) {
  std::cout << "topology: " << t.source();
  if (!t.hostname().empty()) std::cout << " (" << t.hostname() << ")";
  std::cout << "\n"
            << absl::StrFormat("  %d socket(s), %d PCIe switch(es), %d GPU(s), %d NIC(s)\n",
                               t.sockets_size(), t.pcie_switches_size(), t.gpus_size(),
                               t.nics_size());
  for (const auto& s : t.sockets()) {
    std::cout << "  socket " << s.id();
    if (s.cpu_cores() > 0) std::cout << " (" << s.cpu_cores() << " cores)";
    std::cout << "\n";
  }
  for (const auto& s : t.pcie_switches()) {
    std::cout << "  switch " << s.id() << " on "
              << (s.parent_id().empty() ? absl::StrCat("socket ", s.socket_id())
                                        : absl::StrCat("switch ", s.parent_id()))
              << "\n";
  }
  auto where = [](const std::string& sw, int numa) {
    return absl::StrCat(sw.empty() ? "root complex" : absl::StrCat("switch ", sw),
                        numa >= 0 ? absl::StrCat(", numa ", numa) : "");
  };
  for (const auto& g : t.gpus()) {
    std::cout << absl::StrFormat("  gpu %d %s %s (%s)\n", g.index(), g.pci_bus_id(), g.name(),
                                 where(g.parent_switch_id(), g.numa_node()));
  }
  for (const auto& n : t.nics()) {
    std::cout << absl::StrFormat("  nic %s %s %.0f Gbit/s (%s)\n", n.name(), n.pci_bus_id(),
                                 n.speed_bits_per_s() / 1e9,
                                 where(n.parent_switch_id(), n.numa_node()));
  }
  if (t.nvlinks_size() > 0) {
    int links = 0;
    std::vector<std::string> items;
    for (const auto& l : t.nvlinks()) {
      links += l.link_count();
      items.push_back(absl::StrCat(l.gpu_a(), "-", l.gpu_b(), "x", l.link_count()));
    }
    std::cout << absl::StrFormat("  nvlink: %d connections, %d links, %s per link: %s\n",
                                 t.nvlinks_size(), links, Gbs(t.bandwidth().nvlink_bytes_per_s()),
                                 absl::StrJoin(items, " "));
  }
  if (t.has_nvswitch() && t.nvswitch().gpus_size() > 0) {
    std::cout << absl::StrFormat("  nvswitch: GPUs %s, %d links per GPU\n",
                                 absl::StrJoin(t.nvswitch().gpus(), ","),
                                 t.nvswitch().links_per_gpu());
  }
}

absl::Status RunTopo(const TopoOptions& options) {
  v1::Topology topology;
  if (options.topology_file.empty()) {
    ASSIGN_OR_RETURN(topology, topo::DiscoverLocalTopology());
  } else {
    ASSIGN_OR_RETURN(topology, topo::LoadTopologyFile(options.topology_file));
  }
  topo::LinkMode mode;
  if (options.links == "nvlink") {
    mode = topo::LinkMode::kNvLinkOnly;
  } else if (options.links == "all") {
    mode = topo::LinkMode::kAll;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--links: \"", options.links, "\" is neither nvlink nor all"));
  }
  ASSIGN_OR_RETURN(std::vector<int> gpus, ParseGpuList(options.gpus));
  ASSIGN_OR_RETURN(topo::IntraNodeResult plan, topo::PlanIntraNode(topology, gpus, mode));
  const topo::IntraNodeStrategy& strategy = plan.strategy;
  const topo::GpuGraph& graph = plan.graph;

  json out;
  out["strategy"] = {{"kind", topo::StrategyKindName(strategy.kind)},
                     {"reason", strategy.reason},
                     {"root_gpu", strategy.root_gpu},
                     {"switch_groups", strategy.switch_groups},
                     {"nic", strategy.nic}};
  if (!options.json) {
    PrintTopology(topology);
    std::cout << "gpus: " << absl::StrJoin(graph.gpus, ",") << " (links: " << options.links
              << ")\n";
    std::cout << "strategy: " << topo::StrategyKindName(strategy.kind);
    if (strategy.root_gpu >= 0) std::cout << " (root GPU " << strategy.root_gpu << ")";
    std::cout << "\n  reason: " << strategy.reason << "\n";
  }
  if (graph.gpus.size() < 2) {
    if (!options.json) std::cout << "(fewer than two GPUs: no trees or rings)\n";
    out["broadcast"] = nullptr;
    out["allreduce"] = nullptr;
    out["ring"] = {{"exists", false}, {"bytes_per_s", 0}};
    if (options.json) std::cout << out.dump(2) << std::endl;
    return absl::OkStatus();
  }
  const double unit = graph.nvlink_bytes_per_s > 0 ? graph.nvlink_bytes_per_s : 1;

  // Broadcast/reduce from the strategy's root when it has one, else from the best root.
  const int root = plan.root;
  const topo::RootedBound& best = plan.best_root;
  const absl::StatusOr<topo::TreePlan>& bcast = *plan.broadcast;
  const absl::StatusOr<topo::TreePlan>& allreduce = *plan.allreduce;
  const topo::RingResult& ring = plan.ring;

  auto plan_json = [&](const absl::StatusOr<topo::TreePlan>& p, double bound) {
    json j = {{"bound_bytes_per_s", bound},
              {"bound_links", bound / unit},
              {"achieved_bytes_per_s", p.ok() ? p->reduced.rate : 0.0},
              {"fraction", p.ok() && bound > 0 ? p->reduced.rate / bound : 0.0},
              {"weighted_bytes_per_s", p.ok() ? p->weighted.rate : 0.0},
              {"trees", p.ok() ? TreesJson(graph, p->reduced) : json::array()}};
    if (!p.ok()) j["error"] = std::string(p.status().message());
    return j;
  };
  const double bcast_bound = plan.broadcast_bound;
  const double ar_bound = plan.allreduce_bound;
  out["broadcast"] = plan_json(bcast, bcast_bound);
  out["broadcast"]["root"] = graph.gpus[root];
  out["broadcast"]["best_root"] = graph.gpus[best.root];
  out["broadcast"]["best_root_bound_bytes_per_s"] = best.rate;
  out["allreduce"] = plan_json(allreduce, ar_bound);
  std::vector<int> ring_order;
  for (int i : ring.order) ring_order.push_back(graph.gpus[i]);
  out["ring"] = {{"exists", ring.exists},
                 {"nvlink", ring.nvlink},
                 {"order", ring_order},
                 {"bytes_per_s", ring.allreduce_rate},
                 {"bidirectional_bytes_per_s", ring.bidirectional_allreduce_rate},
                 {"bottleneck_bytes_per_s", ring.bottleneck_bytes_per_s}};
  if (options.json) {
    std::cout << out.dump(2) << std::endl;
    return absl::OkStatus();
  }
  auto print_plan = [&](const std::string& name, const absl::StatusOr<topo::TreePlan>& p,
                        double bound) {
    std::cout << absl::StrFormat("%s: bound %s (%.2f links)", name, Gbs(bound), bound / unit);
    if (!p.ok()) {
      std::cout << "; no packing: " << p.status().message() << "\n";
      return;
    }
    std::cout << absl::StrFormat("; achieved %s with %d tree(s) (%.1f%% of the bound)\n",
                                 Gbs(p->reduced.rate), p->reduced.trees.size(),
                                 bound > 0 ? 100 * p->reduced.rate / bound : 0.0);
    PrintTrees(graph, p->reduced);
  };
  print_plan(absl::StrCat("broadcast/reduce from GPU ", graph.gpus[root]), bcast, bcast_bound);
  if (graph.gpus[best.root] != graph.gpus[root]) {
    std::cout << absl::StrFormat("  (best root: GPU %d at %s)\n", graph.gpus[best.root],
                                 Gbs(best.rate));
  }
  print_plan("all-reduce", allreduce, ar_bound);
  if (ring.exists) {
    std::cout << absl::StrFormat(
        "ring (%s) %s: all-reduce %s one way, %s both ways; trees reach %.2fx\n",
        ring.nvlink ? "NVLink" : "with PCIe", absl::StrJoin(ring_order, "-"),
        Gbs(ring.allreduce_rate), Gbs(ring.bidirectional_allreduce_rate),
        allreduce.ok() && ring.bidirectional_allreduce_rate > 0
            ? allreduce->reduced.rate / ring.bidirectional_allreduce_rate
            : 0.0);
  } else {
    std::cout << "ring: none (no Hamiltonian cycle over these links)\n";
  }
  return absl::OkStatus();
}

}  // namespace

void AddTopoCommand(CLI::App& app, GlobalOptions& global) {
  CLI::App* command = app.add_subcommand(
      "topo", "show a node topology, its intra-node strategy and tree/ring plans");
  auto options = std::make_shared<TopoOptions>();
  command->add_option("--topology", options->topology_file,
                      "topology file (NCCL XML, nvidia-smi topo -m, JSON, YAML); default: this "
                      "machine");
  command->add_option("--gpus", options->gpus, "device indices, e.g. 0,1,2,5 (default: all)");
  command->add_option("--links", options->links,
                      "all (default: NVLink plus PCIe/host paths) or nvlink (NVLink only, what "
                      "Blink's TreeGen packs)");
  command->add_flag("--json", options->json, "print one JSON object");
  SetAction(command, global, [options] { return RunTopo(*options); });
}

}  // namespace tributary::client::cli
