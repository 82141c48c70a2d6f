// All-gather and reduce-scatter: the ring and halving-doubling schedules (simulated step by
// step), the engine over the in-process transport with several processes per node, in every
// kind of job (ring, halving-doubling, push/pull with spares: the workers run them among
// themselves), and mismatches across ranks.
#include <chrono>
#include <cstdint>
#include <future>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dataplane/collectives/allgather_reduce_scatter_halving_doubling.h"
#include "dataplane/collectives/allgather_reduce_scatter_ring.h"
#include "dataplane/collectives/allreduce_push_pull.h"
#include "dataplane/collectives/collective_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/cluster_harness.h"
#include "tests/util/typed_values.h"

namespace tributary::dataplane {
namespace {

using common::DataType;
using ::testing::AnyOf;
using testing::Await;
using testing::GetValue;
using ::testing::HasSubstr;
using testing::PutValue;

// ---------------------------------------------------------------------------------------------
// Schedules, simulated: all ranks run step k together; a send reads the sender's state after
// step k - 1. The state of a block on a rank is the set of ranks whose contribution it holds
// (a bit mask); all-gather copies it, reduce-scatter adds (the sets must be disjoint: nothing is
// counted twice).

using Schedule = std::vector<ScheduleStep>;

// Each send meets its peer's receive of the same range in the same step.
void ExpectPairing(const std::vector<Schedule>& s, int n, const std::string& what) {
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(s[r].size(), s[0].size()) << what;
    for (size_t k = 0; k < s[r].size(); ++k) {
      const ScheduleStep& a = s[r][k];
      ASSERT_GE(a.send_peer, 0) << what;
      ASSERT_LT(a.send_peer, n) << what;
      const ScheduleStep& b = s[a.send_peer][k];
      EXPECT_EQ(b.recv_peer, r) << what << " rank " << r << " step " << k;
      EXPECT_EQ(b.recv_offset, a.send_offset) << what << " rank " << r << " step " << k;
      EXPECT_EQ(b.recv_count, a.send_count) << what << " rank " << r << " step " << k;
    }
  }
}

// Runs the schedules on block masks; returns state[rank][block].
std::vector<std::vector<uint64_t>> Simulate(const std::vector<Schedule>& s, int n, uint64_t block,
                                            bool reduce, const std::string& what) {
  std::vector<std::vector<uint64_t>> state(n, std::vector<uint64_t>(n, 0));
  for (int r = 0; r < n; ++r) {
    for (int b = 0; b < n; ++b) {
      // All-gather starts with only the own block; reduce-scatter with its own contribution
      // everywhere.
      state[r][b] = (reduce || b == r) ? (uint64_t{1} << r) : 0;
    }
  }
  for (size_t k = 0; k < s[0].size(); ++k) {
    const auto before = state;
    for (int r = 0; r < n; ++r) {
      const ScheduleStep& step = s[r][k];
      const ScheduleStep& from = s[step.recv_peer][k];
      EXPECT_EQ(step.recv_offset % block, 0u) << what;
      EXPECT_EQ(step.recv_count % block, 0u) << what;
      for (uint64_t b = step.recv_offset / block; b < (step.recv_offset + step.recv_count) / block;
           ++b) {
        const uint64_t incoming = before[step.recv_peer][b];
        if (reduce) {
          EXPECT_EQ(step.action, ScheduleStep::Action::kReduce) << what;
          EXPECT_EQ(state[r][b] & incoming, 0u)
              << what << ": rank " << r << " step " << k << " block " << b << " counted twice";
          state[r][b] |= incoming;
        } else {
          EXPECT_EQ(step.action, ScheduleStep::Action::kCopy) << what;
          EXPECT_NE(incoming, 0u) << what << ": rank " << r << " copies an empty block " << b;
          state[r][b] = incoming;
        }
      }
      (void)from;
    }
  }
  return state;
}

void CheckAllGather(const std::vector<Schedule>& s, int n, uint64_t block,
                    const std::string& what) {
  ExpectPairing(s, n, what);
  const auto state = Simulate(s, n, block, /*reduce=*/false, what);
  for (int r = 0; r < n; ++r) {
    for (int b = 0; b < n; ++b) {
      EXPECT_EQ(state[r][b], uint64_t{1} << b) << what << " rank " << r << " block " << b;
    }
  }
}

void CheckReduceScatter(const std::vector<Schedule>& s, int n, uint64_t block,
                        const std::string& what) {
  ExpectPairing(s, n, what);
  const auto state = Simulate(s, n, block, /*reduce=*/true, what);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(state[r][r], (uint64_t{1} << n) - 1) << what << " rank " << r;
  }
}

