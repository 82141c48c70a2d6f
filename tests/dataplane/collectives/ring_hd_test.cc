#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "dataplane/collectives/algorithm_selector.h"
#include "dataplane/collectives/allreduce_halving_doubling.h"
#include "dataplane/collectives/allreduce_recursive_doubling.h"
#include "dataplane/collectives/allreduce_ring.h"
#include "dataplane/collectives/collective_engine.h"
#include "dataplane/collectives/data_plane_node.h"
#include "dataplane/reduce/cpu/cpu_reducer.h"
#include "dataplane/transport/inprocess/inprocess_transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/cluster_harness.h"
#include "tests/util/typed_values.h"

namespace tributary::dataplane {
namespace {

using common::DataType;
using ::testing::HasSubstr;

constexpr auto kRingGuard = std::chrono::seconds(20);  // a test-only bound on waiting for futures

using testing::GetValue;
using testing::PutValue;

using testing::Await;

// n ranks (worker nodes "rank-0".. of job "job-r") on one in-process network, each a
// DataPlaneNode; tests post to the engine with the algorithm they choose, or start through the
// node with the job's algorithm.
class Ring : public testing::Cluster {
 public:
  explicit Ring(int n, uint64_t partition_bytes = 16, Algorithm job_algorithm = Algorithm::kRing)
      : Cluster(Options(n, partition_bytes, job_algorithm)) {}

  CollectiveEngine& engine(int i) { return node(i).engine(); }
  int n() const { return workers(); }

