// Peer recovery of push/pull (the "fan-out hole", allreduce_push_pull.h kDefaultRetainBytes): a
// summation server that died part-way through sending a chunk's sum leaves the collective
// complete on some workers; the others complete it from a copy of the sums instead of retrying
// an iteration the complete ones have left. 3 workers (every one also a server) + 1 spare in one
// process over the in-process transport, with a FakeClock that moves only when a test says so.
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/buffer_pool.h"
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
using testing::PutValue;

constexpr uint64_t kRecoveryCount = 3000;  // float32: at most 4 chunks per server at 1 KiB
// More chunks per server than a worker pushes ahead of their sums (kPushPullAhead).
constexpr uint64_t kBigCount = 30000;

ClusterOptions RecoveryJob() {
  ClusterOptions o;
  o.workers = 3;
  o.spare_servers = 1;  // node-3
  o.job_id = "job-r";
  o.plan_version = 7;
  o.algorithm = Algorithm::kPushPull;
  o.partition_bytes = 1024;
  o.credit_bytes = 1 << 20;
  return o;
}

// Node `i`'s view of plan v8: the spare left, nodes 0..2 serve.
JobView WithoutTheSpare(const Cluster& cluster, int i) {
  JobView v = cluster.ViewOf(i);
  v.plan_version = 8;
  v.server_addresses.resize(3);
  v.server_weights.assign(3, ChunkMap::kWeightTotal / 3);
  v.server_weights[0] += ChunkMap::kWeightTotal % 3;
  v.my_server_index = i < 3 ? i : -1;
  return v;
}

// Rank r's input: (r + 1) * (i % 7 + 1); the sum over 3 ranks is exact in float32.
std::vector<std::vector<std::byte>> RecoveryInput(int rank, uint64_t count = kRecoveryCount) {
  std::vector<std::vector<std::byte>> b(1, std::vector<std::byte>(count * 4));
  for (uint64_t i = 0; i < count; ++i) {
    PutValue(DataType::kFloat32, b[0].data(), i, (rank + 1.0) * (i % 7 + 1));
  }
  return b;
}

int64_t Wrong(const std::vector<std::vector<std::byte>>& b) {
  int64_t wrong = 0;
  for (uint64_t i = 0; i < b[0].size() / 4; ++i) {
    wrong += GetValue(DataType::kFloat32, b[0].data(), i) != 6.0 * (i % 7 + 1);
  }
  return wrong;
}

bool RecoveryEventually(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

const PushPullStats& Stats(Cluster& cluster, int i) { return cluster.node(i).push_pull().stats(); }

// Worker 1 comes to hold exactly `bytes` of kept sums (a completed operation's state
// can outlive its caller's Await by a moment on the engine's thread).
void ExpectWorkerOneHolds(Cluster& cluster, uint64_t bytes) {
  EXPECT_TRUE(RecoveryEventually([&] {
    return Stats(cluster, 1).worker_retained_bytes.load() == bytes;
  })) << Stats(cluster, 1).worker_retained_bytes.load()
      << " bytes held, expected " << bytes;
}

// The chunks of "grad" the spare owns under plan v7.
uint64_t SpareChunks(const Cluster& cluster) {
  auto map = ChunkMap::Create(cluster.view().server_weights);
  const uint32_t chunks = PushPullChunks(kRecoveryCount, 4, 1024, 4);
  uint64_t owned = 0;
  for (uint32_t c = 0; c < chunks; ++c) {
    owned += map->ServerOf(common::StableHash64("grad"), chunks, c) == 3;
  }
  return owned;
}

// The servers' share of "grad" (every chunk but the spare's) has been summed and sent to all 3.
bool WorkerServersDone(Cluster& cluster) {
  uint64_t sent = 0;
  for (int i = 0; i < 3; ++i) sent += Stats(cluster, i).results_sent.load();
  return sent == (PushPullChunks(kRecoveryCount, 4, 1024, 4) - SpareChunks(cluster)) * 3;
}

// Pushes received by the servers on the worker nodes (0..2) so far.
uint64_t PushesAtWorkerServers(Cluster& cluster) {
  uint64_t n = 0;
  for (int i = 0; i < 3; ++i) n += Stats(cluster, i).pushes_received.load();
  return n;
}

struct Iteration {
  std::vector<std::vector<std::vector<std::byte>>> buffers;
  std::vector<std::future<absl::Status>> done;
};

// Starts iteration `iteration` of "grad" on the given workers.
void Start(Cluster& cluster, Iteration& run, std::vector<int> ranks, uint64_t iteration = 0,
           uint64_t count = kRecoveryCount) {
  if (run.buffers.empty()) {
    for (int r = 0; r < 3; ++r) run.buffers.push_back(RecoveryInput(r, count));
    run.done.resize(3);
  }
  for (int r : ranks) {
    run.done[r] = cluster.Start(
        r, MakeOp("grad", iteration, DataType::kFloat32, count, Reduction::kSum, run.buffers[r]));
  }
}

bool Pending(std::future<absl::Status>& f) {
  return f.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout;
}

void ExpectRetriable(const absl::Status& s) {
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("plan of job job-r changed from v7 to v8"));
  EXPECT_EQ(EpochOf(s), 7u) << s;
}

