// Operations whose input arrives while they run (StagedInput, dataplane/collectives/operation.h):
// push/pull touches a chunk only once its input is there and reports each chunk's result as
// final once; other algorithms wait for the whole input.
#include <algorithm>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "dataplane/collectives/data_plane_node.h"
#include "dataplane/collectives/operation.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/cluster_harness.h"

namespace tributary::dataplane {
namespace {

using common::DataType;
using testing::Await;
using testing::Cluster;
using testing::ClusterOptions;
using ::testing::HasSubstr;
using testing::MakeOp;

constexpr auto kStagedGuard = std::chrono::seconds(20);
constexpr uint64_t kStagedCount = 10007;  // float32: 40028 bytes, many 1 KiB partitions
constexpr uint64_t kBytes = kStagedCount * sizeof(float);
constexpr float kNotYet = -1e6f;  // what a buffer holds where its input has not arrived

ClusterOptions Options(int n, int k, Algorithm algorithm) {
  ClusterOptions o;
  o.workers = n;
  o.spare_servers = k;
  o.procs_per_node = 2;
  o.job_id = "job-s";
  o.plan_version = 3;
  o.algorithm = algorithm;
  o.partition_bytes = 1024;
  o.credit_bytes = 8192;
  return o;
}

float Input(int global, uint64_t i) { return static_cast<float>((global + 1) * (i % 11 + 1)); }

// One node's staged operation: its buffers' real input, what is in them so far, and the ranges
// the data plane reported final (checked against what was staged when it reported them).
struct StagedNode {
  std::vector<std::vector<float>> input;    // per local process
  std::vector<std::vector<float>> buffers;  // what the data plane sees
  std::shared_ptr<StagedInput> staged = std::make_shared<StagedInput>(kBytes);
  std::mutex mu;
  std::vector<std::pair<uint64_t, uint64_t>> finals;
  int final_beyond_ready = 0;  // a range reported final before its input was there

