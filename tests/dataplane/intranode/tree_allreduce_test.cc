// TreeAllReduce on HostGpuOps: exact sums and averages on every GPU's buffer for every dtype,
// tree layout (a star, a chain, the NVLink ring cut at its root, weighted packings, one GPU),
// chunk size and count, with the work run in random legal orders (deferred HostGpuOps, several
// seeds: a missing dependency shows as a wrong sum); the data path (peer copies only along tree
// edges, host copies only at roots); the inter-node step; the online chunk tuner with an injected
// clock; no fence left behind; bad input. HostGpuOps' queues, queue waits and deferral
// themselves are tested first.
#include "dataplane/intranode/tree_allreduce.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "dataplane/intranode/cpu_assisted_allreduce.h"
#include "dataplane/intranode/host_gpu_ops.h"
#include "dataplane/reduce/cpu/scalar_reducer.h"
#include "gtest/gtest.h"
#include "tests/dataplane/intranode/host_node.h"
#include "tests/util/typed_values.h"

namespace tributary::dataplane {
namespace {

using common::DataType;
using testing::GetValue;
using testing::Input;
using testing::Node;
using testing::PutValue;

// Two queues of two GPUs: B copies what A wrote. Without a queue wait, some order of the
// deferred work copies the old value; with one, every order copies the new one.
TEST(HostGpuOps, DeferredWorkRunsInRandomLegalOrdersAndQueueWaitsOrderIt) {
  ScalarReducer reducer;
  std::set<float> seen_without_wait;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    for (bool wait : {false, true}) {
      HostGpuOps ops(2, reducer, {.deferred = true, .seed = seed});
      float a[1] = {1}, b[1] = {0}, source[1] = {7};
      ops.RegisterBuffer(0, a, sizeof(a));
      ops.RegisterBuffer(0, source, sizeof(source));
      ops.RegisterBuffer(1, b, sizeof(b));
      absl::StatusOr<int> qa = ops.AddQueue(0);
      ASSERT_TRUE(qa.ok());
      EXPECT_EQ(*qa, 2);
      EXPECT_EQ(ops.QueueGpu(*qa), 0);
      EXPECT_EQ(ops.QueueGpu(9), -1);
      ASSERT_TRUE(ops.CopyAsync(*qa, a, source, sizeof(a)).ok());
      absl::StatusOr<uint64_t> f = ops.Fence(*qa);
      ASSERT_TRUE(f.ok());
      if (wait) {
        ASSERT_TRUE(ops.QueueWaitFence(1, *f).ok());
      }
      ASSERT_TRUE(ops.CopyAsync(1, b, a, sizeof(a)).ok());  // Peer copy on GPU 1's queue.
      EXPECT_EQ(b[0], 0) << "work ran before anyone waited";
      ASSERT_TRUE(ops.Synchronize(1).ok());
      if (wait) {
        EXPECT_EQ(b[0], 7) << "seed " << seed;
      } else {
        seen_without_wait.insert(b[0]);
      }
      ASSERT_TRUE(ops.ReleaseFence(*f).ok());
      EXPECT_EQ(ops.ReleaseFence(*f).code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(ops.fence_count(), 0u);
    }
  }
  EXPECT_EQ(seen_without_wait, (std::set<float>{1, 7})) << "both orders should occur";
}

// A wait can only name a fence already enqueued, so the enqueue order is always a legal order:
// interleaved waits in both directions run; unknown queues and fences are errors.
TEST(HostGpuOps, CrossWaitsRunAndBadIdsAreErrors) {
  ScalarReducer reducer;
  HostGpuOps ops(2, reducer, {.deferred = true});
  absl::StatusOr<uint64_t> f0 = ops.Fence(0);
  ASSERT_TRUE(f0.ok());
  ASSERT_TRUE(ops.QueueWaitFence(1, *f0).ok());
  absl::StatusOr<uint64_t> f1 = ops.Fence(1);
  ASSERT_TRUE(f1.ok());
  ASSERT_TRUE(ops.QueueWaitFence(0, *f1).ok());
  absl::StatusOr<uint64_t> g0 = ops.Fence(0);
  ASSERT_TRUE(g0.ok());
  EXPECT_TRUE(ops.WaitFence(0, *g0).ok());
  EXPECT_EQ(ops.WaitFence(0, *g0).code(), absl::StatusCode::kInvalidArgument);  // Waited.
  EXPECT_TRUE(ops.ReleaseFence(*f0).ok());
  EXPECT_TRUE(ops.ReleaseFence(*f1).ok());
  EXPECT_EQ(ops.fence_count(), 0u);
  EXPECT_EQ(ops.QueueWaitFence(0, 12345).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ops.QueueWaitFence(0, *f0).code(), absl::StatusCode::kInvalidArgument);  // Released.
  EXPECT_EQ(ops.AddQueue(5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ops.Fence(7).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ops.Synchronize(-1).code(), absl::StatusCode::kInvalidArgument);
}

struct TreeLayout {
  const char* name;
  int gpus;
  std::vector<GpuTree> trees;
};

std::vector<TreeLayout> Layouts() {
  std::vector<TreeLayout> layouts;
  layouts.push_back({"star", 4, {{{-1, 0, 0, 0}}}});
  layouts.push_back({"chain", 4, {{{1, 2, 3, -1}}}});
  const std::vector<int> ring{0, 3, 2, 1, 5, 6, 7, 4};  // A DGX-1-like NVLink ring.
  layouts.push_back({"ring rooted at 6", 8, {*RingRootedTree(ring, 6)}});
  // Two trees with different roots and weights 2:1 (a packing's shares).
  layouts.push_back({"two weighted trees", 5, {{{-1, 0, 1, 2, 3}, 2.0}, {{2, 4, 4, 2, -1}, 1.0}}});
  layouts.push_back({"three trees", 3, {{{-1, 0, 0}}, {{1, -1, 1}}, {{2, 2, -1}}}});
  layouts.push_back({"one GPU", 1, {{{-1}}}});
  return layouts;
}

bool IsEdge(const TreeLayout& l, int a, int b) {
  for (const GpuTree& t : l.trees) {
    if (t.parent[a] == b || t.parent[b] == a) return true;
  }
  return false;
}

bool IsRoot(const TreeLayout& l, int g) {
  for (const GpuTree& t : l.trees) {
    if (t.parent[g] == -1) return true;
  }
  return false;
}

TEST(RingRootedTree, TwoChainsFromTheRootAlongTheRing) {
  const std::vector<int> ring{0, 3, 2, 1, 5, 6, 7, 4};
  for (int root = 0; root < 8; ++root) {
    absl::StatusOr<GpuTree> tree = RingRootedTree(ring, root);
    ASSERT_TRUE(tree.ok()) << tree.status();
    int depth_max = 0, children_of_root = 0;
    for (int g = 0; g < 8; ++g) {
      if (g == root) {
        EXPECT_EQ(tree->parent[g], -1);
        continue;
      }
      // The parent is a ring neighbour; the path reaches the root within 4 steps.
      const int at = static_cast<int>(std::find(ring.begin(), ring.end(), g) - ring.begin());
      const int p = tree->parent[g];
      EXPECT_TRUE(p == ring[(at + 1) % 8] || p == ring[(at + 7) % 8]) << g << " -> " << p;
      if (p == root) ++children_of_root;
      int depth = 0;
      for (int x = g; x != root && depth <= 8; x = tree->parent[x]) ++depth;
      depth_max = std::max(depth_max, depth);
    }
    EXPECT_EQ(children_of_root, 2);
    EXPECT_EQ(depth_max, 4);
  }
  // Two GPUs: one child; one GPU: just the root.
  EXPECT_EQ(RingRootedTree(std::vector<int>{1, 0}, 1)->parent, (std::vector<int>{1, -1}));
  EXPECT_EQ(RingRootedTree(std::vector<int>{0}, 0)->parent, (std::vector<int>{-1}));
  EXPECT_EQ(RingRootedTree(std::vector<int>{0, 1, 1}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RingRootedTree(std::vector<int>{0, 1, 3}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RingRootedTree(std::vector<int>{0, 1, 2}, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TreeAllReduce, EveryBufferHoldsTheExactSumInEveryLegalOrder) {
  for (const TreeLayout& layout : Layouts()) {
    for (DataType dtype : common::kAllDataTypes) {
      // (count, chunk bytes): one chunk, two, many; chunks that do and do not divide.
      for (auto [count, chunk_bytes] :
           {std::pair<size_t, size_t>{1, 16}, {3, 16}, {1000, 16}, {4097, 1000}, {3, 1 << 20}}) {
        for (uint64_t seed : {0, 1, 2, 3}) {  // 0: work runs when enqueued.
          // Odd seeds: enqueued piece by piece; even: recorded, then replayed.
          const bool record = seed % 2 == 0;
          SCOPED_TRACE(::testing::Message()
                       << layout.name << ", " << common::DataTypeName(dtype) << ", count " << count
                       << ", chunk " << chunk_bytes << ", seed " << seed);
          Node node(layout.gpus, dtype, count, 1, {.deferred = seed != 0, .seed = seed});
          auto ar =
              TreeAllReduce::Create(node.ops(), node.reducer(), layout.trees,
                                    {.chunk_bytes = chunk_bytes, .tune = false, .record = record});
          ASSERT_TRUE(ar.ok()) << ar.status();
          absl::Status s = (*ar)->AllReduce(dtype, node.pointers(), count, false);
          ASSERT_TRUE(s.ok()) << s;
          EXPECT_EQ((*ar)->replays(), record ? 1 : 0);
          for (int g = 0; g < layout.gpus; ++g) {
            for (size_t i = 0; i < count; ++i) {
              double want = 0;
              for (int h = 0; h < layout.gpus; ++h) want += Input(h, i, 1);
              ASSERT_EQ(GetValue(dtype, node.buffer(g), i), want)
                  << "GPU " << g << " element " << i;
            }
          }
          EXPECT_EQ(node.ops().fence_count(), 0u);
          // The data path: peer copies only along tree edges, no host copy without a host step.
          for (const std::string& e : node.ops().log()) {
            int from = -1, to = -1, queue = -1;
            if (std::sscanf(e.c_str(), "peer %d->%d on %d", &from, &to, &queue) == 3) {
              ASSERT_TRUE(IsEdge(layout, from, to)) << e << ": not a tree edge";
            }
            ASSERT_EQ(e.rfind("d2h", 0), std::string::npos) << e;
            ASSERT_EQ(e.rfind("h2d", 0), std::string::npos) << e;
          }
        }
      }
    }
  }
}

TEST(TreeAllReduce, ChunksArePipelinedAcrossQueues) {
  // A chain of 4 with 64 chunks, deferred: the host enqueues everything before anything runs,
  // so all of the work is pending at once (the device, not the host, orders the chunks).
  const TreeLayout chain = Layouts()[1];
  Node node(4, DataType::kFloat32, 64 * 4, 1, {.deferred = true, .seed = 5});
  auto ar = TreeAllReduce::Create(node.ops(), node.reducer(), chain.trees,
                                  {.chunk_bytes = 16, .tune = false, .record = false});
  ASSERT_TRUE(ar.ok());
  ASSERT_TRUE((*ar)->AllReduce(DataType::kFloat32, node.pointers(), 64 * 4, false).ok());
  // Per chunk at least 3 pushes, 3 sums, 3 broadcast copies.
  EXPECT_GT(node.ops().max_pending(), 64u * 9);
  // Two queues per GPU and tree besides the default ones (no replay queue without recording).
  EXPECT_EQ(node.ops().queue_count(), 4 + 2 * 4);
}

// Repeated calls with the same arguments replay one recording (no work enqueued piece by
// piece), exact every time on fresh inputs and with the same data path; other arguments make
// other recordings, of which the last `recordings` are kept.
TEST(TreeAllReduce, RepeatedCallsReplayOneRecording) {
  const TreeLayout layout = Layouts()[3];  // Two weighted trees over 5 GPUs.
  for (uint64_t seed : {0, 11}) {
    Node node(layout.gpus, DataType::kFloat64, 700, 1, {.deferred = seed != 0, .seed = seed});
    auto ar = TreeAllReduce::Create(node.ops(), node.reducer(), layout.trees,
                                    {.chunk_bytes = 400, .tune = false, .recordings = 2});
    ASSERT_TRUE(ar.ok());
    std::vector<std::string> first_log;
    for (int call = 0; call < 4; ++call) {
      // Fresh inputs: GPU g holds Input(g, i, call + 1).
      for (int g = 0; g < layout.gpus; ++g) {
        for (size_t i = 0; i < 700; ++i) {
          PutValue(DataType::kFloat64, node.pointers()[g], i, Input(g, i, call + 1));
        }
      }
      node.ops().ClearLog();
      ASSERT_TRUE((*ar)->AllReduce(DataType::kFloat64, node.pointers(), 700, false).ok());
      for (int g = 0; g < layout.gpus; ++g) {
        for (size_t i = 0; i < 700; ++i) {
          double want = 0;
          for (int h = 0; h < layout.gpus; ++h) want += Input(h, i, call + 1);
          ASSERT_EQ(GetValue(DataType::kFloat64, node.buffer(g), i), want)
              << "call " << call << " GPU " << g << " element " << i;
        }
      }
      std::vector<std::string> log = node.ops().log();
      EXPECT_EQ(std::count(log.begin(), log.end(), "record"), call == 0 ? 1 : 0);
      EXPECT_EQ(std::count(log.begin(), log.end(), "replay"), 1);
      log.erase(std::remove(log.begin(), log.end(), "record"), log.end());
      std::sort(log.begin(), log.end());
      if (call == 0) {
        first_log = log;
      } else {
        EXPECT_EQ(log, first_log) << "a replay does other work than the recorded call";
      }
    }
    EXPECT_EQ((*ar)->replays(), 4);
    EXPECT_EQ(node.ops().replays(), 4);
    // Other counts: new recordings; the oldest beyond two is dropped and recorded again.
    for (size_t count : {699, 698, 700}) {
      node.ops().ClearLog();
      ASSERT_TRUE((*ar)->AllReduce(DataType::kFloat64, node.pointers(), count, false).ok());
      const std::vector<std::string>& log = node.ops().log();
      EXPECT_EQ(std::count(log.begin(), log.end(), "record"), 1) << count;
    }
    node.ops().ClearLog();
    ASSERT_TRUE((*ar)->AllReduce(DataType::kFloat64, node.pointers(), 698, false).ok());
    EXPECT_EQ(std::count(node.ops().log().begin(), node.ops().log().end(), "record"), 0);
  }
}

TEST(HostGpuOps, RecordingsReplayWithFreshFencesAndNoHostWaitWhileRecording) {
  ScalarReducer reducer;
  HostGpuOps ops(2, reducer, {.deferred = true, .seed = 9});
  int64_t a[1] = {1}, b[1] = {0};
  ops.RegisterBuffer(0, a, sizeof(a));
  ops.RegisterBuffer(1, b, sizeof(b));
  ASSERT_TRUE(ops.BeginRecording().ok());
  EXPECT_EQ(ops.BeginRecording().code(), absl::StatusCode::kFailedPrecondition);
  // a = a + a on GPU 0, then b = a on GPU 1 after it.
  std::vector<const void*> srcs{a, a};
  ASSERT_TRUE(ops.ReduceAsync(0, DataType::kInt64, a, srcs, 1).ok());
  absl::StatusOr<uint64_t> f = ops.Fence(0);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(ops.QueueWaitFence(1, *f).ok());
  ASSERT_TRUE(ops.ReleaseFence(*f).ok());
  ASSERT_TRUE(ops.CopyAsync(1, b, a, sizeof(a)).ok());
  EXPECT_EQ(ops.Synchronize(1).code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<uint64_t> recording = ops.EndRecording();
  ASSERT_TRUE(recording.ok());
  EXPECT_EQ(a[0], 1) << "recorded work ran";
  for (int i = 1; i <= 5; ++i) {
    ASSERT_TRUE(ops.Replay(*recording, 1).ok());
    ASSERT_TRUE(ops.Synchronize(1).ok());
    EXPECT_EQ(b[0], int64_t{1} << i);
  }
  EXPECT_TRUE(ops.DropRecording(*recording).ok());
  EXPECT_EQ(ops.Replay(*recording, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ops.EndRecording().status().code(), absl::StatusCode::kFailedPrecondition);
}

// The two halves for a caller that runs the inter-node step itself: ReduceToRoots writes each
// share's node sum to the host destination of its root and leaves every buffer as it was (a
// failed operation keeps its inputs); the caller doubles the sum (the other node) and puts it in
// the root's buffer; after BroadcastFromRoots every GPU holds the doubled sum. Enqueued and
// recorded, in random orders, twice (the second replays).
TEST(TreeAllReduce, ReduceToRootsThenBroadcastFromRoots) {
  for (const TreeLayout& layout : Layouts()) {
    for (uint64_t seed : {0, 1, 2}) {
      SCOPED_TRACE(::testing::Message() << layout.name << ", seed " << seed);
      constexpr size_t kCount = 777;
      Node node(layout.gpus, DataType::kInt64, kCount, 1, {.deferred = seed != 0, .seed = seed});
      std::vector<std::vector<int64_t>> host(layout.gpus, std::vector<int64_t>(kCount, -1));
      std::vector<void*> host_out;
      for (int g = 0; g < layout.gpus; ++g) {
        node.ops().RegisterBuffer(-1, host[g].data(), kCount * 8);
        host_out.push_back(host[g].data());
      }
      auto ar = TreeAllReduce::Create(node.ops(), node.reducer(), layout.trees,
                                      {.chunk_bytes = 256, .tune = false, .record = seed != 1});
      ASSERT_TRUE(ar.ok());
      for (int round = 0; round < 2; ++round) {
        for (int g = 0; g < layout.gpus; ++g) {
          for (size_t i = 0; i < kCount; ++i) {
            PutValue(DataType::kInt64, node.pointers()[g], i, Input(g, i, round + 1));
          }
        }
        ASSERT_TRUE((*ar)->ReduceToRoots(DataType::kInt64, node.pointers(), kCount, host_out).ok());
        for (int g = 0; g < layout.gpus; ++g) {
          for (size_t i = 0; i < kCount; ++i) {
            ASSERT_EQ(GetValue(DataType::kInt64, node.buffer(g), i), Input(g, i, round + 1))
                << "the input of GPU " << g << " changed at " << i;
          }
        }
        size_t covered = 0;
        for (const TreeAllReduce::Share& share : (*ar)->Shares(kCount)) {
          ASSERT_EQ(share.first, covered);
          covered += share.count;
          for (size_t i = share.first; i < share.first + share.count; ++i) {
            double want = 0;
            for (int h = 0; h < layout.gpus; ++h) want += Input(h, i, round + 1);
            ASSERT_EQ(host[share.root][i], want) << "root " << share.root << " element " << i;
            PutValue(DataType::kInt64, node.pointers()[share.root], i, 2 * want);
          }
        }
        ASSERT_EQ(covered, kCount);
        ASSERT_TRUE((*ar)->BroadcastFromRoots(DataType::kInt64, node.pointers(), kCount).ok());
        for (int g = 0; g < layout.gpus; ++g) {
          for (size_t i = 0; i < kCount; ++i) {
            double want = 0;
            for (int h = 0; h < layout.gpus; ++h) want += Input(h, i, round + 1);
            ASSERT_EQ(GetValue(DataType::kInt64, node.buffer(g), i), 2 * want)
                << "GPU " << g << " element " << i;
          }
        }
        EXPECT_EQ(node.ops().fence_count(), 0u);
        // The only copies to the host: the roots' sums.
        for (const std::string& e : node.ops().log()) {
          int gpu = -1, queue = -1;
          if (std::sscanf(e.c_str(), "d2h %d on %d", &gpu, &queue) == 2) {
            ASSERT_TRUE(IsRoot(layout, gpu)) << e;
          }
          ASSERT_EQ(e.rfind("h2d", 0), std::string::npos) << e;
        }
      }
      EXPECT_EQ((*ar)->replays(), seed != 1 ? 4 : 0);
      std::vector<void*> short_out(host_out.begin(), host_out.end() - 1);
      EXPECT_EQ((*ar)->ReduceToRoots(DataType::kInt64, node.pointers(), kCount, short_out).code(),
                absl::StatusCode::kInvalidArgument);
    }
  }
}

// Two "nodes": the hook doubles the node's sum (the other node holds the same inputs), sees every
// element once, only the roots cross to the host, and the average divides by all contributors.
TEST(TreeAllReduce, InterNodeStepAtTheRootsAndAverage) {
  for (const TreeLayout& layout : Layouts()) {
    const int contributors = 2 * layout.gpus;
    for (DataType dtype : common::kAllDataTypes) {
      for (uint64_t seed : {0, 7, 8}) {
        SCOPED_TRACE(::testing::Message()
                     << layout.name << ", " << common::DataTypeName(dtype) << ", seed " << seed);
        constexpr size_t kCount = 1001;
        Node node(layout.gpus, dtype, kCount, contributors, {.deferred = seed != 0, .seed = seed});
        auto ar =
            TreeAllReduce::Create(node.ops(), node.reducer(), layout.trees,
                                  {.chunk_bytes = 64, .tune = false, .slots = 1, .window = 3});
        ASSERT_TRUE(ar.ok());
        std::vector<int> seen(kCount, 0);
        absl::Status s = (*ar)->AllReduce(dtype, node.pointers(), kCount, true, contributors,
                                          [&](DataType t, void* data, size_t n, size_t offset) {
                                            for (size_t i = 0; i < n; ++i) {
                                              ++seen[offset + i];
                                              PutValue(t, data, i, 2 * GetValue(t, data, i));
                                            }
                                            return absl::OkStatus();
                                          });
        ASSERT_TRUE(s.ok()) << s;
        EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<long>(kCount));
        for (int g = 0; g < layout.gpus; ++g) {
          for (size_t i = 0; i < kCount; ++i) {
            double sum = 0;
            for (int h = 0; h < layout.gpus; ++h) sum += Input(h, i, contributors);
            ASSERT_EQ(GetValue(dtype, node.buffer(g), i), 2 * sum / contributors)
                << "GPU " << g << " element " << i;
          }
        }
        EXPECT_EQ(node.ops().fence_count(), 0u);
        for (const std::string& e : node.ops().log()) {
          int gpu = -1, queue = -1;
          if (std::sscanf(e.c_str(), "d2h %d on %d", &gpu, &queue) == 2 ||
              std::sscanf(e.c_str(), "h2d %d on %d", &gpu, &queue) == 2) {
            ASSERT_TRUE(IsRoot(layout, gpu)) << e << ": not a root";
          }
        }
      }
    }
  }
}

TEST(TreeAllReduce, AFailedStepFailsTheCallAndTheNextOneIsExact) {
  const TreeLayout layout = Layouts()[2];
  Node node(layout.gpus, DataType::kInt32, 500, 1, {.deferred = true, .seed = 3});
  auto ar = TreeAllReduce::Create(node.ops(), node.reducer(), layout.trees,
                                  {.chunk_bytes = 64, .tune = false});
  ASSERT_TRUE(ar.ok());
  int calls = 0;
  absl::Status s = (*ar)->AllReduce(
      DataType::kInt32, node.pointers(), 500, false, 1, [&](DataType, void*, size_t, size_t) {
        return ++calls == 3 ? absl::UnavailableError("server gone") : absl::OkStatus();
      });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(node.ops().fence_count(), 0u);
  // Fresh inputs: exact again.
  Node again(layout.gpus, DataType::kInt32, 500, 1, {.deferred = true, .seed = 4});
  auto ar2 = TreeAllReduce::Create(again.ops(), again.reducer(), layout.trees,
                                   {.chunk_bytes = 64, .tune = false});
  ASSERT_TRUE(ar2.ok());
  ASSERT_TRUE((*ar2)->AllReduce(DataType::kInt32, again.pointers(), 500, false).ok());
  for (size_t i = 0; i < 500; ++i) {
    double want = 0;
    for (int h = 0; h < layout.gpus; ++h) want += Input(h, i, 1);
    ASSERT_EQ(GetValue(DataType::kInt32, again.buffer(5), i), want);
  }
}

// The tuner with an injected clock: each all-reduce takes bytes / rate(chunk), where the rate
// rises to a peak at 4 MiB chunks and falls after. The chunk size climbs from 1 MiB and settles
// near the peak; every all-reduce stays exact. With recordings, a call that records reports
// nothing (it takes longer than its chunk size explains), so the same path takes more calls.
TEST(TreeAllReduce, TheChunkSizeIsTunedOnlineTowardTheBestThroughput) {
  const TreeLayout layout = Layouts()[0];
  constexpr size_t kCount = 8 << 20;  // 32 MiB of floats: 4 chunks at 8 MiB.
  for (bool record : {false, true}) {
    SCOPED_TRACE(record ? "recorded" : "enqueued");
    ScalarReducer reducer;
    HostGpuOps ops(4, reducer);
    std::vector<std::vector<float>> data(4, std::vector<float>(kCount, 1.0f));
    std::vector<void*> pointers;
    for (int g = 0; g < 4; ++g) {
      ops.RegisterBuffer(g, data[g].data(), kCount * sizeof(float));
      pointers.push_back(data[g].data());
    }
    TreeAllReduce* executor = nullptr;
    double now = 0;
    int calls = 0;
    auto rate = [](double chunk) {  // bytes/s: peak 10 GB/s at 4 MiB.
      const double x = std::log2(chunk / (4 << 20));
      return 10e9 / (1 + 0.3 * x * x);
    };
    auto ar =
        TreeAllReduce::Create(ops, reducer, layout.trees,
                              {.chunk_bytes = 1 << 20, .tune = true, .record = record, .now = [&] {
                                 if (calls++ % 2 == 1) {  // The end of a call: charge its time.
                                   now += static_cast<double>(kCount * sizeof(float)) /
                                          rate(static_cast<double>(executor->chunk_bytes()));
                                 }
                                 return absl::UnixEpoch() + absl::Seconds(now);
                               }});
    ASSERT_TRUE(ar.ok());
    executor = ar->get();
    const int rounds = record ? 40 : 24;
    for (int i = 0; i < rounds; ++i) {
      ASSERT_TRUE((*ar)->AllReduce(DataType::kFloat32, pointers, kCount, false).ok());
      ASSERT_EQ(data[2][kCount - 1], std::pow(4.0f, static_cast<float>(i + 1)));
    }
    const std::vector<size_t>& path = (*ar)->chunk_trajectory();
    ASSERT_GE(path.size(), 3u);
    EXPECT_EQ(path[0], size_t{1} << 20);
    EXPECT_EQ(path[1], size_t{2} << 20);
    EXPECT_EQ(path[2], size_t{4} << 20);
    EXPECT_GE((*ar)->chunk_bytes(), size_t{3} << 20);
    EXPECT_LE((*ar)->chunk_bytes(), size_t{6} << 20);
  }
}

TEST(TreeAllReduce, BadInputIsAClearError) {
  ScalarReducer reducer;
  HostGpuOps ops(3, reducer);
  auto create = [&](std::vector<GpuTree> trees, TreeAllReduce::Options options = {}) {
    return TreeAllReduce::Create(ops, reducer, std::move(trees), options).status();
  };
  auto message = [&](std::vector<GpuTree> trees) {
    return std::string(create(std::move(trees)).message());
  };
  EXPECT_EQ(create({}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(message({{{-1, 0}}}), "tree 0 names a parent for 2 GPUs; the node has 3");
  EXPECT_EQ(message({{{-1, 0, -1}}}), "tree 0 has two roots (GPUs 0 and 2)");
  EXPECT_EQ(message({{{1, 2, 0}}}), "tree 0 has no root");
  EXPECT_EQ(message({{{-1, 2, 1}}}), "tree 0 does not reach every GPU from its root (a cycle)");
  EXPECT_EQ(message({{{-1, 0, 3}}}), "tree 0 gives GPU 2 the parent 3");
  EXPECT_EQ(message({{{-1, 1, 0}}}), "tree 0 gives GPU 1 the parent 1");
  EXPECT_EQ(message({{{-1, 0, 0}, 1.0}, {{-1, 0, 0}, 0.0}}),
            "tree 1 has weight 0; weights must be positive and finite");
  EXPECT_EQ(create({{{-1, 0, 0}, std::numeric_limits<double>::infinity()}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create({{{-1, 0, 0}}}, {.chunk_bytes = 8}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create({{{-1, 0, 0}}}, {.slots = 0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create({{{-1, 0, 0}}}, {.window = 0}).code(), absl::StatusCode::kInvalidArgument);
  auto ar = TreeAllReduce::Create(ops, reducer, {{{-1, 0, 0}}}, {});
  ASSERT_TRUE(ar.ok());
  std::vector<float> b(4);
  ops.RegisterBuffer(0, b.data(), sizeof(float) * 4);
  std::vector<void*> two{b.data(), b.data()};
  EXPECT_EQ((*ar)->AllReduce(DataType::kFloat32, two, 4, false).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<void*> with_null{b.data(), nullptr, b.data()};
  EXPECT_EQ((*ar)->AllReduce(DataType::kFloat32, with_null, 4, false).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<void*> three{b.data(), b.data(), b.data()};
  EXPECT_EQ((*ar)->AllReduce(static_cast<DataType>(99), three, 4, false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*ar)
                ->AllReduce(DataType::kFloat32, three, 4, true, 0,
                            [](DataType, void*, size_t, size_t) { return absl::OkStatus(); })
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The CPU-assisted executor's orderings hold under any legal order too.
TEST(CpuAssistedAllReduce, ExactInEveryLegalOrder) {
  const std::vector<std::vector<int>> groups{{0, 1}, {2, 3, 4}, {5}};
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    Node node(6, DataType::kInt64, 3001, 1, {.deferred = true, .seed = seed});
    auto ar =
        CpuAssistedAllReduce::Create(node.ops(), node.reducer(), groups, {.chunk_bytes = 800});
    ASSERT_TRUE(ar.ok());
    ASSERT_TRUE((*ar)->AllReduce(DataType::kInt64, node.pointers(), 3001, false).ok());
    for (int g = 0; g < 6; ++g) {
      for (size_t i = 0; i < 3001; ++i) {
        double want = 0;
        for (int h = 0; h < 6; ++h) want += Input(h, i, 1);
        ASSERT_EQ(GetValue(DataType::kInt64, node.buffer(g), i), want)
            << "seed " << seed << " GPU " << g << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace tributary::dataplane
