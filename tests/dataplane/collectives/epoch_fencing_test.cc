// Epoch fencing of push/pull and the engine (the job's plan version is its epoch): messages of
// another epoch are dropped and counted, never summed; an operation that straddles a plan switch
// fails on its participants with a retriable UNAVAILABLE carrying its epoch; a retry of the same
// iteration on the new plan is exact. N nodes in one process over the in-process transport, with
// a FakeClock that moves only when a test says so.
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "dataplane/collectives/data_plane_node.h"
#include "dataplane/schedule/chunk_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/cluster_harness.h"
#include "tests/util/typed_values.h"

namespace tributary::dataplane {
namespace {

using common::DataType;
using testing::Await;
using testing::Cluster;
using testing::ClusterOptions;
using testing::GetValue;
using ::testing::HasSubstr;
using testing::MakeOp;
using ::testing::Not;
using testing::PutValue;

constexpr uint64_t kCount = 3000;  // float32: several chunks per server at 1 KiB

// 3 workers (every one also a server) + 1 spare server, push/pull, plan v7.
ClusterOptions Job(int workers = 3, int spares = 1) {
  ClusterOptions o;
  o.workers = workers;
  o.spare_servers = spares;
  o.job_id = "job-f";
  o.plan_version = 7;
  o.algorithm = Algorithm::kPushPull;
  o.partition_bytes = 1024;
  o.credit_bytes = 1 << 20;
  return o;
}

// Node `i`'s view of plan `version` served by the first `servers` nodes, equal weights.
JobView PlanOf(const Cluster& cluster, int i, uint64_t version, int servers) {
  JobView v = cluster.ViewOf(i);
  v.plan_version = version;
  v.server_addresses.resize(servers);
  v.server_weights.assign(servers, ChunkMap::kWeightTotal / servers);
  v.server_weights[0] += ChunkMap::kWeightTotal % servers;
  v.my_server_index = i < servers ? i : -1;
  return v;
}

// Rank r's input: (r + 1) * (i % 7 + 1); the sum over n ranks is exact in float32.
void Refill(std::vector<std::vector<std::byte>>& b, int rank) {
  for (uint64_t i = 0; i < kCount; ++i) {
    PutValue(DataType::kFloat32, b[0].data(), i, (rank + 1.0) * (i % 7 + 1));
  }
}
std::vector<std::vector<std::byte>> Input(int rank) {
  std::vector<std::vector<std::byte>> b(1, std::vector<std::byte>(kCount * 4));
  Refill(b, rank);
  return b;
}

int64_t Wrong(const std::vector<std::vector<std::byte>>& b, int n) {
  int64_t wrong = 0;
  for (uint64_t i = 0; i < kCount; ++i) {
    wrong += GetValue(DataType::kFloat32, b[0].data(), i) != n * (n + 1) / 2.0 * (i % 7 + 1);
  }
  return wrong;
}

uint64_t Fenced(Cluster& cluster) {
  uint64_t n = 0;
  for (int i = 0; i < cluster.size(); ++i) {
    n += cluster.node(i).push_pull().stats().fenced_messages.load();
  }
  return n;
}

// Waits (bounded) for another thread's delivery to show in a counter.
bool Eventually(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

void ExpectPlanChanged(const absl::Status& s, uint64_t from, uint64_t to) {
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("plan of job job-f changed from v", from, " to v",
                                                  to, " during ")));
  EXPECT_THAT(s.message(), HasSubstr("; retry"));
  EXPECT_THAT(s.message(), Not(HasSubstr("disagree")));
  EXPECT_EQ(EpochOf(s), from) << s;
}

// Every worker runs iteration `iteration` on its current plan; all must be exact.
void RunExact(Cluster& cluster, int n, uint64_t iteration) {
  std::vector<std::vector<std::vector<std::byte>>> b;
  for (int r = 0; r < n; ++r) b.push_back(Input(r));
  std::vector<std::future<absl::Status>> f;
  for (int r = 0; r < n; ++r) {
    f.push_back(cluster.Start(
        r, MakeOp("grad", iteration, DataType::kFloat32, kCount, Reduction::kSum, b[r])));
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(Await(f[r]).ok()) << "rank " << r;
    EXPECT_EQ(Wrong(b[r], n), 0) << "rank " << r;
  }
}

TEST(EpochFencing, StragglerOnAnOldEpochIsFencedAndFailsRetriableThenItsRetryIsExact) {
  Cluster cluster(Job());
  // Every node but worker 0 has moved on to v8 (same servers).
  for (int i = 1; i < cluster.size(); ++i) cluster.SetJob(i, PlanOf(cluster, i, 8, 4));
  std::vector<std::vector<std::vector<std::byte>>> b;
  for (int r = 0; r < 3; ++r) b.push_back(Input(r));
  std::vector<std::future<absl::Status>> f;
  for (int r = 0; r < 3; ++r) {
    f.push_back(
        cluster.Start(r, MakeOp("grad", 5, DataType::kFloat32, kCount, Reduction::kSum, b[r])));
  }
  // Worker 0 pushed with v7: the v8 servers fence its pushes and tell it; nothing is summed.
  absl::Status straggler = Await(f[0]);  // the fake clock never moves: no deadline fires
  ExpectPlanChanged(straggler, 7, 8);
  EXPECT_GT(Fenced(cluster), 0u);
  EXPECT_EQ(f[1].wait_for(std::chrono::milliseconds(20)), std::future_status::timeout);
  // Worker 0 gets v8 (its own server fails what it accumulated under v7, telling everyone: the
  // v8 operations fence that error) and runs iteration 5 again from its original inputs.
  cluster.SetJob(0, PlanOf(cluster, 0, 8, 4));
  Refill(b[0], 0);  // the original inputs
  auto retry =
      cluster.Start(0, MakeOp("grad", 5, DataType::kFloat32, kCount, Reduction::kSum, b[0]));
  EXPECT_TRUE(Await(retry).ok());
  for (int r = 1; r < 3; ++r) EXPECT_TRUE(Await(f[r]).ok()) << "rank " << r;
  for (int r = 0; r < 3; ++r) EXPECT_EQ(Wrong(b[r], 3), 0) << "rank " << r;  // nothing twice
  RunExact(cluster, 3, 6);
}

TEST(EpochFencing, OperationStraddlingAServersPlanSwitchFailsRetriableOnEveryWorker) {
  Cluster cluster(Job());
  std::vector<std::vector<std::vector<std::byte>>> b;
  for (int r = 0; r < 3; ++r) b.push_back(Input(r));
  std::vector<std::future<absl::Status>> f;
  for (int r = 0; r < 2; ++r) {  // worker 2 is late
    f.push_back(
        cluster.Start(r, MakeOp("grad", 0, DataType::kFloat32, kCount, Reduction::kSum, b[r])));
  }
  // The spare switches to v8 while its chunks of iteration 0 still accumulate under v7.
  ASSERT_TRUE(
      Eventually([&] { return cluster.node(3).push_pull().stats().pushes_received.load() >= 2; }));
  cluster.SetJob(3, PlanOf(cluster, 3, 8, 4));
  for (int r = 0; r < 2; ++r) ExpectPlanChanged(Await(f[r]), 7, 8);
  // The late worker's v7 pushes are fenced at the spare: it fails the same way.
  f.push_back(
      cluster.Start(2, MakeOp("grad", 0, DataType::kFloat32, kCount, Reduction::kSum, b[2])));
  ExpectPlanChanged(Await(f[2]), 7, 8);
  EXPECT_GT(cluster.node(3).push_pull().stats().plan_change_failures.load(), 0u);
  // Everyone on v8: iteration 0 again, exact.
  for (int i = 0; i < 3; ++i) cluster.SetJob(i, PlanOf(cluster, i, 8, 4));
  RunExact(cluster, 3, 0);
}

TEST(EpochFencing, LostServerFailsItsWaitersRetriableAndItsLateSumsAreFenced) {
  Cluster cluster(Job());
  // The spare hangs (SIGSTOP): what is sent to it is held.
  cluster.network().SetFrozen("node-3", true);
  std::vector<std::vector<std::vector<std::byte>>> b;
  for (int r = 0; r < 3; ++r) b.push_back(Input(r));
  std::vector<std::future<absl::Status>> f;
  for (int r = 0; r < 3; ++r) {
    f.push_back(
        cluster.Start(r, MakeOp("grad", 0, DataType::kFloat32, kCount, Reduction::kSum, b[r])));
  }
  // Servers 0..2 complete their chunks (each sum sent to the 3 workers); the spare's never.
  auto map = ChunkMap::Create(cluster.view().server_weights);
  ASSERT_TRUE(map.ok());
  const uint32_t chunks = PushPullChunks(kCount, 4, 1024, 4);
  uint64_t owned = 0;
  for (uint32_t c = 0; c < chunks; ++c)
    owned += map->ServerOf(common::StableHash64("grad"), chunks, c) != 3;
  ASSERT_GT(owned, 0u);
  ASSERT_LT(owned, chunks);
  ASSERT_TRUE(Eventually([&] {
    uint64_t sent = 0;
    for (int i = 0; i < 3; ++i) sent += cluster.node(i).push_pull().stats().results_sent.load();
    return sent == owned * 3;
  }));
  // The controller re-plans without it (v8, servers 0..2): every worker's operation, which
  // waits on it, fails at once, retriable, naming it.
  for (int i = 0; i < 3; ++i) cluster.SetJob(i, PlanOf(cluster, i, 8, 3));
  for (int r = 0; r < 3; ++r) {
    absl::Status s = Await(f[r]);
    ExpectPlanChanged(s, 7, 8);
    EXPECT_THAT(s.message(), HasSubstr("summation server node-3 left the plan"));
  }
  // Workers 0 and 1 retry iteration 0 on v8 (worker 2 not yet, so theirs stay open); then the
  // spare wakes up with its v7 plan, sums what it held and serves it: the v7 sums reach
  // operations of v8 and are fenced, never written.
  for (int r = 0; r < 3; ++r) Refill(b[r], r);
  std::vector<std::future<absl::Status>> retry;
  for (int r = 0; r < 2; ++r) {
    retry.push_back(
        cluster.Start(r, MakeOp("grad", 0, DataType::kFloat32, kCount, Reduction::kSum, b[r])));
  }
  const uint64_t fenced_before = Fenced(cluster);
  cluster.network().SetFrozen("node-3", false);
  ASSERT_TRUE(Eventually([&] {
    return cluster.node(0).push_pull().stats().fenced_messages.load() > 0 &&
           cluster.node(1).push_pull().stats().fenced_messages.load() > 0;
  }));
  EXPECT_GT(Fenced(cluster), fenced_before);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(retry[r].wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  }
  retry.push_back(
      cluster.Start(2, MakeOp("grad", 0, DataType::kFloat32, kCount, Reduction::kSum, b[2])));
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(Await(retry[r]).ok()) << "rank " << r;
    EXPECT_EQ(Wrong(b[r], 3), 0) << "rank " << r;
  }
}

