// SplitByWeight: exact totals, proportional shares, largest remainders first with ties to the
// lower index, non-positive weights.
#include "common/weighted_split.h"

#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace tributary::common {
namespace {

TEST(SplitByWeight, SharesSumToTheCountAndFollowTheWeights) {
  EXPECT_EQ(SplitByWeight(10, std::vector<double>{2, 1, 1}), (std::vector<size_t>{5, 3, 2}));
  EXPECT_EQ(SplitByWeight(9, std::vector<double>{1, 1, 1}), (std::vector<size_t>{3, 3, 3}));
  // 7 x 1/3 = 2.33 each: the one left over goes to the lowest index (ties).
  EXPECT_EQ(SplitByWeight(7, std::vector<double>{1, 1, 1}), (std::vector<size_t>{3, 2, 2}));
  // 10 x (3, 9, 8) / 20 = 1.5, 4.5, 4: the one left over goes to a remainder of 0.5, the
  // lower index of the two.
  EXPECT_EQ(SplitByWeight(10, std::vector<double>{3, 9, 8}), (std::vector<size_t>{2, 4, 4}));
  // The largest remainder wins over a lower index: 10 x (1, 3) / 4 = 2.5, 7.5 -> ties again;
  // 4 x (1, 2) / 3 = 1.33, 2.67 -> the remainder 0.67 of index 1.
  EXPECT_EQ(SplitByWeight(4, std::vector<double>{1, 2}), (std::vector<size_t>{1, 3}));
  for (size_t count : {0, 1, 2, 3, 1000, 1001, 123457}) {
    const std::vector<size_t> s = SplitByWeight(count, std::vector<double>{0.3, 2.9, 1e-9, 7});
    EXPECT_EQ(std::accumulate(s.begin(), s.end(), size_t{0}), count);
  }
}

TEST(SplitByWeight, NonPositiveWeightsGetNothing) {
  EXPECT_EQ(SplitByWeight(5, std::vector<double>{-1, 1, 0}), (std::vector<size_t>{0, 5, 0}));
  EXPECT_EQ(SplitByWeight(5, std::vector<double>{0, 0}), (std::vector<size_t>{5, 0}));
  EXPECT_TRUE(SplitByWeight(5, std::vector<double>{}).empty());
}

}  // namespace
}  // namespace tributary::common
