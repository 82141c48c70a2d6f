// Job replies carry plans in pages (controller.proto, PlanPage): the cut and the merge
// (api/tributary/v1/plan_pages.h), the controller's CreateJob, GetJob and ListJobs with a small
// page, over gRPC, and the CLI's client reading them whole.
#include "tributary/v1/plan_pages.h"

#include <map>
#include <string>
#include <vector>

#include "client/cli/cli_common.h"
#include "common/clock.h"
#include "controller/cluster_state.h"
#include "controller/controller_service.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace tributary {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;

v1::Job MakeJob(int workers, int servers) {
  v1::Job job;
  job.set_job_id("big");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_message("hello");
  job.mutable_spec()->set_procs_per_node(8);
  v1::JobPlan& plan = *job.mutable_plan();
  plan.set_job_id("big");
  plan.set_version(7);
  plan.set_partition_bytes(1 << 20);
  plan.set_predicted_seconds(0.5);
  for (int w = 0; w < workers; ++w) {
    v1::WorkerNode& worker = *plan.add_workers();
    worker.set_node_id("worker-" + std::to_string(w));
    worker.set_rank(w);
    worker.set_data_plane_address("198.18.0.1:" + std::to_string(2000 + w));
    plan.add_intra_node()->set_node_id(worker.node_id());
  }
  for (int s = 0; s < servers; ++s) {
    v1::SummationServer& server = *plan.add_servers();
    server.set_node_id("server-" + std::to_string(s));
    server.set_weight(s + 1);
  }
  return job;
}

// Every page of `job` from `first`, merged, with the pages' bytes of lists.
v1::Job ReadByPages(v1::Job& job, size_t budget, std::vector<size_t>* page_bytes) {
  v1::Job merged;
  page_bytes->push_back(v1::CopyJobPage(job, 0, budget, true, &merged));
  while (!merged.plan_page().next_token().empty()) {
    absl::StatusOr<v1::PlanPageToken> token =
        v1::DecodePlanPageToken(merged.plan_page().next_token());
    EXPECT_TRUE(token.ok()) << token.status();
    EXPECT_EQ(token->version, job.plan().version());
    v1::Job page;
    page_bytes->push_back(v1::CopyJobPage(job, token->first, budget, true, &page));
    EXPECT_TRUE(v1::AppendPlanPage(merged, page).ok());
  }
  return merged;
}

TEST(PlanPagesTest, PagesPutBackTogetherAreTheJob) {
  v1::Job job = MakeJob(40, 12);
  const v1::Job before = job;
  const size_t budget = 300;
  std::vector<size_t> bytes;
  v1::Job merged = ReadByPages(job, budget, &bytes);
  EXPECT_TRUE(MessageDifferencer::Equals(merged, job)) << merged.DebugString();
  EXPECT_FALSE(merged.has_plan_page());
  EXPECT_TRUE(MessageDifferencer::Equals(job, before));  // the source is left as it was
  EXPECT_GT(bytes.size(), 5u);
  size_t largest_entry = 0;
  for (const auto& w : job.plan().workers())
    largest_entry = std::max(largest_entry, w.ByteSizeLong());
  for (size_t b : bytes) EXPECT_LE(b, budget + largest_entry + 8);
}

TEST(PlanPagesTest, APlanThatFitsIsOnePageWithoutPageInfo) {
  v1::Job job = MakeJob(3, 2);
  v1::Job page;
  v1::CopyJobPage(job, 0, v1::kPlanPageBytes, true, &page);
  EXPECT_TRUE(MessageDifferencer::Equals(page, job));
  EXPECT_FALSE(page.has_plan_page());
  // Empty lists too.
  v1::Job empty = MakeJob(0, 0);
  v1::CopyJobPage(empty, 0, 10, true, &page);
  EXPECT_FALSE(page.has_plan_page());
  EXPECT_EQ(v1::PlanEntries(page.plan()), 0u);
}