TEST(GatherScatterScheduleTest, RingForOneToSixRanks) {
  for (int n = 1; n <= 6; ++n) {
    for (uint64_t block : {1, 3, 64}) {
      const std::string what = absl::StrCat("ring n ", n, " block ", block);
      std::vector<Schedule> ag, rs;
      for (int r = 0; r < n; ++r) {
        ag.push_back(RingAllGatherSchedule(block, n, r));
        rs.push_back(RingReduceScatterSchedule(block, n, r));
        EXPECT_EQ(ag.back().size(), static_cast<size_t>(n - 1)) << what;
        EXPECT_EQ(rs.back().size(), static_cast<size_t>(n - 1)) << what;
        // Pipelined: every step after the first forwards what the previous step received.
        for (const Schedule* s : {&ag.back(), &rs.back()}) {
          for (size_t k = 1; k < s->size(); ++k) {
            EXPECT_EQ((*s)[k].send_after, ScheduleStep::SendAfter::kPrevStepSameChunk) << what;
            EXPECT_EQ((*s)[k].send_offset, (*s)[k - 1].recv_offset) << what;
          }
        }
      }
      CheckAllGather(ag, n, block, what);
      CheckReduceScatter(rs, n, block, what);
    }
  }
}

TEST(GatherScatterScheduleTest, HalvingDoublingForPowersOfTwo) {
  for (int n = 1; n <= 6; ++n) {
    EXPECT_EQ(IsPowerOfTwo(n), n == 1 || n == 2 || n == 4) << n;
  }
  for (int n : {1, 2, 4, 8}) {
    for (uint64_t block : {1, 5}) {
      const std::string what = absl::StrCat("halving-doubling n ", n, " block ", block);
      std::vector<Schedule> ag, rs;
      int log2n = 0;
      while ((1 << log2n) < n) ++log2n;
      for (int r = 0; r < n; ++r) {
        ag.push_back(HalvingDoublingAllGatherSchedule(block, n, r));
        rs.push_back(HalvingDoublingReduceScatterSchedule(block, n, r));
        EXPECT_EQ(ag.back().size(), static_cast<size_t>(log2n)) << what;
        EXPECT_EQ(rs.back().size(), static_cast<size_t>(log2n)) << what;
      }
      CheckAllGather(ag, n, block, what);
      CheckReduceScatter(rs, n, block, what);
    }
  }
  EXPECT_TRUE(HalvingDoublingAllGatherSchedule(4, 3, 0).empty());
  EXPECT_TRUE(HalvingDoublingReduceScatterSchedule(4, 6, 1).empty());
}

// ---------------------------------------------------------------------------------------------
// The engine, through DataPlaneNode::Start, n nodes of `procs` processes each.

testing::ClusterOptions Options(int n, uint32_t procs, Algorithm algorithm, int spares = 0) {
  testing::ClusterOptions o;
  o.workers = n;
  o.spare_servers = spares;
  o.procs_per_node = procs;
  o.algorithm = algorithm;
  o.partition_bytes = 16;  // several sub-chunks per block: the pipelined paths run
  o.credit_bytes = 1 << 20;
  return o;
}

// Input of process g at element i of its region (exact in every dtype used here).
double AllGatherInput(uint64_t g, uint64_t i) { return static_cast<double>(g * 100 + i % 89); }

// Runs one all-gather or reduce-scatter on every process of `cluster` and checks every element
// of the result; returns the first error.
absl::Status RunAndCheck(testing::Cluster& cluster, Reduction reduction, DataType t, uint64_t count,
                         const std::string& name, uint64_t iteration = 0) {
  const int n = cluster.workers();
  const uint32_t procs = cluster.view().procs_per_node;
  const uint64_t world = static_cast<uint64_t>(n) * procs;
  const uint64_t region = world * count;
  const size_t es = common::DataTypeSize(t);
  // bufs[node][local]
  std::vector<std::vector<std::vector<std::byte>>> bufs(
      n, std::vector<std::vector<std::byte>>(procs, std::vector<std::byte>(region * es)));
  // Reduce-scatter: process g holds world * (g + i % 5) at element i, so the sum is
  // world * (world(world-1)/2 + world * (i % 5)) and the average world(world-1)/2 + world(i % 5):
  // integers, exact in every dtype.
  const auto rs_input = [&](uint64_t g, uint64_t i) {
    return static_cast<double>(world * (g + i % 5));
  };
  for (int node = 0; node < n; ++node) {
    for (uint32_t l = 0; l < procs; ++l) {
      const uint64_t g = node * procs + l;
      for (uint64_t i = 0; i < region; ++i) {
        double v = rs_input(g, i);
        if (reduction == Reduction::kAllGather) {
          // Only the own block is input; the rest must be overwritten.
          v = i / count == g ? AllGatherInput(g, i) : -1;
        }
        PutValue(t, bufs[node][l].data(), i, v);
      }
    }
  }
  std::vector<std::future<absl::Status>> futures;
  for (int node = 0; node < n; ++node) {
    futures.push_back(
        cluster.Start(node, testing::MakeOp(name, iteration, t, count, reduction, bufs[node])));
  }
  absl::Status first;
  for (int node = 0; node < n; ++node) {
    absl::Status s = Await(futures[node]);
    if (!s.ok() && first.ok()) first = s;
  }
  if (!first.ok()) return first;
  uint64_t wrong = 0;
  for (int node = 0; node < n; ++node) {
    for (uint32_t l = 0; l < procs; ++l) {
      const uint64_t g = node * procs + l;
      const std::byte* b = bufs[node][l].data();
      if (reduction == Reduction::kAllGather) {
        for (uint64_t i = 0; i < region; ++i) {
          if (GetValue(t, b, i) != AllGatherInput(i / count, i)) ++wrong;
        }
      } else {
        for (uint64_t i = g * count; i < (g + 1) * count; ++i) {
          const double sum =
              static_cast<double>(world * (world * (world - 1) / 2 + world * (i % 5)));
          const double want = reduction == Reduction::kReduceScatterSum ? sum : sum / world;
          if (GetValue(t, b, i) != want) ++wrong;
        }
      }
    }
  }
  if (wrong > 0) {
    return absl::InternalError(absl::StrCat(wrong, " wrong elements"));
  }
  return absl::OkStatus();
}

