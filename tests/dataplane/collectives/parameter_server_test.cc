// Asynchronous parameter-server training and bounded staleness (parameter_server.h): N nodes in
// one process over the in-process transport, a FakeClock that moves only when a test says so,
// integer-valued float32 data so that every final parameter is exact.
#include "dataplane/collectives/parameter_server.h"

#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "dataplane/collectives/data_plane_node.h"
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

constexpr uint64_t kPsCount = 1000;  // float32 at 256-byte partitions: 16 chunks over the servers

ClusterOptions PsJob(int workers, uint32_t procs, int spares) {
  ClusterOptions o;
  o.workers = workers;
  o.procs_per_node = procs;
  o.spare_servers = spares;
  o.job_id = "job-ps";
  o.plan_version = 3;
  o.partition_bytes = 256;
  o.op_timeout = std::chrono::milliseconds(5000);
  return o;
}

// The cluster's job in async mode with staleness `s` on every node (plan version `version`).
void MakeAsync(Cluster& c, int32_t s, uint64_t version = 3, double scale = 1.0) {
  for (int i = 0; i < c.size(); ++i) {
    JobView v = c.ViewOf(i);
    v.plan_version = version;
    v.async_mode = true;
    v.staleness = s;
    v.delta_scale = scale;
    c.SetJob(i, v);
  }
}

// One process's parameter-server operation and its result.
struct PsCall {
  std::future<absl::Status> result;
  std::shared_ptr<uint64_t> version = std::make_shared<uint64_t>(UINT64_MAX);
};

class Worker {
 public:
  Worker(Cluster& c, uint32_t rank) : c_(c), rank_(rank), buffer_(kPsCount) {}

  PsCall Call(Reduction r, const std::vector<float>& values, const std::string& name = "w",
              double scale = 0) {
    buffer_ = values;
    Operation op;
    op.tensor_name = name;
    op.dtype = DataType::kFloat32;
    op.count = buffer_.size();
    op.reduction = r;
    op.buffers = {reinterpret_cast<std::byte*>(buffer_.data())};
    op.ps_worker = rank_;
    op.ps_scale = scale;
    PsCall call;
    op.ps_version = call.version;
    call.result = c_.Start(static_cast<int>(rank_ / c_.view().procs_per_node), std::move(op));
    return call;
  }
  absl::Status Init(const std::vector<float>& values) {
    PsCall call = Call(Reduction::kPsInit, values);
    return Await(call.result);
  }
  absl::Status Delta(const std::vector<float>& delta) {
    PsCall call = Call(Reduction::kPsDelta, delta);
    return Await(call.result);
  }
  // Pulls into buffer(); returns the version.
  absl::StatusOr<uint64_t> Pull() {
    PsCall call = Call(Reduction::kPsPull, std::vector<float>(kPsCount, -1.0f));
    absl::Status s = Await(call.result);
    if (!s.ok()) return s;
    return *call.version;
  }
  const std::vector<float>& buffer() const { return buffer_; }

 private:
  Cluster& c_;
  uint32_t rank_;
  std::vector<float> buffer_;
};

std::vector<float> Initial() {
  std::vector<float> v(kPsCount);
  for (uint64_t i = 0; i < kPsCount; ++i) v[i] = static_cast<float>(i % 97);
  return v;
}

// Delta number k (1-based) of worker w: small integers, different per worker, step and element.
std::vector<float> DeltaOf(uint32_t w, uint64_t k) {
  std::vector<float> v(kPsCount);
  for (uint64_t i = 0; i < kPsCount; ++i) {
    v[i] = static_cast<float>(static_cast<int>((w + 1) * 3 + k * 5 + i % 7) % 11 - 5);
  }
  return v;
}

uint64_t Parked(Cluster& c) {
  uint64_t n = 0;
  for (int i = 0; i < c.size(); ++i) n += c.node(i).parameter_server().stats().pulls_parked.load();
  return n;
}

