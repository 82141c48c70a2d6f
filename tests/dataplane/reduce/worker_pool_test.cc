#include "dataplane/reduce/cpu/worker_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tributary::dataplane {
namespace {

TEST(WorkerPoolTest, RunsEveryPartExactlyOnce) {
  for (int workers : {0, 1, 3}) {
    WorkerPool pool(workers);
    for (int parts : {0, 1, 2, 7, 64}) {
      std::vector<std::atomic<int>> runs(parts);
      pool.ParallelFor(parts, [&](int p) { runs[p].fetch_add(1); });
      for (int p = 0; p < parts; ++p) {
        EXPECT_EQ(runs[p].load(), 1)
            << "workers " << workers << " parts " << parts << " part " << p;
      }
    }
  }
}

TEST(WorkerPoolTest, UsesTheWorkers) {
  WorkerPool pool(2);
  // Three parts that each wait until all three have started can only finish if two workers
  // run beside the caller.
  std::atomic<int> started{0};
  pool.ParallelFor(3, [&](int) {
    started.fetch_add(1);
    while (started.load() < 3) std::this_thread::yield();
  });
  EXPECT_EQ(started.load(), 3);
}

TEST(WorkerPoolTest, ConcurrentCallersAllComplete) {
  WorkerPool pool(2);
  std::atomic<long> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 200; ++round) {
        pool.ParallelFor(5, [&](int p) { total.fetch_add(p + 1); });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 4L * 200 * (1 + 2 + 3 + 4 + 5));
}

}  // namespace
}  // namespace tributary::dataplane
