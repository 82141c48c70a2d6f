// The client's pool of retry copies (client/input_pool.h).
#include "client/input_pool.h"

#include <gtest/gtest.h>

#include <vector>

namespace tributary::client::internal {
namespace {

TEST(InputPoolTest, TakesTheSmallestFreeBlockThatFits) {
  InputPool pool;
  InputPool::Block small = pool.Take(4096);
  InputPool::Block large = pool.Take(16384);
  EXPECT_EQ(small.capacity, 4096u);
  EXPECT_EQ(large.capacity, 16384u);
  EXPECT_EQ(pool.allocated(), 2u);
  std::byte* small_data = small.data.get();
  std::byte* large_data = large.data.get();
  pool.Give(std::move(large));
  pool.Give(std::move(small));
  EXPECT_EQ(pool.free_blocks(), 2u);
  InputPool::Block got = pool.Take(4000);  // both fit: the smaller one
  EXPECT_EQ(got.data.get(), small_data);
  EXPECT_EQ(got.capacity, 4096u);
  InputPool::Block next = pool.Take(8192);  // only the large one fits
  EXPECT_EQ(next.data.get(), large_data);
  InputPool::Block none = pool.Take(4096);  // nothing left: a new block
  EXPECT_NE(none.data, nullptr);
  EXPECT_EQ(pool.allocated(), 3u);
  EXPECT_EQ(pool.Take(0).capacity, 1u);
}

// One iteration of BERT-large's small tensors submitted one by one (243 copies in flight at
// once): the next iteration reuses every block. With a pool of 64 blocks, 179 were allocated
// again every iteration.
TEST(InputPoolTest, AnIterationOfManyTensorsReusesEveryBlock) {
  InputPool pool;
  for (int iteration = 0; iteration < 3; ++iteration) {
    std::vector<InputPool::Block> in_flight;
    for (int t = 0; t < 243; ++t) in_flight.push_back(pool.Take(t % 3 == 0 ? 16384 : 4096));
    for (auto& b : in_flight) pool.Give(std::move(b));
    EXPECT_EQ(pool.allocated(), 243u) << "iteration " << iteration;
    EXPECT_EQ(pool.free_blocks(), 243u);
  }
}

TEST(InputPoolTest, KeepsAtMostItsBoundsAndFreesTheRest) {
  InputPool pool;
  std::vector<InputPool::Block> blocks;
  for (size_t i = 0; i < InputPool::kMaxBlocks + 10; ++i) blocks.push_back(pool.Take(1));
  for (auto& b : blocks) pool.Give(std::move(b));
  EXPECT_EQ(pool.free_blocks(), InputPool::kMaxBlocks);
  // A block that would take the free bytes past kMaxBytes is freed, not kept.
  InputPool big;
  big.Give(InputPool::Block{std::make_unique<std::byte[]>(1), InputPool::kMaxBytes + 1});
  EXPECT_EQ(big.free_blocks(), 0u);
  big.Give(InputPool::Block{});  // an empty block is ignored
  EXPECT_EQ(big.free_blocks(), 0u);
}

}  // namespace
}  // namespace tributary::client::internal