// Waits (bounded) until the servers have parked `n` chunk pulls: the state a test then checks.
bool WaitParked(Cluster& c, uint64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (Parked(c) < n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

void Expire(Cluster& c) {
  for (int i = 0; i < c.size(); ++i) c.node(i).ExpireStale();
}

bool Ready(std::future<absl::Status>& f) {
  return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

// The chunks of a kPsCount float32 tensor at 256-byte partitions over the cluster's servers.
uint32_t Chunks(Cluster& c) {
  return PushPullChunks(kPsCount, sizeof(float), c.view().partition_bytes,
                        c.view().server_addresses.size());
}

TEST(ParameterServerTest, DeltasFromWorkersAtDifferentSpeedsAreEachAppliedOnce) {
  // 2 worker nodes x 2 processes + 1 spare: 4 workers (global ranks), 3 servers.
  Cluster c(PsJob(2, 2, 1));
  MakeAsync(c, /*s=*/-1);
  ASSERT_GT(Chunks(c), 3u);
  std::vector<Worker> w;
  for (uint32_t r = 0; r < 4; ++r) w.emplace_back(c, r);
  // Every rank calls init: rank 0 pushes, the others wait for the values.
  std::vector<PsCall> inits;
  for (uint32_t r = 1; r < 4; ++r)
    inits.push_back(w[r].Call(Reduction::kPsInit, std::vector<float>(kPsCount, -1.0f)));
  ASSERT_TRUE(w[0].Init(Initial()).ok());
  for (uint32_t r = 1; r < 4; ++r) {
    ASSERT_TRUE(Await(inits[r - 1].result).ok());
    EXPECT_EQ(*inits[r - 1].version, 0u);
    EXPECT_EQ(w[r].buffer(), Initial()) << "rank " << r;
  }

  // Worker r pushes 2 * (r + 1) deltas, interleaved round by round (the slow ones stop early),
  // pulling after each: versions never go back for anyone.
  std::vector<float> expected = Initial();
  std::vector<uint64_t> last(4, 0);
  uint64_t total = 0;
  for (uint64_t k = 1; k <= 8; ++k) {
    for (uint32_t r = 0; r < 4; ++r) {
      if (k > 2 * (r + 1)) continue;
      const std::vector<float> d = DeltaOf(r, k);
      ASSERT_TRUE(w[r].Delta(d).ok()) << "worker " << r << " delta " << k;
      for (uint64_t i = 0; i < kPsCount; ++i) expected[i] += d[i];
      ++total;
      absl::StatusOr<uint64_t> v = w[r].Pull();
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_GE(*v, last[r]) << "worker " << r;
      EXPECT_EQ(*v, total) << "a worker's own delta is in what it pulls next";
      last[r] = *v;
    }
  }
  // The slowest worker (rank 0, 2 deltas) pulls last: everything, exactly.
  absl::StatusOr<uint64_t> v = w[0].Pull();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 2u + 4 + 6 + 8);
  for (uint64_t i = 0; i < kPsCount; ++i) ASSERT_EQ(w[0].buffer()[i], expected[i]) << i;

  // A duplicate of an applied delta (a retry after a lost acknowledgement) is acknowledged and
  // dropped: the same chunk pushed again by hand with worker 3's clock 8.
  uint64_t applied = 0;
  for (int i = 0; i < c.size(); ++i) {
    applied += c.node(i).parameter_server().stats().deltas_applied.load();
  }
  EXPECT_EQ(applied, total * Chunks(c));
  WireHeader h;
  h.kind = static_cast<uint8_t>(MessageKind::kPush);
  h.algorithm = static_cast<uint8_t>(Algorithm::kParameterServer);
  h.dtype = static_cast<uint8_t>(DataType::kFloat32);
  h.reduce = static_cast<uint8_t>(Reduction::kPsDelta);
  h.job = c.view().job_hash();
  h.tensor = common::StableHash64("w");
  h.iteration = 999;
  h.plan_version = 3;
  h.tensor_count = kPsCount;
  h.world_size = 4;
  h.sender = h.root = 3;
  h.num_chunks = Chunks(c);
  h.chunk = 0;
  const ChunkRange r0 = GetChunk(kPsCount, h.num_chunks, 0);
  h.chunk_offset = r0.offset;
  h.chunk_count = r0.count;
  h.step = 8;
  const std::vector<float> d = DeltaOf(3, 8);
  absl::StatusOr<ChunkMap> map = ChunkMap::Create(c.view().server_weights);
  const uint32_t owner = map->ServerOf(h.tensor, h.num_chunks, 0);
  auto probe = c.network().CreateEndpoint("probe");
  probe->SetReceiveHandler([](auto, auto) {});
  std::promise<absl::Status> sent;
  probe->Send(c.address(owner), AsBytes(h),
              {reinterpret_cast<const std::byte*>(d.data()), r0.count * sizeof(float)},
              [&](absl::Status s) { sent.set_value(s); });
  ASSERT_TRUE(sent.get_future().get().ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (c.node(owner).parameter_server().stats().duplicate_deltas.load() == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_EQ(c.node(owner).parameter_server().stats().duplicate_deltas.load(), 1u);
  v = w[1].Pull();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 20u);
  for (uint64_t i = 0; i < kPsCount; ++i) ASSERT_EQ(w[1].buffer()[i], expected[i]) << i;
  auto info = c.node(owner).parameter_server().Inspect("job-ps", "w", 0);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->version, 20u);
  EXPECT_EQ(info->clocks, (std::vector<uint64_t>{2, 4, 6, 8}));
  probe->Shutdown();
}

TEST(ParameterServerTest, ServerScaleAppliesLearningRate) {
  Cluster c(PsJob(2, 1, 0));
  MakeAsync(c, -1, 3, /*scale=*/-0.5);
  Worker a(c, 0), b(c, 1);
  ASSERT_TRUE(a.Init(std::vector<float>(kPsCount, 10.0f)).ok());
  ASSERT_TRUE(b.Delta(std::vector<float>(kPsCount, 4.0f)).ok());  // the job's scale: -0.5 * 4
  PsCall call = a.Call(Reduction::kPsDelta, std::vector<float>(kPsCount, 1.0f), "w", /*scale=*/3);
  ASSERT_TRUE(Await(call.result).ok());  // the call's scale: 3 * 1
  absl::StatusOr<uint64_t> v = b.Pull();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 2u);
  for (float x : b.buffer()) ASSERT_EQ(x, 11.0f);
}

TEST(ParameterServerTest, SspBlocksAFastWorkerAtExactlySAheadUntilTheSlowOneCatchesUp) {
  // 3 workers (one process per node), 1 spare; staleness 2; worker 2 is held back.
  Cluster c(PsJob(3, 1, 1));
  MakeAsync(c, /*s=*/2);
  std::vector<Worker> w;
  for (uint32_t r = 0; r < 3; ++r) w.emplace_back(c, r);
  ASSERT_TRUE(w[0].Init(std::vector<float>(kPsCount, 0.0f)).ok());
  const uint32_t chunks = Chunks(c);
  // Workers 0 and 1 run ahead: after deltas 1 and 2 their pulls answer at once.
  for (uint64_t k = 1; k <= 2; ++k) {
    for (uint32_t r = 0; r < 2; ++r) {
      ASSERT_TRUE(w[r].Delta(std::vector<float>(kPsCount, 1.0f)).ok());
      ASSERT_TRUE(w[r].Pull().ok()) << "worker " << r << " at clock " << k;
    }
  }
  EXPECT_EQ(Parked(c), 0u);
  // Delta 3 puts worker 0 three ahead of worker 2: its pull blocks (every chunk parked).
  ASSERT_TRUE(w[0].Delta(std::vector<float>(kPsCount, 1.0f)).ok());
  PsCall blocked = w[0].Call(Reduction::kPsPull, std::vector<float>(kPsCount, -1.0f));
  ASSERT_TRUE(WaitParked(c, chunks));
  EXPECT_FALSE(Ready(blocked.result));
  // Worker 1 at clock 2 is still within the bound.
  ASSERT_TRUE(w[1].Pull().ok());
  // Worker 2 catches up by one: worker 0 is now exactly 2 ahead and resumes.
  ASSERT_TRUE(w[2].Delta(std::vector<float>(kPsCount, 1.0f)).ok());
  ASSERT_TRUE(Await(blocked.result).ok());
  EXPECT_EQ(*blocked.version, 6u);  // 3 + 2 + 1 deltas
  EXPECT_EQ(w[0].buffer(), std::vector<float>(kPsCount, 6.0f));

  // Worker 2 dies: worker 0's next lead of 3 turns into an error at the deadline that names it.
  ASSERT_TRUE(w[0].Delta(std::vector<float>(kPsCount, 1.0f)).ok());
  PsCall dead = w[0].Call(Reduction::kPsPull, std::vector<float>(kPsCount, -1.0f));
  ASSERT_TRUE(WaitParked(c, 2 * chunks));
  c.clock().Advance(std::chrono::milliseconds(4999));
  Expire(c);
  EXPECT_FALSE(Ready(dead.result)) << "not before the deadline";
  c.clock().Advance(std::chrono::milliseconds(1));
  Expire(c);
  absl::Status s = Await(dead.result);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("slowest worker(s) 2 (1 deltas)"));
  EXPECT_THAT(s.message(), HasSubstr("pull_params of 'w' in job 'job-ps' (worker 0)"));
}

