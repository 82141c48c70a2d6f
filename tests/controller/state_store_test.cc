// The controller's durable state: the SQLite store on its own (round trips, the version
// high-water mark, files it must refuse) and ClusterState restoring from it with a fake clock.
#include "controller/state_store.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "common/clock.h"
#include "common/metrics/metrics.h"
#include "controller/cluster_state.h"
#include "controller/sqlite.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace tributary::controller {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

class StateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/state-store-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/controller.db";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  static tributary::v1::Job MakeJob(const std::string& id, uint64_t version, int workers = 2) {
    tributary::v1::Job job;
    job.set_job_id(id);
    job.mutable_spec()->set_procs_per_node(2);
    job.mutable_plan()->set_job_id(id);
    job.mutable_plan()->set_version(version);
    for (int w = 0; w < workers; ++w) {
      job.mutable_spec()->add_worker_nodes("w" + std::to_string(w));
      job.mutable_plan()->add_workers()->set_node_id("w" + std::to_string(w));
    }
    job.set_state(tributary::v1::JOB_STATE_RUNNING);
    return job;
  }

  void WriteFile(const std::string& bytes) {
    std::ofstream f(path_, std::ios::binary | std::ios::trunc);
    f << bytes;
  }

  std::string dir_, path_;
};

bool Same(const tributary::v1::Job& a, const tributary::v1::Job& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

TEST_F(StateStoreTest, JobsAndPlansRoundTripAcrossReopen) {
  const tributary::v1::Job a = MakeJob("a", 3), b = MakeJob("b", 7, 5);
  {
    auto store = StateStore::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    auto loaded = (*store)->Load();
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_TRUE(loaded->created);
    EXPECT_TRUE(loaded->jobs.empty());
    EXPECT_EQ(loaded->starts, 1u);
    ASSERT_TRUE((*store)->Commit({&a, &b}, {}, 7).ok());
  }
  tributary::v1::Job b2 = b;
  b2.mutable_plan()->set_version(8);
  {
    auto store = StateStore::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    auto loaded = (*store)->Load();
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_FALSE(loaded->created);
    EXPECT_EQ(loaded->starts, 2u);
    ASSERT_EQ(loaded->jobs.size(), 2u);
    EXPECT_TRUE(Same(loaded->jobs[0], a));
    EXPECT_TRUE(Same(loaded->jobs[1], b));
    EXPECT_EQ(loaded->max_plan_version, 7u);
    // Replace b, delete a, in one transaction.
    ASSERT_TRUE((*store)->Commit({&b2}, {"a"}, 8).ok());
  }
  auto store = StateStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  auto loaded = (*store)->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->jobs.size(), 1u);
  EXPECT_TRUE(Same(loaded->jobs[0], b2));
  EXPECT_EQ(loaded->starts, 3u);
}

TEST_F(StateStoreTest, PlanVersionHighWaterMarkNeverGoesDown) {
  {
    auto store = StateStore::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    const tributary::v1::Job j = MakeJob("j", 41);
    ASSERT_TRUE((*store)->Commit({&j}, {}, 41).ok());
    ASSERT_TRUE((*store)->Commit({}, {"j"}, 12).ok());  // a lower mark does not lower it
  }
  auto store = StateStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  auto loaded = (*store)->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->jobs.empty());
  EXPECT_EQ(loaded->max_plan_version, 41u);  // the deleted job's epoch is remembered
}