// Every worker runs iteration `iteration` on plan v8: exact everywhere.
void RunExactOnV8(Cluster& cluster, uint64_t iteration) {
  Iteration run;
  Start(cluster, run, {0, 1, 2}, iteration);
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(Await(run.done[r]).ok()) << "rank " << r;
    EXPECT_EQ(Wrong(run.buffers[r]), 0) << "rank " << r;
  }
}

TEST(PeerRecovery, WorkerTheDeadSpareNeverReachedCompletesFromAPeersCopyOnTheReplan) {
  Cluster cluster(RecoveryJob());
  const uint64_t spare_chunks = SpareChunks(cluster);
  ASSERT_GT(spare_chunks, 0u);
  // The spare sends its sums to workers 1 and 2, then dies before worker 0's arrive.
  cluster.network().SetCut("node-3", "node-0", true);
  Iteration run;
  Start(cluster, run, {0, 1, 2});
  for (int r : {1, 2}) {
    EXPECT_TRUE(Await(run.done[r]).ok()) << "rank " << r;
    EXPECT_EQ(Wrong(run.buffers[r]), 0) << "rank " << r;
  }
  ASSERT_TRUE(RecoveryEventually(
      [&] { return Stats(cluster, 3).results_sent.load() == spare_chunks * 3; }));
  EXPECT_TRUE(Pending(run.done[0]));
  // Workers 1 and 2 keep their sums (one tensor's worth each) for peer recovery.
  EXPECT_EQ(Stats(cluster, 1).worker_retained_bytes.load(), kRecoveryCount * 4);
  // The controller re-plans without the spare. Worker 0, which waited on it with every chunk
  // pushed, asks the others instead of failing: it completes with the same sum, no retry.
  for (int i = 0; i < 3; ++i) cluster.SetJob(i, WithoutTheSpare(cluster, i));
  EXPECT_TRUE(Await(run.done[0]).ok());
  EXPECT_EQ(Wrong(run.buffers[0]), 0);
  EXPECT_EQ(Stats(cluster, 0).peer_recoveries_started.load(), 1u);
  EXPECT_EQ(Stats(cluster, 0).peer_recoveries.load(), 1u);
  EXPECT_EQ(Stats(cluster, 0).plan_change_failures.load(), 1u);  // it would have, before
  EXPECT_EQ(Stats(cluster, 0).ops_failed.load(), 0u);
  // One of them sent the chunks it missed (the spare's), once.
  EXPECT_EQ(
      Stats(cluster, 1).peer_chunks_served.load() + Stats(cluster, 2).peer_chunks_served.load(),
      spare_chunks);
  // Everyone is on the same iteration: the next one runs on the new plan as usual.
  RunExactOnV8(cluster, 1);
}

