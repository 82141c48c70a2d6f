// The assignments watch at scale over real gRPC: 500 simulated agents, one WatchAssignments
// stream each (callback API, on a few channels), while jobs are created, nodes die and come back
// and a job is deleted. Every agent must receive exactly the sequence of assignments versions the
// controller's state produced for its node (recorded in-process as the ground truth), in order,
// each message with the node's part of every plan it takes part in.
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "controller/cluster_state.h"
#include "controller/controller_service.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace tributary::controller {
namespace {

constexpr int kAgents = 500;
constexpr int kChannels = 4;
constexpr auto kWatchTimeout = std::chrono::milliseconds(1000);
constexpr auto kDeadline = std::chrono::seconds(30);

std::string Name(int i) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "n%03d", i);
  return buf;
}

// Ground truth: every message ClusterState pushes for one node, in-process.
class TruthWatcher : public ClusterState::AssignmentsWatcher {
 public:
  void Push(uint64_t version, const grpc::ByteBuffer&) override { versions.push_back(version); }
  void End(const absl::Status&) override { ended = true; }
  std::vector<uint64_t> versions;  // under ClusterState's mutex
  bool ended = false;
};

// One simulated agent's stream.
class AgentWatch : public grpc::ClientReadReactor<tributary::v1::WatchAssignmentsResponse> {
 public:
  void Start(tributary::v1::Controller::Stub* stub, const std::string& node, uint64_t incarnation) {
    node_ = node;
    req_.set_node_id(node);
    req_.set_incarnation(incarnation);
    stub->async()->WatchAssignments(&ctx_, &req_, this);
    StartRead(&msg_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    {
      std::lock_guard lock(mu_);
      versions_.push_back(msg_.assignments_version());
      for (const auto& plan : msg_.plans()) {
        int own = 0;
        for (const auto& intra : plan.intra_node()) own += intra.node_id() == node_ ? 1 : 0;
        if (own != plan.intra_node_size()) foreign_intra_ = true;
        plans_[plan.job_id()].push_back(plan.version());
      }
    }
    cv_.notify_all();
    StartRead(&msg_);
  }
  void OnDone(const grpc::Status& status) override {
    std::lock_guard lock(mu_);
    done_ = true;
    status_ = status;
    cv_.notify_all();
  }
  bool WaitFor(uint64_t version, std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(mu_);
    return cv_.wait_until(lock, deadline, [&] {
      return done_ || (!versions_.empty() && versions_.back() >= version);
    }) && !done_;
  }
  void Cancel() { ctx_.TryCancel(); }
  bool WaitDone(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return done_; });
  }
  std::vector<uint64_t> versions() {
    std::lock_guard lock(mu_);
    return versions_;
  }
  grpc::Status status() {
    std::lock_guard lock(mu_);
    return status_;
  }
  std::map<std::string, std::vector<uint64_t>> plans() {
    std::lock_guard lock(mu_);
    return plans_;
  }
  bool foreign_intra() {
    std::lock_guard lock(mu_);
    return foreign_intra_;
  }

 private:
  grpc::ClientContext ctx_;
  tributary::v1::WatchAssignmentsRequest req_;
  tributary::v1::WatchAssignmentsResponse msg_;
  std::string node_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> versions_;
  std::map<std::string, std::vector<uint64_t>> plans_;
  bool foreign_intra_ = false;
  bool done_ = false;
  grpc::Status status_;
};

