#include "dataplane/intranode/intra_node_execution.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tributary::dataplane {

absl::StatusOr<IntraNodeExecution> ExecutionFromPlan(const tributary::v1::IntraNodePlan& plan) {
  const std::string& strategy = plan.strategy();
  std::map<int, int> position;  // Device index -> executor GPU.
  for (int i = 0; i < plan.gpus_size(); ++i) {
    if (!position.emplace(plan.gpus(i), i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("the plan lists GPU ", plan.gpus(i), " twice"));
    }
  }
  auto at = [&](int device, const char* what) -> absl::StatusOr<int> {
    auto it = position.find(device);
    if (it == position.end()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " names GPU ", device,
                                                     ", which is not among the plan's GPUs (",
                                                     absl::StrJoin(plan.gpus(), " "), ")"));
    }
    return it->second;
  };
  const int n = plan.gpus_size();
  IntraNodeExecution e;
  if (strategy == "direct" || strategy == "cpu-only" || n < 2) {
    e.description = absl::StrCat(strategy, ": nothing to aggregate on GPUs");
    return e;
  }
  if (strategy == "cpu-assisted-per-switch" || strategy == "host-staging") {
    std::vector<int> seen(n, 0);
    for (const tributary::v1::GpuGroup& group : plan.groups()) {
      std::vector<int> g;
      for (int device : group.gpus()) {
        absl::StatusOr<int> p = at(device, "a GPU group");
        if (!p.ok()) return p.status();
        if (seen[*p]++) {
          return absl::InvalidArgumentError(absl::StrCat("GPU ", device, " is in two groups"));
        }
        g.push_back(*p);
      }
      if (g.empty()) return absl::InvalidArgumentError("the plan has an empty GPU group");
      // The root GPU (outside the NIC's switch) leads its group.
      if (auto root = position.find(plan.root_gpu()); root != position.end()) {
        auto it = std::find(g.begin(), g.end(), root->second);
        if (it != g.end()) std::rotate(g.begin(), it, it + 1);
      }
      e.groups.push_back(std::move(g));
    }
    for (int i = 0; i < n; ++i) {
      if (!seen[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("GPU ", plan.gpus(i), " is in none of the plan's groups"));
      }
    }
    e.kind = IntraNodeExecution::kCpuAssisted;
    std::vector<std::string> shown;
    for (const tributary::v1::GpuGroup& group : plan.groups()) {
      shown.push_back(absl::StrCat("{", absl::StrJoin(group.gpus(), " "), "}"));
    }
    e.description = absl::StrCat(strategy, ": groups ", absl::StrJoin(shown, " "));
    return e;
  }
  if (strategy == "nvlink-rooted-outside-nic-switch") {
    if (plan.ring_size() != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the nvlink-rooted plan carries a ring of ", plan.ring_size(), " GPUs for ", n,
          " GPUs (a controller older than the ring field planned it: re-plan the job)"));
    }
    std::vector<int> ring;
    for (int device : plan.ring()) {
      absl::StatusOr<int> p = at(device, "the ring");
      if (!p.ok()) return p.status();
      ring.push_back(*p);
    }
    absl::StatusOr<int> root = at(plan.root_gpu(), "the root");
    if (!root.ok()) return root.status();
    absl::StatusOr<GpuTree> tree = RingRootedTree(ring, *root);
    if (!tree.ok()) return tree.status();
    e.kind = IntraNodeExecution::kTrees;
    e.trees.push_back(std::move(*tree));
    e.description = absl::StrCat(strategy, ": ring ", absl::StrJoin(plan.ring(), " "),
                                 " cut at GPU ", plan.root_gpu());
    return e;
  }
  if (strategy == "packed-trees") {
    if (plan.allreduce_trees_size() == 0) {
      return absl::InvalidArgumentError("the packed-trees plan carries no all-reduce tree");
    }
    for (int t = 0; t < plan.allreduce_trees_size(); ++t) {
      const tributary::v1::GpuTree& in = plan.allreduce_trees(t);
      GpuTree tree{std::vector<int>(n, -2), in.weight_bytes_per_s()};
      if (!(tree.weight > 0) || !std::isfinite(tree.weight)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tree ", t, " of the plan carries ", in.weight_bytes_per_s(), " bytes/s"));
      }
      absl::StatusOr<int> root = at(in.root(), "a tree's root");
      if (!root.ok()) return root.status();
      tree.parent[*root] = -1;
      for (const tributary::v1::GpuTree::Edge& edge : in.edges()) {
        absl::StatusOr<int> parent = at(edge.parent(), "a tree edge");
        if (!parent.ok()) return parent.status();
        absl::StatusOr<int> child = at(edge.child(), "a tree edge");
        if (!child.ok()) return child.status();
        if (tree.parent[*child] != -2) {
          return absl::InvalidArgumentError(
              absl::StrCat("tree ", t, " of the plan reaches GPU ", edge.child(), " twice"));
        }
        tree.parent[*child] = *parent;
      }
      for (int i = 0; i < n; ++i) {
        if (tree.parent[i] == -2) {
          return absl::InvalidArgumentError(
              absl::StrCat("tree ", t, " of the plan does not reach GPU ", plan.gpus(i)));
        }
      }
      e.trees.push_back(std::move(tree));
    }
    e.kind = IntraNodeExecution::kTrees;
    e.description = absl::StrCat("packed-trees: ", e.trees.size(), " trees");
    return e;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown intra-node strategy \"", strategy, "\""));
}

}  // namespace tributary::dataplane
