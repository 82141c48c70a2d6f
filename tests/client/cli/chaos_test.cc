// The verdicts of `tributary chaos` (client/cli/chaos.h): records, hangs, wrong sums, recovery.
#include "client/cli/chaos.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tributary::client::cli {
namespace {

ChaosIteration Ok(uint32_t rank, uint64_t step, int64_t start, int64_t end) {
  ChaosIteration it;
  it.rank = rank;
  it.step = step;
  it.start_ms = start;
  it.end_ms = end;
  it.max_op_ms = end - start;
  it.ok = true;
  return it;
}

ChaosIteration Failed(uint32_t rank, int64_t start, int64_t end, std::string error) {
  ChaosIteration it = Ok(rank, 0, start, end);
  it.ok = false;
  it.error = std::move(error);
  return it;
}

ChaosTrial TwoRanks() {
  ChaosTrial t;
  t.fault = "spare-kill";
  t.world_size = 2;
  t.op_deadline_ms = 1000;
  t.fault_ms = 100;
  return t;
}

TEST(ChaosTest, RecordsRoundTripAndOtherLinesAreRejected) {
  ChaosIteration it = Failed(3, 10, 2500, "DEADLINE_EXCEEDED: \"quoted\" message");
  it.step = 42;
  it.wrong = 7;
  absl::StatusOr<ChaosIteration> back = ParseChaosIteration(FormatChaosIteration(it));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rank, 3u);
  EXPECT_EQ(back->step, 42u);
  EXPECT_EQ(back->start_ms, 10);
  EXPECT_EQ(back->end_ms, 2500);
  EXPECT_EQ(back->max_op_ms, 2490);
  EXPECT_FALSE(back->ok);
  EXPECT_EQ(back->error, it.error);
  EXPECT_EQ(back->wrong, 7u);
  for (const char* line : {"", "warning: something", "{}", "[1,2]", "{\"chaos\":1}",
                           "{\"chaos\":1,\"rank\":\"x\",\"step\":1,\"start_ms\":1,\"end_ms\":1,"
                           "\"max_op_ms\":1,\"ok\":true,\"error\":\"\",\"wrong\":0}"}) {
    EXPECT_EQ(ParseChaosIteration(line).status().code(), absl::StatusCode::kInvalidArgument)
        << line;
  }
}

TEST(ChaosTest, RecoveryIsTheFirstStepAfterTheFaultThatEveryRankCompleted) {
  ChaosTrial t = TwoRanks();
  t.iterations = {Ok(0, 5, 50, 60),
                  Ok(1, 5, 50, 61),  // before the fault: not a recovery
                  Failed(0, 100, 900, "UNAVAILABLE: lost"),
                  Ok(1, 6, 100, 150),
                  Ok(0, 7, 910, 930),
                  Ok(1, 7, 905, 940),  // the first step both completed
                  Ok(0, 8, 940, 950),
                  Ok(1, 8, 940, 952)};
  const ChaosVerdict v = JudgeChaosTrial(t);
  EXPECT_EQ(v.hangs, 0u);
  EXPECT_EQ(v.wrong_elements, 0u);
  EXPECT_EQ(v.failed_iterations, 1u);
  ASSERT_TRUE(v.recovery_ms.has_value());
  EXPECT_EQ(*v.recovery_ms, 940 - 100);
  EXPECT_EQ(v.split_steps, 1u);  // step 6: rank 1 only
}

TEST(ChaosTest, AnElasticJobRecoversWhenEveryRankOfItsNewWorldCompletedAStep) {
  ChaosTrial t = TwoRanks();
  t.fault = "worker-agent-kill";
  EXPECT_FALSE(JudgeChaosTrial(t).expected_to_recover);  // a degraded job does not run
  t.elastic = true;
  t.world_size = 3;
  auto in = [](ChaosIteration it, uint32_t world) {
    it.world = world;
    return it;
  };
  t.iterations = {in(Ok(0, 5, 50, 60), 3),
                  in(Ok(1, 5, 50, 60), 3),
                  in(Ok(2, 5, 50, 60), 3),
                  in(Failed(0, 100, 300, "ABORTED: x"), 3),
                  in(Ok(0, 6, 400, 500), 2),
                  in(Ok(1, 6, 400, 510), 2),
                  in(Failed(2, 100, 9000, "UNAVAILABLE: no agent"), 0)};
  const ChaosVerdict v = JudgeChaosTrial(t);
  EXPECT_TRUE(v.expected_to_recover);
  ASSERT_TRUE(v.recovery_ms.has_value());
  EXPECT_EQ(*v.recovery_ms, 510 - 100);  // step 6 in a world of 2: both ranks
  EXPECT_EQ(v.split_steps, 0u);
  // Parsed back with its world.
  absl::StatusOr<ChaosIteration> back = ParseChaosIteration(FormatChaosIteration(t.iterations[4]));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->world, 2u);
}