TEST(ParameterServerTest, StalenessZeroIsSynchronous) {
  Cluster c(PsJob(2, 1, 1));
  MakeAsync(c, /*s=*/0);
  Worker a(c, 0), b(c, 1);
  ASSERT_TRUE(a.Init(std::vector<float>(kPsCount, 1.0f)).ok());
  const uint32_t chunks = Chunks(c);
  for (uint64_t k = 1; k <= 3; ++k) {
    ASSERT_TRUE(a.Delta(std::vector<float>(kPsCount, 2.0f)).ok());
    PsCall pa = a.Call(Reduction::kPsPull, std::vector<float>(kPsCount, -1.0f));
    ASSERT_TRUE(WaitParked(c, k * chunks));
    EXPECT_FALSE(Ready(pa.result)) << "a waits for b's delta " << k;
    ASSERT_TRUE(b.Delta(std::vector<float>(kPsCount, 3.0f)).ok());
    ASSERT_TRUE(Await(pa.result).ok());
    absl::StatusOr<uint64_t> vb = b.Pull();
    ASSERT_TRUE(vb.ok());
    // Both see the round's two deltas, like a synchronous all-reduce step.
    EXPECT_EQ(*pa.version, 2 * k);
    EXPECT_EQ(*vb, 2 * k);
    EXPECT_EQ(a.buffer(), std::vector<float>(kPsCount, 1.0f + 5.0f * k));
    EXPECT_EQ(b.buffer(), a.buffer());
  }
}