TEST(PeerRecovery, WorkerPastItsDeadlineWithoutAReplanCompletesFromAPeersCopy) {
  // A frozen spare that reached only some workers, before the controller notices: worker 0's
  // deadline passes first.
  Cluster cluster(RecoveryJob());
  cluster.network().SetCut("node-3", "node-0", true);
  Iteration run;
  Start(cluster, run, {0, 1, 2});
  for (int r : {1, 2}) EXPECT_TRUE(Await(run.done[r]).ok()) << "rank " << r;
  ASSERT_TRUE(RecoveryEventually(
      [&] { return Stats(cluster, 3).results_sent.load() == SpareChunks(cluster) * 3; }));
  cluster.clock().Advance(std::chrono::seconds(6));
  cluster.node(0).push_pull().worker().ExpireStale();
  EXPECT_TRUE(Await(run.done[0]).ok());
  EXPECT_EQ(Wrong(run.buffers[0]), 0);
  EXPECT_EQ(Stats(cluster, 0).peer_recoveries.load(), 1u);
}

TEST(PeerRecovery, WhenNoWorkerHasTheSumsEveryOneFailsRetriableAndTheRetryIsExact) {
  Cluster cluster(RecoveryJob());
  cluster.network().SetFrozen("node-3", true);  // nobody gets the spare's sums
  Iteration run;
  Start(cluster, run, {0, 1, 2});
  // The workers' own servers finish their chunks (else their plan-change verdict, shared by
  // every worker, fails the collective before anyone asks).
  ASSERT_TRUE(RecoveryEventually([&] { return WorkerServersDone(cluster); }));
  // Each worker asks the others, each of which has nothing to give: all fail, retriable.
  for (int i = 0; i < 3; ++i) cluster.SetJob(i, WithoutTheSpare(cluster, i));
  for (int r = 0; r < 3; ++r) {
    absl::Status s = Await(run.done[r]);
    ExpectRetriable(s);
    EXPECT_THAT(s.message(), HasSubstr("summation server node-3 left the plan"));
    EXPECT_EQ(Stats(cluster, r).peer_recoveries_started.load(), 1u);
    EXPECT_EQ(Stats(cluster, r).peer_recoveries.load(), 0u);
  }
  RunExactOnV8(cluster, 0);
}

TEST(PeerRecovery, PeerStillWaitingAnswersWhenItsOwnAttemptCompletes) {
  Cluster cluster(RecoveryJob());
  cluster.network().SetFrozen("node-3", true);  // the spare hangs with everyone's pushes
  Iteration run;
  Start(cluster, run, {0, 1, 2});
  ASSERT_TRUE(RecoveryEventually([&] { return WorkerServersDone(cluster); }));
  // Worker 0 learns of a plan without the spare first; workers 1 and 2 still wait on it, so
  // they answer worker 0 only once their own attempt ends.
  cluster.node(0).push_pull().worker().SetJob(WithoutTheSpare(cluster, 0));
  ASSERT_TRUE(
      RecoveryEventually([&] { return Stats(cluster, 0).peer_recoveries_started.load() == 1; }));
  EXPECT_TRUE(Pending(run.done[0]));
  // The spare wakes and sends its sums, which reach workers 1 and 2 only.
  cluster.network().SetCut("node-3", "node-0", true);
  cluster.network().SetFrozen("node-3", false);
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(Await(run.done[r]).ok()) << "rank " << r;
    EXPECT_EQ(Wrong(run.buffers[r]), 0) << "rank " << r;
  }
  EXPECT_EQ(Stats(cluster, 0).peer_recoveries.load(), 1u);
}