TEST_F(StateStoreTest, TruncatedFileIsAClearError) {
  {
    auto store = StateStore::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    std::vector<tributary::v1::Job> jobs;
    for (int i = 0; i < 64; ++i) jobs.push_back(MakeJob("job-" + std::to_string(i), i + 1, 40));
    std::vector<const tributary::v1::Job*> put;
    for (const auto& j : jobs) put.push_back(&j);
    ASSERT_TRUE((*store)->Commit(put, {}, 64).ok());
  }  // a clean close checkpoints the WAL into the file and removes it
  ASSERT_FALSE(fs::exists(path_ + "-wal"));
  const auto size = fs::file_size(path_);
  ASSERT_GT(size, 4u * 4096);
  fs::resize_file(path_, size / 2);
  auto store = StateStore::Open(path_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(store.status().message(),
              AllOf(HasSubstr(path_), HasSubstr("truncated"), HasSubstr("move it away")));
}

TEST_F(StateStoreTest, EmptyFileIsAClearErrorNotAFreshDatabase) {
  WriteFile("");
  auto store = StateStore::Open(path_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(store.status().message(), AllOf(HasSubstr(path_), HasSubstr("empty")));
}

TEST_F(StateStoreTest, GarbageFileIsAClearError) {
  std::string garbage(8192, '\0');
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>(i * 131 + 7);
  WriteFile(garbage);
  auto store = StateStore::Open(path_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(store.status().message(), AllOf(HasSubstr(path_), HasSubstr("not an SQLite database"),
                                              HasSubstr("restore the file from a backup")));
  // Nothing was written over it.
  std::ifstream f(path_, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(f), {}), garbage);
}

TEST_F(StateStoreTest, CorruptPagesAreAClearError) {
  {
    auto store = StateStore::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    std::vector<tributary::v1::Job> jobs;
    for (int i = 0; i < 64; ++i) jobs.push_back(MakeJob("job-" + std::to_string(i), i + 1, 40));
    std::vector<const tributary::v1::Job*> put;
    for (const auto& j : jobs) put.push_back(&j);
    ASSERT_TRUE((*store)->Commit(put, {}, 64).ok());
  }
  // Scribble over everything after the first page (the header stays valid).
  std::fstream f(path_, std::ios::binary | std::ios::in | std::ios::out);
  const auto size = fs::file_size(path_);
  f.seekp(4096);
  f << std::string(size - 4096, '\xa5');
  f.close();
  auto store = StateStore::Open(path_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(store.status().message(), AllOf(HasSubstr(path_), HasSubstr("move it away")));
}

TEST_F(StateStoreTest, UnknownSchemaVersionIsAClearError) {
  ASSERT_TRUE(StateStore::Open(path_).ok());
  {
    auto db = SqliteDb::Open(path_, false);
    ASSERT_TRUE(db.ok()) << db.status();
    ASSERT_TRUE((*db)->Exec("UPDATE schema_version SET version = 99").ok());
  }
  auto store = StateStore::Open(path_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(),
              AllOf(HasSubstr(path_), HasSubstr("schema version 99"), HasSubstr("up to 1")));
}

TEST_F(StateStoreTest, ForeignSqliteDatabaseIsRefused) {
  {
    auto db = SqliteDb::Open(path_, true);
    ASSERT_TRUE(db.ok()) << db.status();
    ASSERT_TRUE((*db)->Exec("CREATE TABLE photos(id INTEGER PRIMARY KEY)").ok());
  }
  auto store = StateStore::Open(path_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(store.status().message(),
              AllOf(HasSubstr(path_), HasSubstr("not a Tributary state database")));
}

TEST_F(StateStoreTest, CorruptJobRowNamesTheJob) {
  ASSERT_TRUE(StateStore::Open(path_).ok());
  {
    auto db = SqliteDb::Open(path_, false);
    ASSERT_TRUE(db.ok()) << db.status();
    ASSERT_TRUE(
        (*db)
            ->Exec("INSERT INTO jobs(job_id, plan_version, job) VALUES ('bert', 3, x'ffff0102')")
            .ok());
  }
  auto store = StateStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  auto loaded = (*store)->Load();
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(loaded.status().message(), AllOf(HasSubstr(path_), HasSubstr("'bert'")));
}

TEST_F(StateStoreTest, UnusablePathsAreClearErrors) {
  auto dir = StateStore::Open(dir_);
  ASSERT_FALSE(dir.ok());
  EXPECT_THAT(dir.status().message(), AllOf(HasSubstr(dir_), HasSubstr("is a directory")));
  const std::string missing_folder = dir_ + "/no/such/folder/controller.db";
  auto missing = StateStore::Open(missing_folder);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(missing.status().message(), HasSubstr(missing_folder));
}

// ClusterState over a store: what a controller restart sees.
class RestoreTest : public StateStoreTest {
 protected:
  static constexpr auto kGrace = std::chrono::seconds(5);

  // A controller "process": its store, registry and state.
  struct Controller {
    std::unique_ptr<StateStore> store;
    prometheus::Registry registry;
    std::unique_ptr<ClusterState> state;
    std::map<std::string, uint64_t> incarnations;
  };

  std::unique_ptr<Controller> Start() {
    auto c = std::make_unique<Controller>();
    auto store = StateStore::Open(path_);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return nullptr;
    c->store = *std::move(store);
    // Heartbeats time out long after the grace: liveness is not what these tests are about.
    ClusterState::Options options{std::chrono::milliseconds(100), std::chrono::seconds(60), kGrace};
    c->state = std::make_unique<ClusterState>(&clock_, options, 1, &c->registry, c->store.get());
    return c;
  }

  // By default the same inventory at every registration, as an agent that outlives the
  // controller has.
  void Register(Controller& c, const std::string& id, std::string address = "") {
    if (address.empty()) {
      address = "127.0.0.1:" + std::to_string(1000 + std::hash<std::string>{}(id) % 1000);
    }
    tributary::v1::RegisterNodeRequest req;
    req.set_node_id(id);
    req.mutable_inventory()->set_data_plane_address(address);
    req.mutable_inventory()->set_nic_bytes_per_s(10e9 / 8);
    req.mutable_inventory()->set_sum_bytes_per_s(100e9);
    req.mutable_inventory()->set_offers_summation(true);
    tributary::v1::RegisterNodeResponse resp;
    ASSERT_TRUE(c.state->RegisterNode(req, &resp).ok());
    c.incarnations[id] = resp.incarnation();
  }

  absl::StatusOr<tributary::v1::Job> Create(Controller& c, const std::string& id,
                                            std::vector<std::string> workers) {
    tributary::v1::CreateJobRequest req;
    req.set_job_id(id);
    for (auto& w : workers) req.mutable_spec()->add_worker_nodes(w);
    tributary::v1::Job job;
    absl::Status s = c.state->CreateJob(req, &job);
    if (!s.ok()) return s;
    return job;
  }

  static double Metric(Controller& c, const std::string& name,
                       const std::vector<std::pair<std::string, std::string>>& labels = {}) {
    std::vector<prometheus::MetricFamily> f = c.registry.Collect();
    for (auto& m : c.state->CollectMetrics()) f.push_back(std::move(m));
    const prometheus::ClientMetric* m = common::metrics::FindSample(f, name, labels);
    if (m == nullptr) return -1;
    return name.ends_with("_total") ? m->counter.value : m->gauge.value;
  }

  common::FakeClock clock_;
};

TEST_F(RestoreTest, JobsComeBackWithTheirPlanAndWaitForTheirNodes) {
  tributary::v1::Job before;
  {
    auto c = Start();
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(c->state->Restore().ok());
    EXPECT_EQ(Metric(*c, "tributary_controller_state_restores_total"), 0);  // a new file
    // Three workers: a spare summation server helps (with two it would not be in the plan).
    for (const char* n : {"w0", "w1", "w2", "s0"}) Register(*c, n);
    auto job = Create(*c, "j", {"w0", "w1", "w2"});
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(job->plan().servers_size(), 4);
    Register(*c, "s1");  // a membership change: re-planned, stored before it is visible
    ASSERT_TRUE(c->state->GetJob("j", &before).ok());
    ASSERT_GT(before.plan().version(), job->plan().version());
    EXPECT_EQ(Metric(*c, "tributary_controller_state_writes_total", {{"result", "ok"}}), 2);
  }  // the controller is gone

  auto c = Start();
  ASSERT_NE(c, nullptr);
  auto restored = c->state->Restore();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, 1u);
  EXPECT_EQ(Metric(*c, "tributary_controller_state_restores_total"), 1);
  EXPECT_EQ(Metric(*c, "tributary_controller_restored_jobs"), 1);
  EXPECT_EQ(Metric(*c, "tributary_controller_restored_jobs_waiting"), 1);
  tributary::v1::Job job;
  ASSERT_TRUE(c->state->GetJob("j", &job).ok());
  EXPECT_EQ(job.plan().version(), before.plan().version());
  EXPECT_EQ(job.state(), tributary::v1::JOB_STATE_DEGRADED);
  EXPECT_THAT(job.message(), AllOf(HasSubstr("restored"), HasSubstr("s0, s1, w0, w1, w2")));

  // Nodes come back one by one: the stored plan is served as is (no epoch change for agents that
  // still run it) until the last one is back.
  std::string secret;  // every node of the restored job gets the same one
  for (const char* n : {"w0", "s1", "w1", "w2"}) {
    Register(*c, n);
    tributary::v1::GetAssignmentsRequest req;
    req.set_node_id(n);
    tributary::v1::GetAssignmentsResponse resp;
    ASSERT_TRUE(c->state->GetAssignments(req, &resp).ok());
    ASSERT_EQ(resp.plans_size(), 1);
    // The node's part of the stored plan: all of it but the other nodes' intra-node plans.
    tributary::v1::JobPlan part = before.plan();
    part.clear_intra_node();
    for (const auto& intra : before.plan().intra_node()) {
      if (intra.node_id() == n) *part.add_intra_node() = intra;
    }
    // The stored job keeps its data-plane secret across the restart (GetJob never shows it).
    tributary::v1::JobPlan got = resp.plans(0);
    if (secret.empty()) secret = got.job_secret();
    EXPECT_EQ(got.job_secret(), secret);
    EXPECT_EQ(secret.size(), 32u);
    got.clear_job_secret();
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got, part));
  }
  ASSERT_TRUE(c->state->GetJob("j", &job).ok());
  EXPECT_THAT(job.message(), HasSubstr("register again: s0"));
  // A node of no restored plan registering within the grace is a rejoin too: no re-plan.
  Register(*c, "s9");
  ASSERT_TRUE(c->state->GetJob("j", &job).ok());
  EXPECT_EQ(job.plan().version(), before.plan().version());
  Register(*c, "s0");
  ASSERT_TRUE(c->state->GetJob("j", &job).ok());
  EXPECT_EQ(job.state(), tributary::v1::JOB_STATE_RUNNING) << job.message();
  EXPECT_GE(job.plan().version(), before.plan().version());
  EXPECT_EQ(job.plan().servers_size(), before.plan().servers_size());
  EXPECT_EQ(Metric(*c, "tributary_controller_restored_jobs_waiting"), 0);

  // The next plan change works and is stored: a second job, then deleting the first.
  auto second = Create(*c, "k", {"w0", "w1", "w2"});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GT(second->plan().version(), job.plan().version());
  ASSERT_TRUE(c->state->DeleteJob("j").ok());
  tributary::v1::Job k;  // the delete may have re-planned it onto the capacity j held
  ASSERT_TRUE(c->state->GetJob("k", &k).ok());
  c.reset();
  c = Start();
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(*c->state->Restore(), 1u);
  EXPECT_FALSE(c->state->GetJob("j", &job).ok());
  ASSERT_TRUE(c->state->GetJob("k", &job).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(job.plan(), k.plan()));
}

TEST_F(RestoreTest, PlanVersionsKeepIncreasingAcrossRestartsAndRecreation) {
  uint64_t last = 0;
  for (int restart = 0; restart < 3; ++restart) {
    auto c = Start();
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(c->state->Restore().ok());
    for (const char* n : {"w0", "w1"}) Register(*c, n);
    // A job deleted and created again under the same id gets a new epoch, never an old one.
    ASSERT_TRUE(c->state->DeleteJob("j").ok());
    auto job = Create(*c, "j", {"w0", "w1"});
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_GT(job->plan().version(), last) << "restart " << restart;
    last = job->plan().version();
  }
}

TEST_F(RestoreTest, NodesThatDoNotComeBackAreDeadAfterTheGrace) {
  {
    auto c = Start();
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(c->state->Restore().ok());
    for (const char* n : {"w0", "w1", "w2", "s0"}) Register(*c, n);
    auto job = Create(*c, "j", {"w0", "w1", "w2"});
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(job->plan().servers_size(), 4);  // s0 is in the plan
  }
  auto c = Start();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->state->Restore().ok());
  for (const char* n : {"w0", "w1", "w2"}) Register(*c, n);
  clock_.Advance(kGrace - std::chrono::milliseconds(1));
  c->state->CheckLiveness();
  tributary::v1::Job job;
  ASSERT_TRUE(c->state->GetJob("j", &job).ok());
  EXPECT_THAT(job.message(), HasSubstr("register again: s0"));
  const uint64_t held = job.plan().version();

  // The workers keep heartbeating; s0 never registers.
  for (const char* n : {"w0", "w1", "w2"}) {
    tributary::v1::HeartbeatRequest req;
    req.set_node_id(n);
    req.set_incarnation(c->incarnations[n]);
    tributary::v1::HeartbeatResponse resp;
    ASSERT_TRUE(c->state->Heartbeat(req, &resp).ok());
  }
  clock_.Advance(std::chrono::milliseconds(1));
  c->state->CheckLiveness();
  ASSERT_TRUE(c->state->GetJob("j", &job).ok());
  EXPECT_EQ(job.state(), tributary::v1::JOB_STATE_RUNNING) << job.message();
  EXPECT_GT(job.plan().version(), held);  // re-planned without s0
  for (const auto& s : job.plan().servers()) EXPECT_NE(s.node_id(), "s0");
}

