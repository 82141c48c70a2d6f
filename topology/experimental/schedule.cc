#include "topology/experimental/schedule.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/weighted_split.h"

namespace tributary::topology {

absl::StatusOr<Schedule> CompileAllReduceSchedule(const Packing& packing, int num_positions,
                                                  size_t num_elements, size_t chunk_elements) {
  if (num_positions < 1) return absl::InvalidArgumentError("schedule needs at least one position");
  if (chunk_elements == 0) return absl::InvalidArgumentError("chunk_elements must be positive");
  if (packing.trees.empty()) return absl::InvalidArgumentError("packing has no trees");
  double total_weight = 0;
  for (const Tree& tree : packing.trees) total_weight += std::max(tree.weight, 0.0);
  if (!(total_weight > 0)) return absl::InvalidArgumentError("packing has no positive weight");

  Schedule schedule;
  schedule.num_positions = num_positions;
  schedule.num_elements = num_elements;
  for (size_t t = 0; t < packing.trees.size(); ++t) {
    const Tree& tree = packing.trees[t];
    ScheduleTree st;
    st.root = tree.root;
    st.parent.assign(num_positions, -1);
    st.children.assign(num_positions, {});
    if (tree.root < 0 || tree.root >= num_positions ||
        static_cast<int>(tree.edges.size()) != num_positions - 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("tree ", t, " does not span ", num_positions, " positions"));
    }
    for (const auto& [u, v] : tree.edges) {
      if (u < 0 || u >= num_positions || v < 0 || v >= num_positions || v == tree.root ||
          st.parent[v] >= 0 || u == v) {
        return absl::InvalidArgumentError(
            absl::StrCat("tree ", t, ": edge ", u, "->", v, " breaks the arborescence"));
      }
      st.parent[v] = u;
      st.children[u].push_back(v);
    }
    std::vector<int> stack = {tree.root};
    int reached = 0;
    while (!stack.empty()) {
      const int u = stack.back();
      stack.pop_back();
      ++reached;
      for (int v : st.children[u]) stack.push_back(v);
    }
    if (reached != num_positions) {
      return absl::InvalidArgumentError(absl::StrCat("tree ", t, " is not connected"));
    }
    schedule.trees.push_back(std::move(st));
  }

  // Largest-remainder split of the elements by weight.
  const size_t k = packing.trees.size();
  std::vector<double> weights;
  for (const Tree& tree : packing.trees) weights.push_back(tree.weight);
  const std::vector<size_t> share = common::SplitByWeight(num_elements, weights);
  size_t offset = 0;
  size_t max_chunks = 0;
  for (size_t t = 0; t < k; ++t) {
    schedule.trees[t].offset = offset;
    schedule.trees[t].count = share[t];
    offset += share[t];
    max_chunks = std::max(max_chunks, (share[t] + chunk_elements - 1) / chunk_elements);
  }
  for (size_t c = 0; c < max_chunks; ++c) {
    for (size_t t = 0; t < k; ++t) {
      const ScheduleTree& st = schedule.trees[t];
      const size_t begin = c * chunk_elements;
      if (begin >= st.count) continue;
      schedule.chunks.push_back(
          {static_cast<int>(t), st.offset + begin, std::min(chunk_elements, st.count - begin)});
    }
  }
  return schedule;
}

}  // namespace tributary::topology
