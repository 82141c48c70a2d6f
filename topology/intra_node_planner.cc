#include "topology/intra_node_planner.h"

#include "common/status_macros.h"

namespace tributary::topology {
namespace {

void AddTrees(const GpuGraph& graph, const Packing& packing,
              google::protobuf::RepeatedPtrField<tributary::v1::GpuTree>* out) {
  for (const Tree& t : packing.trees) {
    auto* tree = out->Add();
    tree->set_root(graph.gpus[t.root]);
    tree->set_weight_bytes_per_s(t.weight);
    for (const auto& [parent, child] : t.edges) {
      auto* e = tree->add_edges();
      e->set_parent(graph.gpus[parent]);
      e->set_child(graph.gpus[child]);
    }
  }
}

}  // namespace

absl::StatusOr<IntraNodeResult> PlanIntraNode(const tributary::v1::Topology& topology,
                                              const std::vector<int>& gpus, LinkMode mode,
                                              const PackingOptions& options) {
  IntraNodeResult r;
  r.mode = mode;
  ASSIGN_OR_RETURN(r.strategy, ChooseStrategy(topology, gpus));
  ASSIGN_OR_RETURN(r.graph, BuildGpuGraph(topology, gpus, mode));
  if (r.graph.gpus.size() < 2) return r;
  r.best_root = BestBroadcastBound(r.graph);
  r.root = r.best_root.root;
  for (size_t i = 0; i < r.graph.gpus.size(); ++i) {
    if (r.graph.gpus[i] == r.strategy.root_gpu) r.root = static_cast<int>(i);
  }
  r.broadcast_bound = BroadcastBound(r.graph, r.root);
  r.allreduce_bound = AllReduceBound(r.graph);
  r.broadcast = PlanBroadcast(r.graph, r.root, options);
  r.allreduce = PlanAllReduce(r.graph, options);
  r.ring = BestRing(r.graph);
  return r;
}

tributary::v1::IntraNodePlan ToProto(const IntraNodeResult& r) {
  tributary::v1::IntraNodePlan p;
  for (int g : r.graph.gpus) p.add_gpus(g);
  p.set_strategy(StrategyKindName(r.strategy.kind));
  p.set_reason(r.strategy.reason);
  p.set_root_gpu(r.graph.gpus.size() >= 2 ? r.graph.gpus[r.root] : r.strategy.root_gpu);
  for (const auto& group : r.strategy.switch_groups) {
    auto* g = p.add_groups();
    for (int gpu : group) g->add_gpus(gpu);
  }
  p.set_links(r.mode == LinkMode::kNvLinkOnly ? "nvlink" : "all");
  p.set_broadcast_bound_bytes_per_s(r.broadcast_bound);
  p.set_allreduce_bound_bytes_per_s(r.allreduce_bound);
  if (r.broadcast && r.broadcast->ok()) {
    p.set_broadcast_achieved_bytes_per_s((*r.broadcast)->reduced.rate);
    AddTrees(r.graph, (*r.broadcast)->reduced, p.mutable_broadcast_trees());
  }
  if (r.allreduce && r.allreduce->ok()) {
    p.set_allreduce_achieved_bytes_per_s((*r.allreduce)->reduced.rate);
    AddTrees(r.graph, (*r.allreduce)->reduced, p.mutable_allreduce_trees());
  }
  p.set_ring_exists(r.ring.exists);
  if (r.ring.exists) {
    for (int i : r.ring.order) p.add_ring(r.graph.gpus[i]);
  }
  p.set_ring_nvlink(r.ring.nvlink);
  p.set_ring_bytes_per_s(r.ring.allreduce_rate);
  return p;
}

}  // namespace tributary::topology