TEST_F(RestoreTest, NodeBackAtANewAddressReplansTheJob) {
  tributary::v1::Job before;
  {
    auto c = Start();
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(c->state->Restore().ok());
    for (const char* n : {"w0", "w1"}) Register(*c, n);
    auto job = Create(*c, "j", {"w0", "w1"});
    ASSERT_TRUE(job.ok()) << job.status();
    before = *job;
  }
  auto c = Start();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->state->Restore().ok());
  Register(*c, "w0", "127.0.0.1:9");  // its agent restarted too: the stored plan is stale
  tributary::v1::Job job;
  ASSERT_TRUE(c->state->GetJob("j", &job).ok());
  EXPECT_THAT(job.message(), HasSubstr("register again: w1"));
  EXPECT_EQ(job.plan().version(), before.plan().version());
  Register(*c, "w1");
  ASSERT_TRUE(c->state->GetJob("j", &job).ok());
  EXPECT_EQ(job.state(), tributary::v1::JOB_STATE_RUNNING) << job.message();
  EXPECT_GT(job.plan().version(), before.plan().version());
  EXPECT_EQ(job.plan().workers(0).data_plane_address(), "127.0.0.1:9");
}

TEST_F(RestoreTest, InMemoryStateRestoresNothing) {
  ClusterState state(&clock_, {}, 1);
  auto restored = state.Restore();
  ASSERT_TRUE(restored.ok());
  EXPECT_EQ(*restored, 0u);
}

}  // namespace
}  // namespace tributary::controller