 private:
  static testing::ClusterOptions Options(int n, uint64_t partition_bytes, Algorithm algorithm) {
    testing::ClusterOptions o;
    o.workers = n;
    o.job_id = "job-r";
    o.plan_version = 3;
    o.algorithm = algorithm;
    o.partition_bytes = partition_bytes;
    o.address_prefix = "rank-";
    return o;
  }
};

// One rank's operation on one buffer.
Operation MakeRingOp(const std::string& name, uint64_t iteration, DataType t, uint64_t count,
                     Reduction reduction, std::vector<std::byte>& buffer, uint32_t root = 0) {
  Operation op;
  op.tensor_name = name;
  op.iteration = iteration;
  op.dtype = t;
  op.count = count;
  op.reduction = reduction;
  op.root_node = root;
  op.buffers = {buffer.data()};
  return op;
}

// Runs one collective on every rank and counts wrong elements over all ranks.
// value(rank, i) is the input, expect(i) the result.
uint64_t RunAndCount(Ring& ring, Algorithm alg, const std::string& name, uint64_t iteration,
                     DataType t, uint64_t count, Reduction kind, uint32_t root,
                     const std::function<double(int, uint64_t)>& value,
                     const std::function<double(uint64_t)>& expect) {
  const size_t es = common::DataTypeSize(t);
  std::vector<std::vector<std::byte>> bufs(ring.n(), std::vector<std::byte>(count * es));
  for (int r = 0; r < ring.n(); ++r) {
    for (uint64_t i = 0; i < count; ++i) PutValue(t, bufs[r].data(), i, value(r, i));
  }
  std::vector<std::future<absl::Status>> futures;
  for (int r = 0; r < ring.n(); ++r) {
    futures.push_back(
        ring.Post(r, alg, MakeRingOp(name, iteration, t, count, kind, bufs[r], root)));
  }
  uint64_t wrong = 0;
  for (int r = 0; r < ring.n(); ++r) {
    absl::Status s = Await(futures[r]);
    EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s;
    if (!s.ok()) {  // where every rank got stuck
      for (int q = 0; q < ring.n(); ++q) {
        std::cerr << "rank " << q << " sent " << ring.engine(q).stats().messages_sent << " recv "
                  << ring.engine(q).stats().messages_received << " early "
                  << ring.engine(q).stats().early_messages << " malformed "
                  << ring.engine(q).stats().malformed_messages << " active "
                  << ring.engine(q).active_operations() << "\n";
      }
    }
    if (!s.ok()) return count * ring.n();
    for (uint64_t i = 0; i < count; ++i) {
      if (GetValue(t, bufs[r].data(), i) != expect(i)) ++wrong;
    }
  }
  return wrong;
}

// ---------------------------------------------------------------------------------------------
// Schedules

// Every send of every rank meets the matching receive of its peer in the same step, and the
// receives of each rank's all-reduce cover each block as the algorithm says.
void CheckPairing(const std::vector<std::vector<ScheduleStep>>& s, int n) {
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(s[r].size(), s[0].size());
    for (size_t k = 0; k < s[r].size(); ++k) {
      const ScheduleStep& a = s[r][k];
      if (a.send_peer >= 0) {
        const ScheduleStep& b = s[a.send_peer][k];
        EXPECT_EQ(b.recv_peer, r) << "n " << n << " rank " << r << " step " << k;
        EXPECT_EQ(b.recv_offset, a.send_offset);
        EXPECT_EQ(b.recv_count, a.send_count);
      }
      if (a.recv_peer >= 0) {
        EXPECT_EQ(s[a.recv_peer][k].send_peer, r) << "n " << n << " rank " << r << " step " << k;
      }
    }
  }
}

TEST(ScheduleTest, RingHalvingDoublingAndRecursiveDoublingPairUp) {
  for (int n = 1; n <= 12; ++n) {
    for (uint64_t count : {1, 5, 64, 1000}) {
      std::vector<std::vector<ScheduleStep>> ring, hd, rd, bcast, star;
      for (int r = 0; r < n; ++r) {
        ring.push_back(RingAllReduceSchedule(count, n, r));
        hd.push_back(HalvingDoublingSchedule(count, n, r));
        rd.push_back(RecursiveDoublingSchedule(count, n, r));
        bcast.push_back(RingBroadcastSchedule(count, n, r, n / 2));
        star.push_back(StarBroadcastSchedule(count, n, r, n / 2));
      }
      CheckPairing(ring, n);
      CheckPairing(hd, n);
      CheckPairing(rd, n);
      CheckPairing(bcast, n);
      CheckPairing(star, n);
      // The star: every other rank receives the whole buffer once, straight from the root.
      for (int r = 0; r < n; ++r) {
        int received = 0, sent = 0;
        for (const ScheduleStep& step : star[r]) {
          if (step.recv_peer >= 0) {
            EXPECT_EQ(step.recv_peer, n / 2);
            EXPECT_EQ(step.recv_count, count);
            ++received;
          }
          if (step.send_peer >= 0) {
            EXPECT_EQ(step.send_after, ScheduleStep::SendAfter::kStart);
            ++sent;
          }
        }
        EXPECT_EQ(received, r == n / 2 ? 0 : 1) << "n " << n << " rank " << r;
        EXPECT_EQ(sent, r == n / 2 ? n - 1 : 0) << "n " << n << " rank " << r;
      }
      EXPECT_EQ(ring[0].size(), n == 1 ? 0u : 2u * (n - 1));
      int levels = 0;
      while ((2 << levels) <= n) ++levels;
      EXPECT_EQ(hd[0].size(), n == 1 ? 0u : 2u * levels + 2);
      EXPECT_EQ(rd[0].size(), n == 1 ? 0u : levels + 2u);
      // Recursive doubling moves the whole tensor in every message, and a rank that folds into
      // its partner has nothing to do between the fold and the hand-back.
      for (int r = 0; r < n; ++r) {
        int active = 0;
        for (const ScheduleStep& step : rd[r]) {
          if (step.send_peer >= 0) {
            EXPECT_EQ(step.send_count, count);
          }
          if (step.recv_peer >= 0) {
            EXPECT_EQ(step.recv_count, count);
          }
          active += step.send_peer >= 0 || step.recv_peer >= 0;
        }
        const int extra = n - (1 << levels);
        const int expected = n == 1 ? 0 : r < 2 * extra ? (r % 2 == 0 ? 2 : levels + 2) : levels;
        EXPECT_EQ(active, expected) << "n " << n << " rank " << r;
      }
    }
  }
}

TEST(ScheduleTest, BlocksAreNearEqualAndCoverTheTensor) {
  for (uint64_t count : {1, 3, 7, 100}) {
    for (uint64_t n : {1, 3, 8}) {
      uint64_t next = 0;
      for (uint64_t b = 0; b < n; ++b) {
        const BlockRange r = GetBlock(count, n, b);
        EXPECT_EQ(r.offset, next);
        EXPECT_LE(r.count, count / n + 1);
        EXPECT_GE(r.count, count / n);
        next += r.count;
      }
      EXPECT_EQ(next, count);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// All-reduce

class AllReduceTest : public ::testing::TestWithParam<std::tuple<Algorithm, int>> {};

TEST_P(AllReduceTest, SumEveryDtypeAndSizeIsExactOnEveryRank) {
  const auto [alg, n] = GetParam();
  Ring ring(n, /*partition_bytes=*/16);  // 4 float32 per message: many sub-chunks
  uint64_t iteration = 0;
  for (DataType t : common::kAllDataTypes) {
    for (uint64_t count : {1, 2, 7, 13, 97, 1031}) {
      const uint64_t wrong = RunAndCount(
          ring, alg, "grad", iteration++, t, count, Reduction::kSum, 0,
          [](int r, uint64_t i) { return (r + 1) + static_cast<double>(i % 7); },
          [n](uint64_t i) { return n * (n + 1) / 2.0 + n * static_cast<double>(i % 7); });
      EXPECT_EQ(wrong, 0u) << AlgorithmName(alg) << " n " << n << " " << common::DataTypeName(t)
                           << " count " << count;
    }
  }
  for (int r = 0; r < n; ++r) EXPECT_EQ(ring.engine(r).stats().malformed_messages, 0u);
  EXPECT_EQ(ring.engine(0).active_operations(), 0u);
}

TEST_P(AllReduceTest, AverageEveryDtype) {
  const auto [alg, n] = GetParam();
  Ring ring(n, /*partition_bytes=*/64);
  uint64_t iteration = 0;
  for (DataType t : common::kAllDataTypes) {
    for (uint64_t count : {1, 31, 300}) {
      const uint64_t wrong = RunAndCount(
          ring, alg, "avg", iteration++, t, count, Reduction::kAverage, 0,
          [](int r, uint64_t i) { return static_cast<double>(i % 5) + 2 * r; },
          [n](uint64_t i) { return static_cast<double>(i % 5) + (n - 1); });
      EXPECT_EQ(wrong, 0u) << AlgorithmName(alg) << " n " << n << " " << common::DataTypeName(t)
                           << " count " << count;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllReduceTest,
                         ::testing::Combine(::testing::Values(Algorithm::kRing,
                                                              Algorithm::kHalvingDoubling,
                                                              Algorithm::kRecursiveDoubling),
                                            ::testing::Values(1, 2, 3, 4, 5, 7, 8)),
                         [](const auto& info) {
                           return absl::StrCat(std::string(AlgorithmName(std::get<0>(info.param))),
                                               "_n", std::get<1>(info.param));
                         });

TEST(AllReduceTest, LargePartitionsAndSingleMessageSteps) {
  Ring ring(4, /*partition_bytes=*/4 << 20);
  for (Algorithm alg :
       {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kRecursiveDoubling}) {
    const uint64_t wrong = RunAndCount(
        ring, alg, "big", static_cast<uint64_t>(alg), DataType::kFloat32, 100000, Reduction::kSum,
        0, [](int r, uint64_t i) { return r + static_cast<double>(i % 100); },
        [](uint64_t i) { return 6 + 4 * static_cast<double>(i % 100); });
    EXPECT_EQ(wrong, 0u) << AlgorithmName(alg);
  }
}

// ---------------------------------------------------------------------------------------------
// Broadcast

TEST(BroadcastTest, FromSeveralRootsEveryDtype) {
  for (int n : {1, 2, 3, 5, 8}) {
    Ring ring(n, /*partition_bytes=*/32);
    uint64_t iteration = 0;
    for (uint32_t root : {0, n / 2, n - 1}) {
      for (DataType t : common::kAllDataTypes) {
        for (uint64_t count : {1, 13, 1031}) {
          const uint64_t wrong = RunAndCount(
              ring, Algorithm::kRing, "weights", iteration++, t, count, Reduction::kBroadcast, root,
              [root](int r, uint64_t i) {
                return r == static_cast<int>(root) ? 1 + static_cast<double>(i % 200) : 0;
              },
              [](uint64_t i) { return 1 + static_cast<double>(i % 200); });
          EXPECT_EQ(wrong, 0u) << "n " << n << " root " << root << " " << common::DataTypeName(t)
                               << " count " << count;
        }
      }
    }
  }
}

// The agent's control broadcasts (Operation::control) go straight from the root to every rank:
// nobody forwards, and the root completes before the others have posted (its messages wait in
// their early buffers).
TEST(BroadcastTest, ControlBroadcastGoesStraightFromTheRootToEveryRank) {
  for (int n : {2, 3, 5, 8}) {
    Ring ring(n, /*partition_bytes=*/64);
    const uint32_t root = static_cast<uint32_t>(n / 2);
    const uint64_t count = 100;  // 400 bytes: 7 messages per receiver
    std::vector<std::vector<std::byte>> bufs(n, std::vector<std::byte>(count * 4));
    for (uint64_t i = 0; i < count; ++i) {
      PutValue(DataType::kInt32, bufs[root].data(), i, 3 + static_cast<double>(i));
    }
    const auto control_op = [&](int r) {
      Operation op =
          MakeRingOp("decisions", 0, DataType::kInt32, count, Reduction::kBroadcast, bufs[r], root);
      op.control = true;
      return op;
    };
    // The root alone first: its sends need no receiver to have posted.
    std::future<absl::Status> at_root =
        ring.Post(static_cast<int>(root), Algorithm::kRing, control_op(root));
    EXPECT_TRUE(Await(at_root).ok());
    for (int r = 0; r < n; ++r) {
      if (r == static_cast<int>(root)) continue;
      std::future<absl::Status> at_rank = ring.Post(r, Algorithm::kRing, control_op(r));
      absl::Status s = Await(at_rank);
      ASSERT_TRUE(s.ok()) << "n " << n << " rank " << r << ": " << s;
      for (uint64_t i = 0; i < count; ++i) {
        ASSERT_EQ(GetValue(DataType::kInt32, bufs[r].data(), i), 3 + static_cast<double>(i))
            << "n " << n << " rank " << r << " element " << i;
      }
      EXPECT_EQ(ring.engine(r).stats().messages_sent, 0u) << "n " << n << " rank " << r;
      EXPECT_EQ(ring.engine(r).stats().messages_received, 7u) << "n " << n << " rank " << r;
    }
    EXPECT_EQ(ring.engine(static_cast<int>(root)).stats().messages_sent, 7u * (n - 1));
  }
}

TEST(BroadcastTest, HalvingDoublingDeclinesAndFallsBackToRing) {
  Ring ring(4, /*partition_bytes=*/16, Algorithm::kHalvingDoubling);
  Operation op;
  op.reduction = Reduction::kBroadcast;
  EXPECT_EQ(ring.engine(0).CanServe(Algorithm::kHalvingDoubling, op).code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(ring.engine(0).CanServe(Algorithm::kPushPull, op).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ring.node(0).push_pull().CanServe(Algorithm::kRing, op).code(),
            absl::StatusCode::kFailedPrecondition);
  // Posted to the engine as halving-doubling, it is refused; started through the node, the
  // selector falls back to ring.
  std::vector<std::byte> unused(4 * 50);
  auto refused =
      ring.Post(0, Algorithm::kHalvingDoubling,
                MakeRingOp("b", 0, DataType::kInt32, 50, Reduction::kBroadcast, unused, 2));
  EXPECT_EQ(Await(refused).code(), absl::StatusCode::kUnimplemented);
  std::vector<std::vector<std::byte>> bufs(4, std::vector<std::byte>(4 * 50));
  for (uint64_t i = 0; i < 50; ++i) PutValue(DataType::kInt32, bufs[2].data(), i, i);
  std::vector<std::future<absl::Status>> futures;
  for (int r = 0; r < 4; ++r) {
    futures.push_back(
        ring.Start(r, MakeRingOp("b", 0, DataType::kInt32, 50, Reduction::kBroadcast, bufs[r], 2)));
  }
  for (auto& f : futures) ASSERT_TRUE(Await(f).ok());
  for (int r = 0; r < 4; ++r) {
    for (uint64_t i = 0; i < 50; ++i) EXPECT_EQ(GetValue(DataType::kInt32, bufs[r].data(), i), i);
    EXPECT_EQ(ring.node(r).stats().fallbacks, 1u);
  }
}

// A job that chose recursive doubling runs its other collectives as ring: the engine declines
// them, the node falls back.
TEST(BroadcastTest, RecursiveDoublingDeclinesAllButAllReduceAndFallsBackToRing) {
  Ring ring(3, /*partition_bytes=*/16, Algorithm::kRecursiveDoubling);
  for (Reduction kind :
       {Reduction::kBroadcast, Reduction::kAllGather, Reduction::kReduceScatterSum}) {
    Operation op;
    op.reduction = kind;
    const absl::Status s = ring.engine(0).CanServe(Algorithm::kRecursiveDoubling, op);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << ReductionName(kind);
    EXPECT_THAT(s.message(), HasSubstr("all-reduce only"));
  }
  Operation sum;
  sum.reduction = Reduction::kAverage;
  EXPECT_TRUE(ring.engine(0).CanServe(Algorithm::kRecursiveDoubling, sum).ok());
  std::vector<std::vector<std::byte>> bufs(3, std::vector<std::byte>(4 * 50));
  for (uint64_t i = 0; i < 50; ++i) PutValue(DataType::kInt32, bufs[1].data(), i, 7 * i);
  std::vector<std::future<absl::Status>> futures;
  for (int r = 0; r < 3; ++r) {
    futures.push_back(
        ring.Start(r, MakeRingOp("b", 0, DataType::kInt32, 50, Reduction::kBroadcast, bufs[r], 1)));
  }
  for (auto& f : futures) ASSERT_TRUE(Await(f).ok());
  for (int r = 0; r < 3; ++r) {
    for (uint64_t i = 0; i < 50; ++i) {
      EXPECT_EQ(GetValue(DataType::kInt32, bufs[r].data(), i), 7 * i);
    }
    EXPECT_EQ(ring.node(r).stats().fallbacks, 1u);
  }
  // The job's all-reduce runs recursive doubling (no fallback).
  EXPECT_EQ(RunAndCount(
                ring, Algorithm::kRecursiveDoubling, "s", 1, DataType::kInt32, 50, Reduction::kSum,
                0, [](int r, uint64_t i) { return r + static_cast<double>(i); },
                [](uint64_t i) { return 3 + 3 * static_cast<double>(i); }),
            0u);
}

// ---------------------------------------------------------------------------------------------
// Failures

class MismatchTest : public ::testing::TestWithParam<Algorithm> {};

// The clock never moves and ExpireStale never runs: every rank must fail from the messages alone.
TEST_P(MismatchTest, CountMismatchFailsEveryRankWithoutADeadline) {
  for (int n : {2, 3, 4, 5}) {
    Ring ring(n);
    std::vector<std::vector<std::byte>> bufs(n, std::vector<std::byte>(64 * 4));
    std::vector<std::future<absl::Status>> futures;
    for (int r = 0; r < n; ++r) {
      const uint64_t count = r == n - 1 ? 63 : 64;
      futures.push_back(ring.Post(
          r, GetParam(), MakeRingOp("g", 0, DataType::kFloat32, count, Reduction::kSum, bufs[r])));
    }
    for (int r = 0; r < n; ++r) {
      absl::Status s = Await(futures[r]);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "n " << n << " rank " << r << s;
      EXPECT_THAT(s.message(), HasSubstr("disagree"));
    }
  }
}

TEST_P(MismatchTest, DtypeMismatchFailsEveryRank) {
  const int n = 4;
  Ring ring(n);
  std::vector<std::vector<std::byte>> bufs(n, std::vector<std::byte>(64 * 8));
  std::vector<std::future<absl::Status>> futures;
  for (int r = 0; r < n; ++r) {
    const DataType t = r == 1 ? DataType::kFloat64 : DataType::kFloat32;
    futures.push_back(
        ring.Post(r, GetParam(), MakeRingOp("g", 0, t, 64, Reduction::kSum, bufs[r])));
  }
  for (int r = 0; r < n; ++r) {
    absl::Status s = Await(futures[r]);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "rank " << r << s;
    EXPECT_THAT(s.message(), HasSubstr("float64"));
  }
}

TEST_P(MismatchTest, SumAgainstAverageFailsEveryRank) {
  // One rank asks for the average, the others for the sum: the reduction travels in every
  // message, so nobody ends up with a result the others did not compute.
  const int n = 4;
  Ring ring(n);
  std::vector<std::vector<std::byte>> bufs(n, std::vector<std::byte>(64 * 4));
  std::vector<std::future<absl::Status>> futures;
  for (int r = 0; r < n; ++r) {
    const Reduction reduction = r == 2 ? Reduction::kAverage : Reduction::kSum;
    futures.push_back(
        ring.Post(r, GetParam(), MakeRingOp("g", 0, DataType::kFloat32, 64, reduction, bufs[r])));
  }
  for (int r = 0; r < n; ++r) {
    absl::Status s = Await(futures[r]);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "rank " << r << s;
    EXPECT_THAT(s.message(), HasSubstr("disagree"));
    EXPECT_THAT(s.message(), HasSubstr("average"));
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, MismatchTest,
                         ::testing::Values(Algorithm::kRing, Algorithm::kHalvingDoubling,
                                           Algorithm::kRecursiveDoubling),
                         [](const auto& info) { return std::string(AlgorithmName(info.param)); });

TEST(DeadlineTest, MissingRankTurnsIntoDeadlineExceededNamingStepAndPeer) {
  const int n = 4;
  Ring ring(n);
  std::vector<std::vector<std::byte>> bufs(n, std::vector<std::byte>(40 * 4));
  std::vector<std::future<absl::Status>> futures;
  for (int r = 0; r < n - 1; ++r) {  // rank 3 never starts
    futures.push_back(ring.Post(
        r, Algorithm::kRing, MakeRingOp("g", 0, DataType::kFloat32, 40, Reduction::kSum, bufs[r])));
  }
  ring.engine(0).ExpireStale();  // not yet due
  for (auto& f : futures) {
    EXPECT_EQ(f.wait_for(std::chrono::milliseconds(20)), std::future_status::timeout);
  }
  ring.clock().Advance(ring.view().op_timeout + std::chrono::milliseconds(1));
  ring.engine(0).ExpireStale();
  absl::Status s0 = Await(futures[0]);
  EXPECT_EQ(s0.code(), absl::StatusCode::kDeadlineExceeded) << s0;
  // Rank 0 receives from rank 3 in every step of the ring.
  EXPECT_THAT(s0.message(), HasSubstr("step 1/6"));
  EXPECT_THAT(s0.message(), HasSubstr("waiting for rank 3 (rank-3)"));
  for (int r = 1; r < n - 1; ++r) {
    ring.engine(r).ExpireStale();
    absl::Status s = Await(futures[r]);
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << "rank " << r << s;
  }
}

// ---------------------------------------------------------------------------------------------
// Abort: the fake clock never moves and ExpireStale never runs, so no deadline can be what fails
// the other ranks; only the abort messages can.

class AbortTest : public ::testing::TestWithParam<Algorithm> {};

TEST_P(AbortTest, ARankThatAbortsFailsEveryOtherRankAtOnce) {
  const int n = 4;
  Ring ring(n, /*partition_bytes=*/16, GetParam());
  const common::Clock::TimePoint t0 = ring.clock().Now();
  std::vector<std::vector<std::byte>> bufs(n, std::vector<std::byte>(64 * 4));
  std::vector<std::future<absl::Status>> futures;
  for (int r = 0; r < n - 1; ++r) {  // rank 3 aborts instead of taking part
    futures.push_back(
        ring.Start(r, MakeRingOp("g", 7, DataType::kFloat32, 64, Reduction::kSum, bufs[r])));
  }
  ring.node(3).Abort("job-r", "g", 7, absl::UnavailableError("local process 1 died"));
  for (int r = 0; r < n - 1; ++r) {
    absl::Status s = Await(futures[r]);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << "rank " << r << ": " << s;
    EXPECT_EQ(s.message(),
              "rank 3 aborted tensor 'g' iteration 7 (job job-r): local process 1 died");
  }
  // Rank 3 itself fails the operation at once if it starts it after all.
  auto late = ring.Start(3, MakeRingOp("g", 7, DataType::kFloat32, 64, Reduction::kSum, bufs[3]));
  ASSERT_EQ(late.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ(late.get().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ring.clock().Now(), t0);
  for (int r = 0; r < n; ++r) EXPECT_EQ(ring.engine(r).active_operations(), 0u) << r;
}

TEST_P(AbortTest, AnAbortThatArrivesBeforeTheOperationFailsItWhenItStarts) {
  const int n = 4;
  Ring ring(n, /*partition_bytes=*/16, GetParam());
  const common::Clock::TimePoint t0 = ring.clock().Now();
  // Deterministically first: rank 0's abort, as it arrives at rank 1, before rank 1 starts.
  WireHeader h;
  h.kind = static_cast<uint8_t>(MessageKind::kAbort);
  // An auto job's tensor runs with a concrete algorithm: the one the header names.
  h.algorithm = static_cast<uint8_t>(GetParam() == Algorithm::kAuto ? Algorithm::kRecursiveDoubling
                                                                    : GetParam());
  h.job = common::StableHash64("job-r");
  h.tensor = common::StableHash64("g");
  h.iteration = 2;
  h.world_size = n;
  h.sender = 0;
  h.error_code = static_cast<uint32_t>(absl::StatusCode::kCancelled);
  const std::string reason = "rank 0 aborted tensor 'g' iteration 2 (job job-r): client left";
  const std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(reason.data()),
                                           reason.size());
  absl::StatusOr<WireHeader> parsed = ParseHeader(AsBytes(h), payload.size());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ring.engine(1).HandleMessage(*parsed, payload);
  std::vector<std::byte> buf(64 * 4);
  auto f = ring.Start(1, MakeRingOp("g", 2, DataType::kFloat32, 64, Reduction::kSum, buf));
  ASSERT_EQ(f.wait_for(std::chrono::seconds(0)), std::future_status::ready);  // no message needed
  absl::Status s = f.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_EQ(s.message(), reason);

  // The same end to end: rank 0 aborts before any rank starts; whenever the abort reaches each
  // other rank (before or after its start), its operation fails with the reason.
  ring.node(0).Abort("job-r", "h", 3, absl::CancelledError("client left"));
  std::vector<std::vector<std::byte>> bufs(n, std::vector<std::byte>(64 * 4));
  std::vector<std::future<absl::Status>> futures;
  for (int r = 1; r < n; ++r) {
    futures.push_back(
        ring.Start(r, MakeRingOp("h", 3, DataType::kFloat32, 64, Reduction::kSum, bufs[r])));
  }
  for (auto& x : futures) {
    absl::Status st = Await(x);
    EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
    EXPECT_EQ(st.message(), "rank 0 aborted tensor 'h' iteration 3 (job job-r): client left");
  }
  EXPECT_EQ(ring.clock().Now(), t0);
}

// A failed collective is remembered for kTombstoneTtl from the last time it was failed, then
// forgotten: the same (tensor, iteration) runs again. Setting it again restarts its time (the
// expiry queue holds an entry per setting; the first one's must not remove the second).
TEST(TombstoneTest, AFailureIsRememberedForItsTtlFromItsLastSetting) {
  Ring ring(1);
  const auto ttl = CollectiveEngine::kTombstoneTtl;
  std::vector<std::byte> buf(8 * 4);
  const auto start = [&] {
    for (uint64_t i = 0; i < 8; ++i) PutValue(DataType::kInt32, buf.data(), i, 3 + i);
    return ring.Start(0, MakeRingOp("g", 2, DataType::kInt32, 8, Reduction::kSum, buf));
  };
  ring.node(0).Abort("job-r", "g", 2, absl::CancelledError("first"));
  ring.clock().Advance(ttl / 2);
  ring.node(0).Abort("job-r", "g", 2, absl::CancelledError("second"));
  ring.clock().Advance(ttl / 2 + std::chrono::milliseconds(1));  // the first setting expired
  ring.engine(0).ExpireStale();
  auto failed = start();
  ASSERT_EQ(failed.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  absl::Status s = failed.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_THAT(s.message(), HasSubstr("second"));
  ring.clock().Advance(ttl / 2);  // the second expired too
  ring.engine(0).ExpireStale();
  auto again = start();
  absl::Status ok = Await(again);
  EXPECT_TRUE(ok.ok()) << ok;
  for (uint64_t i = 0; i < 8; ++i) EXPECT_EQ(GetValue(DataType::kInt32, buf.data(), i), 3 + i);
}

// kAuto: the 256-byte tensors of these tests go to recursive doubling by size at n = 4 (and the
// abort goes to the push/pull home server as well).
INSTANTIATE_TEST_SUITE_P(Algorithms, AbortTest,
                         ::testing::Values(Algorithm::kRing, Algorithm::kHalvingDoubling,
                                           Algorithm::kRecursiveDoubling, Algorithm::kAuto),
                         [](const auto& info) { return std::string(AlgorithmName(info.param)); });

TEST(MalformedTest, BadMessagesAreDroppedAndCounted) {
  Ring ring(2);
  const std::string addr = ring.view().worker_addresses[1];
  WireHeader h;
  h.kind = static_cast<uint8_t>(MessageKind::kData);
  h.algorithm = static_cast<uint8_t>(Algorithm::kRing);
  // Truncated header, bad dtype, payload of the wrong size, a push/pull kind sent as ring.
  ring.network().Inject(addr, AsBytes(h).first(10), {});
  h.dtype = 99;
  h.world_size = 2;
  ring.network().Inject(addr, AsBytes(h), {});
  h.dtype = static_cast<uint8_t>(DataType::kFloat32);
  h.reduce = static_cast<uint8_t>(Reduction::kSum);
  h.tensor_count = 8;
  h.num_chunks = 1;
  h.chunk_count = 4;
  std::vector<std::byte> three_floats(12);
  ring.network().Inject(addr, AsBytes(h), three_floats);
  WireHeader push = h;
  push.kind = static_cast<uint8_t>(MessageKind::kPush);
  std::vector<std::byte> four_floats(16);
  EXPECT_THAT(ParseHeader(AsBytes(push), four_floats.size()).status().message(),
              HasSubstr("does not belong to ring"));
  ring.network().Inject(addr, AsBytes(push), four_floats);
  // A collective still works afterwards.
  const uint64_t wrong = RunAndCount(
      ring, Algorithm::kRing, "after", 0, DataType::kInt64, 9, Reduction::kSum, 0,
      [](int r, uint64_t i) { return r + static_cast<double>(i); },
      [](uint64_t i) { return 1 + 2 * static_cast<double>(i); });
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(ring.node(1).stats().malformed_messages, 4u);
  EXPECT_EQ(ring.node(1).malformed_messages(), 4u);
  EXPECT_EQ(ring.engine(1).stats().malformed_messages, 0u);
}

// ---------------------------------------------------------------------------------------------
// Ordering

TEST(EarlyMessagesTest, ARankThatStartsFirstIsBufferedUntilThePeerStarts) {
  for (Algorithm alg :
       {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kRecursiveDoubling}) {
    const int n = 4;
    Ring ring(n);
    const uint64_t count = 100;
    std::vector<std::vector<std::byte>> bufs(n, std::vector<std::byte>(count * 4));
    for (int r = 0; r < n; ++r) {
      for (uint64_t i = 0; i < count; ++i) PutValue(DataType::kInt32, bufs[r].data(), i, r + 1);
    }
    std::vector<std::future<absl::Status>> futures;
    futures.push_back(
        ring.Post(0, alg, MakeRingOp("e", 5, DataType::kInt32, count, Reduction::kSum, bufs[0])));
    // Rank 0's first step reaches rank 1 (ring, recursive doubling) or rank 2 (halving-doubling)
    // before it starts.
    const int first_peer = alg == Algorithm::kHalvingDoubling ? 2 : 1;
    const auto until = std::chrono::steady_clock::now() + kRingGuard;
    while (ring.engine(first_peer).stats().early_messages == 0 &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_GT(ring.engine(first_peer).stats().early_messages, 0u);
    for (int r = n - 1; r >= 1; --r) {
      futures.push_back(
          ring.Post(r, alg, MakeRingOp("e", 5, DataType::kInt32, count, Reduction::kSum, bufs[r])));
    }
    for (auto& f : futures) EXPECT_TRUE(Await(f).ok());
    for (int r = 0; r < n; ++r) {
      for (uint64_t i = 0; i < count; ++i) {
        ASSERT_EQ(GetValue(DataType::kInt32, bufs[r].data(), i), 10) << AlgorithmName(alg);
      }
    }
  }
}

// Two ranks running a ring job with a 300 s op timeout (long past the tests' fake-clock steps).
testing::ClusterOptions TwoRanks(const std::string& job_id, uint64_t plan_version = 1) {
  testing::ClusterOptions o;
  o.workers = 2;
  o.job_id = job_id;
  o.plan_version = plan_version;
  o.algorithm = Algorithm::kRing;
  o.op_timeout = std::chrono::seconds(300);
  return o;
}

// Rank r's int32 input r + 1 at every element.
void FillRanks(std::vector<std::vector<std::byte>>& bufs, uint64_t count) {
  for (size_t r = 0; r < bufs.size(); ++r) {
    for (uint64_t i = 0; i < count; ++i) PutValue(DataType::kInt32, bufs[r].data(), i, r + 1);
  }
}

// Every element of every rank's buffer is `sum`.
void ExpectSums(const std::vector<std::vector<std::byte>>& bufs, uint64_t count, double sum) {
  for (size_t r = 0; r < bufs.size(); ++r) {
    for (uint64_t i = 0; i < count; ++i) {
      ASSERT_EQ(GetValue(DataType::kInt32, bufs[r].data(), i), sum) << "rank " << r << " at " << i;
    }
  }
}

// Early messages are kept for the job's op timeout when it is longer than kTombstoneTtl: ranks
// may start one collective minutes apart. BERT-large's fused collectives on a 4-rank ring at
// 125 Mbit/s started up to 80 s apart (op timeout 300 s); the first step, dropped after 60 s,
// left its receiver waiting until the op timeout and the whole ring with it (session 41). Past
// the op timeout they are dropped (the memory stays bounded) with a warning.
TEST(EarlyMessagesTest, AreKeptForTheJobsOpTimeout) {
  testing::ClusterOptions o = TwoRanks("job-e", 3);
  o.partition_bytes = 16;
  testing::Cluster cluster(o);
  const uint64_t count = 100;
  std::vector<std::vector<std::byte>> bufs(2, std::vector<std::byte>(count * 4));
  FillRanks(bufs, count);
  const auto early_at_rank_1 = [&] {
    const auto until = std::chrono::steady_clock::now() + kRingGuard;
    while (cluster.node(1).engine().stats().early_messages == 0 &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return cluster.node(1).engine().stats().early_messages.load();
  };
  auto first =
      cluster.Post(0, Algorithm::kRing,
                   MakeRingOp("late", 1, DataType::kInt32, count, Reduction::kSum, bufs[0]));
  ASSERT_GT(early_at_rank_1(), 0u);
  // Rank 1 starts 90 s later: past kTombstoneTtl, within the op timeout.
  cluster.clock().Advance(CollectiveEngine::kTombstoneTtl + std::chrono::seconds(30));
  cluster.node(1).engine().ExpireStale();
  EXPECT_EQ(cluster.node(1).engine().stats().early_dropped, 0u);
  auto second =
      cluster.Post(1, Algorithm::kRing,
                   MakeRingOp("late", 1, DataType::kInt32, count, Reduction::kSum, bufs[1]));
  EXPECT_TRUE(Await(first).ok());
  EXPECT_TRUE(Await(second).ok());
  ExpectSums(bufs, count, 3);

  // Past the op timeout an early message goes.
  const uint64_t before = cluster.node(1).engine().stats().early_messages.load();
  auto lone =
      cluster.Post(0, Algorithm::kRing,
                   MakeRingOp("alone", 1, DataType::kInt32, count, Reduction::kSum, bufs[0]));
  const auto until = std::chrono::steady_clock::now() + kRingGuard;
  while (cluster.node(1).engine().stats().early_messages == before &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  cluster.clock().Advance(o.op_timeout + std::chrono::milliseconds(1));
  cluster.node(1).engine().ExpireStale();
  EXPECT_GT(cluster.node(1).engine().stats().early_dropped, 0u);
  cluster.node(0).engine().ExpireStale();  // rank 0's own operation times out
  EXPECT_EQ(Await(lone).code(), absl::StatusCode::kDeadlineExceeded);
}

// The early messages of a collective that failed go when the failure arrives, not at their
// expiry (an op timeout later): they can no longer be used and would hold the shared limit.
TEST(EarlyMessagesTest, ThoseOfAFailedCollectiveGoWithTheFailure) {
  Ring ring(2);
  const uint64_t count = 100;
  std::vector<std::byte> buf(count * 4);
  auto first = ring.Post(0, Algorithm::kRing,
                         MakeRingOp("doomed", 2, DataType::kInt32, count, Reduction::kSum, buf));
  const auto until = std::chrono::steady_clock::now() + kRingGuard;
  while (ring.engine(1).stats().early_messages == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GT(ring.engine(1).stats().early_messages, 0u);
  EXPECT_EQ(ring.engine(1).stats().early_dropped, 0u);
  ring.node(0).Abort("job-r", "doomed", 2, absl::CancelledError("client left"));
  EXPECT_EQ(Await(first).code(), absl::StatusCode::kCancelled);
  const auto dropped_by = std::chrono::steady_clock::now() + kRingGuard;
  while (ring.engine(1).stats().early_dropped == 0 &&
         std::chrono::steady_clock::now() < dropped_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(ring.engine(1).stats().early_dropped, ring.engine(1).stats().early_messages);
}

// A message of a collective not started yet that would pass the early-message limit fails the
// collective at once for every rank, with the limit named: the collective cannot complete
// without it (the message was dropped and its ranks waited out their op timeouts). The next
// collective is exact.
TEST(EarlyMessagesTest, OneOverTheLimitFailsItsCollectiveForEveryRank) {
  const testing::ClusterOptions o = TwoRanks("job-l");
  testing::Cluster cluster(o);
  cluster.node(1).engine().SetEarlyMessageLimit(1024);
  const uint64_t count = 1000;  // int32: a 2,000-byte step each way
  std::vector<std::vector<std::byte>> bufs(2, std::vector<std::byte>(count * 4));
  FillRanks(bufs, count);
  auto first = cluster.Post(
      0, Algorithm::kRing, MakeRingOp("big", 1, DataType::kInt32, count, Reduction::kSum, bufs[0]));
  const absl::Status at_0 = Await(first);
  EXPECT_EQ(at_0.code(), absl::StatusCode::kResourceExhausted) << at_0;
  EXPECT_THAT(at_0.message(), HasSubstr("--early-message-mib"));
  EXPECT_EQ(cluster.node(1).engine().stats().early_messages, 0u);
  EXPECT_EQ(cluster.node(1).engine().stats().early_dropped, 1u);
  // Rank 1 starts it later: it fails at once with the same reason.
  auto second = cluster.Post(
      1, Algorithm::kRing, MakeRingOp("big", 1, DataType::kInt32, count, Reduction::kSum, bufs[1]));
  const absl::Status at_1 = Await(second);
  EXPECT_EQ(at_1.code(), absl::StatusCode::kResourceExhausted) << at_1;
  EXPECT_EQ(at_1.message(), at_0.message());

  // Rank 1 first this time: its messages are early at rank 0, whose limit is the default.
  FillRanks(bufs, count);
  auto next_1 = cluster.Post(
      1, Algorithm::kRing, MakeRingOp("big", 2, DataType::kInt32, count, Reduction::kSum, bufs[1]));
  auto next_0 = cluster.Post(
      0, Algorithm::kRing, MakeRingOp("big", 2, DataType::kInt32, count, Reduction::kSum, bufs[0]));
  EXPECT_TRUE(Await(next_1).ok());
  EXPECT_TRUE(Await(next_0).ok());
  ExpectSums(bufs, count, 3);
}

// Over the limit before this engine has the job's plan (a peer got it first): the other ranks
// cannot be told then; the rank tells them when it posts the collective, which fails at once.
TEST(EarlyMessagesTest, OverTheLimitBeforeThePlanThePeersAreToldAtThePost) {
  const testing::ClusterOptions o = TwoRanks("job-u");
  testing::Cluster cluster(o);
  CollectiveEngine& engine_1 = cluster.node(1).engine();
  engine_1.RemoveJob(cluster.ViewOf(1).job_hash());
  engine_1.SetEarlyMessageLimit(1024);
  const uint64_t count = 1000;
  std::vector<std::vector<std::byte>> bufs(2, std::vector<std::byte>(count * 4));
  auto first = cluster.Post(
      0, Algorithm::kRing, MakeRingOp("big", 1, DataType::kInt32, count, Reduction::kSum, bufs[0]));
  const auto until = std::chrono::steady_clock::now() + kRingGuard;
  while (engine_1.stats().early_dropped == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(engine_1.stats().early_dropped, 1u);
  EXPECT_EQ(first.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  engine_1.SetJob(cluster.ViewOf(1));
  auto second = cluster.Post(
      1, Algorithm::kRing, MakeRingOp("big", 1, DataType::kInt32, count, Reduction::kSum, bufs[1]));
  const absl::Status at_1 = Await(second);
  EXPECT_EQ(at_1.code(), absl::StatusCode::kResourceExhausted) << at_1;
  EXPECT_THAT(at_1.message(), HasSubstr("the limit is 1024"));
  const absl::Status at_0 = Await(first);  // told by rank 1's post
  EXPECT_EQ(at_0.code(), absl::StatusCode::kResourceExhausted) << at_0;
  EXPECT_EQ(at_0.message(), at_1.message());
}

// A straggler of an older membership generation (iterations count from 0 again in each) that
// comes over the limit is dropped as stale: the collective of the same numbers running now in
// the new generation is not failed on any rank.
TEST(EarlyMessagesTest, AStragglerOfAnOlderGenerationOverTheLimitFailsNothing) {
  const testing::ClusterOptions o = TwoRanks("job-g", 3);
  testing::Cluster cluster(o);
  for (int r = 0; r < 2; ++r) {
    JobView v = cluster.ViewOf(r);
    v.plan_version = 5;
    v.generation = 1;
    cluster.SetJob(r, v);
  }
  cluster.node(1).engine().SetEarlyMessageLimit(1024);
  const uint64_t count = 100;  // int32: 200-byte steps, under the limit
  std::vector<std::vector<std::byte>> bufs(2, std::vector<std::byte>(count * 4));
  FillRanks(bufs, count);
  auto first =
      cluster.Post(0, Algorithm::kRing,
                   MakeRingOp("grad", 0, DataType::kInt32, count, Reduction::kSum, bufs[0]));
  // Generation 0's message of the same tensor and iteration, 2,000 bytes, from rank 0.
  WireHeader h;
  h.kind = static_cast<uint8_t>(MessageKind::kData);
  h.algorithm = static_cast<uint8_t>(Algorithm::kRing);
  h.dtype = static_cast<uint8_t>(DataType::kInt32);
  h.reduce = static_cast<uint8_t>(Reduction::kSum);
  h.job = cluster.ViewOf(1).job_hash();
  h.tensor = common::StableHash64("grad");
  h.iteration = 0;
  h.plan_version = 3;
  h.tensor_count = 1000;
  h.world_size = 2;
  h.sender = 0;
  h.num_chunks = 1;
  h.chunk_count = 500;
  std::vector<std::byte> payload(2000);
  const uint64_t fenced = cluster.node(1).engine().stats().fenced_messages.load();
  cluster.network().Inject(cluster.ViewOf(1).worker_addresses[1], AsBytes(h), payload);
  const auto until = std::chrono::steady_clock::now() + kRingGuard;
  while (cluster.node(1).engine().stats().fenced_messages == fenced &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(cluster.node(1).engine().stats().fenced_messages, fenced + 1);
  auto second =
      cluster.Post(1, Algorithm::kRing,
                   MakeRingOp("grad", 0, DataType::kInt32, count, Reduction::kSum, bufs[1]));
  EXPECT_TRUE(Await(first).ok());
  EXPECT_TRUE(Await(second).ok());
  ExpectSums(bufs, count, 3);
}

// A collective of an older membership generation that a peer will never run (it moved to the
// new generation and counts its iterations from 0 again) fails, retriable, as soon as the new
// generation's plan arrives; it waited out its op timeout (300 s here), and a rank stuck there
// joined the new generation's first collective too late for its peers (python_rejoin).
TEST(GenerationsTest, AnOlderGenerationsCollectiveFailsWhenTheMembershipMoves) {
  const testing::ClusterOptions o = TwoRanks("job-m", 3);
  testing::Cluster cluster(o);
  const uint64_t count = 100;
  std::vector<std::vector<std::byte>> bufs(2, std::vector<std::byte>(count * 4));
  FillRanks(bufs, count);
  auto stuck =
      cluster.Post(0, Algorithm::kRing,
                   MakeRingOp("grad", 4, DataType::kInt32, count, Reduction::kSum, bufs[0]));
  EXPECT_EQ(stuck.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  // A new plan of the same generation leaves it running.
  JobView same = cluster.ViewOf(0);
  same.plan_version = 4;
  cluster.SetJob(0, same);
  EXPECT_EQ(stuck.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  for (int r = 0; r < 2; ++r) {
    JobView v = cluster.ViewOf(r);
    v.plan_version = 5;
    v.generation = 1;
    cluster.SetJob(r, v);
  }
  const absl::Status status = Await(stuck);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("changed from v3 to v5"));
  EXPECT_THAT(status.message(), HasSubstr("membership generation 0 -> 1"));
  // The new generation's collectives run, from iteration 0.
  FillRanks(bufs, count);
  auto first =
      cluster.Post(0, Algorithm::kRing,
                   MakeRingOp("grad", 0, DataType::kInt32, count, Reduction::kSum, bufs[0]));
  auto second =
      cluster.Post(1, Algorithm::kRing,
                   MakeRingOp("grad", 0, DataType::kInt32, count, Reduction::kSum, bufs[1]));
  EXPECT_TRUE(Await(first).ok());
  EXPECT_TRUE(Await(second).ok());
  ExpectSums(bufs, count, 3);
}

// A failure is remembered as long as early messages are kept (the job's op timeout when longer
// than kTombstoneTtl): a rank that starts the collective 90 s after another rank aborted it
// fails at once with the abort's reason. It waited out its own op timeout for peers that were
// done with it when the failure was kept for 60 s only. Past the op timeout it is forgotten.
TEST(TombstonesTest, AFailureReachesARankThatStartsAnOpTimeoutLater) {
  const testing::ClusterOptions o = TwoRanks("job-t");
  testing::Cluster cluster(o);
  const uint64_t count = 100;
  std::vector<std::vector<std::byte>> bufs(2, std::vector<std::byte>(count * 4));
  const auto abort_reaches_rank_1 = [&](const std::string& name, uint64_t iteration) {
    const uint64_t early = cluster.node(1).engine().stats().early_messages.load();
    const uint64_t before = cluster.node(1).engine().stats().early_dropped.load();
    auto first = cluster.Post(
        0, Algorithm::kRing,
        MakeRingOp(name, iteration, DataType::kInt32, count, Reduction::kSum, bufs[0]));
    const auto until = std::chrono::steady_clock::now() + kRingGuard;
    while (cluster.node(1).engine().stats().early_messages == early &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    cluster.node(0).Abort(o.job_id, name, iteration, absl::CancelledError("client left"));
    EXPECT_EQ(Await(first).code(), absl::StatusCode::kCancelled);
    // The abort's tombstone drops rank 1's early messages of the collective.
    while (cluster.node(1).engine().stats().early_dropped == before &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_GT(cluster.node(1).engine().stats().early_dropped, before);
  };
  abort_reaches_rank_1("aborted", 1);
  cluster.clock().Advance(CollectiveEngine::kTombstoneTtl + std::chrono::seconds(30));
  cluster.node(1).engine().ExpireStale();
  auto late =
      cluster.Post(1, Algorithm::kRing,
                   MakeRingOp("aborted", 1, DataType::kInt32, count, Reduction::kSum, bufs[1]));
  const absl::Status status = Await(late);
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_THAT(status.message(), HasSubstr("client left"));

  // Past the op timeout the failure is forgotten: a rank starting then waits for its peer (and
  // fails at its own op timeout; here the peer never starts).
  abort_reaches_rank_1("forgotten", 1);
  cluster.clock().Advance(o.op_timeout + std::chrono::seconds(1));
  cluster.node(1).engine().ExpireStale();
  auto too_late =
      cluster.Post(1, Algorithm::kRing,
                   MakeRingOp("forgotten", 1, DataType::kInt32, count, Reduction::kSum, bufs[1]));
  EXPECT_EQ(too_late.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  cluster.clock().Advance(o.op_timeout + std::chrono::seconds(1));
  cluster.node(1).engine().ExpireStale();
  EXPECT_EQ(Await(too_late).code(), absl::StatusCode::kDeadlineExceeded);
}

// With two local processes the engine sums their buffers before the nodes run and copies the
// result back to the second after: that copy, and the average, run in done, after the engine
// dropped its operation. The operation's keepalive (the processes' shared-memory mappings in the
// agent) must still hold then: a process that unregistered its buffer meanwhile had the agent
// copy into unmapped memory (found in session 37: SIGSEGV in the agent).
TEST(LocalBuffersTest, TheResultIsCopiedToEveryLocalBufferWhileTheKeepaliveHolds) {
  for (Reduction kind : {Reduction::kSum, Reduction::kAverage, Reduction::kAllGather}) {
    testing::ClusterOptions o;
    o.workers = 2;
    o.procs_per_node = 2;
    o.job_id = "job-local";
    o.partition_bytes = 64;
    testing::Cluster cluster(o);
    const uint64_t count = 40;  // per process for all-gather
    const uint64_t region = kind == Reduction::kAllGather ? count * 4 : count;
    std::vector<std::future<absl::Status>> futures;
    // What each rank's done found: whether the memory was still held, and its contents. The
    // test keeps no reference of its own: only the operation's keepalive holds the memory.
    std::vector<std::shared_ptr<std::optional<std::vector<float>>>> found;
    for (int r = 0; r < 2; ++r) {
      auto memory = std::make_shared<std::vector<float>>(2 * region, 0.0f);
      for (int local = 0; local < 2; ++local) {
        const uint64_t base = kind == Reduction::kAllGather ? (r * 2 + local) * count : 0;
        for (uint64_t i = 0; i < count; ++i) {
          (*memory)[local * region + base + i] = static_cast<float>((r * 2 + local + 1) * (i + 1));
        }
      }
      Operation op;
      op.tensor_name = "local-copies";
      op.dtype = DataType::kFloat32;
      op.count = count;
      op.reduction = kind;
      op.buffers = {reinterpret_cast<std::byte*>(memory->data()),
                    reinterpret_cast<std::byte*>(memory->data() + region)};
      std::weak_ptr<std::vector<float>> weak = memory;
      op.keepalive = std::move(memory);
      auto result = std::make_shared<std::optional<std::vector<float>>>();
      found.push_back(result);
      auto promise = std::make_shared<std::promise<absl::Status>>();
      futures.push_back(promise->get_future());
      op.done = [promise, result, weak](absl::Status s) {
        if (std::shared_ptr<std::vector<float>> m = weak.lock()) *result = *m;
        promise->set_value(std::move(s));
      };
      ASSERT_TRUE(cluster.node(r).engine().Post(o.job_id, Algorithm::kRing, std::move(op)).ok());
    }
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(Await(futures[r]).ok()) << r;
      ASSERT_TRUE(found[r]->has_value())
          << ReductionName(kind) << " rank " << r << ": the memory was gone when done ran";
      const std::vector<float>& got = **found[r];
      for (int local = 0; local < 2; ++local) {
        for (uint64_t i = 0; i < region; ++i) {
          float expected = 0;
          if (kind == Reduction::kAllGather) {
            expected = static_cast<float>((i / count + 1) * (i % count + 1));
          } else {
            for (int q = 1; q <= 4; ++q) expected += static_cast<float>(q * (i + 1));
            if (kind == Reduction::kAverage) expected /= 4;
          }
          ASSERT_EQ(got[local * region + i], expected)
              << ReductionName(kind) << " rank " << r << " local " << local << " i " << i;
        }
      }
    }
  }
}

TEST(BackToBackTest, FiftyIterationsOfThreeTensorsNeverMix) {
  const int n = 5;
  const int iterations = 50;
  Ring ring(n, /*partition_bytes=*/64);
  struct Tensor {
    std::string name;
    Algorithm alg;
    Reduction kind;
    DataType dtype;
    uint64_t count;
  };
  const std::vector<Tensor> tensors = {
      {"conv1", Algorithm::kRing, Reduction::kSum, DataType::kFloat32, 37},
      {"fc", Algorithm::kHalvingDoubling, Reduction::kSum, DataType::kInt64, 101},
      {"bn", Algorithm::kRecursiveDoubling, Reduction::kAverage, DataType::kBFloat16, 11}};
  // bufs[rank][iteration * 3 + tensor]
  std::vector<std::vector<std::vector<std::byte>>> bufs(n);
  const auto value = [](int r, int it, int k, uint64_t i) {
    return static_cast<double>((it + k + i) % 9) + 2 * r;
  };
  for (int r = 0; r < n; ++r) {
    for (int it = 0; it < iterations; ++it) {
      for (int k = 0; k < 3; ++k) {
        const Tensor& t = tensors[k];
        bufs[r].emplace_back(t.count * common::DataTypeSize(t.dtype));
        for (uint64_t i = 0; i < t.count; ++i)
          PutValue(t.dtype, bufs[r].back().data(), i, value(r, it, k, i));
      }
    }
  }
  // Every rank submits everything at once from its own thread, in a rank-dependent order.
  std::vector<std::vector<std::future<absl::Status>>> futures(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      for (int it = 0; it < iterations; ++it) {
        for (int j = 0; j < 3; ++j) {
          const int k = (j + r) % 3;
          const Tensor& t = tensors[k];
          futures[r].push_back(ring.Post(
              r, t.alg, MakeRingOp(t.name, it, t.dtype, t.count, t.kind, bufs[r][it * 3 + k])));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  uint64_t wrong = 0;
  for (int r = 0; r < n; ++r) {
    for (auto& f : futures[r]) ASSERT_TRUE(Await(f).ok());
    for (int it = 0; it < iterations; ++it) {
      for (int k = 0; k < 3; ++k) {
        const Tensor& t = tensors[k];
        for (uint64_t i = 0; i < t.count; ++i) {
          double sum = 0;
          for (int q = 0; q < n; ++q) sum += value(q, it, k, i);
          const double want = t.kind == Reduction::kAverage ? sum / n : sum;
          if (GetValue(t.dtype, bufs[r][it * 3 + k].data(), i) != want) ++wrong;
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(ring.engine(0).active_operations(), 0u);
  EXPECT_EQ(ring.engine(0).stats().ops_completed, 150u);
}

TEST(StartTest, RejectsWhatItCannotStart) {
  Ring ring(2);
  std::vector<std::byte> buf(16);
  Operation op = MakeRingOp("x", 0, DataType::kFloat32, 4, Reduction::kSum, buf);
  op.done = [](absl::Status) {};
  EXPECT_EQ(ring.engine(0).Post("nope", Algorithm::kRing, op).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ring.node(0).Start("nope", op).code(), absl::StatusCode::kNotFound);
  Operation zero = op;
  zero.count = 0;
  EXPECT_EQ(ring.engine(0).Post("job-r", Algorithm::kRing, zero).code(),
            absl::StatusCode::kInvalidArgument);
  Operation bad_root = op;
  bad_root.reduction = Reduction::kBroadcast;
  bad_root.root_node = 2;
  EXPECT_EQ(ring.engine(0).Post("job-r", Algorithm::kRing, bad_root).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ring.engine(0).Post("job-r", Algorithm::kRing, op).ok());
  EXPECT_EQ(ring.engine(0).Post("job-r", Algorithm::kRing, op).code(),
            absl::StatusCode::kAlreadyExists);
  ring.node(0).RemoveJob("job-r");
  EXPECT_EQ(ring.engine(0).active_operations(), 0u);
}

// ---------------------------------------------------------------------------------------------
// Selector

TEST(SelectorTest, ModelThresholdsSplitSizesIntoRanges) {
  const CostModel model;
  const SelectorThresholds t8 = ModelThresholds(8, 0, model);
  // At n = 8 recursive doubling (3 messages) wins small tensors, halving-doubling (6) the middle
  // ones, ring the rest; no push/pull without servers.
  EXPECT_GT(t8.recursive_doubling_below, 4u << 10);
  EXPECT_LT(t8.recursive_doubling_below, t8.halving_doubling_below);
  EXPECT_LT(t8.halving_doubling_below, 16u << 20);
  EXPECT_EQ(t8.push_pull_from, UINT64_MAX);
  EXPECT_EQ(Select(4 << 10, 8, t8), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(Select(t8.recursive_doubling_below, 8, t8), Algorithm::kHalvingDoubling);
  EXPECT_EQ(Select(64 << 20, 8, t8), Algorithm::kRing);
  // Each latency-optimal pick is predicted at least kSelectorMargin faster than the next one.
  const double keep = 1 - kSelectorMargin;
  const uint64_t r = t8.recursive_doubling_below;
  EXPECT_LE(PredictSeconds(Algorithm::kRecursiveDoubling, r - 1, 8, 0, model),
            keep * PredictSeconds(Algorithm::kHalvingDoubling, r - 1, 8, 0, model));
  EXPECT_GE(PredictSeconds(Algorithm::kRecursiveDoubling, r + 1, 8, 0, model),
            keep * PredictSeconds(Algorithm::kHalvingDoubling, r + 1, 8, 0, model));
  // Not a power of two: the fold's two extra messages of the whole tensor count.
  EXPECT_NEAR(PredictSeconds(Algorithm::kRecursiveDoubling, 1000, 6, 0, model),
              4 * model.alpha_seconds +
                  1000 * (4 * model.beta_seconds_per_byte + 3 * model.gamma_seconds_per_byte),
              1e-12);
  // At the threshold the model's costs cross, with the margin.
  const uint64_t m = t8.halving_doubling_below;
  EXPECT_LE(PredictSeconds(Algorithm::kHalvingDoubling, m - 1, 8, 0, model),
            keep * PredictSeconds(Algorithm::kRing, m - 1, 8, 0, model));
  EXPECT_GE(PredictSeconds(Algorithm::kHalvingDoubling, m + 1, 8, 0, model),
            keep * PredictSeconds(Algorithm::kRing, m + 1, 8, 0, model));
  // Without the margin halving-doubling would take sizes where it is predicted barely faster.
  EXPECT_LT(PredictSeconds(Algorithm::kHalvingDoubling, m + 1, 8, 0, model),
            PredictSeconds(Algorithm::kRing, m + 1, 8, 0, model));
  // n = 2: halving-doubling and ring both take 2 steps, ring pipelines its summation: never
  // halving-doubling; one exchange of the whole tensor (recursive doubling) wins small tensors.
  EXPECT_EQ(ModelThresholds(2, 0, model).halving_doubling_below, 0u);
  EXPECT_EQ(Select(1, 2, ModelThresholds(2, 0, model)), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(Select(1 << 20, 2, ModelThresholds(2, 0, model)), Algorithm::kRing);
  // With as many extra servers as workers, push/pull takes the large tensors.
  const SelectorThresholds pp = ModelThresholds(8, 8, model);
  EXPECT_LT(pp.push_pull_from, 64u << 20);
  EXPECT_EQ(Select(64 << 20, 8, pp), Algorithm::kPushPull);
  EXPECT_LT(PredictSeconds(Algorithm::kPushPull, 64 << 20, 8, 8, model),
            PredictSeconds(Algorithm::kRing, 64 << 20, 8, 8, model));
  // One rank: nothing to do.
  EXPECT_EQ(Select(1 << 20, 1, t8), Algorithm::kRing);
  EXPECT_EQ(PredictSeconds(Algorithm::kRing, 1 << 20, 1, 0, model), 0);
}

TEST(SelectorTest, ConfiguredThresholdsAndFallback) {
  SelectorThresholds t;
  t.recursive_doubling_below = 100;
  t.halving_doubling_below = 1000;
  t.push_pull_from = 5000;
  EXPECT_EQ(Select(99, 4, t), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(Select(100, 4, t), Algorithm::kHalvingDoubling);
  EXPECT_EQ(Select(999, 4, t), Algorithm::kHalvingDoubling);
  EXPECT_EQ(Select(1000, 4, t), Algorithm::kRing);
  EXPECT_EQ(Select(4999, 4, t), Algorithm::kRing);
  EXPECT_EQ(Select(5000, 4, t), Algorithm::kPushPull);
  Operation bcast;
  bcast.reduction = Reduction::kBroadcast;
  Ring ring(1);
  auto engine_only = [&](Algorithm a) { return ring.engine(0).CanServe(a, bcast); };
  EXPECT_EQ(*SelectServable(10, 4, t, engine_only), Algorithm::kRing);
  EXPECT_EQ(*SelectServable(9000, 4, t, engine_only), Algorithm::kRing);
  auto nothing = [](Algorithm) { return absl::UnimplementedError("no"); };
  EXPECT_EQ(SelectServable(10, 4, t, nothing).status().code(), absl::StatusCode::kUnimplemented);
}

// Worker 0 of a job with `workers` worker nodes (also servers, unless `workers_serve` is false:
// a plan that gives them no share leaves them out) and `spares` spare servers, equal shares, on
// an in-process transport: enough to ask a DataPlaneNode which algorithm it picks.
class SelectorNode {
 public:
  SelectorNode() : transport_(network_.CreateEndpoint("w0")), reducer_(1) {}
  ~SelectorNode() { transport_->Shutdown(); }

  DataPlaneNode& collectives() { return node_; }
  void SetAutoJob(const std::string& job_id, int workers, int spares, bool workers_serve = true,
                  double selector_nic_bytes_per_s = 0) {
    JobView view;
    view.job_id = job_id;
    view.selector_nic_bytes_per_s = selector_nic_bytes_per_s;
    view.plan_version = 1;
    for (int i = 0; i < workers; ++i) view.worker_addresses.push_back(absl::StrCat("w", i));
    if (workers_serve) view.server_addresses = view.worker_addresses;
    for (int i = 0; i < spares; ++i) view.server_addresses.push_back(absl::StrCat("s", i));
    const int servers = static_cast<int>(view.server_addresses.size());
    for (int i = 0; i < servers; ++i) {
      view.server_weights.push_back(ChunkMap::kWeightTotal / servers +
                                    (i == 0 ? ChunkMap::kWeightTotal % servers : 0));
    }
    view.my_worker_rank = 0;
    view.my_server_index = workers_serve ? 0 : -1;
    node_.SetJob(view, Algorithm::kAuto);
  }

 private:
  InProcessNetwork network_;
  std::unique_ptr<Transport> transport_;
  CpuReducer reducer_;
  common::FakeClock clock_;
  DataPlaneNode node_{transport_.get(), &reducer_, &clock_};
};

TEST(SelectorTest, NodesFollowTheirCostModel) {
  // 4 worker nodes + 4 spare servers; a 500 Mbit/s NIC; the suite-fitted per-message cost.
  SelectorNode node;
  DataPlaneNode& collectives = node.collectives();
  const CostModel model{.alpha_seconds = 200e-6,
                        .beta_seconds_per_byte = 1 / 62.5e6,
                        .gamma_seconds_per_byte = 1 / 4e9};
  collectives.SetCostModel(model);
  node.SetAutoJob("auto", 4, 4);
  const SelectorThresholds t = ModelThresholds(4, 4, model);
  // Push/pull's 14 messages cost 8 alpha more than ring's 6, its bytes 1.0 M beta against
  // ring's 1.5 M beta; ring is kept only where it is predicted 10 % faster: below
  // 6 + 1.5 M beta = 0.9 (14 + M beta) alpha-units, M = 11 alpha / beta = 137.5 KB.
  EXPECT_GT(t.push_pull_from, 130u << 10);
  EXPECT_LT(t.push_pull_from, 140u << 10);
  EXPECT_NE(*collectives.AlgorithmFor("auto", 4 << 10), Algorithm::kPushPull);
  EXPECT_EQ(*collectives.AlgorithmFor("auto", 64 << 20), Algorithm::kPushPull);
  EXPECT_EQ(*collectives.AlgorithmFor("auto", t.push_pull_from), Algorithm::kPushPull);
  EXPECT_NE(*collectives.AlgorithmFor("auto", t.push_pull_from - 1), Algorithm::kPushPull);
  // A different model moves the thresholds: with a free message, push/pull wins from the start.
  collectives.SetCostModel(CostModel{
      .alpha_seconds = 0, .beta_seconds_per_byte = 1 / 62.5e6, .gamma_seconds_per_byte = 1 / 4e9});
  node.SetAutoJob("auto", 4, 4);
  EXPECT_EQ(*collectives.AlgorithmFor("auto", 4 << 10), Algorithm::kPushPull);
}

// Two nodes with different NICs (500 Mbit/s and 1 Gbit/s) in one job: each node's own model puts
// a tensor between their push/pull thresholds on different algorithms (a mismatch every rank
// would see as an error); with the plan's NIC rate (the slower one) both pick the same, the
// slower node's choice, for every size.
TEST(SelectorTest, NodesWithDifferentNicsAgreeByThePlansRate) {
  const CostModel slow{.alpha_seconds = 200e-6,
                       .beta_seconds_per_byte = 1 / 62.5e6,
                       .gamma_seconds_per_byte = 1 / 4e9};
  CostModel fast = slow;
  fast.beta_seconds_per_byte = 1 / 125e6;
  SelectorNode a;
  SelectorNode b;
  a.collectives().SetCostModel(slow);
  b.collectives().SetCostModel(fast);
  const uint64_t slow_from = ModelThresholds(4, 4, slow).push_pull_from;
  const uint64_t fast_from = ModelThresholds(4, 4, fast).push_pull_from;
  ASSERT_LT(slow_from, fast_from);
  const uint64_t between = (slow_from + fast_from) / 2;
  a.SetAutoJob("own", 4, 4);
  b.SetAutoJob("own", 4, 4);
  EXPECT_EQ(*a.collectives().AlgorithmFor("own", between), Algorithm::kPushPull);
  EXPECT_NE(*b.collectives().AlgorithmFor("own", between), Algorithm::kPushPull);

  a.SetAutoJob("plan", 4, 4, true, 62.5e6);
  b.SetAutoJob("plan", 4, 4, true, 62.5e6);
  for (uint64_t bytes : {uint64_t{4} << 10, slow_from - 1, slow_from, between, fast_from - 1,
                         fast_from, uint64_t{64} << 20}) {
    EXPECT_EQ(*a.collectives().AlgorithmFor("plan", bytes),
              *b.collectives().AlgorithmFor("plan", bytes))
        << bytes;
  }
  EXPECT_EQ(*b.collectives().AlgorithmFor("plan", between), Algorithm::kPushPull);
  EXPECT_NE(*b.collectives().AlgorithmFor("plan", slow_from - 1), Algorithm::kPushPull);

  // A rate that is not finite and positive (a broken controller) leaves each node its own.
  for (double nonsense :
       {-1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    b.SetAutoJob("nonsense", 4, 4, true, nonsense);
    EXPECT_NE(*b.collectives().AlgorithmFor("nonsense", between), Algorithm::kPushPull) << nonsense;
  }
}

// With 4 spares the planner may give the workers no share (theirs is ~1 % and rounds to 0 when
// they look busy), and the plan then names the 4 spares alone as servers: still k = 4. (Counted
// as servers - workers = 0, such a plan sent every tensor of an auto job to ring: the main job's
// auto k = 4 ran at Gloo ring's speed instead of push/pull's.)
TEST(SelectorTest, SparesAreTheServersThatAreNotWorkers) {
  SelectorNode node;
  DataPlaneNode& collectives = node.collectives();
  collectives.SetCostModel(CostModel{.alpha_seconds = 200e-6,
                                     .beta_seconds_per_byte = 1 / 62.5e6,
                                     .gamma_seconds_per_byte = 1 / 4e9});
  node.SetAutoJob("spares-only", 4, 4, /*workers_serve=*/false);
  EXPECT_EQ(*collectives.AlgorithmFor("spares-only", 64 << 20), Algorithm::kPushPull);
  node.SetAutoJob("no-spares", 4, 0);
  EXPECT_EQ(*collectives.AlgorithmFor("no-spares", 64 << 20), Algorithm::kRing);
  JobView view;
  view.worker_addresses = {"a", "b", "c"};
  view.server_addresses = {"b", "x", "a", "y"};
  EXPECT_EQ(view.num_spare_servers(), 2);
}

TEST(SelectorTest, MeasuredThresholdsFromTheSuitesCalibration) {
  absl::StatusOr<MeasuredThresholds> m = ParseSelectorCalibration(R"({
    "workers": 4, "rate_mbit": 500, "alpha_seconds": {"tributary ring": 0.00019},
    "ring_beats_halving_doubling_from": 524288, "recursive_doubling_below": 32768,
    "push_pull_beats_ring_from": {"k=0": null, "k=2": 16777216, "k=4": 8388608}})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->ring_beats_halving_doubling_from, 524288u);
  EXPECT_EQ(m->recursive_doubling_below, 32768u);
  EXPECT_EQ(m->push_pull_beats_ring_from.at(0), UINT64_MAX);
  // No spares: never push/pull; 3 spares: the k = 2 measurement; 8: the k = 4 one.
  EXPECT_EQ(MeasuredSelectorThresholds(*m, 4, 0).push_pull_from, UINT64_MAX);
  EXPECT_EQ(MeasuredSelectorThresholds(*m, 4, 3).push_pull_from, 16777216u);
  const SelectorThresholds t = MeasuredSelectorThresholds(*m, 4, 8);
  EXPECT_EQ(t.push_pull_from, 8388608u);
  EXPECT_EQ(Select(4 << 10, 4, t), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(Select(32 << 10, 4, t), Algorithm::kHalvingDoubling);
  EXPECT_EQ(Select(1 << 20, 4, t), Algorithm::kRing);
  EXPECT_EQ(Select(8 << 20, 4, t), Algorithm::kPushPull);
  EXPECT_EQ(MeasuredSelectorThresholds(*m, 2, 0).halving_doubling_below, 0u);  // n = 2: ring
  // A calibration from before recursive doubling, or in which it never won: never chosen.
  for (const char* json :
       {R"({"ring_beats_halving_doubling_from": 1})", R"({"recursive_doubling_below": null})"}) {
    absl::StatusOr<MeasuredThresholds> old = ParseSelectorCalibration(json);
    ASSERT_TRUE(old.ok()) << old.status();
    EXPECT_EQ(MeasuredSelectorThresholds(*old, 4, 0).recursive_doubling_below, 0u) << json;
  }
  // Errors name the field.
  EXPECT_THAT(ParseSelectorCalibration("[1]").status().message(),
              ::testing::HasSubstr("not a JSON object"));
  EXPECT_THAT(
      ParseSelectorCalibration(R"({"ring_beats_halving_doubling_from": -1})").status().message(),
      ::testing::HasSubstr("ring_beats_halving_doubling_from must be"));
  EXPECT_THAT(ParseSelectorCalibration(R"({"recursive_doubling_below": "4K"})").status().message(),
              ::testing::HasSubstr("recursive_doubling_below must be"));
  EXPECT_THAT(
      ParseSelectorCalibration(R"({"push_pull_beats_ring_from": {"two": 5}})").status().message(),
      ::testing::HasSubstr("'two' is not k=N"));
}

TEST(SelectorTest, NodesPreferMeasuredThresholds) {
  SelectorNode node;
  DataPlaneNode& collectives = node.collectives();
  MeasuredThresholds m;
  m.ring_beats_halving_doubling_from = 1 << 20;
  m.recursive_doubling_below = 16 << 10;
  m.push_pull_beats_ring_from = {{0, UINT64_MAX}, {2, 16 << 20}};
  collectives.SetMeasuredThresholds(m);
  node.SetAutoJob("measured", 4, 2);
  EXPECT_EQ(*collectives.AlgorithmFor("measured", 4 << 10), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(*collectives.AlgorithmFor("measured", 64 << 10), Algorithm::kHalvingDoubling);
  EXPECT_EQ(*collectives.AlgorithmFor("measured", 4 << 20), Algorithm::kRing);
  EXPECT_EQ(*collectives.AlgorithmFor("measured", 16 << 20), Algorithm::kPushPull);
}

// Records the congestion controls a node asks of its transport; everything else goes to an
// in-process endpoint.
class CongestionRecorder final : public Transport {
 public:
  explicit CongestionRecorder(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  std::string Address() const override { return inner_->Address(); }
  void SetReceiveHandler(ReceiveHandler handler) override {
    inner_->SetReceiveHandler(std::move(handler));
  }
  void Send(const std::string& peer, std::span<const std::byte> header,
            std::span<const std::byte> payload, SendCallback done) override {
    inner_->Send(peer, header, payload, std::move(done));
  }
  void Shutdown() override { inner_->Shutdown(); }
  void SetPeerCongestionControl(const std::string& peer, const std::string& name) override {
    std::lock_guard lock(mu_);
    if (name.empty()) {
      set_.erase(peer);
    } else {
      set_[peer] = name;
    }
    ++calls_;
  }
  // The connections with a congestion control of their own, by peer.
  std::map<std::string, std::string> set() {
    std::lock_guard lock(mu_);
    return set_;
  }
  int calls() {
    std::lock_guard lock(mu_);
    return calls_;
  }

 private:
  std::unique_ptr<Transport> inner_;
  std::mutex mu_;
  std::map<std::string, std::string> set_;
  int calls_ = 0;
};

// A job of node "w0" over `workers` and `servers` (equal weights), by address.
JobView CongestionJob(const std::string& id, std::vector<std::string> workers,
                      std::vector<std::string> servers = {}) {
  JobView view;
  view.job_id = id;
  view.plan_version = 1;
  view.worker_addresses = std::move(workers);
  view.server_addresses = servers.empty() ? view.worker_addresses : std::move(servers);
  const uint64_t n = view.server_addresses.size();
  for (uint64_t i = 0; i < n; ++i) {
    view.server_weights.push_back(ChunkMap::kWeightTotal / n +
                                  (i == 0 ? ChunkMap::kWeightTotal % n : 0));
  }
  auto rank = std::find(view.worker_addresses.begin(), view.worker_addresses.end(), "w0");
  view.my_worker_rank = rank == view.worker_addresses.end()
                            ? -1
                            : static_cast<int>(rank - view.worker_addresses.begin());
  auto index = std::find(view.server_addresses.begin(), view.server_addresses.end(), "w0");
  view.my_server_index = index == view.server_addresses.end()
                             ? -1
                             : static_cast<int>(index - view.server_addresses.begin());
  return view;
}

// The worker congestion control goes on a node's connections to the other workers of jobs whose
// collectives run among the workers alone, and comes off a connection when no such job names it
// any more or when a job with spare servers, push/pull or asynchronous training also uses it.
TEST(WorkerCongestionControlTest, SetOnConnectionsAmongWorkersOfJobsWithoutSpares) {
  InProcessNetwork network;
  CongestionRecorder recorder(network.CreateEndpoint("w0"));
  CpuReducer reducer(1);
  common::FakeClock clock;
  DataPlaneNode node(&recorder, &reducer, &clock);
  using Set = std::map<std::string, std::string>;

  // Off by default: a ring job sets nothing.
  node.SetJob(CongestionJob("ring", {"w0", "w1", "w2", "w3"}), Algorithm::kRing);
  EXPECT_EQ(recorder.calls(), 0);
  // Turned on: the current job's other workers get it, this node's own address never.
  node.SetWorkerCongestionControl("cubic");
  EXPECT_EQ(recorder.set(), (Set{{"w1", "cubic"}, {"w2", "cubic"}, {"w3", "cubic"}}));

  // A job with a spare server shares w1 (and names s0): w1 goes back to the default.
  node.SetJob(CongestionJob("spares", {"w0", "w1"}, {"w0", "w1", "s0"}), Algorithm::kAuto);
  EXPECT_EQ(recorder.set(), (Set{{"w2", "cubic"}, {"w3", "cubic"}}));
  // Push/pull without spares and asynchronous training leave their workers alone too.
  node.SetJob(CongestionJob("pp", {"w0", "w4"}), Algorithm::kPushPull);
  JobView async = CongestionJob("async", {"w0", "w5"});
  async.async_mode = true;
  node.SetJob(async, Algorithm::kAuto);
  EXPECT_EQ(recorder.set(), (Set{{"w2", "cubic"}, {"w3", "cubic"}}));
  // An auto job without spares runs among its workers: w6 gets it.
  node.SetJob(CongestionJob("auto", {"w6", "w0"}), Algorithm::kAuto);
  EXPECT_EQ(recorder.set(), (Set{{"w2", "cubic"}, {"w3", "cubic"}, {"w6", "cubic"}}));

  // The job with the spare ends: w1 is the ring job's alone again.
  node.RemoveJob("spares");
  EXPECT_EQ(recorder.set(),
            (Set{{"w1", "cubic"}, {"w2", "cubic"}, {"w3", "cubic"}, {"w6", "cubic"}}));
  // A job of which this node is only a server changes nothing.
  node.SetJob(CongestionJob("served", {"w7", "w8"}, {"w0"}), Algorithm::kAuto);
  EXPECT_EQ(recorder.set().size(), 4u);
  // Another name replaces it everywhere; empty takes it off every connection.
  node.SetWorkerCongestionControl("reno");
  EXPECT_EQ(recorder.set(), (Set{{"w1", "reno"}, {"w2", "reno"}, {"w3", "reno"}, {"w6", "reno"}}));
  // A new view of the ring job with a spare server: its workers go back to the default.
  node.SetJob(CongestionJob("ring", {"w0", "w1", "w2", "w3"}, {"w0", "w1", "w2", "w3", "s9"}),
              Algorithm::kRing);
  EXPECT_EQ(recorder.set(), (Set{{"w6", "reno"}}));
  node.RemoveJob("ring");
  EXPECT_EQ(recorder.set(), (Set{{"w6", "reno"}}));
  // A calibration that prices push/pull below the ring without spares: an auto job set from now
  // on may pick it, so its workers keep the default.
  MeasuredThresholds measured;
  measured.push_pull_beats_ring_from[0] = 16 << 20;
  node.SetMeasuredThresholds(measured);
  node.SetJob(CongestionJob("calibrated", {"w0", "w10"}), Algorithm::kAuto);
  EXPECT_EQ(recorder.set(), (Set{{"w6", "reno"}}));
  node.SetJob(CongestionJob("calibrated-ring", {"w0", "w11"}), Algorithm::kRing);
  EXPECT_EQ(recorder.set(), (Set{{"w6", "reno"}, {"w11", "reno"}}));
  node.SetWorkerCongestionControl("");
  EXPECT_EQ(recorder.set(), Set{});
  recorder.Shutdown();
}

}  // namespace
}  // namespace tributary::dataplane