// A header for a message from a server (or injected as one) about iteration `it` of "grad".
WireHeader FromServer(MessageKind kind, uint64_t epoch, uint64_t it) {
  WireHeader h;
  h.kind = static_cast<uint8_t>(kind);
  h.dtype = static_cast<uint8_t>(DataType::kFloat32);
  h.reduce = static_cast<uint8_t>(Reduction::kSum);
  h.algorithm = static_cast<uint8_t>(Algorithm::kPushPull);
  h.job = common::StableHash64("job-f");
  h.tensor = common::StableHash64("grad");
  h.iteration = it;
  h.plan_version = epoch;
  h.tensor_count = kCount;
  h.num_chunks = 1;
  h.chunk_count = kCount;
  h.sender = WireHeader::kFromServer;
  return h;
}

TEST(EpochFencing, LateResultAndErrorOfAnOldEpochNeverReachARetriedOperation) {
  ClusterOptions o = Job(2, 0);
  o.plan_version = 8;  // the retry's plan
  Cluster cluster(o);
  std::vector<std::vector<std::vector<std::byte>>> b = {Input(0), Input(1)};
  auto f0 = cluster.Start(0, MakeOp("grad", 3, DataType::kFloat32, kCount, Reduction::kSum, b[0]));
  // A sum and an error of iteration 3's earlier attempt under v7 arrive late.
  std::vector<std::byte> garbage(kCount * 4, std::byte{0x7f});
  const WireHeader result = FromServer(MessageKind::kResult, 7, 3);
  cluster.network().Inject("node-0", AsBytes(result), garbage);
  WireHeader error = FromServer(MessageKind::kError, 7, 3);
  error.error_code = static_cast<uint32_t>(absl::StatusCode::kUnavailable);
  const std::string msg = "old attempt failed";
  cluster.network().Inject("node-0", AsBytes(error),
                           {reinterpret_cast<const std::byte*>(msg.data()), msg.size()});
  ASSERT_TRUE(
      Eventually([&] { return cluster.node(0).push_pull().stats().fenced_messages.load() == 2; }));
  EXPECT_EQ(f0.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  EXPECT_EQ(cluster.node(0).malformed_messages(), 0u);
  auto f1 = cluster.Start(1, MakeOp("grad", 3, DataType::kFloat32, kCount, Reduction::kSum, b[1]));
  EXPECT_TRUE(Await(f0).ok());
  EXPECT_TRUE(Await(f1).ok());
  EXPECT_EQ(Wrong(b[0], 2), 0);
  EXPECT_EQ(Wrong(b[1], 2), 0);
}

TEST(EpochFencing, DuplicatePushIsDroppedAndNeverSummedTwice) {
  // Worker 0 is a raw endpoint (pushes injected by hand), worker 1 a real node, one server.
  InProcessNetwork network;
  auto w0 = network.CreateEndpoint("w0");
  std::atomic<int> results{0};
  w0->SetReceiveHandler([&](std::span<const std::byte>, std::span<const std::byte>) { results++; });
  auto w1_ep = network.CreateEndpoint("w1");
  auto s_ep = network.CreateEndpoint("s");
  CpuReducer reducer(1, 1 << 20);
  common::FakeClock clock;
  DataPlaneNode w1(w1_ep.get(), &reducer, &clock);
  DataPlaneNode server(s_ep.get(), &reducer, &clock);
  JobView v;
  v.job_id = "job-f";
  v.plan_version = 7;
  v.worker_addresses = {"w0", "w1"};
  v.server_addresses = {"s"};
  v.server_weights = {ChunkMap::kWeightTotal};
  v.partition_bytes = uint64_t{1} << 20;  // one chunk
  v.my_worker_rank = 1;
  w1.SetJob(v, Algorithm::kPushPull);
  v.my_worker_rank = -1;
  v.my_server_index = 0;
  server.SetJob(v, Algorithm::kPushPull);
  ASSERT_EQ(PushPullChunks(kCount, 4, v.partition_bytes, 1), 1u);

  WireHeader push = FromServer(MessageKind::kPush, 7, 0);
  push.sender = 0;
  const std::vector<std::vector<std::byte>> in0 = Input(0);
  network.Inject("s", AsBytes(push), in0[0]);
  network.Inject("s", AsBytes(push), in0[0]);  // again: a duplicate
  ASSERT_TRUE(Eventually([&] { return server.push_pull().stats().duplicate_pushes.load() == 1; }));
  std::vector<std::vector<std::byte>> b1 = Input(1);
  std::promise<absl::Status> done;
  auto op = MakeOp("grad", 0, DataType::kFloat32, kCount, Reduction::kSum, b1);
  op.done = [&](absl::Status s) { done.set_value(s); };
  ASSERT_TRUE(w1.Start("job-f", std::move(op)).ok());
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_TRUE(f.get().ok());
  EXPECT_EQ(Wrong(b1, 2), 0);  // 1x + 2x, not 1x + 1x + 2x
  ASSERT_TRUE(Eventually([&] { return results.load() == 1; }));
  w0->Shutdown();
  w1_ep->Shutdown();
  s_ep->Shutdown();
}

TEST(EpochFencing, RingRanksOnDifferentPlansFailRetriableNotAsADisagreement) {
  ClusterOptions o = Job(3, 0);
  o.algorithm = Algorithm::kRing;
  Cluster cluster(o);
  cluster.SetJob(2, PlanOf(cluster, 2, 8, 3));
  std::vector<std::vector<std::vector<std::byte>>> b;
  for (int r = 0; r < 3; ++r) b.push_back(Input(r));
  std::vector<std::future<absl::Status>> f;
  for (int r = 0; r < 3; ++r) {
    f.push_back(
        cluster.Start(r, MakeOp("grad", 0, DataType::kFloat32, kCount, Reduction::kSum, b[r])));
  }
  for (int r = 0; r < 3; ++r) {
    absl::Status s = Await(f[r]);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << "rank " << r << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("changed from v7 to v8"));
    EXPECT_THAT(s.message(), Not(HasSubstr("disagree")));
  }
  uint64_t fenced = 0;
  for (int r = 0; r < 3; ++r) fenced += cluster.node(r).engine().stats().fenced_messages.load();
  EXPECT_GT(fenced, 0u);
}