TEST(PeerRecovery, WorkerThatGaveUpBeforeItsPeersCompletedRecoversWhenItsRetryTimesOut) {
  Cluster cluster(RecoveryJob());
  Iteration run;
  Start(cluster, run, {0});  // workers 1 and 2 have not reached iteration 0 yet
  // Worker 0 alone learns that the spare left; nobody has the sums, so it fails, retriable.
  cluster.node(0).push_pull().worker().SetJob(WithoutTheSpare(cluster, 0));
  ExpectRetriable(Await(run.done[0]));
  // Its pushes still sit at the v7 servers, the spare included: workers 1 and 2 complete
  // iteration 0 under v7 (worker 0's copy of the sums is fenced).
  Start(cluster, run, {1, 2});
  for (int r : {1, 2}) {
    EXPECT_TRUE(Await(run.done[r]).ok()) << "rank " << r;
    EXPECT_EQ(Wrong(run.buffers[r]), 0) << "rank " << r;
  }
  // Everyone moves to v8 and worker 0 retries iteration 0, which workers 1 and 2 never push
  // again: the servers time it out naming them, and worker 0 asks them for the sums.
  for (int i = 0; i < 4; ++i) cluster.SetJob(i, WithoutTheSpare(cluster, i));
  auto pushes = [&] { return PushesAtWorkerServers(cluster); };
  const uint64_t before = pushes();
  run.buffers[0] = RecoveryInput(0);
  Start(cluster, run, {0});
  ASSERT_TRUE(RecoveryEventually(
      [&] { return pushes() == before + PushPullChunks(kRecoveryCount, 4, 1024, 3); }));
  cluster.clock().Advance(std::chrono::milliseconds(5100));
  for (int i = 0; i < 3; ++i) cluster.node(i).push_pull().server().ExpireStale();
  EXPECT_TRUE(Await(run.done[0]).ok());
  EXPECT_EQ(Wrong(run.buffers[0]), 0);
  EXPECT_EQ(Stats(cluster, 0).peer_recoveries.load(), 1u);
  RunExactOnV8(cluster, 1);
}

TEST(PeerRecovery, RetryHoldingBackMostOfItsChunksFetchesThemAllFromAPeer) {
  // A tensor with more chunks per server than a worker pushes ahead of their sums: a retry
  // whose peers completed earlier pushes only the first few of each server's share, gets no sums
  // back, and holds the rest. Here every worker completed iteration 0 under v7; worker 0 then
  // runs it again under v8 (as its agent would had it not seen that outcome).
  Cluster cluster(RecoveryJob());
  Iteration first;
  Start(cluster, first, {0, 1, 2}, 0, kBigCount);
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(Await(first.done[r]).ok()) << "rank " << r;
    EXPECT_EQ(Wrong(first.buffers[r]), 0) << "rank " << r;
  }
  for (int i = 0; i < 4; ++i) cluster.SetJob(i, WithoutTheSpare(cluster, i));
  auto pushes = [&] { return PushesAtWorkerServers(cluster); };
  const uint64_t before = pushes();
  Iteration retry;
  Start(cluster, retry, {0}, 0, kBigCount);
  ASSERT_TRUE(RecoveryEventually([&] { return pushes() == before + 3 * kPushPullAhead; }));
  cluster.clock().Advance(std::chrono::milliseconds(5100));
  for (int i = 0; i < 3; ++i) cluster.node(i).push_pull().server().ExpireStale();
  EXPECT_TRUE(Await(retry.done[0]).ok());
  EXPECT_EQ(Wrong(retry.buffers[0]), 0);
  EXPECT_EQ(Stats(cluster, 0).peer_recoveries.load(), 1u);
  // Every chunk came from the one peer it fetched from: those pushed and those held back.
  EXPECT_EQ(
      Stats(cluster, 1).peer_chunks_served.load() + Stats(cluster, 2).peer_chunks_served.load(),
      PushPullChunks(kBigCount, 4, 1024, 3));
}

// Runs collective `iteration` of `tensor` (`count` elements) on every worker; every element exact.
void RunExact(Cluster& cluster, const std::string& tensor, uint64_t iteration, uint64_t count) {
  Iteration run;
  for (int r = 0; r < 3; ++r) {
    run.buffers.push_back(RecoveryInput(r, count));
    run.done.push_back(cluster.Start(
        r, MakeOp(tensor, iteration, DataType::kFloat32, count, Reduction::kSum, run.buffers[r])));
  }
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(Await(run.done[r]).ok()) << tensor << " " << iteration << " rank " << r;
    EXPECT_EQ(Wrong(run.buffers[r]), 0) << tensor << " " << iteration << " rank " << r;
  }
}

