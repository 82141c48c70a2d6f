#include "common/buffer_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

namespace tributary::common {
namespace {

constexpr uint64_t kKiB = 1024;

TEST(BufferPool, ClassesAreFourPerDoublingFromTheThreshold) {
  EXPECT_EQ(BufferPool::ClassBytes(1), 1u);
  EXPECT_EQ(BufferPool::ClassBytes(16 * kKiB - 1), 16 * kKiB - 1);  // not pooled: exact
  EXPECT_EQ(BufferPool::ClassBytes(64 * kKiB), 64 * kKiB);
  EXPECT_EQ(BufferPool::ClassBytes(64 * kKiB + 1), 80 * kKiB);
  EXPECT_EQ(BufferPool::ClassBytes(80 * kKiB), 80 * kKiB);
  EXPECT_EQ(BufferPool::ClassBytes(100 * kKiB), 112 * kKiB);
  EXPECT_EQ(BufferPool::ClassBytes(113 * kKiB), 128 * kKiB);
  EXPECT_EQ(BufferPool::ClassBytes(1280 * kKiB + 1), 1536 * kKiB);
  for (uint64_t bytes = 64 * kKiB; bytes < (uint64_t{1} << 30); bytes = bytes * 9 / 7 + 13) {
    const uint64_t c = BufferPool::ClassBytes(bytes);
    EXPECT_GE(c, bytes);
    EXPECT_LE(c, bytes + bytes / 4) << bytes;
    EXPECT_EQ(BufferPool::ClassBytes(c), c) << bytes;
  }
}

TEST(BufferPool, AReleasedBufferServesTheNextRequestOfItsClass) {
  BufferPool pool(16 << 20);
  std::byte* first;
  {
    std::shared_ptr<std::byte[]> a = pool.Get(100 * kKiB);
    first = a.get();
    std::memset(a.get(), 7, 112 * kKiB);  // the whole class is usable
  }
  EXPECT_EQ(pool.stats().kept_buffers, 1u);
  EXPECT_EQ(pool.stats().kept_bytes, 112 * kKiB);
  std::shared_ptr<std::byte[]> b = pool.Get(97 * kKiB);  // same class, another size
  EXPECT_EQ(b.get(), first);
  EXPECT_EQ(pool.stats().reused, 1u);
  EXPECT_EQ(pool.stats().allocated, 1u);
  EXPECT_EQ(pool.stats().kept_bytes, 0u);
  std::shared_ptr<std::byte[]> c = pool.Get(97 * kKiB);  // the one kept is out: a new one
  EXPECT_NE(c.get(), first);
  EXPECT_EQ(pool.stats().allocated, 2u);
  std::shared_ptr<std::byte[]> d = pool.Get(200 * kKiB);  // another class never takes it
  EXPECT_EQ(pool.stats().allocated, 3u);
}

TEST(BufferPool, TheLatestReturnedOfAClassGoesOutFirst) {
  BufferPool pool(16 << 20);
  std::shared_ptr<std::byte[]> a = pool.Get(1 << 20);
  std::shared_ptr<std::byte[]> b = pool.Get(1 << 20);
  std::byte* const later = b.get();
  a.reset();
  b.reset();
  EXPECT_EQ(pool.Get(1 << 20).get(), later);
}

TEST(BufferPool, SmallRequestsAreNotKept) {
  BufferPool pool(16 << 20);
  pool.Get(4 * kKiB).reset();
  pool.Get(0).reset();
  EXPECT_EQ(pool.stats().kept_buffers, 0u);
  EXPECT_EQ(pool.stats().allocated, 0u);
}

TEST(BufferPool, KeepsAtMostItsBudgetFreeingTheLongestKeptFirst) {
  BufferPool pool(3 << 20);
  std::vector<std::shared_ptr<std::byte[]>> out;
  for (int i = 0; i < 4; ++i) out.push_back(pool.Get(1 << 20));
  std::byte* const second = out[1].get();
  out.clear();  // returned in order 0, 1, 2, 3: the first is freed for the fourth
  EXPECT_EQ(pool.stats().kept_buffers, 3u);
  EXPECT_EQ(pool.stats().kept_bytes, uint64_t{3} << 20);
  EXPECT_EQ(pool.stats().freed, 1u);
  // A returned buffer of another class pushes the longest kept out too: 1 and 2 here.
  pool.Get(2 << 20).reset();
  EXPECT_EQ(pool.stats().freed, 3u);
  EXPECT_EQ(pool.stats().kept_bytes, uint64_t{3} << 20);
  std::shared_ptr<std::byte[]> last = pool.Get(1 << 20);
  EXPECT_NE(last.get(), second);
  EXPECT_EQ(pool.stats().reused, 1u);
  // A buffer larger than the whole budget is freed, and frees nothing kept.
  pool.Get(4 << 20).reset();
  EXPECT_EQ(pool.stats().kept_bytes, uint64_t{2} << 20);
  EXPECT_EQ(pool.stats().freed, 4u);
}

TEST(BufferPool, ShrinkingTheBudgetFreesTheLongestKept) {
  BufferPool pool(8 << 20);
  std::vector<std::shared_ptr<std::byte[]>> out;
  for (int i = 0; i < 4; ++i) out.push_back(pool.Get(1 << 20));
  std::byte* const newest = out[3].get();
  out.clear();
  pool.SetKeepBytes(1 << 20);
  EXPECT_EQ(pool.stats().kept_buffers, 1u);
  EXPECT_EQ(pool.stats().freed, 3u);
  EXPECT_EQ(pool.Get(1 << 20).get(), newest);
  pool.SetKeepBytes(0);
  EXPECT_EQ(pool.stats().kept_buffers, 0u);
}

TEST(BufferPool, BuffersMayOutliveThePoolAndMoveBetweenThreads) {
  std::shared_ptr<std::byte[]> survivor;
  {
    BufferPool pool(64 << 20);
    survivor = pool.Get(1 << 20);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&pool, t] {
        for (int i = 0; i < 200; ++i) {
          std::shared_ptr<std::byte[]> b = pool.Get((64 + 16 * (i % 8)) * kKiB);
          std::memset(b.get(), t, 64 * kKiB);
          std::thread([b = std::move(b)] {}).join();  // released on another thread
        }
      });
    }
    for (std::thread& t : threads) t.join();
    const BufferPool::Stats s = pool.stats();
    EXPECT_EQ(s.reused + s.allocated, 801u);
    EXPECT_LE(s.allocated, 1u + 4 * 8);  // at most one per class and thread at a time
  }
  std::memset(survivor.get(), 1, 1 << 20);
  survivor.reset();  // returns to the pool's state, which it kept alive
}

}  // namespace
}  // namespace tributary::common
