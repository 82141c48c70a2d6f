// Client::ResyncTo: a process that joined before another process of its job was replaced moves
// to the generation the replacement joined at, and the first collective of both then sums
// exactly (real controller and agent processes: 2 worker nodes, one process each). This is what
// tributary/distributed.py does on torch's store when a process group is created again.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/cluster/local_cluster.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tributary {
namespace resync_to_test {

using std::chrono::milliseconds;

constexpr size_t kCount = 5000;

absl::StatusOr<std::unique_ptr<client::Client>> Join(
    const std::string& agent, uint32_t local_rank = 0, uint32_t local_size = 1,
    milliseconds join_timeout = milliseconds(20000)) {
  client::ClientOptions o;
  o.agent_address = agent;
  o.join_timeout = join_timeout;
  o.op_timeout = milliseconds(10000);
  return client::Client::Connect(o, "resync", local_rank, local_size);
}

// Each client all-reduces (rank + 1) * (e % 5 + 1) once, in its own thread; the statuses in
// client order, and the elements that are not the exact sum.
struct Round {
  std::vector<absl::Status> statuses;
  int wrong = 0;
};
Round AllReduceOnce(const std::vector<client::Client*>& clients) {
  Round round;
  round.statuses.resize(clients.size());
  std::vector<std::shared_ptr<client::SharedBuffer>> buffers(clients.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < clients.size(); ++i) {
    threads.emplace_back([&, i] {
      client::Client& c = *clients[i];
      auto buffer = c.AllocateBuffer(kCount * sizeof(float));
      if (!buffer.ok()) {
        round.statuses[i] = buffer.status();
        return;
      }
      buffers[i] = *buffer;
      auto* v = reinterpret_cast<float*>(buffers[i]->data());
      for (size_t e = 0; e < kCount; ++e)
        v[e] = static_cast<float>((c.global_rank() + 1) * (e % 5 + 1));
      round.statuses[i] = c.AllReduce("resync.grad", *buffers[i], 0, kCount,
                                      common::DataType::kFloat32, client::ReduceOp::kSum);
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < clients.size(); ++i) {
    if (!round.statuses[i].ok()) continue;
    const auto* v = reinterpret_cast<const float*>(buffers[i]->data());
    for (size_t e = 0; e < kCount; ++e) round.wrong += v[e] != 3.0f * (e % 5 + 1);
  }
  return round;
}

// A local cluster of `workers` worker nodes and job "resync" on all of them.
absl::StatusOr<std::unique_ptr<client::LocalCluster>> StartWithJob(int workers,
                                                                   uint32_t procs_per_node,
                                                                   std::string state_db = "") {
  client::LocalClusterOptions o;
  o.bin_dir = TRIBUTARY_BIN_DIR;
  o.workers = workers;
  o.spares = 0;
  o.state_db = std::move(state_db);
  ASSIGN_OR_RETURN(std::unique_ptr<client::LocalCluster> cluster, client::LocalCluster::Start(o));
  v1::CreateJobRequest req;
  req.set_job_id("resync");
  for (const auto& w : cluster->worker_node_ids()) req.mutable_spec()->add_worker_nodes(w);
  req.mutable_spec()->set_procs_per_node(procs_per_node);
  req.mutable_spec()->set_op_timeout_ms(10000);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::Job job;
  RETURN_IF_ERROR(common::FromGrpcStatus(cluster->controller().CreateJob(&ctx, req, &job)));
  return cluster;
}

TEST(ResyncToTest, AProcessMovesToTheGenerationAReplacementJoinedAt) {
  auto started = StartWithJob(2, 1);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<client::LocalCluster> cluster = *std::move(started);
  auto a = Join(cluster->agent_address(0));
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = Join(cluster->agent_address(1));
  ASSERT_TRUE(b.ok()) << b.status();
  {
    const Round first = AllReduceOnce({a->get(), b->get()});
    for (const auto& s : first.statuses) ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(first.wrong, 0);
  }
  const uint64_t before = (*a)->generation();
  ASSERT_EQ((*b)->generation(), before);

  // Node 1's process is replaced: the new one joins once the job is at a newer generation.
  b->reset();
  auto replacement = Join(cluster->agent_address(1));
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  const uint64_t newest = (*replacement)->generation();
  ASSERT_GT(newest, before);

  // Node 0's process joined before: it moves to the replacement's generation (its agent may
  // still have to hear of it from the controller).
  const absl::Status moved = (*a)->ResyncTo(newest, milliseconds(20000));
  ASSERT_TRUE(moved.ok()) << moved;
  EXPECT_EQ((*a)->generation(), newest);
  // A generation the job never reaches: the wait ends at its limit and says so.
  const absl::Status too_far = (*a)->ResyncTo(newest + 1, milliseconds(300));
  EXPECT_EQ(too_far.code(), absl::StatusCode::kDeadlineExceeded) << too_far;
  EXPECT_THAT(too_far.message(),
              ::testing::HasSubstr(
                  absl::StrCat("another process of the job joined at generation ", newest + 1)));
  EXPECT_EQ((*a)->generation(), newest);
  EXPECT_EQ((*a)->global_rank(), 0u);
  const Round again = AllReduceOnce({a->get(), replacement->get()});
  for (const auto& s : again.statuses) EXPECT_TRUE(s.ok()) << s;  // no membership change
  EXPECT_EQ(again.wrong, 0);
}

// The other process of the same node is replaced while the controller is down: the agent holds
// the replacement's join and this process's Resync back (UNAVAILABLE) until the controller's new
// generation arrives. ResyncTo keeps asking within its own timeout although the client's
// join_timeout (Resync's own retry limit) is shorter than the controller's absence; it returned
// Resync's UNAVAILABLE before.
TEST(ResyncToTest, AReplacementOnTheSameNodeIsWaitedForWithinTheTimeout) {
  char dir_template[] = "/tmp/tributary-resync-to-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  // The job outlives the controller's restart.
  auto started = StartWithJob(1, 2, dir + "/controller.db");
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<client::LocalCluster> cluster = *std::move(started);
  const auto join = [&](uint32_t local_rank, milliseconds join_timeout) {
    return Join(cluster->agent_address(0), local_rank, 2, join_timeout);
  };
  auto b = join(1, milliseconds(20000));  // waits for the plan
  ASSERT_TRUE(b.ok()) << b.status();
  constexpr milliseconds kShortJoinTimeout(1000);
  auto a = join(0, kShortJoinTimeout);
  ASSERT_TRUE(a.ok()) << a.status();
  const uint64_t before = (*a)->generation();

  cluster->KillController();
  b->reset();
  absl::StatusOr<std::unique_ptr<client::Client>> replacement;
  std::thread rejoin([&] { replacement = join(1, milliseconds(60000)); });
  // Until the replacement's join reaches the agent, a Resync finds nothing to do; then it is
  // held back (bounded: the replacement's Connect keeps asking).
  absl::Status held = absl::OkStatus();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (held.ok() && std::chrono::steady_clock::now() < until) {
    held = (*a)->Resync();
    if (held.ok()) std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(held.code(), absl::StatusCode::kUnavailable) << held;
  absl::Status moved;
  std::thread move([&] { moved = (*a)->ResyncTo(before + 1, milliseconds(60000)); });
  // The controller stays away for longer than a's join_timeout: a Resync alone gives up first.
  std::this_thread::sleep_for(kShortJoinTimeout + milliseconds(500));
  absl::Status restarted = cluster->RestartController(std::chrono::seconds(20));
  move.join();
  rejoin.join();
  ASSERT_TRUE(restarted.ok()) << restarted;
  ASSERT_TRUE(moved.ok()) << moved;
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  EXPECT_GE((*a)->generation(), before + 1);
  EXPECT_EQ((*a)->generation(), (*replacement)->generation());
  const Round round = AllReduceOnce({a->get(), replacement->get()});
  for (const auto& s : round.statuses) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(round.wrong, 0);
  cluster.reset();
  std::filesystem::remove_all(dir);
}

TEST(ResyncToTest, AProcessAlreadyThereDoesNotAskTheAgent) {
  auto started = StartWithJob(1, 1);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<client::LocalCluster> cluster = *std::move(started);
  auto a = Join(cluster->agent_address(0));
  ASSERT_TRUE(a.ok()) << a.status();
  const uint64_t generation = (*a)->generation();
  ASSERT_TRUE((*a)->Leave().ok());
  // Left: a Resync would fail; at or below its generation nothing is asked.
  EXPECT_TRUE((*a)->ResyncTo(generation, milliseconds(0)).ok());
  EXPECT_TRUE((*a)->ResyncTo(0, milliseconds(0)).ok());
  EXPECT_EQ((*a)->ResyncTo(generation + 1, milliseconds(0)).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace resync_to_test
}  // namespace tributary