// The sums a later collective of their tensor replaced go back to the process's buffer pool
// (common/buffer_pool.h), and the next collective of their size class, whatever its tensor
// (tensor fusion's collectives take 64 names in turn), writes its copy into them: after "a"
// twice and "b" once, every worker holds a's and b's kept sums, and b's are a's first ones.
TEST(PeerRecovery, ReplacedSumsServeTheNextCollectiveOfTheirSize) {
  Cluster cluster(RecoveryJob());
  RunExact(cluster, "a", 0, kBigCount);
  const common::BufferPool::Stats before = common::BufferPool::Process().stats();
  RunExact(cluster, "a", 1, kBigCount);  // a copy per worker, none kept to take yet
  const common::BufferPool::Stats middle = common::BufferPool::Process().stats();
  EXPECT_EQ(middle.allocated - before.allocated, 3u);
  EXPECT_EQ(middle.reused - before.reused, 0u);
  EXPECT_GE(middle.kept_buffers, 3u);          // a's iteration-0 copies, replaced
  RunExact(cluster, "b", 0, kBigCount - 100);  // the same size class
  const common::BufferPool::Stats after = common::BufferPool::Process().stats();
  EXPECT_EQ(after.allocated - middle.allocated, 0u);
  EXPECT_EQ(after.reused - middle.reused, 3u);
  // Held as their size class: 120,000 and 119,600 bytes each in a 128 KiB buffer.
  ExpectWorkerOneHolds(cluster, 2 * common::BufferPool::ClassBytes(kBigCount * 4));
  EXPECT_EQ(common::BufferPool::ClassBytes(kBigCount * 4), uint64_t{128} << 10);
}

// A tensor whose size changes at every collective holds only its last sums.
TEST(PeerRecovery, ReplacedSumsAreNotHeld) {
  Cluster cluster(RecoveryJob());
  constexpr uint64_t kCollectives = 10;
  for (uint64_t k = 0; k < kCollectives; ++k) RunExact(cluster, "f", k, kRecoveryCount + k);
  ExpectWorkerOneHolds(cluster, (kRecoveryCount + kCollectives - 1) * 4);
}

// Kept sums of a tensor that never comes again (DDP's buckets before it rebuilds them) go
// RetainedLifetime after their collective completed, 2 minutes at this job's 5 s op timeout;
// those of a later collective stay their own lifetime.
TEST(PeerRecovery, KeptSumsOfATensorThatNeverComesAgainExpire) {
  EXPECT_EQ(RetainedLifetime(std::chrono::seconds(5)), std::chrono::minutes(2));
  // 8 x (60 s + WorkerGrace, at most 5 s).
  EXPECT_EQ(RetainedLifetime(std::chrono::seconds(60)), std::chrono::seconds(520));
  Cluster cluster(RecoveryJob());
  RunExact(cluster, "once", 0, kRecoveryCount);
  ExpectWorkerOneHolds(cluster, kRecoveryCount * 4);
  cluster.clock().Advance(std::chrono::seconds(119));
  cluster.node(1).push_pull().worker().ExpireStale();
  EXPECT_EQ(Stats(cluster, 1).worker_retained_bytes.load(), kRecoveryCount * 4);
  RunExact(cluster, "later", 0, kRecoveryCount);  // kept until 239 s
  ExpectWorkerOneHolds(cluster, 2 * kRecoveryCount * 4);
  cluster.clock().Advance(std::chrono::seconds(1));
  cluster.node(1).push_pull().worker().ExpireStale();
  ExpectWorkerOneHolds(cluster, kRecoveryCount * 4);  // "once"'s went
  cluster.clock().Advance(std::chrono::seconds(118));
  cluster.node(1).push_pull().worker().ExpireStale();
  EXPECT_EQ(Stats(cluster, 1).worker_retained_bytes.load(), kRecoveryCount * 4);
  cluster.clock().Advance(std::chrono::seconds(1));
  cluster.node(1).push_pull().worker().ExpireStale();
  ExpectWorkerOneHolds(cluster, 0);
}