TEST(ChaosTest, SlowCollectivesStuckProcessesAndWrongElementsAreCounted) {
  ChaosTrial t = TwoRanks();
  t.stuck_processes = 1;
  ChaosIteration slow = Failed(0, 100, 2200, "DEADLINE_EXCEEDED: client gave up");
  slow.max_op_ms = 2001;  // over 2 x the 1000 ms deadline
  ChaosIteration at_bound = Failed(1, 100, 2100, "DEADLINE_EXCEEDED: server");
  at_bound.max_op_ms = 2000;  // exactly 2 x: not a hang
  ChaosIteration wrong = Ok(1, 9, 2200, 2300);
  wrong.wrong = 3;
  wrong.ok = false;  // a rank that saw wrong elements reports the iteration as failed
  t.iterations = {slow, at_bound, wrong};
  const ChaosVerdict v = JudgeChaosTrial(t);
  EXPECT_EQ(v.hangs, 2u);
  EXPECT_EQ(v.wrong_elements, 3u);
  EXPECT_EQ(v.failed_iterations, 3u);
  EXPECT_FALSE(v.recovery_ms.has_value());
}

// The end of a trial: rank 1 saw the stop before its next step, rank 0 had started it and waits
// out its deadline. Counted apart from the failures of the run, and only after the stop.
TEST(ChaosTest, FailuresAfterTheStopAreCountedApart) {
  ChaosTrial t = TwoRanks();
  t.stop_ms = 1000;
  ChaosIteration wrong_after_stop = Ok(1, 11, 990, 1500);
  wrong_after_stop.wrong = 2;
  wrong_after_stop.ok = false;
  t.iterations = {Failed(0, 200, 400, "UNAVAILABLE: lost"),  // during the run
                  Ok(0, 9, 500, 600),
                  Ok(1, 9, 500, 610),
                  Failed(0, 995, 4000, "DEADLINE_EXCEEDED: waited for rank 1"),
                  Failed(1, 990, 1000, "CANCELLED: x"),  // ended at the stop
                  wrong_after_stop};                     // wrong sums are never set apart
  const ChaosVerdict v = JudgeChaosTrial(t);
  EXPECT_EQ(v.failed_iterations, 2u);
  EXPECT_EQ(v.failed_at_stop, 2u);
  EXPECT_EQ(v.wrong_elements, 2u);
  const std::vector<ChaosSummary> s = SummarizeChaos({{"spare-kill", v}, {"spare-kill", v}});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].failed_iterations, 4u);
  EXPECT_EQ(s[0].failed_at_stop, 4u);
}

TEST(ChaosTest, SummaryPerFaultWithRecoveryQuantiles) {
  std::vector<std::pair<std::string, ChaosVerdict>> trials;
  for (int64_t ms : {300, 100, 200, 400}) {
    ChaosVerdict v;
    v.recovery_ms = ms;
    v.failed_iterations = 1;
    v.expected_to_recover = true;
    trials.emplace_back("spare-kill", v);
  }
  ChaosVerdict bad;
  bad.hangs = 1;
  bad.wrong_elements = 5;
  bad.expected_to_recover = true;
  trials.emplace_back("process-restart", bad);  // expected to recover, did not
  trials.emplace_back("worker-agent-kill", ChaosVerdict{});
  const std::vector<ChaosSummary> s = SummarizeChaos(trials);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].fault, "spare-kill");
  EXPECT_EQ(s[0].trials, 4u);
  EXPECT_EQ(s[0].failed_iterations, 4u);
  EXPECT_EQ(s[0].recovered, 4u);
  EXPECT_EQ(s[0].expected_to_recover, 4u);
  EXPECT_EQ(s[0].recovery_p50_ms, 200);
  EXPECT_EQ(s[0].recovery_p99_ms, 400);
  EXPECT_EQ(s[0].recovery_max_ms, 400);
  EXPECT_EQ(s[1].fault, "process-restart");
  EXPECT_EQ(s[1].hangs, 1u);
  EXPECT_EQ(s[1].trials_with_wrong_sums, 1u);
  EXPECT_EQ(s[1].recovered, 0u);
  EXPECT_EQ(s[1].expected_to_recover, 1u);
  EXPECT_FALSE(s[1].recovery_p50_ms.has_value());
  EXPECT_EQ(s[2].expected_to_recover, 0u);  // a dead worker node degrades the job
}

}  // namespace
}  // namespace tributary::client::cli