TEST(ParameterServerTest, BadInputIsAClearError) {
  Cluster c(PsJob(2, 1, 0));
  Worker a(c, 0), b(c, 1);
  // A synchronous job has no parameter server.
  PsCall sync = a.Call(Reduction::kPsPull, std::vector<float>(kPsCount));
  absl::Status s = Await(sync.result);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("--mode async"));

  MakeAsync(c, -1);
  // A delta before init.
  s = b.Delta(std::vector<float>(kPsCount, 1.0f));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("push_delta before init_params"));
  EXPECT_THAT(s.message(), HasSubstr("push_delta of 'w' in job 'job-ps' (worker 1)"));
  // A pull before init waits, and fails at the deadline saying who initialises.
  PsCall early = b.Call(Reduction::kPsPull, std::vector<float>(kPsCount));
  ASSERT_TRUE(WaitParked(c, Chunks(c)));
  c.clock().Advance(std::chrono::milliseconds(5000));
  Expire(c);
  s = Await(early.result);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("not initialised"));
  EXPECT_THAT(s.message(), HasSubstr("rank 0"));

  ASSERT_TRUE(a.Init(std::vector<float>(kPsCount, 1.0f)).ok());
  // Another size than the initialised one.
  PsCall wrong = b.Call(Reduction::kPsPull, std::vector<float>(kPsCount + 1));
  s = Await(wrong.result);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("initialised as 1000 float32"));
  // A process of another node, and a second delta while one is in flight are refused at once.
  Operation op;
  op.tensor_name = "w";
  op.count = 4;
  op.reduction = Reduction::kPsDelta;
  std::vector<float> buf(4);
  op.buffers = {reinterpret_cast<std::byte*>(buf.data())};
  op.ps_worker = 1;
  s = c.node(0).Start("job-ps", op);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  op.ps_worker = 7;
  EXPECT_EQ(c.node(0).Start("job-ps", op).code(), absl::StatusCode::kInvalidArgument);
  op.buffers.clear();
  op.ps_worker = 0;
  EXPECT_EQ(c.node(0).Start("job-ps", op).code(), absl::StatusCode::kInvalidArgument);
  // Initialised once: after a delta, another init is refused (parameters live for the epoch).
  ASSERT_TRUE(b.Delta(std::vector<float>(kPsCount, 1.0f)).ok());
  s = a.Init(std::vector<float>(kPsCount, 5.0f));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("already initialised"));
}