struct EngineCase {
  Algorithm algorithm;
  int spares;
};

class GatherScatterEngineTest : public ::testing::TestWithParam<EngineCase> {};

TEST_P(GatherScatterEngineTest, EveryShapeEveryElement) {
  for (int n = 1; n <= 5; ++n) {
    for (uint32_t procs = 1; procs <= 3; ++procs) {
      testing::Cluster cluster(Options(n, procs, GetParam().algorithm, GetParam().spares));
      uint64_t iteration = 0;
      for (DataType t : {DataType::kFloat32, DataType::kInt32}) {
        for (uint64_t count : {1, 7, 33}) {
          for (Reduction r : {Reduction::kAllGather, Reduction::kReduceScatterSum,
                              Reduction::kReduceScatterAverage}) {
            const std::string what =
                absl::StrCat(std::string(ReductionName(r)), " n ", n, " procs ", procs, " ",
                             std::string(common::DataTypeName(t)), " count ", count);
            absl::Status s = RunAndCheck(cluster, r, t, count, "t", iteration++);
            EXPECT_TRUE(s.ok()) << what << ": " << s;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Jobs, GatherScatterEngineTest,
                         ::testing::Values(EngineCase{Algorithm::kRing, 0},
                                           EngineCase{Algorithm::kHalvingDoubling, 0},
                                           EngineCase{Algorithm::kPushPull, 2},
                                           EngineCase{Algorithm::kAuto, 1}),
                         [](const auto& info) {
                           return absl::StrCat(std::string(AlgorithmName(info.param.algorithm)),
                                               "_spares", info.param.spares);
                         });

TEST(GatherScatterEngineTest, RunsOnTheEngineAmongWorkersInAPushPullJob) {
  testing::Cluster cluster(Options(3, 2, Algorithm::kPushPull, 2));
  uint64_t bytes = 0;
  Operation op;
  op.count = 10;
  op.dtype = DataType::kFloat32;
  op.reduction = Reduction::kAllGather;
  EXPECT_EQ(*cluster.node(0).AlgorithmForOperation("job", op, &bytes), Algorithm::kRing);
  EXPECT_EQ(bytes, 10u * 4 * 6);  // the whole region: 6 processes' blocks
  op.reduction = Reduction::kSum;
  EXPECT_EQ(*cluster.node(0).AlgorithmForOperation("job", op, &bytes), Algorithm::kPushPull);
  EXPECT_EQ(bytes, 10u * 4);
  ASSERT_TRUE(RunAndCheck(cluster, Reduction::kReduceScatterSum, DataType::kFloat32, 10, "p").ok());
  for (int i = 0; i < cluster.workers(); ++i) {
    EXPECT_EQ(cluster.node(i).engine().stats().ops_completed, 1u);
    EXPECT_EQ(cluster.node(i).stats().fallbacks, 0u);
  }
  // Spares take no part.
  for (int i = cluster.workers(); i < cluster.size(); ++i) {
    EXPECT_EQ(cluster.node(i).engine().stats().messages_received, 0u);
  }
}

TEST(GatherScatterEngineTest, RejectsBuffersThatAreNotOnePerProcess) {
  testing::Cluster cluster(Options(2, 2, Algorithm::kRing));
  std::vector<std::vector<std::byte>> bufs(1, std::vector<std::byte>(4 * 4 * 4));
  auto f =
      cluster.Start(0, testing::MakeOp("x", 0, DataType::kFloat32, 4, Reduction::kAllGather, bufs));
  absl::Status s = Await(f);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("1 local buffers for 2 processes per node"));
  testing::Cluster one(Options(2, 1, Algorithm::kRing));
  auto g = one.Start(0, testing::MakeOp("y", 0, DataType::kFloat32, UINT64_MAX / 4,
                                        Reduction::kReduceScatterSum, bufs));
  s = Await(g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("overflow"));
}

// ---------------------------------------------------------------------------------------------
// Mismatches: an error on every rank, never a hang or a wrong result.

// Node `odd` submits `odd_op` (count odd_count), every other node `op` (count): the clock never
// moves, so every rank must fail from the messages alone.
void ExpectAllFail(testing::Cluster& cluster, Reduction op, uint64_t count, int odd,
                   Reduction odd_op, uint64_t odd_count, const std::string& what) {
  const int n = cluster.workers();
  const uint32_t procs = cluster.view().procs_per_node;
  const uint64_t world = static_cast<uint64_t>(n) * procs;
  std::vector<std::vector<std::vector<std::byte>>> bufs(
      n, std::vector<std::vector<std::byte>>(procs, std::vector<std::byte>(world * 16 * 4)));
  std::vector<std::future<absl::Status>> futures;
  for (int node = 0; node < n; ++node) {
    futures.push_back(cluster.Start(
        node, testing::MakeOp("m", 0, DataType::kFloat32, node == odd ? odd_count : count,
                              node == odd ? odd_op : op, bufs[node])));
  }
  for (int node = 0; node < n; ++node) {
    absl::Status s = Await(futures[node]);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what << " node " << node << s;
    EXPECT_THAT(s.message(), HasSubstr("disagree")) << what;
  }
}

TEST(GatherScatterMismatchTest, AllGatherAgainstAllReduceFailsEveryRank) {
  for (Algorithm a : {Algorithm::kRing, Algorithm::kHalvingDoubling}) {
    for (int n : {2, 3, 4}) {
      testing::Cluster cluster(Options(n, 2, a));
      // The all-reduce covers the same bytes as the all-gather's region.
      ExpectAllFail(cluster, Reduction::kAllGather, 4, n - 1, Reduction::kSum, 4 * 2 * n,
                    absl::StrCat(std::string(AlgorithmName(a)), " n ", n));
    }
  }
}

TEST(GatherScatterMismatchTest, DifferentCountsOrOpsFailEveryRank) {
  for (int n : {2, 3, 5}) {
    testing::Cluster cluster(Options(n, 1, Algorithm::kRing));
    ExpectAllFail(cluster, Reduction::kReduceScatterSum, 8, 0, Reduction::kReduceScatterSum, 7,
                  absl::StrCat("counts n ", n));
    testing::Cluster again(Options(n, 1, Algorithm::kRing));
    ExpectAllFail(again, Reduction::kAllGather, 8, n - 1, Reduction::kReduceScatterAverage, 8,
                  absl::StrCat("ops n ", n));
  }
}

// In a push/pull job the all-reduce runs on the servers and the all-gather among the workers:
// nothing carries both, so the operations' deadline fails every one of them.
TEST(GatherScatterMismatchTest, AllGatherAgainstPushPullAllReduceFailsEveryRankByTheDeadline) {
  testing::ClusterOptions o = Options(3, 1, Algorithm::kPushPull, 1);
  o.op_timeout = std::chrono::milliseconds(1000);
  testing::Cluster cluster(o);
  std::vector<std::vector<std::vector<std::byte>>> bufs(
      3, std::vector<std::vector<std::byte>>(1, std::vector<std::byte>(3 * 16 * 4)));
  std::vector<std::future<absl::Status>> futures;
  for (int node = 0; node < 3; ++node) {
    const bool gather = node != 1;
    futures.push_back(cluster.Start(
        node, testing::MakeOp("m", 0, DataType::kFloat32, gather ? 16 : 48,
                              gather ? Reduction::kAllGather : Reduction::kSum, bufs[node])));
  }
  for (auto& f : futures) {
    EXPECT_EQ(f.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  }
  // Past the push/pull worker's own deadline too (op timeout + WorkerGrace): its pushes may not
  // have reached any server before the sweep, and then only that deadline fails it.
  cluster.clock().Advance(std::chrono::milliseconds(1001) + WorkerGrace(o.op_timeout));
  for (int i = 0; i < cluster.size(); ++i) cluster.node(i).ExpireStale();
  for (int node = 0; node < 3; ++node) {
    absl::Status s = Await(futures[node]);
    EXPECT_THAT(s.code(),
                AnyOf(absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kInvalidArgument))
        << "node " << node << s;
  }
}

}  // namespace
}  // namespace tributary::dataplane
