// Splitting a count of items by weight, exactly (largest remainder).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace tributary::common {

// Shares of `count` items in proportion to `weights` (negative weights count as 0) that sum to
// exactly `count`: each share is the floor of its exact part, and the items left over go one
// each to the largest remainders, ties to the lower index. All weights 0 (or none): every share
// 0 but the first, which gets everything (none for no weights).
inline std::vector<size_t> SplitByWeight(size_t count, std::span<const double> weights) {
  const size_t k = weights.size();
  std::vector<size_t> share(k, 0);
  if (k == 0) return share;
  double total = 0;
  for (double w : weights) total += std::max(w, 0.0);
  if (!(total > 0)) {
    share[0] = count;
    return share;
  }
  std::vector<std::pair<double, size_t>> remainders;
  size_t given = 0;
  for (size_t i = 0; i < k; ++i) {
    const double exact = static_cast<double>(count) * std::max(weights[i], 0.0) / total;
    share[i] = std::min(static_cast<size_t>(std::floor(exact)), count - given);
    given += share[i];
    remainders.push_back({exact - std::floor(exact), i});
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; given < count; i = (i + 1) % k, ++given) ++share[remainders[i].second];
  return share;
}

}  // namespace tributary::common