TEST(PlanPagesTest, EachPageHoldsAtLeastOneEntryAndSaysWhereItIs) {
  v1::Job job = MakeJob(2, 1);  // entries: 2 workers, 2 intra-node plans, 1 server
  v1::Job page;
  v1::CopyJobPage(job, 3, /*budget=*/1, true, &page);
  ASSERT_TRUE(page.has_plan_page());
  EXPECT_EQ(page.plan_page().first(), 3u);
  EXPECT_EQ(page.plan_page().count(), 1u);
  EXPECT_EQ(page.plan_page().total(), 5u);
  EXPECT_EQ(page.plan().workers_size(), 0);
  ASSERT_EQ(page.plan().intra_node_size(), 1);
  EXPECT_EQ(page.plan().intra_node(0).node_id(), "worker-1");
  EXPECT_EQ(page.plan().version(), 7u);  // every other field whole
  EXPECT_EQ(page.message(), "hello");
  absl::StatusOr<v1::PlanPageToken> next = v1::DecodePlanPageToken(page.plan_page().next_token());
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->first, 4u);
  // The last page has no next token; a dry run's page has none either.
  v1::CopyJobPage(job, 4, 1, true, &page);
  EXPECT_TRUE(page.plan_page().next_token().empty());
  EXPECT_EQ(page.plan().servers_size(), 1);
  v1::CopyJobPage(job, 0, 1, /*continuable=*/false, &page);
  EXPECT_TRUE(page.has_plan_page());
  EXPECT_TRUE(page.plan_page().next_token().empty());
}

