#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <iostream>
#include <memory>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "dataplane/collectives/algorithm_selector.h"
#include "dataplane/collectives/allreduce_halving_doubling.h"
#include "dataplane/collectives/allreduce_ring.h"
#include "dataplane/collectives/collective_engine.h"
#include "dataplane/collectives/node_collectives.h"
#include "dataplane/reduce/cpu/cpu_reducer.h"
#include "dataplane/transport/inprocess/inprocess_transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/typed_values.h"

namespace tributary::dataplane {
namespace {

using common::DataType;
using ::testing::HasSubstr;

constexpr auto kGuard = std::chrono::seconds(20);  // a test-only bound on waiting for futures

// Writes a small non-negative integer (exact in every dtype).
void Put(DataType t, std::byte* base, uint64_t i, double v) { testing::PutValue(t, base, i, v); }

double Get(DataType t, const std::byte* base, uint64_t i) { return testing::GetValue(t, base, i); }

// n ranks on one in-process network, each with a CollectiveEngine behind a small dispatcher
// (the rule of IsCollectiveMessage; other messages are only counted).
class Ring {
 public:
  explicit Ring(int n, uint64_t partition_bytes = 16) : n_(n), reducer_(1) {
    view_.job_id = "job-r";
    view_.plan_version = 3;
    view_.partition_bytes = partition_bytes;
    view_.op_timeout = std::chrono::milliseconds(5000);
    for (int i = 0; i < n; ++i) view_.rank_addresses.push_back(absl::StrCat("rank-", i));
    for (int i = 0; i < n; ++i) {
      transports_.push_back(network_.CreateEndpoint(view_.rank_addresses[i]));
      engines_.push_back(
          std::make_unique<CollectiveEngine>(transports_.back().get(), &reducer_, &clock_));
      CollectiveEngine* engine = engines_.back().get();
      transports_.back()->SetReceiveHandler(
          [this, engine](std::span<const std::byte> header, std::span<const std::byte> payload) {
            if (IsCollectiveMessage(header)) {
              engine->HandleMessage(header, payload);
            } else {
              other_messages_++;
            }
          });
      RankView v = view_;
      v.my_rank = i;
      engine->SetJob(v);
    }
  }
  ~Ring() {
    for (auto& t : transports_) t->Shutdown();
  }

  std::future<absl::Status> Start(int rank, Algorithm alg, CollectiveOperation op) {
    auto promise = std::make_shared<std::promise<absl::Status>>();
    auto future = promise->get_future();
    op.done = [promise](absl::Status s) { promise->set_value(std::move(s)); };
    absl::Status started = engines_[rank]->Start(view_.job_id, alg, std::move(op));
    if (!started.ok()) promise->set_value(started);
    return future;
  }

  CollectiveEngine& engine(int i) { return *engines_[i]; }
  InProcessNetwork& network() { return network_; }
  common::FakeClock& clock() { return clock_; }
  const RankView& view() const { return view_; }
  int n() const { return n_; }
  int other_messages() const { return other_messages_; }

