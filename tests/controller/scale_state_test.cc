// ClusterState at scale, on a fake clock: debounced and batched re-plans, re-plans limited to the
// jobs an event affects, per-node assignments (versions and the node's part of each plan),
// watchers, and ListNodes pages.
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "controller/cluster_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/topology/fixture_path.h"
#include "tests/util/assigned_plan_view.h"
#include "topology/topology_file.h"

namespace tributary::controller {
namespace {

using ::testing::HasSubstr;

constexpr auto kTimeout = std::chrono::milliseconds(1000);
constexpr auto kDebounce = std::chrono::milliseconds(200);

class ScaleStateTest : public ::testing::Test {
 protected:
  explicit ScaleStateTest(std::chrono::milliseconds debounce = kDebounce)
      : state_(&clock_,
               {.heartbeat_interval = std::chrono::milliseconds(100),
                .heartbeat_timeout = kTimeout,
                .replan_debounce = debounce},
               1) {}

  void Register(const std::string& id, bool offers = true,
                const tributary::v1::Topology* topology = nullptr) {
    tributary::v1::RegisterNodeRequest req;
    req.set_node_id(id);
    if (topology != nullptr) *req.mutable_inventory()->mutable_topology() = *topology;
    req.mutable_inventory()->set_data_plane_address("127.0.0.1:" + std::to_string(1000 + n_++));
    req.mutable_inventory()->set_nic_bytes_per_s(10e9 / 8);
    req.mutable_inventory()->set_sum_bytes_per_s(100e9);
    req.mutable_inventory()->set_offers_summation(offers);
    req.set_expands_packed_plans(packed_plans_);
    tributary::v1::RegisterNodeResponse resp;
    ASSERT_TRUE(state_.RegisterNode(req, &resp).ok());
    incarnations_[id] = resp.incarnation();
  }
  void Heartbeat(const std::string& id) {
    tributary::v1::HeartbeatRequest req;
    req.set_node_id(id);
    req.set_incarnation(incarnations_[id]);
    tributary::v1::HeartbeatResponse resp;
    ASSERT_TRUE(state_.Heartbeat(req, &resp).ok());
  }
  // Every registered node but `silent` heartbeats.
  void HeartbeatAllBut(const std::set<std::string>& silent) {
    for (const auto& [id, inc] : incarnations_) {
      if (!silent.contains(id)) Heartbeat(id);
    }
  }
  tributary::v1::Job Create(const std::string& id, std::vector<std::string> workers,
                            std::optional<uint32_t> max_spares = {}) {
    tributary::v1::CreateJobRequest req;
    req.set_job_id(id);
    for (auto& w : workers) req.mutable_spec()->add_worker_nodes(w);
    if (max_spares) req.mutable_spec()->set_max_spare_nodes(*max_spares);
    tributary::v1::Job job;
    absl::Status s = state_.CreateJob(req, &job);
    EXPECT_TRUE(s.ok()) << s;
    return job;
  }
  tributary::v1::Job Get(const std::string& id) {
    tributary::v1::Job job;
    EXPECT_TRUE(state_.GetJob(id, &job).ok());
    return job;
  }
  static std::vector<std::string> Names(const std::string& prefix, int n) {
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) out.push_back(prefix + std::to_string(i));
    return out;
  }
  static std::set<std::string> Servers(const tributary::v1::Job& job) {
    std::set<std::string> out;
    for (const auto& s : job.plan().servers()) {
      if (!s.is_worker()) out.insert(s.node_id());
    }
    return out;
  }