TEST(EpochFencing, ANewGenerationReusesIterationNumbersWithoutTheOldOnesTombstones) {
  // Generation 0: ring iterations 0 and 1 complete; iteration 2 fails (rank 2 aborts it).
  ClusterOptions o = Job(3, 0);
  o.algorithm = Algorithm::kRing;
  Cluster cluster(o);
  auto run = [&](uint64_t iteration) {
    std::vector<std::vector<std::vector<std::byte>>> b;
    for (int r = 0; r < 3; ++r) b.push_back(Input(r));
    std::vector<std::future<absl::Status>> f;
    for (int r = 0; r < 3; ++r) {
      f.push_back(cluster.Start(
          r, MakeOp("grad", iteration, DataType::kFloat32, kCount, Reduction::kSum, b[r])));
    }
    for (int r = 0; r < 3; ++r) {
      absl::Status s = Await(f[r]);
      EXPECT_TRUE(s.ok()) << "iteration " << iteration << " rank " << r << ": " << s;
      EXPECT_EQ(Wrong(b[r], 3), 0);
    }
  };
  run(0);
  run(1);
  cluster.node(2).Abort("job-f", "grad", 2, absl::AbortedError("local rank 1 ended"));

  // Generation 1 (plan v8): the processes count from 0 again. Rank 0 gets the plan and starts
  // first, so its messages reach ranks that still run v7 and hold v7's tombstones of the same
  // numbers: they must wait as early messages, not be dropped as late ones.
  for (int r = 0; r < 3; ++r) {
    JobView v = cluster.ViewOf(r);
    v.plan_version = 8;
    v.generation = 1;
    if (r == 0) cluster.SetJob(r, v);
  }
  std::vector<std::vector<std::vector<std::byte>>> b;
  for (int r = 0; r < 3; ++r) b.push_back(Input(r));
  std::vector<std::future<absl::Status>> f;
  f.push_back(
      cluster.Start(0, MakeOp("grad", 0, DataType::kFloat32, kCount, Reduction::kSum, b[0])));
  for (int r = 1; r < 3; ++r) {
    JobView v = cluster.ViewOf(r);
    v.plan_version = 8;
    v.generation = 1;
    cluster.SetJob(r, v);
    f.push_back(
        cluster.Start(r, MakeOp("grad", 0, DataType::kFloat32, kCount, Reduction::kSum, b[r])));
  }
  for (int r = 0; r < 3; ++r) {
    absl::Status s = Await(f[r]);
    EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s;
    EXPECT_EQ(Wrong(b[r], 3), 0);
  }
  run(1);
  run(2);  // generation 0's aborted iteration 2 does not fail generation 1's
}

}  // namespace
}  // namespace tributary::dataplane
