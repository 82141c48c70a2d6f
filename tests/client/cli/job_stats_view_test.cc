// `tributary job-stats`: the --what-if parser and the rendering of GetJobStats' answer.
#include "client/cli/job_stats_view.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tributary::client::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(JobStatsViewTest, ParsesWhatIfPairs) {
  auto pairs = ParseWhatIf("8:2,16:0");
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  ASSERT_EQ(pairs->size(), 2u);
  EXPECT_EQ((*pairs)[0], std::make_pair(8u, 2u));
  EXPECT_EQ((*pairs)[1], std::make_pair(16u, 0u));
  EXPECT_TRUE(ParseWhatIf("")->empty());
  for (const char* bad : {"8", "8:", ":2", "0:2", "8:-1", "8:2:1", "eight:2", "8:2x"}) {
    auto r = ParseWhatIf(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("WORKERS:SPARES")) << bad;
  }
}

TEST(JobStatsViewTest, RendersObservedPredictedNodesAndWhatIf) {
  tributary::v1::JobStats s;
  s.set_job_id("train");
  s.set_plan_version(7);
  s.set_workers(4);
  s.set_spares(2);
  s.set_window_seconds(30);
  s.set_reporting_nodes(6);
  s.set_wire_bytes(3 << 20);
  s.set_collectives(40);
  s.set_achieved_bytes_per_s(2.5e8);
  s.set_iterations(10);
  s.set_mean_iteration_seconds(0.25);
  s.set_max_iteration_seconds(0.3);
  s.set_comm_fraction(0.42);
  s.set_observed_seconds_per_byte(2e-9);
  s.set_predicted_seconds_per_byte(1e-9);
  s.set_observed_to_predicted(2);
  s.set_model_bytes(64 << 20);
  s.set_predicted_seconds(0.067);
  s.set_nic_bytes_per_s(1.25e9);
  auto* n = s.add_nodes();
  n->set_node_id("node-0");
  n->set_worker(true);
  n->set_wire_bytes_sent(1 << 20);
  n->set_busy_seconds(0.5);
  n->set_achieved_bytes_per_s(2.5e8);
  auto* w = s.add_what_if();
  w->set_workers(4);
  w->set_spares(2);
  w->set_seconds_per_byte(1e-9);
  w->set_allreduce_seconds(0.067);
  w->set_speedup_vs_ring(1.2);
  w->set_current(true);
  const std::string text = RenderJobStats(s);
  EXPECT_THAT(text, HasSubstr("job train: plan v7, 4 workers, 2 spare servers"));
  EXPECT_THAT(text, HasSubstr("250.0 MB/s"));
  EXPECT_THAT(text, HasSubstr("2.000 ns/B"));
  EXPECT_THAT(text, HasSubstr("1.000 ns/B"));
  EXPECT_THAT(text, HasSubstr("42.0 %"));
  EXPECT_THAT(text, HasSubstr("node-0"));
  EXPECT_THAT(text, HasSubstr("1.20x"));
  EXPECT_THAT(text, HasSubstr("<- current"));

  // Without data: dashes, never a division by zero.
  tributary::v1::JobStats empty;
  empty.set_job_id("idle");
  const std::string idle = RenderJobStats(empty);
  EXPECT_THAT(idle, HasSubstr("(no node reported the job in the window)"));
  EXPECT_THAT(idle, Not(HasSubstr("nan")));
  EXPECT_THAT(idle, Not(HasSubstr("inf")));
}

}  // namespace
}  // namespace tributary::client::cli