  common::FakeClock clock_;
  const common::Clock::TimePoint start_ = clock_.Now();
  ClusterState state_;
  int n_ = 0;
  std::map<std::string, uint64_t> incarnations_;
  bool packed_plans_ = true;  // as agents register (expands_packed_plans)
};

TEST_F(ScaleStateTest, DeathsWithinTheDebounceAreOneReplanPerJob) {
  for (const auto& w : Names("w", 3)) Register(w, false);
  for (const auto& s : Names("s", 3)) Register(s);
  const tributary::v1::Job job = Create("j", Names("w", 3));
  ASSERT_EQ(Servers(job).size(), 3u);

  // s0 goes silent at 0 ms, s1 at 150 ms: they die at sweeps 150 ms apart, one re-plan follows,
  // once the debounce has passed since the first death.
  clock_.Advance(std::chrono::milliseconds(150));
  HeartbeatAllBut({"s0"});
  auto sweep_at = [&](std::chrono::milliseconds t) {
    clock_.Advance(start_ + t - clock_.Now());
    HeartbeatAllBut({"s0", "s1"});
    state_.CheckLiveness();
  };
  sweep_at(std::chrono::milliseconds(1001));  // s0 dead
  EXPECT_EQ(state_.pending_replans(), 1u);
  EXPECT_EQ(Get("j").state(), tributary::v1::JOB_STATE_RUNNING);  // spares only
  sweep_at(std::chrono::milliseconds(1152));                      // s1 dead
  EXPECT_EQ(Get("j").plan().version(), job.plan().version()) << "re-planned before the debounce";
  EXPECT_EQ(state_.pending_replans(), 1u);
  sweep_at(std::chrono::milliseconds(1201));  // 200 ms after the first mark
  const tributary::v1::Job after = Get("j");
  EXPECT_EQ(after.plan().version(), job.plan().version() + 1);
  EXPECT_EQ(Servers(after), (std::set<std::string>{"s2"}));
  EXPECT_EQ(state_.pending_replans(), 0u);
}

TEST_F(ScaleStateTest, AReturnReplansOnlyTheJobsThatNeedTheNode) {
  // Job a uses spares s0..s1, job b spare s2 only (max 1 spare after a's are taken is not
  // deterministic, so b's workers do not offer summation and b gets exactly one spare).
  for (const auto& w : Names("a", 3)) Register(w, false);
  for (const auto& w : Names("b", 3)) Register(w, false);
  for (const auto& s : Names("s", 3)) Register(s);
  Register("idle", false);
  const tributary::v1::Job a = Create("a", Names("a", 3), 2);
  const tributary::v1::Job b = Create("b", Names("b", 3), 1);
  const std::set<std::string> a_servers = Servers(a);
  ASSERT_EQ(a_servers.size(), 2u);
  std::string unused;  // a spare that job a does not use
  for (const auto& s : Names("s", 3)) {
    if (!a_servers.contains(s)) unused = s;
  }
  ASSERT_FALSE(unused.empty());
  const uint64_t b_version = Get("b").plan().version();

  // "idle" (no job's node) and a's worker a0 die, and come back.
  clock_.Advance(kTimeout + std::chrono::milliseconds(1));
  HeartbeatAllBut({"idle", "a0"});
  state_.CheckLiveness();
  EXPECT_EQ(Get("a").state(), tributary::v1::JOB_STATE_DEGRADED);
  EXPECT_THAT(Get("a").message(), HasSubstr("a0"));
  EXPECT_EQ(state_.pending_replans(), 1u);  // a only: nothing else names a0 or idle
  Heartbeat("idle");
  EXPECT_EQ(state_.pending_replans(), 1u);
  Heartbeat("a0");
  EXPECT_EQ(Get("a").state(), tributary::v1::JOB_STATE_RUNNING);
  clock_.Advance(kDebounce);
  HeartbeatAllBut({});
  state_.CheckLiveness();
  EXPECT_EQ(state_.pending_replans(), 0u);
  EXPECT_EQ(Get("b").plan().version(), b_version) << "b was re-planned for nodes it never used";
}

TEST_F(ScaleStateTest, AssignmentsArePerNodeAndCarryOnlyTheNodesOwnIntraNodePlan) {
  auto dgx = topology::LoadTopologyFile(topology::FixturePath("dgx1v_nccl_topo.xml"));
  ASSERT_TRUE(dgx.ok()) << dgx.status();
  for (const auto& w : Names("w", 3)) {
    tributary::v1::Topology t = *dgx;
    t.set_hostname(w);  // same model, other host: one intra-node plan for all three
    Register(w, false, &t);
  }
  Register("s0");
  Register("loner", false);
  const uint64_t loner = state_.assignments_version("loner");
  const uint64_t w0 = state_.assignments_version("w0");
  const tributary::v1::Job job = Create("j", Names("w", 3));
  ASSERT_EQ(job.plan().intra_node_size(), 3);
  EXPECT_EQ(state_.assignments_version("loner"), loner) << "a plan of others moved its version";
  EXPECT_GT(state_.assignments_version("w0"), w0);
  for (int i = 0; i < 3; ++i) {
    tributary::v1::IntraNodePlan other = job.plan().intra_node(i);
    other.set_node_id("w0");
    EXPECT_EQ(other.SerializeAsString(), job.plan().intra_node(0).SerializeAsString())
        << "identical topologies planned differently";
  }

  for (const std::string node : {"w1", "s0"}) {
    tributary::v1::GetAssignmentsRequest req;
    req.set_node_id(node);
    tributary::v1::GetAssignmentsResponse resp;
    ASSERT_TRUE(state_.GetAssignments(req, &resp).ok());
    EXPECT_EQ(resp.assignments_version(), state_.assignments_version(node));
    ASSERT_EQ(resp.plans_size(), 1);
    tributary::v1::JobPlan part = resp.plans(0);
    // Packed (tributary/v1/assigned_plan.h): the workers travel inside the packed fields.
    EXPECT_EQ(part.workers_size(), 0);
    EXPECT_GT(part.packed_size(), 0u);
    ASSERT_TRUE(tributary::v1::ExpandAssignedPlan(part).ok());
    // The node gets the job's data-plane secret, which CreateJob's answer leaves out.
    EXPECT_EQ(part.job_secret().size(), 32u);
    part.clear_job_secret();
    tributary::v1::JobPlan expected = job.plan();
    expected.clear_intra_node();
    if (node == "w1") *expected.add_intra_node() = job.plan().intra_node(1);
    EXPECT_EQ(part.SerializeAsString(), testing::AsAssigned(expected).SerializeAsString()) << node;
  }
}

// An agent from before packed plans (expands_packed_plans unset) gets its part of each plan whole.
TEST_F(ScaleStateTest, AnAgentThatDoesNotExpandGetsPlansWhole) {
  Register("w0");
  packed_plans_ = false;
  Register("old");
  const tributary::v1::Job job = Create("j", {"w0", "old"});
  for (const std::string node : {"w0", "old"}) {
    tributary::v1::GetAssignmentsRequest req;
    req.set_node_id(node);
    tributary::v1::GetAssignmentsResponse resp;
    ASSERT_TRUE(state_.GetAssignments(req, &resp).ok());
    ASSERT_EQ(resp.plans_size(), 1);
    tributary::v1::JobPlan part = resp.plans(0);
    EXPECT_EQ(part.packed().empty(), node == "old") << node;
    if (node == "w0") {
      ASSERT_TRUE(tributary::v1::ExpandAssignedPlan(part).ok());
    }
    part.clear_job_secret();
    tributary::v1::JobPlan expected = job.plan();
    expected.clear_intra_node();
    for (const auto& intra : job.plan().intra_node()) {
      if (intra.node_id() == node) *expected.add_intra_node() = intra;  // its own entry only
    }
    if (node == "w0") expected = testing::AsAssigned(expected);
    EXPECT_EQ(part.SerializeAsString(), expected.SerializeAsString()) << node;
  }
  // Registering again with the flag: from then on packed.
  packed_plans_ = true;
  Register("old");
  tributary::v1::GetAssignmentsRequest req;
  req.set_node_id("old");
  tributary::v1::GetAssignmentsResponse resp;
  ASSERT_TRUE(state_.GetAssignments(req, &resp).ok());
  ASSERT_EQ(resp.plans_size(), 1);
  EXPECT_FALSE(resp.plans(0).packed().empty());
}

TEST_F(ScaleStateTest, ANodeBackFromTheDeadForgetsADeletedJob) {
  for (const auto& w : Names("w", 3)) Register(w, false);
  Register("s0");
  const tributary::v1::Job job = Create("j", Names("w", 3));
  ASSERT_TRUE(Servers(job).contains("s0"));
  clock_.Advance(kTimeout + std::chrono::milliseconds(1));
  HeartbeatAllBut({"s0"});
  state_.CheckLiveness();  // s0 dead: j lost it
  clock_.Advance(kDebounce);
  HeartbeatAllBut({"s0"});
  state_.CheckLiveness();  // j re-planned without s0
  ASSERT_FALSE(Servers(Get("j")).contains("s0"));
  Heartbeat("s0");  // back: j is marked, and no longer names s0
  ASSERT_TRUE(state_.DeleteJob("j").ok());
  // s0 dies and comes back again: nothing may still point at j.
  clock_.Advance(kTimeout + std::chrono::milliseconds(1));
  HeartbeatAllBut({"s0"});
  state_.CheckLiveness();
  Heartbeat("s0");
  clock_.Advance(kDebounce);
  state_.CheckLiveness();
  tributary::v1::ListNodesResponse nodes;
  ASSERT_TRUE(state_.ListNodes({}, &nodes).ok());
  for (const auto& n : nodes.nodes()) {
    EXPECT_TRUE(n.worker_of().empty() && n.server_of().empty()) << n.node_id();
  }
  EXPECT_EQ(state_.pending_replans(), 0u);
}

class RecordingWatcher : public ClusterState::AssignmentsWatcher {
 public:
  void Push(uint64_t version, const grpc::ByteBuffer& message) override {
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(message.Dump(&slices).ok());
    std::string bytes;
    for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    tributary::v1::WatchAssignmentsResponse resp;
    ASSERT_TRUE(resp.ParseFromString(bytes));
    EXPECT_EQ(resp.assignments_version(), version);
    received.push_back(std::move(resp));
  }
  void End(const absl::Status& why) override { ended.push_back(why); }
  std::vector<tributary::v1::WatchAssignmentsResponse> received;
  std::vector<absl::Status> ended;
};

TEST_F(ScaleStateTest, WatchersGetTheCurrentAssignmentsThenEveryChange) {
  for (const auto& w : Names("w", 3)) Register(w, false);
  Register("s0");
  Register("s1");
  RecordingWatcher fresh, resumed;
  tributary::v1::WatchAssignmentsRequest req;
  req.set_node_id("w0");
  req.set_incarnation(incarnations_["w0"]);
  ASSERT_TRUE(state_.Watch(req, &fresh).ok());  // since 0: the current (empty) set at once
  ASSERT_EQ(fresh.received.size(), 1u);
  EXPECT_EQ(fresh.received[0].plans_size(), 0);
  req.set_since_version(state_.assignments_version("w0"));
  ASSERT_TRUE(state_.Watch(req, &resumed).ok());  // up to date: nothing until a change
  EXPECT_TRUE(resumed.received.empty());

  Create("j", Names("w", 3));
  clock_.Advance(kTimeout + std::chrono::milliseconds(1));
  HeartbeatAllBut({"s1"});
  state_.CheckLiveness();
  clock_.Advance(kDebounce);
  HeartbeatAllBut({"s1"});
  state_.CheckLiveness();  // re-planned without s1
  ASSERT_TRUE(state_.DeleteJob("j").ok());
  ASSERT_EQ(resumed.received.size(), 3u);
  EXPECT_EQ(resumed.received[0].plans_size(), 1);
  EXPECT_EQ(resumed.received[1].plans_size(), 1);
  tributary::v1::Job replanned;
  *replanned.mutable_plan() = resumed.received[1].plans(0);
  ASSERT_TRUE(tributary::v1::ExpandAssignedPlan(*replanned.mutable_plan()).ok());
  EXPECT_EQ(Servers(replanned), std::set<std::string>{"s0"});
  EXPECT_GT(resumed.received[1].plans(0).version(), resumed.received[0].plans(0).version());
  EXPECT_EQ(resumed.received[2].plans_size(), 0);  // deleted
  for (size_t i = 1; i < resumed.received.size(); ++i) {
    EXPECT_GT(resumed.received[i].assignments_version(),
              resumed.received[i - 1].assignments_version());
  }
  EXPECT_EQ(resumed.received.back().assignments_version(), state_.assignments_version("w0"));
  EXPECT_EQ(fresh.received.size(), 4u);
  state_.Unwatch("w0", &fresh);
  state_.Unwatch("w0", &resumed);
  Create("k", Names("w", 3));
  EXPECT_EQ(fresh.received.size(), 4u);

  req.set_incarnation(incarnations_["w0"] + 1);
  RecordingWatcher stale;
  EXPECT_EQ(state_.Watch(req, &stale).code(), absl::StatusCode::kNotFound);
}

// Heartbeats stay small (agent/load_delta.h): load_unchanged keeps the measured load the node
// reported last; its job observations are taken from each heartbeat.
TEST_F(ScaleStateTest, AHeartbeatWithItsLoadUnchangedKeepsTheLoadLastReported) {
  Register("n");
  auto beat = [&](bool unchanged, double cpu, const std::string& job) {
    tributary::v1::HeartbeatRequest req;
    req.set_node_id("n");
    req.set_incarnation(incarnations_["n"]);
    req.set_load_unchanged(unchanged);
    if (!unchanged) {
      req.mutable_load()->set_cpu_busy_fraction(cpu);
      req.mutable_load()->set_nic_tx_bytes_per_s(5e6);
      req.mutable_load()->set_memory_used_bytes(uint64_t{3} << 30);
    }
    req.mutable_load()->add_jobs()->set_job_id(job);
    tributary::v1::HeartbeatResponse resp;
    ASSERT_TRUE(state_.Heartbeat(req, &resp).ok());
  };
  auto load = [&] {
    tributary::v1::ListNodesResponse nodes;
    EXPECT_TRUE(state_.ListNodes({}, &nodes).ok());
    EXPECT_EQ(nodes.nodes_size(), 1);
    return nodes.nodes(0).load();
  };
  beat(false, 0.4, "a");
  beat(true, 0, "b");
  tributary::v1::NodeLoad held = load();
  EXPECT_DOUBLE_EQ(held.cpu_busy_fraction(), 0.4);
  EXPECT_DOUBLE_EQ(held.nic_tx_bytes_per_s(), 5e6);
  EXPECT_EQ(held.memory_used_bytes(), uint64_t{3} << 30);
  ASSERT_EQ(held.jobs_size(), 1);
  EXPECT_EQ(held.jobs(0).job_id(), "b");
  beat(false, 0.9, "c");
  held = load();
  EXPECT_DOUBLE_EQ(held.cpu_busy_fraction(), 0.9);
  EXPECT_EQ(held.jobs(0).job_id(), "c");
}

TEST_F(ScaleStateTest, WatchersOfANodeDeadForTheLingerAreEndedAndDropped) {
  Register("n");
  Register("m");
  RecordingWatcher n, m;
  for (auto [id, w] : {std::pair{"n", &n}, std::pair{"m", &m}}) {
    tributary::v1::WatchAssignmentsRequest req;
    req.set_node_id(id);
    req.set_incarnation(incarnations_[id]);
    ASSERT_TRUE(state_.Watch(req, w).ok());
  }
  clock_.Advance(kTimeout + std::chrono::milliseconds(1));
  state_.CheckLiveness();  // both dead
  clock_.Advance(std::chrono::seconds(59));
  Heartbeat("m");  // back within the linger
  state_.CheckLiveness();
  EXPECT_TRUE(n.ended.empty());
  clock_.Advance(std::chrono::seconds(1));
  state_.CheckLiveness();
  ASSERT_EQ(n.ended.size(), 1u);
  EXPECT_EQ(n.ended[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(n.ended[0].message(), HasSubstr("'n' has been dead (no heartbeat) for 60 s"));
  clock_.Advance(std::chrono::seconds(120));
  Heartbeat("m");
  state_.CheckLiveness();
  EXPECT_TRUE(m.ended.empty());
  // Dropped: n's return and a plan that names it reach only a new watcher.
  Heartbeat("n");
  const size_t before = n.received.size();
  RecordingWatcher again;
  tributary::v1::WatchAssignmentsRequest req;
  req.set_node_id("n");
  req.set_incarnation(incarnations_["n"]);
  ASSERT_TRUE(state_.Watch(req, &again).ok());
  Create("j", {"n"});
  EXPECT_EQ(n.received.size(), before);
  EXPECT_FALSE(again.received.empty());
  EXPECT_EQ(n.ended.size(), 1u);
}

// The controller's loop sleeps until NextCheck: the first heartbeat to expire, then the debounce.
TEST_F(ScaleStateTest, NextCheckIsTheFirstExpiryThenTheEndOfTheDebounce) {
  EXPECT_EQ(state_.NextCheck(), common::Clock::TimePoint::max());
  constexpr auto kMoment = std::chrono::microseconds(1);
  const auto t0 = clock_.Now();
  Register("a");
  EXPECT_EQ(state_.NextCheck(), t0 + kTimeout + kMoment);
  clock_.Advance(std::chrono::milliseconds(300));
  Register("b");
  EXPECT_EQ(state_.NextCheck(), t0 + kTimeout + kMoment);  // a expires first
  clock_.Advance(kTimeout - std::chrono::milliseconds(300) + kMoment);
  state_.CheckLiveness();  // a is dead, b is not
  EXPECT_EQ(state_.NextCheck(), t0 + std::chrono::milliseconds(300) + kTimeout + kMoment);
  Create("j", {"b"});
  Register("c");  // new capacity: j is marked, due a debounce from now, before b expires
  EXPECT_EQ(state_.NextCheck(), clock_.Now() + kDebounce);
}

TEST_F(ScaleStateTest, NextCheckIsADeadNodesWatchLingerWhenNothingIsAlive) {
  Register("a");
  clock_.Advance(kTimeout + std::chrono::microseconds(1));
  state_.CheckLiveness();  // a is dead: its watchers end 60 s from now
  EXPECT_EQ(state_.NextCheck(), clock_.Now() + std::chrono::seconds(60));
  clock_.Advance(std::chrono::seconds(60));
  state_.CheckLiveness();
  EXPECT_EQ(state_.NextCheck(), common::Clock::TimePoint::max());
}

TEST_F(ScaleStateTest, ListNodesPagesEveryNodeOnceInOrder) {
  for (int i = 0; i < 1203; ++i) Register("n" + std::to_string(10000 + i));
  std::vector<std::string> seen;
  tributary::v1::ListNodesRequest req;
  int pages = 0;
  do {
    tributary::v1::ListNodesResponse resp;
    ASSERT_TRUE(state_.ListNodes(req, &resp).ok());
    EXPECT_LE(resp.nodes_size(), 500);
    for (const auto& n : resp.nodes()) seen.push_back(n.node_id());
    req.set_page_token(resp.next_page_token());
    ++pages;
  } while (!req.page_token().empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  ASSERT_EQ(seen.size(), 1203u);
  for (int i = 0; i < 1203; ++i) EXPECT_EQ(seen[i], "n" + std::to_string(10000 + i));

  req.set_page_size(7);
  req.set_page_token("n10005");
  tributary::v1::ListNodesResponse page;
  ASSERT_TRUE(state_.ListNodes(req, &page).ok());
  ASSERT_EQ(page.nodes_size(), 7);
  EXPECT_EQ(page.nodes(0).node_id(), "n10006");
  EXPECT_EQ(page.next_page_token(), "n10012");
  req.set_page_token("not a node id!");
  EXPECT_EQ(state_.ListNodes(req, &page).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ScaleStateTest, HeartbeatIntervalGrowsWithTheCluster) {
  tributary::v1::RegisterNodeRequest req;
  req.set_node_id("x");
  req.mutable_inventory()->set_data_plane_address("127.0.0.1:1");
  req.mutable_inventory()->set_nic_bytes_per_s(10e9 / 8);
  req.mutable_inventory()->set_sum_bytes_per_s(100e9);
  tributary::v1::RegisterNodeResponse resp;
  ASSERT_TRUE(state_.RegisterNode(req, &resp).ok());
  EXPECT_EQ(resp.heartbeat_interval_ms(), 100u);
  ClusterState big(&clock_,
                   {.heartbeat_interval = std::chrono::milliseconds(100),
                    .heartbeat_timeout = std::chrono::seconds(3),
                    .max_heartbeats_per_s = 10},
                   1);
  for (int i = 0; i < 5; ++i) {
    req.set_node_id("n" + std::to_string(i));
    ASSERT_TRUE(big.RegisterNode(req, &resp).ok());
  }
  EXPECT_EQ(resp.heartbeat_interval_ms(), 500u);  // 5 nodes at 10 heartbeats/s in all
  for (int i = 5; i < 200; ++i) {
    req.set_node_id("n" + std::to_string(i));
    ASSERT_TRUE(big.RegisterNode(req, &resp).ok());
  }
  EXPECT_EQ(resp.heartbeat_interval_ms(), 1000u);  // the cap: a third of the 3 s timeout
}

// Jobs with max_spare_nodes plan over the index of spares (their workers, their own spares and
// the k most useful others) instead of every summation node: the plans must be the full scan's.
// Two states get the same random cluster -- NICs, loads, CPU, nodes offering summation or not,
// jobs with and without a spare limit, deaths, returns and deletions -- and every plan is
// compared byte for byte after each step.
TEST(SpareIndexTest, PlansOverTheIndexAreThePlansOverEveryNode) {
  common::FakeClock clock;
  ClusterState::Options options{.heartbeat_interval = std::chrono::milliseconds(100),
                                .heartbeat_timeout = kTimeout};
  ClusterState indexed(&clock, options, 7);
  options.spare_index = false;
  ClusterState scanned(&clock, options, 7);
  std::mt19937 rng(2026);
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  constexpr int kNodes = 80;
  std::map<std::string, uint64_t> incarnations;
  for (int i = 0; i < kNodes; ++i) {
    tributary::v1::RegisterNodeRequest req;
    req.set_node_id("n" + std::to_string(i));
    req.set_agent_instance(1000 + i);
    auto& inv = *req.mutable_inventory();
    inv.set_data_plane_address("127.0.0.1:" + std::to_string(3000 + i));
    inv.set_nic_bytes_per_s(i % 13 == 5 ? 1e6 : uniform(1e9, 12.5e9));  // a few very slow
    inv.set_sum_bytes_per_s(i % 7 == 3 ? 1e6 : uniform(2e9, 40e9));
    inv.set_offers_summation(i % 5 != 0);
    tributary::v1::RegisterNodeResponse a, b;
    ASSERT_TRUE(indexed.RegisterNode(req, &a).ok());
    ASSERT_TRUE(scanned.RegisterNode(req, &b).ok());
    ASSERT_EQ(a.incarnation(), b.incarnation());
    incarnations[req.node_id()] = a.incarnation();
  }
  std::set<std::string> silent;
  auto beat_all = [&] {
    for (const auto& [id, incarnation] : incarnations) {
      if (silent.contains(id)) continue;
      tributary::v1::HeartbeatRequest req;
      req.set_node_id(id);
      req.set_incarnation(incarnation);
      auto& load = *req.mutable_load();
      load.set_cpu_busy_fraction(uniform(0, 1) < 0.3 ? uniform(0, 1) : 0);
      load.set_nic_tx_bytes_per_s(uniform(0, 1) < 0.3 ? uniform(0, 8e9) : 0);
      load.set_nic_rx_bytes_per_s(uniform(0, 1) < 0.2 ? uniform(0, 3e9) : 0);
      tributary::v1::HeartbeatResponse a, b;
      ASSERT_TRUE(indexed.Heartbeat(req, &a).ok());
      ASSERT_TRUE(scanned.Heartbeat(req, &b).ok());
    }
  };
  std::vector<std::string> jobs;
  auto compare = [&](const std::string& step) {
    for (const std::string& id : jobs) {
      tributary::v1::Job a, b;
      const absl::Status sa = indexed.GetJob(id, &a);
      ASSERT_EQ(sa.code(), scanned.GetJob(id, &b).code()) << step << " " << id;
      if (!sa.ok()) continue;
      ASSERT_FALSE(a.has_plan_page());
      EXPECT_EQ(a.plan().SerializeAsString(), b.plan().SerializeAsString()) << step << " " << id;
    }
  };
  int spare_limited = 0;
  for (int round = 0; round < 12; ++round) {
    beat_all();
    // A job of 2-6 workers; most limit their spares.
    tributary::v1::CreateJobRequest req;
    req.set_job_id("job" + std::to_string(round));
    std::set<int> picked;
    const int workers = 2 + static_cast<int>(rng() % 5);
    while (static_cast<int>(picked.size()) < workers) {
      const int w = static_cast<int>(rng() % kNodes);
      if (w % 13 != 5 && !silent.contains("n" + std::to_string(w))) picked.insert(w);
    }
    for (int w : picked) req.mutable_spec()->add_worker_nodes("n" + std::to_string(w));
    if (round % 4 != 3) {
      req.mutable_spec()->set_max_spare_nodes(1 + static_cast<uint32_t>(rng() % 6));
      ++spare_limited;
    }
    tributary::v1::Job a, b;
    const absl::Status sa = indexed.CreateJob(req, &a);
    ASSERT_EQ(sa.code(), scanned.CreateJob(req, &b).code()) << sa;
    if (sa.ok()) jobs.push_back(req.job_id());
    compare("create " + req.job_id());
    // Now and then: two nodes die, the dead ones come back, a job goes.
    if (round % 3 == 1) {
      silent = {"n" + std::to_string(rng() % kNodes), "n" + std::to_string(rng() % kNodes)};
      clock.Advance(kTimeout / 2);
      beat_all();
      clock.Advance(kTimeout / 2 + std::chrono::milliseconds(1));
      indexed.CheckLiveness();
      scanned.CheckLiveness();
      compare("deaths");
    } else if (round % 3 == 2) {
      silent.clear();
      beat_all();
      compare("returns");
    }
    if (round % 5 == 4 && !jobs.empty()) {
      ASSERT_TRUE(indexed.DeleteJob(jobs.front()).ok());
      ASSERT_TRUE(scanned.DeleteJob(jobs.front()).ok());
      jobs.erase(jobs.begin());
      compare("delete");
    }
  }
  EXPECT_GE(jobs.size(), 5u);
  EXPECT_GE(spare_limited, 8);
}

}  // namespace
}  // namespace tributary::controller
