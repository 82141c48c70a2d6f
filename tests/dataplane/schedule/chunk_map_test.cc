#include "dataplane/schedule/chunk_map.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "gtest/gtest.h"

namespace tributary::dataplane {
namespace {

std::vector<uint64_t> WeightsFromFractions(const std::vector<double>& f) {
  std::vector<uint64_t> w;
  uint64_t sum = 0;
  for (size_t i = 0; i + 1 < f.size(); ++i) {
    w.push_back(static_cast<uint64_t>(f[i] * ChunkMap::kWeightTotal));
    sum += w.back();
  }
  w.push_back(ChunkMap::kWeightTotal - sum);
  return w;
}

TEST(ChunkMap, ChunksTileTheTensorExactly) {
  for (uint64_t count : {1ull, 2ull, 7ull, 1000ull, 1000003ull}) {
    for (uint32_t chunks : {1u, 2u, 3u, 7u, 64u}) {
      if (chunks > count) continue;
      uint64_t next = 0;
      for (uint32_t i = 0; i < chunks; ++i) {
        ChunkRange r = GetChunk(count, chunks, i);
        EXPECT_EQ(r.offset, next);
        EXPECT_GE(r.count, count / chunks);
        EXPECT_LE(r.count, count / chunks + 1);
        next += r.count;
      }
      EXPECT_EQ(next, count);
    }
  }
}

TEST(ChunkMap, NumChunksRespectsPartitionSize) {
  EXPECT_EQ(NumChunks(1, 4, 4 << 20), 1u);
  EXPECT_EQ(NumChunks(1 << 20, 4, 4 << 20), 1u);
  EXPECT_EQ(NumChunks((1 << 20) + 1, 4, 4 << 20), 2u);
  EXPECT_EQ(NumChunks(10, 8, 3), 10u);  // a partition below one element still moves one
}

TEST(ChunkMap, PushPullChunksPipelineEveryServer) {
  constexpr uint64_t kMiB = 1 << 20;
  // 64 MiB of float32 over 4 servers with 4 MiB partitions: 16 by size, 256 = 64 per server.
  EXPECT_EQ(PushPullChunks(16 * kMiB, 4, 4 * kMiB, 4), 256u);
  // 16 MiB: 64 per server of the 64 KiB floor.
  EXPECT_EQ(PushPullChunks(4 * kMiB, 4, 256 << 10, 4), 256u);
  // 8 MiB: the floor allows only 128 (32 per server).
  EXPECT_EQ(PushPullChunks(2 * kMiB, 4, 256 << 10, 4), 128u);
  // 1 GiB: the partition gives 256 chunks, as many as the floor; 4 GiB: never fewer than the
  // partition allows.
  EXPECT_EQ(PushPullChunks(256 * kMiB, 4, 4 * kMiB, 4), 256u);
  EXPECT_EQ(PushPullChunks(1024 * kMiB, 4, 4 * kMiB, 4), 1024u);
  // 1 MiB over 8 servers: 16 chunks of the 64 KiB floor, not 128 smaller ones.
  EXPECT_EQ(PushPullChunks(kMiB / 4, 4, 4 * kMiB, 8), 16u);
  // Small tensors are spread over the servers in chunks of at least 8 KiB...
  EXPECT_EQ(PushPullChunks(16384, 4, 4 * kMiB, 4), 4u);  // 64 KiB: one 16 KiB chunk each
  EXPECT_EQ(PushPullChunks(4096, 4, 4 * kMiB, 4), 2u);   // 16 KiB: two of 8 KiB
  // ...and below 16 KiB a tensor is one chunk (latency-bound; cutting it only adds messages).
  EXPECT_EQ(PushPullChunks(1024, 4, 4 * kMiB, 8), 1u);
  EXPECT_EQ(PushPullChunks(1, 4, 4 * kMiB, 8), 1u);
  // A partition smaller than the floor still wins (the job asked for small chunks).
  EXPECT_EQ(PushPullChunks(1024, 4, 1024, 2), 4u);
  // Never more chunks than elements.
  EXPECT_EQ(PushPullChunks(3, 4, 4, 8), 3u);
  // Every element is in exactly one chunk.
  const uint64_t count = 3 * kMiB + 17;
  const uint32_t c = PushPullChunks(count, 4, 4 * kMiB, 5);
  EXPECT_EQ(c, 192u);  // 12 MiB: by the 64 KiB floor
  uint64_t next = 0;
  for (uint32_t i = 0; i < c; ++i) {
    const ChunkRange r = GetChunk(count, c, i);
    EXPECT_EQ(r.offset, next);
    next += r.count;
  }
  EXPECT_EQ(next, count);
}

// A lone collective (nothing else in flight to hide its fill behind) goes down to 4 KiB chunks
// (8 KiB from 16 of them per server on), up to the same 64 per server; a busy one keeps the
// 64 KiB floor.
TEST(ChunkMap, LoneCollectivesAreCutFiner) {
  constexpr uint64_t kMiB = 1 << 20;
  // BERT-large's 243 small tensors fused: 1.29 MB over 4 or 8 servers. 19 chunks busy (64 KiB);
  // lone, every server gets 16 and more of 8 KiB, so 157 of ~8 KiB (not 315 of 4 KiB).
  const uint64_t bert_1d = 1290240 / 4;
  EXPECT_EQ(PushPullChunks(bert_1d, 4, kMiB, 4), 19u);
  EXPECT_EQ(PushPullChunks(bert_1d, 4, kMiB, 4, /*lone=*/true), 157u);
  EXPECT_EQ(PushPullChunks(bert_1d, 4, kMiB, 8, /*lone=*/true), 157u);
  // 8 KiB chunks from 16 per server on: 1 MiB over 8 servers is 128 of them; just under, 4 KiB.
  EXPECT_EQ(PushPullChunks(kMiB / 4, 4, kMiB, 8, true), 128u);
  EXPECT_EQ(PushPullChunks(kMiB / 4 - 8, 4, kMiB, 8, true), 255u);
  EXPECT_EQ(PushPullChunks(kMiB / 4 - 8, 4, kMiB, 4, true), 127u);
  // 256 KiB: 4 chunks busy, 64 of 4 KiB lone.
  EXPECT_EQ(PushPullChunks(64 << 10, 4, kMiB, 4), 4u);
  EXPECT_EQ(PushPullChunks(64 << 10, 4, kMiB, 4, true), 64u);
  // 16 KiB: two chunks of 8 KiB busy, four of 4 KiB lone; 4 KiB stays one chunk.
  EXPECT_EQ(PushPullChunks(4096, 4, kMiB, 4), 2u);
  EXPECT_EQ(PushPullChunks(4096, 4, kMiB, 4, true), 4u);
  EXPECT_EQ(PushPullChunks(1024, 4, kMiB, 4, true), 1u);
  // From 16 MiB on the 64-per-server cap decides, lone or not.
  EXPECT_EQ(PushPullChunks(4 * kMiB, 4, kMiB, 4, true), PushPullChunks(4 * kMiB, 4, kMiB, 4));
}

TEST(ChunkMap, RejectsBadWeights) {
  EXPECT_FALSE(ChunkMap::Create(std::vector<uint64_t>{}).ok());
  EXPECT_FALSE(ChunkMap::Create(std::vector<uint64_t>{1, 2}).ok());
  EXPECT_FALSE(ChunkMap::Create(std::vector<uint64_t>{ChunkMap::kWeightTotal, 0}).ok());
  EXPECT_TRUE(ChunkMap::Create(std::vector<uint64_t>{ChunkMap::kWeightTotal}).ok());
}

TEST(ChunkMap, EveryServerGetsItsShareWithinOneChunk) {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 200; ++trial) {
    const int servers = 1 + static_cast<int>(rng() % 12);
    std::vector<double> f(servers);
    double total = 0;
    for (double& x : f) total += (x = 0.05 + std::uniform_real_distribution<>(0, 1)(rng));
    for (double& x : f) x /= total;
    const std::vector<uint64_t> w = WeightsFromFractions(f);
    auto map = ChunkMap::Create(w);
    ASSERT_TRUE(map.ok());
    const uint32_t chunks = 1 + static_cast<uint32_t>(rng() % 2000);
    const uint64_t tensor = rng();
    std::vector<int64_t> owned(servers);
    for (uint32_t i = 0; i < chunks; ++i) owned[map->ServerOf(tensor, chunks, i)]++;
    for (int s = 0; s < servers; ++s) {
      const double target = static_cast<double>(chunks) * w[s] / ChunkMap::kWeightTotal;
      EXPECT_LT(std::abs(owned[s] - target), 1.0)
          << "server " << s << " of " << servers << ", " << chunks << " chunks";
    }
  }
}

TEST(ChunkMap, DeterministicAndChunkZeroIndependentOfSize) {
  const std::vector<uint64_t> w = WeightsFromFractions({0.1, 0.2, 0.3, 0.4});
  auto a = ChunkMap::Create(w);
  auto b = ChunkMap::Create(w);
  ASSERT_TRUE(a.ok() && b.ok());
  for (uint64_t tensor : {0ull, 1ull, 0xdeadbeefcafeull, ~0ull}) {
    const uint32_t home = a->ServerOf(tensor, 1, 0);
    for (uint32_t chunks : {1u, 2u, 5u, 999u}) {
      EXPECT_EQ(a->ServerOf(tensor, chunks, 0), home);
      for (uint32_t i = 0; i < chunks; ++i) {
        EXPECT_EQ(a->ServerOf(tensor, chunks, i), b->ServerOf(tensor, chunks, i));
      }
    }
  }
}

TEST(ChunkMap, SendOrderIsAPermutationThatInterleavesServers) {
  const std::vector<uint64_t> w = WeightsFromFractions({0.25, 0.25, 0.25, 0.25});
  auto map = ChunkMap::Create(w);
  ASSERT_TRUE(map.ok());
  const uint32_t chunks = 16;
  const std::vector<uint32_t> order = map->SendOrder(99, chunks);
  std::vector<uint32_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t i = 0; i < chunks; ++i) EXPECT_EQ(sorted[i], i);
  // Every window of 4 consecutive sends reaches 4 different servers.
  for (uint32_t start = 0; start + 4 <= chunks; start += 4) {
    std::set<uint32_t> servers;
    for (uint32_t i = start; i < start + 4; ++i)
      servers.insert(map->ServerOf(99, chunks, order[i]));
    EXPECT_EQ(servers.size(), 4u);
  }
}