class WatchStreamTest : public ::testing::Test {
 protected:
  WatchStreamTest()
      : state_(&clock_,
               {.heartbeat_interval = std::chrono::milliseconds(100),
                .heartbeat_timeout = kWatchTimeout},
               1),
        service_(&state_) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    EXPECT_GT(port, 0);
    for (int c = 0; c < kChannels; ++c) {
      grpc::ChannelArguments args;
      args.SetInt("grpc.channel_id", c);  // distinct connections
      stubs_.push_back(tributary::v1::Controller::NewStub(grpc::CreateCustomChannel(
          "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), args)));
    }
  }
  ~WatchStreamTest() override {
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    for (auto& a : agents_) a->Cancel();
    for (auto& a : agents_) EXPECT_TRUE(a->WaitDone(deadline));
    for (int i = 0; i < kAgents; ++i) state_.Unwatch(Name(i), &truth_[i]);
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  void HeartbeatAllBut(const std::set<std::string>& silent) {
    for (int i = 0; i < kAgents; ++i) {
      if (silent.contains(Name(i))) continue;
      tributary::v1::HeartbeatRequest req;
      req.set_node_id(Name(i));
      req.set_incarnation(incarnations_[i]);
      tributary::v1::HeartbeatResponse resp;
      ASSERT_TRUE(state_.Heartbeat(req, &resp).ok());
    }
  }
  // Waits until every agent holds its node's current version.
  void Sync(const char* step) {
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    for (int i = 0; i < kAgents; ++i) {
      ASSERT_TRUE(agents_[i]->WaitFor(state_.assignments_version(Name(i)), deadline))
          << step << ": " << Name(i) << " did not get version "
          << state_.assignments_version(Name(i));
    }
  }
  void CreateJob(const std::string& id, int first, int count, uint32_t spares) {
    tributary::v1::CreateJobRequest req;
    req.set_job_id(id);
    for (int i = first; i < first + count; ++i) req.mutable_spec()->add_worker_nodes(Name(i));
    req.mutable_spec()->set_max_spare_nodes(spares);
    tributary::v1::Job job;
    ASSERT_TRUE(state_.CreateJob(req, &job).ok());
    jobs_[id] = job;
  }

  common::FakeClock clock_;
  ClusterState state_;
  ControllerService service_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::unique_ptr<tributary::v1::Controller::Stub>> stubs_;
  std::vector<std::unique_ptr<AgentWatch>> agents_;
  std::vector<TruthWatcher> truth_ = std::vector<TruthWatcher>(kAgents);
  std::vector<uint64_t> incarnations_ = std::vector<uint64_t>(kAgents);
  std::map<std::string, tributary::v1::Job> jobs_;
};

TEST_F(WatchStreamTest, EveryAgentSeesEveryVersionOnceInOrder) {
  for (int i = 0; i < kAgents; ++i) {
    tributary::v1::RegisterNodeRequest req;
    req.set_node_id(Name(i));
    req.mutable_inventory()->set_data_plane_address("10.0." + std::to_string(i / 250) + "." +
                                                    std::to_string(i % 250) + ":4000");
    req.mutable_inventory()->set_nic_bytes_per_s(10e9 / 8);
    req.mutable_inventory()->set_sum_bytes_per_s(100e9);
    req.mutable_inventory()->set_offers_summation(true);
    tributary::v1::RegisterNodeResponse resp;
    ASSERT_TRUE(state_.RegisterNode(req, &resp).ok());
    incarnations_[i] = resp.incarnation();
    tributary::v1::WatchAssignmentsRequest truth;
    truth.set_node_id(Name(i));
    truth.set_incarnation(resp.incarnation());
    truth.set_since_version(resp.assignments_version());  // the agents' first message is this
    ASSERT_TRUE(state_.Watch(truth, &truth_[i]).ok());
    truth_[i].versions.push_back(resp.assignments_version());
  }
  for (int i = 0; i < kAgents; ++i) {
    agents_.push_back(std::make_unique<AgentWatch>());
    agents_.back()->Start(stubs_[i % kChannels].get(), Name(i), incarnations_[i]);
  }
  ASSERT_NO_FATAL_FAILURE(Sync("initial"));

  ASSERT_NO_FATAL_FAILURE(CreateJob("a", 0, 64, 16));
  ASSERT_NO_FATAL_FAILURE(CreateJob("b", 64, 128, 32));
  ASSERT_NO_FATAL_FAILURE(Sync("created"));

  // Four of a's spare servers die.
  std::set<std::string> dead;
  for (const auto& s : jobs_["a"].plan().servers()) {
    if (!s.is_worker() && dead.size() < 4) dead.insert(s.node_id());
  }
  ASSERT_EQ(dead.size(), 4u);
  clock_.Advance(kWatchTimeout / 2);
  ASSERT_NO_FATAL_FAILURE(HeartbeatAllBut(dead));
  clock_.Advance(kWatchTimeout / 2 + std::chrono::milliseconds(1));
  ASSERT_NO_FATAL_FAILURE(HeartbeatAllBut(dead));
  state_.CheckLiveness();
  ASSERT_NO_FATAL_FAILURE(Sync("deaths"));
  tributary::v1::Job a;
  ASSERT_TRUE(state_.GetJob("a", &a).ok());
  for (const auto& s : a.plan().servers()) EXPECT_FALSE(dead.contains(s.node_id()));

  // They come back; then b is deleted (its capacity frees up for a).
  ASSERT_NO_FATAL_FAILURE(HeartbeatAllBut({}));
  ASSERT_NO_FATAL_FAILURE(Sync("returns"));
  ASSERT_TRUE(state_.DeleteJob("b").ok());
  ASSERT_NO_FATAL_FAILURE(Sync("deleted"));

  int changed = 0;
  for (int i = 0; i < kAgents; ++i) {
    const std::vector<uint64_t> got = agents_[i]->versions();
    // Written under the state's mutex by this thread's calls, all returned.
    const std::vector<uint64_t> want = truth_[i].versions;
    EXPECT_EQ(got, want) << Name(i);
    changed += want.size() > 1 ? 1 : 0;
    EXPECT_FALSE(agents_[i]->foreign_intra()) << Name(i) << " got another node's intra-node plan";
    for (const auto& [job, versions] : agents_[i]->plans()) {
      for (size_t k = 1; k < versions.size(); ++k) {
        EXPECT_LE(versions[k - 1], versions[k]) << Name(i) << " job " << job;
      }
    }
  }
  // Workers of a and b (a's spares are among b's workers) changed; nodes of no job got only
  // their first message.
  EXPECT_GE(changed, 64 + 128);
  EXPECT_LT(changed, kAgents);
}

// A node dead for longer than the linger loses its stream (UNAVAILABLE, saying why), so that a
// vanished machine's connection ends up without calls and is closed; a shorter death keeps it.
TEST_F(WatchStreamTest, ANodeDeadForTheLingerLosesItsStream) {
  for (int i = 0; i < 2; ++i) {
    tributary::v1::RegisterNodeRequest req;
    req.set_node_id(Name(i));
    req.mutable_inventory()->set_data_plane_address("10.0.0." + std::to_string(i + 1) + ":4000");
    req.mutable_inventory()->set_nic_bytes_per_s(10e9 / 8);
    req.mutable_inventory()->set_sum_bytes_per_s(100e9);
    tributary::v1::RegisterNodeResponse resp;
    ASSERT_TRUE(state_.RegisterNode(req, &resp).ok());
    agents_.push_back(std::make_unique<AgentWatch>());
    agents_.back()->Start(stubs_[0].get(), Name(i), resp.incarnation());
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    ASSERT_TRUE(agents_.back()->WaitFor(resp.assignments_version(), deadline));
    incarnations_[i] = resp.incarnation();
  }
  auto beat = [&](int i) {
    tributary::v1::HeartbeatRequest req;
    req.set_node_id(Name(i));
    req.set_incarnation(incarnations_[i]);
    tributary::v1::HeartbeatResponse resp;
    ASSERT_TRUE(state_.Heartbeat(req, &resp).ok());
  };
  // Both die; node 1 is back after 30 s, node 0 never.
  clock_.Advance(kWatchTimeout + std::chrono::milliseconds(1));
  state_.CheckLiveness();
  clock_.Advance(std::chrono::seconds(30));
  ASSERT_NO_FATAL_FAILURE(beat(1));
  state_.CheckLiveness();
  EXPECT_FALSE(agents_[0]->WaitDone(std::chrono::steady_clock::now()));
  clock_.Advance(std::chrono::seconds(30));
  ASSERT_NO_FATAL_FAILURE(beat(1));
  state_.CheckLiveness();
  ASSERT_TRUE(agents_[0]->WaitDone(std::chrono::steady_clock::now() + kDeadline));
  EXPECT_EQ(agents_[0]->status().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(agents_[0]->status().error_message().find("'n000' has been dead"), std::string::npos)
      << agents_[0]->status().error_message();
  EXPECT_FALSE(agents_[1]->WaitDone(std::chrono::steady_clock::now()));
}

}  // namespace
}  // namespace tributary::controller