  StagedNode(int node, uint32_t procs) {
    for (uint32_t p = 0; p < procs; ++p) {
      input.emplace_back(kStagedCount);
      for (uint64_t i = 0; i < kStagedCount; ++i) input.back()[i] = Input(node * procs + p, i);
      buffers.emplace_back(kStagedCount, kNotYet);
    }
    staged->SetFinalSink([this](uint64_t offset, uint64_t bytes) {
      std::lock_guard lock(mu);
      finals.emplace_back(offset, bytes);
      if (offset + bytes > staged->ready()) final_beyond_ready++;
    });
  }
  // Copies the input up to `bytes` into the buffers, then publishes it.
  void StageTo(uint64_t bytes) {
    const uint64_t from = staged->ready() / sizeof(float), to = bytes / sizeof(float);
    for (size_t p = 0; p < input.size(); ++p) {
      std::copy(input[p].begin() + from, input[p].begin() + to, buffers[p].begin() + from);
    }
    staged->Advance(bytes);
  }
  Operation Op(Reduction reduction) {
    Operation op;
    op.tensor_name = "grad";
    op.iteration = 0;
    op.dtype = DataType::kFloat32;
    op.count = kStagedCount;
    op.reduction = reduction;
    for (auto& b : buffers) op.buffers.push_back(reinterpret_cast<std::byte*>(b.data()));
    op.staged = staged;
    return op;
  }
};

// Every element of every buffer of every node against the sum of all processes' inputs.
int64_t CountWrong(const std::vector<std::unique_ptr<StagedNode>>& nodes, int world) {
  int64_t wrong = 0;
  for (const auto& n : nodes) {
    for (const auto& b : n->buffers) {
      for (uint64_t i = 0; i < kStagedCount; ++i) {
        wrong += b[i] != static_cast<float>((i % 11 + 1) * world * (world + 1) / 2);
      }
    }
  }
  return wrong;
}

// Each final range lies within the tensor and no byte is reported twice; returns the bytes.
uint64_t CheckFinals(StagedNode& n) {
  std::lock_guard lock(n.mu);
  std::vector<std::pair<uint64_t, uint64_t>> f = n.finals;
  std::sort(f.begin(), f.end());
  uint64_t covered = 0, end = 0;
  for (const auto& [offset, bytes] : f) {
    EXPECT_GE(offset, end) << "a byte reported final twice";
    EXPECT_LE(offset + bytes, kBytes);
    end = offset + bytes;
    covered += bytes;
  }
  EXPECT_EQ(n.final_beyond_ready, 0);
  return covered;
}

// One staged sum or average per worker node, started at once with `staged` bytes of input there.
struct StagedOps {
  std::vector<std::unique_ptr<StagedNode>> nodes;
  std::vector<std::future<absl::Status>> done;
};
StagedOps StartAll(Cluster& cluster, Reduction reduction, uint64_t staged = 0) {
  StagedOps ops;
  for (int n = 0; n < cluster.workers(); ++n) {
    ops.nodes.push_back(std::make_unique<StagedNode>(n, 2));
    if (staged > 0) ops.nodes[n]->StageTo(staged);
    ops.done.push_back(cluster.Start(n, ops.nodes[n]->Op(reduction)));
  }
  return ops;
}
// Every node stages its input up to `to` bytes and tells its data plane, the last node first.
void StageAll(Cluster& cluster, StagedOps& ops, uint64_t to) {
  for (int n = cluster.workers() - 1; n >= 0; --n) {
    ops.nodes[n]->StageTo(to);
    cluster.node(n).StagedInputAdvanced("job-s", "grad", 0);
  }
}

TEST(StagedInput, AdvanceOnlyGrowsAndStopsAtTheSize) {
  StagedInput s(100);
  EXPECT_EQ(s.ready(), 0u);
  EXPECT_FALSE(s.complete());
  s.Advance(40);
  s.Advance(10);  // never back
  EXPECT_EQ(s.ready(), 40u);
  s.Advance(1000);
  EXPECT_EQ(s.ready(), 100u);
  EXPECT_TRUE(s.complete());
  s.Final(0, 10);  // no sink: nothing happens
}

TEST(StagedPushPull, ChunksLeaveAsTheirInputArrivesAndEveryResultIsReportedOnce) {
  constexpr int kN = 3;
  Cluster cluster(Options(kN, 2, Algorithm::kPushPull));
  StagedOps ops = StartAll(cluster, Reduction::kSum);
  // Nothing staged: nothing can be pushed, nothing completes.
  EXPECT_EQ(cluster.node(0).push_pull().stats().chunks_pushed.load(), 0u);
  EXPECT_GT(cluster.node(0).push_pull().stats().staging_waits.load(), 0u);
  // A third, a half, then everything, in uneven steps; chunks whose input is there go at once.
  for (uint64_t to : {kBytes / 3 / 4 * 4, kBytes / 2 / 4 * 4, kBytes}) {
    StageAll(cluster, ops, to);
    if (to < kBytes) {
      EXPECT_GT(cluster.node(0).push_pull().stats().chunks_pushed.load(), 0u);
      EXPECT_EQ(ops.done[0].wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
    }
  }
  for (auto& f : ops.done) ASSERT_TRUE(Await(f, kStagedGuard).ok());
  EXPECT_EQ(CountWrong(ops.nodes, kN * 2), 0);
  for (auto& n : ops.nodes) EXPECT_EQ(CheckFinals(*n), kBytes);
}

TEST(StagedPushPull, AverageWithInputAlreadyCompleteRunsAtOnce) {
  constexpr int kN = 2;
  Cluster cluster(Options(kN, 1, Algorithm::kPushPull));
  StagedOps ops = StartAll(cluster, Reduction::kAverage, /*staged=*/kBytes);
  for (auto& f : ops.done) ASSERT_TRUE(Await(f, kStagedGuard).ok());
  for (const auto& n : ops.nodes) {
    for (const auto& b : n->buffers) {
      for (uint64_t i = 0; i < kStagedCount; ++i) {
        ASSERT_EQ(b[i], static_cast<float>((i % 11 + 1) * 5 / 2.0)) << i;  // (1+2+3+4)/4
      }
    }
  }
  for (auto& n : ops.nodes) EXPECT_EQ(CheckFinals(*n), kBytes);
}

// Ring reads and writes every chunk in every step: it starts only with the whole input, and
// reports nothing final (the producer copies everything back after done).
TEST(StagedRing, WaitsForTheWholeInput) {
  constexpr int kN = 3;
  Cluster cluster(Options(kN, 0, Algorithm::kRing));
  StagedOps ops = StartAll(cluster, Reduction::kSum);
  StageAll(cluster, ops, kBytes / 2);
  EXPECT_EQ(cluster.node(0).engine().stats().messages_sent.load(), 0u);
  EXPECT_EQ(ops.done[0].wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  StageAll(cluster, ops, kBytes);
  for (auto& f : ops.done) ASSERT_TRUE(Await(f, kStagedGuard).ok());
  EXPECT_EQ(CountWrong(ops.nodes, kN * 2), 0);
  for (auto& n : ops.nodes) EXPECT_EQ(CheckFinals(*n), 0u);
}

TEST(StagedRing, AbortOfAWaitingOperationEndsItWithTheReason) {
  Cluster cluster(Options(2, 0, Algorithm::kRing));
  StagedNode node(0, 2);
  std::future<absl::Status> done = cluster.Start(0, node.Op(Reduction::kSum));
  cluster.node(0).Abort("job-s", "grad", 0, absl::DeadlineExceededError("copy in: stuck GPU"));
  absl::Status s = Await(done, kStagedGuard);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("stuck GPU"));
  // Later advances find nothing to post.
  node.StageTo(kBytes);
  cluster.node(0).StagedInputAdvanced("job-s", "grad", 0);
}

TEST(StagedRing, TheSameIterationWaitingTwiceIsRefused) {
  Cluster cluster(Options(2, 0, Algorithm::kRing));
  StagedNode a(0, 2), b(0, 2);
  std::future<absl::Status> first = cluster.Start(0, a.Op(Reduction::kSum));
  std::future<absl::Status> second = cluster.Start(0, b.Op(Reduction::kSum));
  EXPECT_EQ(Await(second, kStagedGuard).code(), absl::StatusCode::kAlreadyExists);
  cluster.node(0).Abort("job-s", "grad", 0, absl::CancelledError("test over"));
  EXPECT_EQ(Await(first, kStagedGuard).code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace tributary::dataplane