 private:
  int n_;
  InProcessNetwork network_;
  CpuReducer reducer_;
  common::FakeClock clock_;
  RankView view_;
  std::vector<std::unique_ptr<InProcessTransport>> transports_;
  std::vector<std::unique_ptr<CollectiveEngine>> engines_;
  std::atomic<int> other_messages_{0};
};

absl::Status Await(std::future<absl::Status>& f) {
  if (f.wait_for(kGuard) != std::future_status::ready) {
    return absl::InternalError("test guard: the collective neither finished nor failed");
  }
  return f.get();
}

CollectiveOperation MakeOp(const std::string& name, uint64_t iteration, DataType t, uint64_t count,
                           CollectiveKind kind, std::vector<std::byte>& buffer, uint32_t root = 0) {
  CollectiveOperation op;
  op.tensor_name = name;
  op.iteration = iteration;
  op.dtype = t;
  op.count = count;
  op.kind = kind;
  op.root = root;
  op.buffer = buffer.data();
  return op;
}

// Runs one collective on every rank and counts wrong elements over all ranks.
// value(rank, i) is the input, expect(i) the result.
uint64_t RunAndCount(Ring& ring, Algorithm alg, const std::string& name, uint64_t iteration,
                     DataType t, uint64_t count, CollectiveKind kind, uint32_t root,
                     const std::function<double(int, uint64_t)>& value,
                     const std::function<double(uint64_t)>& expect) {
  const size_t es = common::DataTypeSize(t);
  std::vector<std::vector<std::byte>> bufs(ring.n(), std::vector<std::byte>(count * es));
  for (int r = 0; r < ring.n(); ++r) {
    for (uint64_t i = 0; i < count; ++i) Put(t, bufs[r].data(), i, value(r, i));
  }
  std::vector<std::future<absl::Status>> futures;
  for (int r = 0; r < ring.n(); ++r) {
    futures.push_back(ring.Start(r, alg, MakeOp(name, iteration, t, count, kind, bufs[r], root)));
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
      if (Get(t, bufs[r].data(), i) != expect(i)) ++wrong;
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

TEST(ScheduleTest, RingAndHalvingDoublingPairUp) {
  for (int n = 1; n <= 12; ++n) {
    for (uint64_t count : {1, 5, 64, 1000}) {
      std::vector<std::vector<ScheduleStep>> ring, hd, bcast;
      for (int r = 0; r < n; ++r) {
        ring.push_back(RingAllReduceSchedule(count, n, r));
        hd.push_back(HalvingDoublingSchedule(count, n, r));
        bcast.push_back(RingBroadcastSchedule(count, n, r, n / 2));
      }
      CheckPairing(ring, n);
      CheckPairing(hd, n);
      CheckPairing(bcast, n);
      EXPECT_EQ(ring[0].size(), n == 1 ? 0u : 2u * (n - 1));
      int levels = 0;
      while ((2 << levels) <= n) ++levels;
      EXPECT_EQ(hd[0].size(), n == 1 ? 0u : 2u * levels + 2);
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
          ring, alg, "grad", iteration++, t, count, CollectiveKind::kSum, 0,
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
          ring, alg, "avg", iteration++, t, count, CollectiveKind::kAverage, 0,
          [](int r, uint64_t i) { return static_cast<double>(i % 5) + 2 * r; },
          [n](uint64_t i) { return static_cast<double>(i % 5) + (n - 1); });
      EXPECT_EQ(wrong, 0u) << AlgorithmName(alg) << " n " << n << " " << common::DataTypeName(t)
                           << " count " << count;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllReduceTest,
                         ::testing::Combine(::testing::Values(Algorithm::kRing,
                                                              Algorithm::kHalvingDoubling),
                                            ::testing::Values(1, 2, 3, 4, 5, 7, 8)),
                         [](const auto& info) {
                           return absl::StrCat(std::string(AlgorithmName(std::get<0>(info.param))),
                                               "_n", std::get<1>(info.param));
                         });

TEST(AllReduceTest, LargePartitionsAndSingleMessageSteps) {
  Ring ring(4, /*partition_bytes=*/4 << 20);
  for (Algorithm alg : {Algorithm::kRing, Algorithm::kHalvingDoubling}) {
    const uint64_t wrong = RunAndCount(
        ring, alg, "big", static_cast<uint64_t>(alg), DataType::kFloat32, 100000,
        CollectiveKind::kSum, 0, [](int r, uint64_t i) { return r + static_cast<double>(i % 100); },
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
              ring, Algorithm::kRing, "weights", iteration++, t, count, CollectiveKind::kBroadcast,
              root,
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

TEST(BroadcastTest, HalvingDoublingDeclinesAndFallsBackToRing) {
  CollectiveOperation op;
  op.kind = CollectiveKind::kBroadcast;
  EXPECT_EQ(CollectiveEngine::CanServe(Algorithm::kHalvingDoubling, op, 4).code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(CollectiveEngine::CanServe(Algorithm::kPushPull, op, 4).code(),
            absl::StatusCode::kFailedPrecondition);
  Ring ring(4);
  const uint64_t wrong = RunAndCount(
      ring, Algorithm::kHalvingDoubling, "b", 0, DataType::kInt32, 50, CollectiveKind::kBroadcast,
      2, [](int r, uint64_t i) { return r == 2 ? static_cast<double>(i) : 0; },
      [](uint64_t i) { return static_cast<double>(i); });
  EXPECT_EQ(wrong, 0u);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(ring.engine(r).stats().fallbacks, 1u);
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
      futures.push_back(ring.Start(
          r, GetParam(), MakeOp("g", 0, DataType::kFloat32, count, CollectiveKind::kSum, bufs[r])));
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
        ring.Start(r, GetParam(), MakeOp("g", 0, t, 64, CollectiveKind::kSum, bufs[r])));
  }
  for (int r = 0; r < n; ++r) {
    absl::Status s = Await(futures[r]);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "rank " << r << s;
    EXPECT_THAT(s.message(), HasSubstr("float64"));
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, MismatchTest,
                         ::testing::Values(Algorithm::kRing, Algorithm::kHalvingDoubling),
                         [](const auto& info) { return std::string(AlgorithmName(info.param)); });

TEST(DeadlineTest, MissingRankTurnsIntoDeadlineExceededNamingStepAndPeer) {
  const int n = 4;
  Ring ring(n);
  std::vector<std::vector<std::byte>> bufs(n, std::vector<std::byte>(40 * 4));
  std::vector<std::future<absl::Status>> futures;
  for (int r = 0; r < n - 1; ++r) {  // rank 3 never starts
    futures.push_back(
        ring.Start(r, Algorithm::kRing,
                   MakeOp("g", 0, DataType::kFloat32, 40, CollectiveKind::kSum, bufs[r])));
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

TEST(MalformedTest, BadMessagesAreDroppedAndCounted) {
  Ring ring(2);
  const std::string addr = ring.view().rank_addresses[1];
  // Push/pull kinds go elsewhere.
  WireHeader w;
  w.kind = static_cast<uint8_t>(MessageKind::kPush);
  EXPECT_FALSE(IsCollectiveMessage(AsBytes(w)));
  CollectiveHeader h;
  h.kind = static_cast<uint8_t>(CollectiveMessageKind::kData);
  EXPECT_TRUE(IsCollectiveMessage(AsBytes(h)));
  // Truncated header, bad dtype, payload of the wrong size.
  ring.network().Inject(addr, AsBytes(h).first(10), {});
  h.dtype = 99;
  h.world_size = 2;
  ring.network().Inject(addr, AsBytes(h), {});
  h.dtype = static_cast<uint8_t>(DataType::kFloat32);
  h.algorithm = static_cast<uint8_t>(Algorithm::kRing);
  h.op = static_cast<uint8_t>(CollectiveKind::kSum);
  h.tensor_count = 8;
  h.num_chunks = 1;
  h.count = 4;
  std::vector<std::byte> three_floats(12);
  ring.network().Inject(addr, AsBytes(h), three_floats);
  ring.network().Inject(addr, AsBytes(w), {});
  // A collective still works afterwards.
  const uint64_t wrong = RunAndCount(
      ring, Algorithm::kRing, "after", 0, DataType::kInt64, 9, CollectiveKind::kSum, 0,
      [](int r, uint64_t i) { return r + static_cast<double>(i); },
      [](uint64_t i) { return 1 + 2 * static_cast<double>(i); });
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(ring.engine(1).stats().malformed_messages, 3u);
  EXPECT_EQ(ring.other_messages(), 1);
}

// ---------------------------------------------------------------------------------------------
// Ordering

TEST(EarlyMessagesTest, ARankThatStartsFirstIsBufferedUntilThePeerStarts) {
  for (Algorithm alg : {Algorithm::kRing, Algorithm::kHalvingDoubling}) {
    const int n = 4;
    Ring ring(n);
    const uint64_t count = 100;
    std::vector<std::vector<std::byte>> bufs(n, std::vector<std::byte>(count * 4));
    for (int r = 0; r < n; ++r) {
      for (uint64_t i = 0; i < count; ++i) Put(DataType::kInt32, bufs[r].data(), i, r + 1);
    }
    std::vector<std::future<absl::Status>> futures;
    futures.push_back(
        ring.Start(0, alg, MakeOp("e", 5, DataType::kInt32, count, CollectiveKind::kSum, bufs[0])));
    // Rank 0's first step reaches rank 1 (ring) or rank 2 (halving-doubling) before it starts.
    const int first_peer = alg == Algorithm::kRing ? 1 : 2;
    const auto until = std::chrono::steady_clock::now() + kGuard;
    while (ring.engine(first_peer).stats().early_messages == 0 &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_GT(ring.engine(first_peer).stats().early_messages, 0u);
    for (int r = n - 1; r >= 1; --r) {
      futures.push_back(ring.Start(
          r, alg, MakeOp("e", 5, DataType::kInt32, count, CollectiveKind::kSum, bufs[r])));
    }
    for (auto& f : futures) EXPECT_TRUE(Await(f).ok());
    for (int r = 0; r < n; ++r) {
      for (uint64_t i = 0; i < count; ++i) {
        ASSERT_EQ(Get(DataType::kInt32, bufs[r].data(), i), 10) << AlgorithmName(alg);
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
    CollectiveKind kind;
    DataType dtype;
    uint64_t count;
  };
  const std::vector<Tensor> tensors = {
      {"conv1", Algorithm::kRing, CollectiveKind::kSum, DataType::kFloat32, 37},
      {"fc", Algorithm::kHalvingDoubling, CollectiveKind::kSum, DataType::kInt64, 101},
      {"bn", Algorithm::kRing, CollectiveKind::kAverage, DataType::kBFloat16, 11}};
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
          Put(t.dtype, bufs[r].back().data(), i, value(r, it, k, i));
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
          futures[r].push_back(ring.Start(
              r, t.alg, MakeOp(t.name, it, t.dtype, t.count, t.kind, bufs[r][it * 3 + k])));
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
          const double want = t.kind == CollectiveKind::kAverage ? sum / n : sum;
          if (Get(t.dtype, bufs[r][it * 3 + k].data(), i) != want) ++wrong;
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
  CollectiveOperation op = MakeOp("x", 0, DataType::kFloat32, 4, CollectiveKind::kSum, buf);
  op.done = [](absl::Status) {};
  EXPECT_EQ(ring.engine(0).Start("nope", Algorithm::kRing, op).code(), absl::StatusCode::kNotFound);
  CollectiveOperation zero = op;
  zero.count = 0;
  EXPECT_EQ(ring.engine(0).Start("job-r", Algorithm::kRing, zero).code(),
            absl::StatusCode::kInvalidArgument);
  CollectiveOperation bad_root = op;
  bad_root.kind = CollectiveKind::kBroadcast;
  bad_root.root = 2;
  EXPECT_EQ(ring.engine(0).Start("job-r", Algorithm::kRing, bad_root).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ring.engine(0).Start("job-r", Algorithm::kRing, op).ok());
  EXPECT_EQ(ring.engine(0).Start("job-r", Algorithm::kRing, op).code(),
            absl::StatusCode::kAlreadyExists);
  ring.engine(0).RemoveJob("job-r");
  EXPECT_EQ(ring.engine(0).active_operations(), 0u);
}

// ---------------------------------------------------------------------------------------------
// Selector

TEST(SelectorTest, ModelThresholdsSplitSizesIntoRanges) {
  const CostModel model;
  const SelectorThresholds t8 = ModelThresholds(8, 0, model);
  // Halving-doubling wins small tensors at n = 8, ring the rest; no push/pull without servers.
  EXPECT_GT(t8.halving_doubling_below, 4u << 10);
  EXPECT_LT(t8.halving_doubling_below, 16u << 20);
  EXPECT_EQ(t8.push_pull_from, UINT64_MAX);
  EXPECT_EQ(Select(4 << 10, 8, t8), Algorithm::kHalvingDoubling);
  EXPECT_EQ(Select(64 << 20, 8, t8), Algorithm::kRing);
  // At the threshold the model's costs cross.
  const uint64_t m = t8.halving_doubling_below;
  EXPECT_LE(PredictSeconds(Algorithm::kHalvingDoubling, m - 1, 8, 0, model),
            PredictSeconds(Algorithm::kRing, m - 1, 8, 0, model));
  EXPECT_GE(PredictSeconds(Algorithm::kHalvingDoubling, m + 1, 8, 0, model),
            PredictSeconds(Algorithm::kRing, m + 1, 8, 0, model));
  // n = 2: both take 2 steps, ring pipelines its summation: always ring.
  EXPECT_EQ(ModelThresholds(2, 0, model).halving_doubling_below, 0u);
  EXPECT_EQ(Select(1, 2, ModelThresholds(2, 0, model)), Algorithm::kRing);
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
  t.halving_doubling_below = 1000;
  t.push_pull_from = 5000;
  EXPECT_EQ(Select(999, 4, t), Algorithm::kHalvingDoubling);
  EXPECT_EQ(Select(1000, 4, t), Algorithm::kRing);
  EXPECT_EQ(Select(4999, 4, t), Algorithm::kRing);
  EXPECT_EQ(Select(5000, 4, t), Algorithm::kPushPull);
  CollectiveOperation bcast;
  bcast.kind = CollectiveKind::kBroadcast;
  auto engine_only = [&](Algorithm a) { return CollectiveEngine::CanServe(a, bcast, 4); };
  EXPECT_EQ(*SelectServable(10, 4, t, engine_only), Algorithm::kRing);
  EXPECT_EQ(*SelectServable(9000, 4, t, engine_only), Algorithm::kRing);
  auto nothing = [](Algorithm) { return absl::UnimplementedError("no"); };
  EXPECT_EQ(SelectServable(10, 4, t, nothing).status().code(), absl::StatusCode::kUnimplemented);
}

// Worker 0 of a job with `workers` worker nodes (also servers) and `spares` spare servers, equal
// shares, on an in-process transport: enough to ask NodeCollectives which algorithm it picks.
class SelectorNode {
 public:
  SelectorNode() : transport_(network_.CreateEndpoint("w0")), reducer_(1) {}
  ~SelectorNode() { transport_->Shutdown(); }

  NodeCollectives& collectives() { return collectives_; }
  void SetAutoJob(const std::string& job_id, int workers, int spares) {
    JobView view;
    view.job_id = job_id;
    view.plan_version = 1;
    const int servers = workers + spares;
    for (int i = 0; i < servers; ++i) {
      if (i < workers) view.worker_addresses.push_back(absl::StrCat("w", i));
      view.server_addresses.push_back(i < workers ? absl::StrCat("w", i) : absl::StrCat("s", i));
      view.server_weights.push_back(ChunkMap::kWeightTotal / servers +
                                    (i == 0 ? ChunkMap::kWeightTotal % servers : 0));
    }
    view.my_worker_rank = 0;
    view.my_server_index = 0;
    collectives_.SetJob(view, AlgorithmChoice::kAuto);
  }

 private:
  InProcessNetwork network_;
  std::unique_ptr<Transport> transport_;
  CpuReducer reducer_;
  common::FakeClock clock_;
  PushPullNode node_{transport_.get(), &reducer_, &clock_};
  CollectiveEngine engine_{transport_.get(), &reducer_, &clock_};
  NodeCollectives collectives_{&node_, &engine_, &reducer_};
};

TEST(SelectorTest, NodeCollectivesFollowTheirCostModel) {
  // 4 worker nodes + 4 spare servers; a 500 Mbit/s NIC; the suite-fitted per-message cost.
  SelectorNode node;
  NodeCollectives& collectives = node.collectives();
  const CostModel model{.alpha_seconds = 200e-6,
                        .beta_seconds_per_byte = 1 / 62.5e6,
                        .gamma_seconds_per_byte = 1 / 4e9};
  collectives.SetCostModel(model);
  node.SetAutoJob("auto", 4, 4);
  const SelectorThresholds t = ModelThresholds(4, 4, model);
  // Push/pull's 14 messages cost 8 alpha more than ring's 6; at 500 Mbit/s it pays for them
  // from about 8 alpha / (0.5 beta) = 200 KB.
  EXPECT_GT(t.push_pull_from, 100u << 10);
  EXPECT_LT(t.push_pull_from, 400u << 10);
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

TEST(SelectorTest, MeasuredThresholdsFromTheSuitesCalibration) {
  absl::StatusOr<MeasuredThresholds> m = ParseSelectorCalibration(R"({
    "workers": 4, "rate_mbit": 500, "alpha_seconds": {"tributary ring": 0.00019},
    "ring_beats_halving_doubling_from": 524288,
    "push_pull_beats_ring_from": {"k=0": null, "k=2": 16777216, "k=4": 8388608}})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->ring_beats_halving_doubling_from, 524288u);
  EXPECT_EQ(m->push_pull_beats_ring_from.at(0), UINT64_MAX);
  // No spares: never push/pull; 3 spares: the k = 2 measurement; 8: the k = 4 one.
  EXPECT_EQ(MeasuredSelectorThresholds(*m, 4, 0).push_pull_from, UINT64_MAX);
  EXPECT_EQ(MeasuredSelectorThresholds(*m, 4, 3).push_pull_from, 16777216u);
  const SelectorThresholds t = MeasuredSelectorThresholds(*m, 4, 8);
  EXPECT_EQ(t.push_pull_from, 8388608u);
  EXPECT_EQ(Select(4 << 10, 4, t), Algorithm::kHalvingDoubling);
  EXPECT_EQ(Select(1 << 20, 4, t), Algorithm::kRing);
  EXPECT_EQ(Select(8 << 20, 4, t), Algorithm::kPushPull);
  EXPECT_EQ(MeasuredSelectorThresholds(*m, 2, 0).halving_doubling_below, 0u);  // n = 2: ring
  // Errors name the field.
  EXPECT_THAT(ParseSelectorCalibration("[1]").status().message(),
              ::testing::HasSubstr("not a JSON object"));
  EXPECT_THAT(
      ParseSelectorCalibration(R"({"ring_beats_halving_doubling_from": -1})").status().message(),
      ::testing::HasSubstr("ring_beats_halving_doubling_from must be"));
  EXPECT_THAT(
      ParseSelectorCalibration(R"({"push_pull_beats_ring_from": {"two": 5}})").status().message(),
      ::testing::HasSubstr("'two' is not k=N"));
}

TEST(SelectorTest, NodeCollectivesPreferMeasuredThresholds) {
  SelectorNode node;
  NodeCollectives& collectives = node.collectives();
  MeasuredThresholds m;
  m.ring_beats_halving_doubling_from = 1 << 20;
  m.push_pull_beats_ring_from = {{0, UINT64_MAX}, {2, 16 << 20}};
  collectives.SetMeasuredThresholds(m);
  node.SetAutoJob("measured", 4, 2);
  EXPECT_EQ(*collectives.AlgorithmFor("measured", 64 << 10), Algorithm::kHalvingDoubling);
  EXPECT_EQ(*collectives.AlgorithmFor("measured", 4 << 20), Algorithm::kRing);
  EXPECT_EQ(*collectives.AlgorithmFor("measured", 16 << 20), Algorithm::kPushPull);
}

}  // namespace
}  // namespace tributary::dataplane