TEST(ChunkMap, WorkersStartOnDifferentServers) {
  const std::vector<uint64_t> w = WeightsFromFractions({0.25, 0.25, 0.25, 0.25});
  auto map = ChunkMap::Create(w);
  ASSERT_TRUE(map.ok());
  const uint32_t chunks = 16;
  std::set<uint32_t> first_servers;
  for (uint32_t rank = 0; rank < 4; ++rank) {
    const std::vector<uint32_t> order = map->SendOrder(99, chunks, rank);
    std::vector<uint32_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (uint32_t i = 0; i < chunks; ++i) ASSERT_EQ(sorted[i], i);
    // At every step the four workers send to four different servers.
    first_servers.insert(map->ServerOf(99, chunks, order[0]));
    for (uint32_t other = 0; other < rank; ++other) {
      const std::vector<uint32_t> o = map->SendOrder(99, chunks, other);
      for (uint32_t i = 0; i < chunks; ++i) {
        EXPECT_NE(map->ServerOf(99, chunks, order[i]), map->ServerOf(99, chunks, o[i]))
            << "ranks " << rank << " and " << other << " at step " << i;
      }
    }
  }
  EXPECT_EQ(first_servers.size(), 4u);
  EXPECT_EQ(map->SendOrder(99, chunks, 0), map->SendOrder(99, chunks, 4));
}

TEST(ChunkMap, SingleChunkTensorsSpreadByWeight) {
  const std::vector<uint64_t> w = WeightsFromFractions({0.5, 0.25, 0.25});
  auto map = ChunkMap::Create(w);
  ASSERT_TRUE(map.ok());
  std::vector<int> owned(3);
  std::mt19937_64 rng(7);
  const int tensors = 20000;
  for (int t = 0; t < tensors; ++t) owned[map->ServerOf(rng(), 1, 0)]++;
  EXPECT_NEAR(owned[0] / double(tensors), 0.5, 0.02);
  EXPECT_NEAR(owned[1] / double(tensors), 0.25, 0.02);
  EXPECT_NEAR(owned[2] / double(tensors), 0.25, 0.02);
}

}  // namespace
}  // namespace tributary::dataplane