TEST(PeerRecovery, SumsOfAnEarlierMembershipGenerationAreNeverGiven) {
  // Every worker completed iteration 0, then the job moved to a new membership generation, which
  // counts its iterations from 0 again: the same number is another collective.
  Cluster cluster(RecoveryJob());
  RunExactOnV8(cluster, 0);  // (still v7 here: the helper runs on the current plan)
  for (int i = 0; i < 4; ++i) {
    JobView v = WithoutTheSpare(cluster, i);
    v.generation = 1;
    cluster.SetJob(i, v);
  }
  // Nothing kept: the sums go once the last reference to them does.
  ExpectWorkerOneHolds(cluster, 0);
  // Worker 0 runs the new generation's iteration 0 alone; its servers time it out, and the
  // others, who kept the old iteration 0's sums, say no.
  auto pushes = [&] { return PushesAtWorkerServers(cluster); };
  const uint64_t before = pushes();
  Iteration run;
  Start(cluster, run, {0});
  ASSERT_TRUE(RecoveryEventually(
      [&] { return pushes() == before + PushPullChunks(kRecoveryCount, 4, 1024, 3); }));
  cluster.clock().Advance(std::chrono::milliseconds(5100));
  for (int i = 0; i < 3; ++i) cluster.node(i).push_pull().server().ExpireStale();
  absl::Status s = Await(run.done[0]);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(Stats(cluster, 0).peer_recoveries_started.load(), 1u);
  EXPECT_EQ(Stats(cluster, 0).peer_recoveries.load(), 0u);
}

TEST(PeerRecovery, PeerThatNeverAnswersEndsTheRecoveryAtItsDeadline) {
  Cluster cluster(RecoveryJob());
  // Only worker 2 gets the spare's sums, and then hangs.
  cluster.network().SetCut("node-3", "node-0", true);
  cluster.network().SetCut("node-3", "node-1", true);
  Iteration run;
  Start(cluster, run, {0, 1, 2});
  EXPECT_TRUE(Await(run.done[2]).ok());
  cluster.network().SetFrozen("node-2", true);
  cluster.SetJob(0, WithoutTheSpare(cluster, 0));
  cluster.SetJob(1, WithoutTheSpare(cluster, 1));
  ASSERT_TRUE(RecoveryEventually([&] {
    return Stats(cluster, 0).peer_recoveries_started.load() == 1 &&
           Stats(cluster, 1).peer_recoveries_started.load() == 1;
  }));
  EXPECT_TRUE(Pending(run.done[0]));
  // The op's deadline (5 s + 0.625 s) plus the grace (0.625 s): the error it had, never a hang.
  cluster.clock().Advance(std::chrono::seconds(7));
  for (int r : {0, 1}) cluster.node(r).push_pull().worker().ExpireStale();
  for (int r : {0, 1}) ExpectRetriable(Await(run.done[r]));
  // The late answers and copies, once worker 2 wakes, find nothing to land in.
  cluster.network().SetFrozen("node-2", false);
  EXPECT_EQ(Stats(cluster, 0).peer_recoveries.load(), 0u);
}

TEST(PeerRecovery, WithoutARetainBudgetNothingIsKeptAndTheAskerFailsRetriable) {
  Cluster cluster(RecoveryJob());
  for (int i = 0; i < 3; ++i) cluster.node(i).push_pull().worker().SetRetainBudget(0);
  cluster.network().SetCut("node-3", "node-0", true);
  Iteration run;
  Start(cluster, run, {0, 1, 2});
  for (int r : {1, 2}) EXPECT_TRUE(Await(run.done[r]).ok()) << "rank " << r;
  EXPECT_EQ(Stats(cluster, 1).worker_retained_bytes.load(), 0u);
  for (int i = 0; i < 3; ++i) cluster.SetJob(i, WithoutTheSpare(cluster, i));
  ExpectRetriable(Await(run.done[0]));
  EXPECT_EQ(Stats(cluster, 0).peer_recoveries.load(), 0u);
}

}  // namespace
}  // namespace tributary::dataplane