TEST(ParameterServerTest, ReplanLosesParametersRetriablyAndRank0InitialisesAgain) {
  Cluster c(PsJob(2, 1, 1));
  MakeAsync(c, /*s=*/0);
  Worker a(c, 0), b(c, 1);
  ASSERT_TRUE(a.Init(std::vector<float>(kPsCount, 1.0f)).ok());
  ASSERT_TRUE(a.Delta(std::vector<float>(kPsCount, 1.0f)).ok());
  PsCall parked = a.Call(Reduction::kPsPull, std::vector<float>(kPsCount));  // waits for b
  ASSERT_TRUE(WaitParked(c, Chunks(c)));
  // The plan changes (v3 -> v4) on every node: the parked pull fails retriably.
  MakeAsync(c, 0, /*version=*/4);
  absl::Status s = Await(parked.result);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("changed from v3 to v4"));
  EXPECT_EQ(EpochOf(s), 3u);
  for (int i = 0; i < c.size(); ++i) {
    EXPECT_FALSE(c.node(i).parameter_server().Inspect("job-ps", "w", 0).has_value())
        << "node " << i << " still holds parameters of the old epoch";
  }
  // Rank 0 initialises again (from its own copy); clocks start over: b's delta is clock 1.
  PsCall b_init = b.Call(Reduction::kPsInit, std::vector<float>(kPsCount, -1.0f));
  ASSERT_TRUE(a.Init(std::vector<float>(kPsCount, 7.0f)).ok());
  ASSERT_TRUE(Await(b_init.result).ok());
  EXPECT_EQ(b.buffer(), std::vector<float>(kPsCount, 7.0f));
  ASSERT_TRUE(a.Delta(std::vector<float>(kPsCount, 1.0f)).ok());
  ASSERT_TRUE(b.Delta(std::vector<float>(kPsCount, 2.0f)).ok());
  absl::StatusOr<uint64_t> v = a.Pull();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 2u);
  EXPECT_EQ(a.buffer(), std::vector<float>(kPsCount, 10.0f));
}

// Parameter-server operations count in the job's observations (GetJobStats): bytes, completed
// operations, and an iteration per delta of the job's first tensor.
TEST(ParameterServerTest, OperationsCountInTheJobsObservations) {
  ClusterOptions o = PsJob(2, 1, 0);
  o.metrics = true;
  Cluster c(o);
  MakeAsync(c, -1);
  Worker w0(c, 0);
  const std::vector<float> ones(kPsCount, 1.0f);
  PsCall init = w0.Call(Reduction::kPsInit, ones);
  ASSERT_TRUE(Await(init.result).ok());
  for (int i = 0; i < 3; ++i) {
    c.clock().Advance(std::chrono::milliseconds(100));
    PsCall delta = w0.Call(Reduction::kPsDelta, ones);
    ASSERT_TRUE(Await(delta.result).ok());
  }
  const auto obs = c.node(0).TakeObservations();
  ASSERT_EQ(obs.count("job-ps"), 1u);
  EXPECT_EQ(obs.at("job-ps").collectives, 4u);
  EXPECT_EQ(obs.at("job-ps").bytes, 4u * kPsCount * sizeof(float));
  EXPECT_EQ(obs.at("job-ps").iterations, 2u);  // delta 1 opens one; deltas 2 and 3 close two
  EXPECT_NEAR(obs.at("job-ps").iteration_seconds, 0.2, 1e-9);
}

}  // namespace
}  // namespace tributary::dataplane