TEST(PlanPagesTest, TokensRoundTripAndForeignTextIsRefused) {
  const std::string text = v1::EncodePlanPageToken({.version = 123456789012345, .first = 77});
  absl::StatusOr<v1::PlanPageToken> token = v1::DecodePlanPageToken(text);
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(token->version, 123456789012345u);
  EXPECT_EQ(token->first, 77u);
  for (const std::string& bad : std::vector<std::string>{
           "", "v", "x1.2", "v1", "v1.", "v.1", "v0.1", "v1.2.3", "v-1.2", "v1.-2", "v1.4294967296",
           "v18446744073709551616.1", std::string(100, '1')}) {
    absl::StatusOr<v1::PlanPageToken> refused = v1::DecodePlanPageToken(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(refused.status().message(), HasSubstr("plan_page_token")) << bad;
  }
}

TEST(PlanPagesTest, APageOfAnotherVersionOrPlaceIsRefusedAndChangesNothing) {
  v1::Job job = MakeJob(10, 3);
  v1::Job first, second, third;
  v1::CopyJobPage(job, 0, 100, true, &first);
  const uint32_t next = v1::DecodePlanPageToken(first.plan_page().next_token())->first;
  v1::CopyJobPage(job, next, 100, true, &second);
  const uint32_t after = v1::DecodePlanPageToken(second.plan_page().next_token())->first;
  v1::CopyJobPage(job, after, 100, true, &third);
  const v1::Job kept = first;
  absl::Status skipped = v1::AppendPlanPage(first, third);
  EXPECT_EQ(skipped.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageDifferencer::Equals(first, kept));
  second.mutable_plan()->set_version(8);
  absl::Status replanned = v1::AppendPlanPage(first, second);
  EXPECT_EQ(replanned.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(replanned.message(), HasSubstr("re-planned"));
  EXPECT_TRUE(MessageDifferencer::Equals(first, kept));
  // ReadRestOfPlan passes a page call's error on as it came.
  absl::StatusOr<v1::Job> failed =
      v1::ReadRestOfPlan(first, [](const std::string&) -> absl::StatusOr<v1::Job> {
        return absl::NotFoundError("job 'big' not found");
      });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kNotFound);
}

// --- the controller, with a small page ---------------------------------------------------------

class ControllerPagesTest : public ::testing::Test {
 protected:
  static constexpr size_t kPage = 400;
  ControllerPagesTest()
      : state_(&clock_,
               {.heartbeat_interval = std::chrono::milliseconds(100),
                .heartbeat_timeout = std::chrono::seconds(1),
                .reply_page_bytes = kPage},
               1) {
    for (int i = 0; i < 12; ++i) Register("n" + std::to_string(i));
  }

  void Register(const std::string& id) {
    v1::RegisterNodeRequest req;
    req.set_node_id(id);
    req.mutable_inventory()->set_data_plane_address("127.0.0.1:" + std::to_string(1000 + n_++));
    req.mutable_inventory()->set_nic_bytes_per_s(10e9 / 8);
    req.mutable_inventory()->set_sum_bytes_per_s(100e9);
    req.mutable_inventory()->set_offers_summation(true);
    v1::RegisterNodeResponse resp;
    ASSERT_TRUE(state_.RegisterNode(req, &resp).ok());
    incarnations_[id] = resp.incarnation();
  }
  void HeartbeatAllBut(const std::string& silent) {
    for (const auto& [id, incarnation] : incarnations_) {
      if (id == silent) continue;
      v1::HeartbeatRequest req;
      req.set_node_id(id);
      req.set_incarnation(incarnation);
      v1::HeartbeatResponse resp;
      ASSERT_TRUE(state_.Heartbeat(req, &resp).ok());
    }
  }
  v1::CreateJobRequest Spec(const std::string& id, int workers, bool dry_run = false) {
    v1::CreateJobRequest req;
    req.set_job_id(id);
    req.set_dry_run(dry_run);
    req.mutable_spec()->set_procs_per_node(1);
    for (int w = 0; w < workers; ++w) req.mutable_spec()->add_worker_nodes("n" + std::to_string(w));
    return req;
  }
  absl::StatusOr<v1::Job> Whole(v1::Job first) {
    return v1::ReadRestOfPlan(std::move(first), [&](const std::string& token) {
      v1::GetJobRequest req;
      req.set_job_id(first_id_);
      req.set_plan_page_token(token);
      v1::Job page;
      absl::Status s = state_.GetJob(req, &page);
      if (!s.ok()) return absl::StatusOr<v1::Job>(s);
      EXPECT_TRUE(page.plan().job_secret().empty());
      return absl::StatusOr<v1::Job>(page);
    });
  }

  common::FakeClock clock_;
  controller::ClusterState state_;
  int n_ = 0;
  std::map<std::string, uint64_t> incarnations_;
  std::string first_id_ = "j";
};

TEST_F(ControllerPagesTest, CreateAndGetJobReturnPagesThatMakeTheWholePlan) {
  v1::Job created;
  ASSERT_TRUE(state_.CreateJob(Spec("j", 8), &created).ok());
  ASSERT_TRUE(created.has_plan_page());
  EXPECT_FALSE(created.plan_page().next_token().empty());
  EXPECT_LT(created.plan_page().count(), created.plan_page().total());
  EXPECT_TRUE(created.plan().job_secret().empty());
  absl::StatusOr<v1::Job> whole = Whole(created);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_FALSE(whole->has_plan_page());
  const v1::JobPlan& plan = whole->plan();
  ASSERT_EQ(plan.workers_size(), 8);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(plan.workers(r).rank(), static_cast<uint32_t>(r));
  EXPECT_EQ(plan.intra_node_size(), 8);
  EXPECT_EQ(plan.servers_size(), 12);  // 8 workers and 4 spares
  uint64_t weights = 0;
  for (const auto& s : plan.servers()) weights += s.weight();
  EXPECT_EQ(weights, uint64_t{1} << 32);
  // GetJob's first page and its rest are the same job.
  v1::Job first;
  ASSERT_TRUE(state_.GetJob("j", &first).ok());
  absl::StatusOr<v1::Job> again = Whole(first);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(MessageDifferencer::Equals(*again, *whole));
  // Creating it again (idempotent) answers with a page too.
  v1::Job retried;
  ASSERT_TRUE(state_.CreateJob(Spec("j", 8), &retried).ok());
  EXPECT_TRUE(retried.has_plan_page());
}

TEST_F(ControllerPagesTest, AReplanBetweenPagesIsAbortedAndTheReadStartsAgain) {
  v1::Job first;
  ASSERT_TRUE(state_.CreateJob(Spec("j", 8), &first).ok());
  // A spare (n11) dies: the job is re-planned, and the first page's token is stale.
  clock_.Advance(std::chrono::milliseconds(800));
  HeartbeatAllBut("n11");
  clock_.Advance(std::chrono::milliseconds(800));
  state_.CheckLiveness();
  v1::GetJobRequest req;
  req.set_job_id("j");
  req.set_plan_page_token(first.plan_page().next_token());
  v1::Job page;
  absl::Status stale = state_.GetJob(req, &page);
  EXPECT_EQ(stale.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(stale.message(), HasSubstr("read it again"));
  ASSERT_TRUE(state_.GetJob("j", &first).ok());
  absl::StatusOr<v1::Job> whole = Whole(first);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->plan().servers_size(), 11);
}

TEST_F(ControllerPagesTest, BadPageTokensAreInvalidArgument) {
  v1::Job job;
  ASSERT_TRUE(state_.CreateJob(Spec("j", 4), &job).ok());
  v1::GetJobRequest req;
  req.set_job_id("j");
  for (const std::string& bad :
       std::vector<std::string>{"garbage", "v1.x", std::string(500, 'v')}) {
    req.set_plan_page_token(bad);
    EXPECT_EQ(state_.GetJob(req, &job).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  req.set_plan_page_token(v1::EncodePlanPageToken({.version = job.plan().version(), .first = 999}));
  absl::Status past = state_.GetJob(req, &job);
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(past.message(), HasSubstr("past its plan"));
  req.set_job_id("nope");
  EXPECT_EQ(state_.GetJob(req, &job).code(), absl::StatusCode::kNotFound);
  v1::ListJobsRequest list;
  list.set_page_token("no such id!");
  v1::ListJobsResponse listed;
  EXPECT_EQ(state_.ListJobs(list, &listed).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ControllerPagesTest, ADryRunIsCutWithoutAWayToTheRest) {
  v1::Job preview;
  ASSERT_TRUE(state_.CreateJob(Spec("p", 8, /*dry_run=*/true), &preview).ok());
  ASSERT_TRUE(preview.has_plan_page());
  EXPECT_TRUE(preview.plan_page().next_token().empty());
  EXPECT_LT(preview.plan_page().count(), preview.plan_page().total());
  v1::Job none;
  EXPECT_EQ(state_.GetJob("p", &none).code(), absl::StatusCode::kNotFound);
}

TEST_F(ControllerPagesTest, ListJobsPagesByCountAndBytesAndCutsLargePlans) {
  for (const char* id : {"a", "b", "c"}) {
    v1::Job job;
    ASSERT_TRUE(state_.CreateJob(Spec(id, 2), &job).ok());
  }
  v1::Job big;
  ASSERT_TRUE(state_.CreateJob(Spec("d", 10), &big).ok());
  // By count.
  v1::ListJobsRequest req;
  req.set_page_size(1);
  std::vector<std::string> ids;
  do {
    v1::ListJobsResponse page;
    ASSERT_TRUE(state_.ListJobs(req, &page).ok());
    ASSERT_EQ(page.jobs_size(), 1);
    ids.push_back(page.jobs(0).job_id());
    req.set_page_token(page.next_page_token());
  } while (!req.page_token().empty());
  EXPECT_EQ(ids, (std::vector<std::string>{"a", "b", "c", "d"}));
  // By bytes: no page carries much more than its budget; the cut job is read on with GetJob.
  req.Clear();
  std::map<std::string, v1::Job> listed;
  int pages = 0;
  do {
    v1::ListJobsResponse page;
    ASSERT_TRUE(state_.ListJobs(req, &page).ok());
    ++pages;
    for (const v1::Job& job : page.jobs()) {
      EXPECT_TRUE(job.plan().job_secret().empty());
      first_id_ = job.job_id();
      absl::StatusOr<v1::Job> whole = Whole(job);
      ASSERT_TRUE(whole.ok()) << whole.status();
      listed[job.job_id()] = *whole;
    }
    req.set_page_token(page.next_page_token());
  } while (!req.page_token().empty());
  EXPECT_GT(pages, 1);
  ASSERT_EQ(listed.size(), 4u);
  EXPECT_EQ(listed["d"].plan().workers_size(), 10);
  EXPECT_EQ(listed["d"].plan().intra_node_size(), 10);
  EXPECT_EQ(listed["a"].plan().workers_size(), 2);
}

// The CLI's client over gRPC: GetJob, ListJobs and CreateJob return whole jobs.
TEST_F(ControllerPagesTest, TheCliClientReadsJobsWhole) {
  controller::ControllerService service(&state_);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_GT(port, 0);
  client::cli::GlobalOptions global;
  global.controller = "127.0.0.1:" + std::to_string(port);
  client::cli::ControllerClient client(global);
  absl::StatusOr<v1::Job> created = client.CreateJob(Spec("j", 9));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_FALSE(created->has_plan_page());
  EXPECT_EQ(created->plan().workers_size(), 9);
  EXPECT_EQ(created->plan().servers_size(), 12);
  absl::StatusOr<v1::Job> got = client.GetJob("j");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*got, *created));
  ASSERT_TRUE(client.CreateJob(Spec("k", 3)).ok());
  absl::StatusOr<v1::ListJobsResponse> all = client.ListJobs();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->jobs_size(), 2);
  EXPECT_TRUE(MessageDifferencer::Equals(all->jobs(0), *created));
  EXPECT_EQ(all->jobs(1).plan().workers_size(), 3);
  EXPECT_TRUE(all->next_page_token().empty());
  absl::StatusOr<v1::Job> preview = client.CreateJob(Spec("p", 9, /*dry_run=*/true));
  ASSERT_TRUE(preview.ok());
  EXPECT_TRUE(preview->has_plan_page());  // a preview stays cut
  EXPECT_EQ(client.GetJob("nope").status().code(), absl::StatusCode::kNotFound);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace
}  // namespace tributary
