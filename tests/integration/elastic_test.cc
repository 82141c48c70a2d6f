// An elastic job goes on with the worker nodes that are left and takes a returning one back:
// real controller and agent processes (3 worker nodes, one training process each: a thread of
// this test with its own client), exact all-reduces throughout. Killing node 2's agent moves the
// job to a new membership generation with 2 workers; the survivors get a membership-changed
// error once, resync (ranks 0 and 1 of 2) and go on. Restarting the agent plans the node in
// again: a new process joins there and everyone resyncs to 3.
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/cluster/local_cluster.h"
#include "gtest/gtest.h"

namespace tributary {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr int kElasticWorkers = 3;
constexpr size_t kCount = 20000;  // float32: several chunks
constexpr uint32_t kOpTimeoutMs = 3000;

// One training process: all-reduces "elastic.grad" in a loop, resyncing on a membership change.
class Member {
 public:
  Member(std::string agent, std::string job) : agent_(std::move(agent)), job_(std::move(job)) {}
  ~Member() { Stop(); }

  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  // Stops after the current collective (RequestStop every member first: they run in step).
  void RequestStop() { stop_ = true; }
  void Stop() {
    RequestStop();
    if (thread_.joinable()) thread_.join();
  }
  // Exact all-reduces completed with world size `world`.
  int ok_at(uint32_t world) const {
    std::lock_guard lock(mu_);
    return world < ok_.size() ? ok_[world] : 0;
  }
  int membership_changes() const { return changes_.load(); }
  int wrong() const { return wrong_.load(); }
  uint32_t rank() const { return rank_.load(); }
  std::string last_error() const {
    std::lock_guard lock(mu_);
    return error_;
  }

 private:
  void Run() {
    client::ClientOptions o;
    o.agent_address = agent_;
    o.join_timeout = milliseconds(20000);
    o.op_timeout = milliseconds(2 * kOpTimeoutMs + 2000);
    auto c = client::Client::Connect(o, job_, 0, 1);
    if (!c.ok()) {
      Fail(c.status());
      return;
    }
    std::unique_ptr<client::Client> client = *std::move(c);
    auto buffer = client->AllocateBuffer(kCount * sizeof(float));
    if (!buffer.ok()) {
      Fail(buffer.status());
      return;
    }
    while (!stop_) {
      const uint32_t rank = client->global_rank();
      const uint32_t world = client->world_size();
      rank_ = rank;
      auto* v = reinterpret_cast<float*>((*buffer)->data());
      for (size_t e = 0; e < kCount; ++e) v[e] = static_cast<float>((rank + 1) * (e % 7 + 1));
      absl::Status s = client->AllReduce("elastic.grad", **buffer, 0, kCount,
                                         common::DataType::kFloat32, client::ReduceOp::kSum);
      if (client::IsMembershipChanged(s)) {
        changes_++;
        if (absl::Status r = client->Resync(); !r.ok()) Fail(r);
        continue;
      }
      if (!s.ok()) {
        Fail(s);  // the old generation's op that ran into the change, or a deadline
        continue;
      }
      const float ranks = static_cast<float>(world * (world + 1) / 2);
      for (size_t e = 0; e < kCount; ++e) wrong_ += v[e] != ranks * (e % 7 + 1);
      std::lock_guard lock(mu_);
      if (ok_.size() <= world) ok_.resize(world + 1);
      ok_[world]++;
    }
  }
  void Fail(const absl::Status& s) {
    std::lock_guard lock(mu_);
    error_ = s.ToString();
  }

  const std::string agent_, job_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> changes_{0}, wrong_{0};
  std::atomic<uint32_t> rank_{0};
  mutable std::mutex mu_;
  std::vector<int> ok_;  // by world size
  std::string error_;
};

// Polls `done` (bounded: real processes, no event to wait on) for up to `timeout`.
template <typename F>
bool WaitFor(F done, milliseconds timeout) {
  const auto until = steady_clock::now() + timeout;
  while (!done()) {
    if (steady_clock::now() > until) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return true;
}

TEST(ElasticTest, AJobGoesOnWithTheSurvivorsAndTakesAReturningNodeBack) {
  client::LocalClusterOptions o;
  o.bin_dir = TRIBUTARY_BIN_DIR;
  o.workers = kElasticWorkers;
  o.spares = 0;
  o.heartbeat = milliseconds(200);
  o.heartbeat_timeout = milliseconds(1200);
  auto started = client::LocalCluster::Start(o);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<client::LocalCluster> cluster = *std::move(started);

  v1::CreateJobRequest req;
  req.set_job_id("elastic");
  for (const auto& w : cluster->worker_node_ids()) req.mutable_spec()->add_worker_nodes(w);
  req.mutable_spec()->set_procs_per_node(1);
  req.mutable_spec()->set_op_timeout_ms(kOpTimeoutMs);
  req.mutable_spec()->set_elastic(true);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::Job job;
    grpc::Status s = cluster->controller().CreateJob(&ctx, req, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  std::vector<std::unique_ptr<Member>> members;
  for (int n = 0; n < kElasticWorkers; ++n) {
    members.push_back(std::make_unique<Member>(cluster->agent_address(n), "elastic"));
    members.back()->Start();
  }
  auto all_ok_at = [&](std::vector<int> who, uint32_t world, int at_least) {
    for (int m : who) {
      if (members[m]->ok_at(world) < at_least) return false;
    }
    return true;
  };
  ASSERT_TRUE(WaitFor(
      [&] {
        return all_ok_at({0, 1, 2}, 3, 3);
      },
      milliseconds(30000)))
      << members[0]->last_error();

  // Node 2's agent dies: the job goes on with nodes 0 and 1, ranks 0 and 1 of 2.
  cluster->KillNode(2);
  ASSERT_TRUE(WaitFor(
      [&] {
        return all_ok_at({0, 1}, 2, 3);
      },
      milliseconds(30000)))
      << "survivors: " << members[0]->last_error() << " / " << members[1]->last_error();
  EXPECT_EQ(members[0]->rank(), 0u);
  EXPECT_EQ(members[1]->rank(), 1u);
  EXPECT_GE(members[0]->membership_changes(), 1);
  EXPECT_GE(members[1]->membership_changes(), 1);
  members[2]->Stop();  // its agent is gone: its process ends
  const int changes_before_return = members[0]->membership_changes();

  // The agent comes back: the node is planned in again; a new process joins it.
  ASSERT_TRUE(cluster->RestartNode(2).ok());
  members[2] = std::make_unique<Member>(cluster->agent_address(2), "elastic");
  members[2]->Start();
  ASSERT_TRUE(WaitFor(
      [&] {
        return all_ok_at({0, 1, 2}, 3, 6);
      },
      milliseconds(30000)))
      << members[2]->last_error();
  EXPECT_EQ(members[2]->rank(), 2u);
  EXPECT_GT(members[0]->membership_changes(), changes_before_return);
  EXPECT_EQ(members[2]->membership_changes(), 0);  // it joined in the new generation
  for (auto& m : members) m->RequestStop();
  for (auto& m : members) m->Stop();
  for (int m = 0; m < kElasticWorkers; ++m) EXPECT_EQ(members[m]->wrong(), 0) << "member " << m;

  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetJobRequest get;
  get.set_job_id("elastic");
  v1::Job job;
  ASSERT_TRUE(cluster->controller().GetJob(&ctx, get, &job).ok());
  EXPECT_EQ(job.plan().workers_size(), 3);
  EXPECT_GE(job.plan().generation(), 2u);
}

}  // namespace
}  // namespace tributary
