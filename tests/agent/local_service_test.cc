// LocalService without gRPC: sessions, shared-memory buffers, the local gather and its
// failures, against a FakeCollectiveRunner and a FakeClock.
#include "agent/local_service.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/fake_collective_runner.h"
#include "dataplane/collectives/operation.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/shm_test_util.h"

namespace tributary::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::MatchesRegex;
using testing::ScopedShm;
using namespace std::chrono_literals;

// However the tests end, no shared-memory object of theirs is left behind.
class NoShmLeftovers : public ::testing::Environment {
 public:
};
const auto* const kNoShmLeftovers = ::testing::AddGlobalTestEnvironment(new NoShmLeftovers);

// This node is worker 1 of 2, with 2 processes: global ranks 2 and 3 of 4.
LocalJob TwoByTwoJob(const std::string& job_id = "job") {
  return LocalJob{.job_id = job_id,
                  .plan_version = 7,
                  .node_rank = 1,
                  .num_nodes = 2,
                  .procs_per_node = 2,
                  .op_timeout = 1000ms,
                  .down_workers = {}};
}

// What a Reply got, if it ran.
struct Answer {
  bool answered = false;
  absl::Status status;
  bool done = false;
};

class LocalServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { service_.SetJobs({TwoByTwoJob()}); }

  absl::StatusOr<tributary::v1::JoinJobResponse> JoinAs(uint32_t local_rank,
                                                        uint32_t local_size = 2,
                                                        const std::string& job_id = "job") {
    tributary::v1::JoinJobRequest req;
    req.set_job_id(job_id);
    req.set_local_rank(local_rank);
    req.set_local_size(local_size);
    tributary::v1::JoinJobResponse resp;
    absl::Status s = service_.Join(req, &resp);
    if (!s.ok()) return s;
    return resp;
  }
  std::string Join(uint32_t local_rank) {
    auto resp = JoinAs(local_rank);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->session_id() : "";
  }
  absl::StatusOr<uint64_t> Register(const std::string& session, const ScopedShm& shm,
                                    uint64_t size) {
    return service_.RegisterBuffer(testing::Self(), session, size, shm.Dup());
  }
  static tributary::v1::SubmitRequest Request(
      const std::string& session, const std::string& tensor, uint64_t buffer, uint64_t count = 16,
      tributary::v1::CollectiveOp op = tributary::v1::COLLECTIVE_OP_SUM) {
    tributary::v1::SubmitRequest req;
    req.set_session_id(session);
    req.set_tensor_name(tensor);
    req.set_buffer_id(buffer);
    req.set_count(count);
    req.set_dtype(tributary::v1::DATA_TYPE_FLOAT32);
    req.set_op(op);
    return req;
  }
  absl::StatusOr<uint64_t> Submit(const tributary::v1::SubmitRequest& req) {
    tributary::v1::SubmitResponse resp;
    absl::Status s = service_.Submit(req, &resp);
    if (!s.ok()) return s;
    return resp.handle();
  }
  // Waits with `timeout_ms`; the answer fills in when the service replies.
  std::shared_ptr<Answer> Await(const std::string& session, uint64_t handle,
                                uint32_t timeout_ms = 0) {
    auto answer = std::make_shared<Answer>();
    service_.Await(session, handle, timeout_ms, [answer](const absl::Status& s, bool done) {
      EXPECT_FALSE(answer->answered) << "answered twice";
      answer->answered = true;
      answer->status = s;
      answer->done = done;
    });
    return answer;
  }
  // The result of a finished operation (answered at once, done).
  absl::Status Result(const std::string& session, uint64_t handle) {
    auto answer = Await(session, handle);
    EXPECT_TRUE(answer->answered);
    EXPECT_TRUE(answer->done) << "handle " << handle << " still running";
    return answer->status;
  }
  // Two sessions (local ranks 0 and 1) with one 4 KiB buffer each.
  void JoinBoth() {
    s0_ = Join(0);
    s1_ = Join(1);
    auto b0 = Register(s0_, shm0_, shm0_.size());
    auto b1 = Register(s1_, shm1_, shm1_.size());
    ASSERT_TRUE(b0.ok()) << b0.status();
    ASSERT_TRUE(b1.ok()) << b1.status();
    b0_ = *b0;
    b1_ = *b1;
  }

  common::FakeClock clock_;
  FakeCollectiveRunner runner_;
  LocalService service_{&runner_, &clock_};
  ScopedShm shm0_{4096}, shm1_{4096};
  std::string s0_, s1_;
  uint64_t b0_ = 0, b1_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Sessions

TEST_F(LocalServiceTest, JoinGivesGlobalRankWorldSizeAndPlanVersion) {
  auto r0 = JoinAs(0);
  auto r1 = JoinAs(1);
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r0->global_rank(), 2u);
  EXPECT_EQ(r1->global_rank(), 3u);
  EXPECT_EQ(r1->world_size(), 4u);
  EXPECT_EQ(r1->plan_version(), 7u);
  EXPECT_THAT(r0->session_id(), MatchesRegex("[0-9a-f]{32}"));
  EXPECT_NE(r0->session_id(), r1->session_id());
  EXPECT_EQ(service_.num_sessions(), 2u);
}

TEST_F(LocalServiceTest, JoinRejectsUnplannedJobsWrongSizesAndTakenRanks) {
  auto unknown = JoinAs(0, 2, "other");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(unknown.status().message(),
            "job 'other' has no plan on this node yet: create it with this node as a worker, "
            "then retry");
  auto size = JoinAs(0, 3);
  EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(size.status().message(), "job 'job' runs 2 processes per node; local_size is 3");
  auto rank = JoinAs(2);
  EXPECT_EQ(rank.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rank.status().message(), "local_rank 2 is not below local_size 2");

  const std::string first = Join(1);
  auto duplicate = JoinAs(1);
  EXPECT_EQ(duplicate.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(duplicate.status().message(), "local rank 1 of job 'job' is taken by session " + first);
  EXPECT_EQ(service_.num_sessions(), 1u);
}

TEST_F(LocalServiceTest, LeavingFreesTheRankAndEndsTheSessionOnce) {
  const std::string session = Join(0);
  int ended = 0;
  ASSERT_TRUE(service_.WatchSession(session, [&] { ++ended; }).ok());
  service_.EndSession(session, "it left the job");
  service_.EndSession(session, "it left the job");  // idempotent
  EXPECT_EQ(ended, 1);
  EXPECT_EQ(service_.num_sessions(), 0u);

  auto submit = Submit(Request(session, "t", 1));
  EXPECT_EQ(submit.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(submit.status().message(),
            "session '" + session +
                "' not found: call JoinJob first (sessions end when the process disconnects or "
                "leaves)");
  absl::Status watch = service_.WatchSession(session, [] {});
  EXPECT_EQ(watch.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(watch.message(), "session '" + session + "' not found");
  // The rank is free again, for a process that starts its iterations with the others': after
  // the controller moved the job's membership generation (MembershipTest).
  EXPECT_EQ(JoinAs(0).status().code(), absl::StatusCode::kUnavailable);
  LocalJob next = TwoByTwoJob();
  next.generation = 1;
  service_.SetJobs({next});
  EXPECT_TRUE(JoinAs(0).ok());
}

TEST_F(LocalServiceTest, ParameterServerOpsArePerProcessAndCarryTheVersion) {
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  // Local rank 1 alone pulls: no gather waits for local rank 0, the operation starts at once.
  auto pull = Submit(Request(s1_, "w", b1_, 16, tributary::v1::COLLECTIVE_OP_PS_PULL));
  ASSERT_TRUE(pull.ok()) << pull.status();
  ASSERT_EQ(runner_.num_starts(), 1u);
  const FakeCollectiveRunner::StartCall call = runner_.start(0);
  EXPECT_EQ(call.op.reduction, dataplane::Reduction::kPsPull);
  EXPECT_EQ(call.op.ps_worker, 3u);  // node rank 1 x 2 + local rank 1
  EXPECT_EQ(call.op.buffers.size(), 1u);
  // A delta of local rank 0 with the call's scale: its own operation too.
  tributary::v1::SubmitRequest delta =
      Request(s0_, "w", b0_, 16, tributary::v1::COLLECTIVE_OP_PS_PUSH_DELTA);
  delta.set_delta_scale(0.5);
  ASSERT_TRUE(Submit(delta).ok());
  ASSERT_EQ(runner_.num_starts(), 2u);
  EXPECT_EQ(runner_.start(1).op.ps_worker, 2u);
  EXPECT_EQ(runner_.start(1).op.ps_scale, 0.5);
  // The data plane writes the version before done: the wait's answer carries it.
  ASSERT_NE(call.op.ps_version, nullptr);
  *call.op.ps_version = 42;
  runner_.Complete(0, absl::OkStatus());
  uint64_t version = 0;
  auto answer = std::make_shared<Answer>();
  service_.Await(
      s1_, *pull, 0,
      [answer](const absl::Status& s, bool done) {
        answer->answered = true;
        answer->status = s;
        answer->done = done;
      },
      [&version](uint64_t v) { version = v; });
  EXPECT_TRUE(answer->done);
  EXPECT_TRUE(answer->status.ok());
  EXPECT_EQ(version, 42u);
}

TEST_F(LocalServiceTest, KeepAliveEndFailsTheGathersMissingThatRank) {
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  auto grad = Submit(Request(s0_, "grad", b0_));
  ASSERT_TRUE(grad.ok()) << grad.status();
  EXPECT_FALSE(Await(s0_, *grad)->done);

  service_.EndSession(s1_, "its process disconnected");
  const absl::Status aborted = Result(s0_, *grad);
  EXPECT_EQ(aborted.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(aborted.message(),
            "job 'job' tensor 'grad' iteration 0: local rank 1 ended (its process disconnected) "
            "before submitting it");
  // The other nodes are told.
  ASSERT_EQ(runner_.aborts().size(), 1u);
  EXPECT_EQ(runner_.aborts()[0].job_id, "job");
  EXPECT_EQ(runner_.aborts()[0].tensor, "grad");
  EXPECT_EQ(runner_.aborts()[0].iteration, 0u);
  EXPECT_EQ(runner_.aborts()[0].reason, aborted);

  // A later gather that needs the departed rank fails at once, not at the deadline.
  auto bias = Submit(Request(s0_, "bias", b0_));
  ASSERT_TRUE(bias.ok());
  const absl::Status at_once = Result(s0_, *bias);
  EXPECT_EQ(at_once.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(at_once.message(),
            "job 'job' tensor 'bias' iteration 0: local rank 1 ended (its process disconnected) "
            "and cannot submit it");
  EXPECT_EQ(runner_.aborts().size(), 2u);

  // A new process for rank 1 clears it, once the job moved to a new membership generation (the
  // survivor resyncs: its iterations start at 0 again, as the new process's do).
  LocalJob next_generation = TwoByTwoJob();
  next_generation.generation = 1;
  service_.SetJobs({next_generation});
  Join(1);
  tributary::v1::ResyncRequest resync;
  resync.set_session_id(s0_);
  tributary::v1::ResyncResponse resynced;
  ASSERT_TRUE(service_.Resync(resync, &resynced).ok());
  auto next = Submit(Request(s0_, "bias", b0_));
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(Await(s0_, *next)->done);
  EXPECT_EQ(runner_.aborts().size(), 2u);
  EXPECT_EQ(runner_.num_starts(), 0u);
}

TEST_F(LocalServiceTest, ADegradedJobFailsItsCollectivesAtOnce) {
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  LocalJob degraded = TwoByTwoJob();
  degraded.plan_version += 1;
  degraded.down_workers = {"node-7 (rank 1)"};
  service_.SetJobs({degraded});
  auto grad = Submit(Request(s0_, "grad", b0_));
  ASSERT_FALSE(grad.ok());
  EXPECT_EQ(grad.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(grad.status().message(),
            "job 'job' tensor 'grad': the job is degraded: worker node node-7 (rank 1) is down; "
            "its collectives cannot complete until the controller sees them back");
  EXPECT_EQ(runner_.num_starts(), 0u);

  // The node is back: collectives run again.
  degraded.plan_version += 1;
  degraded.down_workers.clear();
  service_.SetJobs({degraded});
  ASSERT_TRUE(Submit(Request(s0_, "grad", b0_)).ok());
  ASSERT_TRUE(Submit(Request(s1_, "grad", b1_)).ok());
  EXPECT_EQ(runner_.num_starts(), 1u);
}

TEST_F(LocalServiceTest, ShutdownEndsSessionsParkedWaitsAndNewJoins) {
  // One process per node: its operation goes to the data plane at once and stays there.
  LocalJob solo = TwoByTwoJob("solo");
  solo.procs_per_node = 1;
  service_.SetJobs({TwoByTwoJob(), solo});
  auto joined = JoinAs(0, 1, "solo");
  ASSERT_TRUE(joined.ok()) << joined.status();
  const std::string session = joined->session_id();
  auto buffer = Register(session, shm0_, shm0_.size());
  ASSERT_TRUE(buffer.ok());
  bool ended = false;
  ASSERT_TRUE(service_.WatchSession(session, [&] { ended = true; }).ok());
  auto handle = Submit(Request(session, "grad", *buffer));
  ASSERT_TRUE(handle.ok());
  EXPECT_EQ(runner_.num_starts(), 1u);
  auto parked = Await(session, *handle, /*timeout_ms=*/60000);
  EXPECT_FALSE(parked->answered);

  service_.Shutdown();
  EXPECT_TRUE(ended);
  EXPECT_TRUE(parked->answered);
  EXPECT_TRUE(parked->status.ok());
  EXPECT_FALSE(parked->done);
  EXPECT_EQ(service_.num_sessions(), 0u);
  auto join = JoinAs(0);
  EXPECT_EQ(join.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(join.status().message(), "the agent is shutting down");
}

// ---------------------------------------------------------------------------------------------
// Buffers

TEST_F(LocalServiceTest, RegisteredBuffersMapTheProcesssMemory) {
  const std::string session = Join(0);
  Join(1);
  auto first = Register(session, shm0_, 4096);
  auto second = Register(session, shm1_, 1024);  // a prefix of the object is fine
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*first, 1u);
  EXPECT_EQ(*second, 2u);

  // The operation's buffer is the process's memory: what the test writes, the agent reads.
  for (int i = 0; i < 16; ++i) shm0_.as<float>()[64 + i] = static_cast<float>(i) + 0.5f;
  auto req = Request(session, "grad", *first);
  req.set_offset_bytes(64 * sizeof(float));
  ASSERT_TRUE(Submit(req).ok());

  tributary::v1::UnregisterBufferRequest unregister;
  unregister.set_session_id(session);
  unregister.set_buffer_id(*first);
  EXPECT_TRUE(service_.UnregisterBuffer(unregister).ok());
  EXPECT_TRUE(service_.UnregisterBuffer(unregister).ok());  // unknown ids are ignored
  auto gone = Submit(Request(session, "grad", *first));
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gone.status().message(),
            "job 'job' tensor 'grad': buffer 1 is not registered in this session");
  unregister.set_session_id("nobody");
  EXPECT_EQ(service_.UnregisterBuffer(unregister).code(), absl::StatusCode::kNotFound);
}

TEST_F(LocalServiceTest, RegisterRejectsSmallUnsealedAndForeignMemory) {
  const std::string session = Join(0);
  ScopedShm small(1024);
  auto too_small = Register(session, small, 4096);
  EXPECT_EQ(too_small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(too_small.status().message(), "buffer of session '" + session +
                                              "': the memfd holds 1024 bytes, fewer than the "
                                              "4096 declared");
  // Unsealed memory could shrink under the agent's mapping (SIGBUS): refused.
  ScopedShm unsealed(1024, /*seal=*/false);
  auto loose = Register(session, unsealed, 1024);
  EXPECT_EQ(loose.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(loose.status().message(), HasSubstr("must be sealed with F_SEAL_SHRINK"));
  // A descriptor that is not a memfd at all (a pipe) is refused before anything is mapped.
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  common::UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  auto pipe = service_.RegisterBuffer(testing::Self(), session, 64, std::move(read_end));
  EXPECT_EQ(pipe.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(pipe.status().message(), HasSubstr("not a sealable memfd"));

  auto empty = Register(session, small, 0);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.status().message(), "buffer size 0 bytes is not in [1, 1 TiB]");
  auto no_session = Register("nobody", small, 64);
  EXPECT_EQ(no_session.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(LocalServiceTest, ASessionBelongsToTheUidOfItsFirstBuffer) {
  const std::string session = Join(0);
  ScopedShm shm(64);
  ASSERT_TRUE(Register(session, shm, 64).ok());
  common::PeerCredentials stranger = testing::Self();
  stranger.uid += 4242;
  auto refused = service_.RegisterBuffer(stranger, session, 64, shm.Dup());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("uid " + std::to_string(stranger.uid) + " may not add buffers"));
  // The owner keeps going.
  EXPECT_TRUE(Register(session, shm, 64).ok());
}

// ---------------------------------------------------------------------------------------------
// Submit's validation: once, here, naming job and tensor

TEST_F(LocalServiceTest, SubmitValidatesTheRequestOnce) {
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  auto expect_invalid = [&](tributary::v1::SubmitRequest req, const std::string& message) {
    auto s = Submit(req);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_EQ(s.status().message(), message);
  };
  auto req = Request(s0_, "t", b0_);
  req.set_op(static_cast<tributary::v1::CollectiveOp>(10));
  expect_invalid(req, "job 'job' tensor 't': unknown op 10");
  req = Request(s0_, "t", b0_);
  req.set_op(tributary::v1::COLLECTIVE_OP_UNSPECIFIED);
  expect_invalid(req, "job 'job' tensor 't': unknown op 0");
  req = Request(s0_, "t", b0_);
  req.set_dtype(tributary::v1::DATA_TYPE_UNSPECIFIED);
  expect_invalid(req, "job 'job' tensor 't': unknown dtype 0");
  expect_invalid(Request(s0_, "", b0_),
                 "job 'job' tensor '': tensor names must have 1 to 1024 bytes");
  expect_invalid(Request(s0_, "__tributary/fused/3", b0_),
                 "job 'job' tensor '__tributary/fused/3': names starting with '__tributary/' "
                 "are reserved for the agent's own collectives");
  expect_invalid(Request(s0_, "t", b0_, 0),
                 "job 'job' tensor 't': count 0 must be in [1, 2^40 bytes / element]");
  expect_invalid(Request(s0_, "t", b0_, 1025),
                 "job 'job' tensor 't': bytes [0, 4100) do not fit buffer 1 of 4096 bytes");
  req = Request(s0_, "t", b0_, 16, tributary::v1::COLLECTIVE_OP_BROADCAST);
  req.set_root_rank(4);
  expect_invalid(req, "job 'job' tensor 't': root rank 4 is not below world size 4");
  // None of them reached the gather or the data plane.
  EXPECT_EQ(runner_.num_starts(), 0u);
  EXPECT_THAT(runner_.aborts(), IsEmpty());

  service_.SetJobs({});
  auto unplanned = Submit(Request(s0_, "t", b0_));
  EXPECT_EQ(unplanned.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(unplanned.status().message(),
            "job 'job' tensor 't': the job is no longer planned on this node");
}

// World of 4 (2 nodes x 2 processes): the region of an all-gather or reduce-scatter is four
// blocks.
TEST_F(LocalServiceTest, BlockwiseOpsValidateTheWholeRegion) {
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  auto expect_invalid = [&](tributary::v1::SubmitRequest req, const std::string& message) {
    auto s = Submit(req);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_EQ(s.status().message(), message);
  };
  expect_invalid(Request(s0_, "t", b0_, 257, tributary::v1::COLLECTIVE_OP_ALLGATHER),
                 "job 'job' tensor 't': bytes [0, 4112) (world size 4 x block of 257 elements) "
                 "do not fit buffer 1 of 4096 bytes");
  auto req = Request(s0_, "t", b0_, 256, tributary::v1::COLLECTIVE_OP_REDUCE_SCATTER_SUM);
  req.set_offset_bytes(4);
  expect_invalid(req,
                 "job 'job' tensor 't': bytes [4, 4100) (world size 4 x block of 256 elements) "
                 "do not fit buffer 1 of 4096 bytes");
  expect_invalid(Request(s0_, "t", b0_, uint64_t{1} << 62,
                         tributary::v1::COLLECTIVE_OP_REDUCE_SCATTER_AVERAGE),
                 "job 'job' tensor 't': block count 4611686018427387904 x world size 4 must be "
                 "in [1, 2^40 bytes / element]");
  expect_invalid(Request(s0_, "t", b0_, 0, tributary::v1::COLLECTIVE_OP_ALLGATHER),
                 "job 'job' tensor 't': block count 0 x world size 4 must be in [1, 2^40 bytes "
                 "/ element]");
  EXPECT_EQ(runner_.num_starts(), 0u);

  // Exactly the buffer: 4 x 256 float32. Both ranks agree: one node operation of 256-element
  // blocks.
  ASSERT_TRUE(Submit(Request(s0_, "g", b0_, 256, tributary::v1::COLLECTIVE_OP_ALLGATHER)).ok());
  ASSERT_TRUE(Submit(Request(s1_, "g", b1_, 256, tributary::v1::COLLECTIVE_OP_ALLGATHER)).ok());
  ASSERT_EQ(runner_.num_starts(), 1u);
  EXPECT_EQ(runner_.start(0).op.reduction, dataplane::Reduction::kAllGather);
  EXPECT_EQ(runner_.start(0).op.count, 256u);
  EXPECT_EQ(runner_.start(0).op.buffers.size(), 2u);

  // An all-gather against a reduce-scatter of the same name fails both local ranks.
  auto h0 = Submit(Request(s0_, "m", b0_, 8, tributary::v1::COLLECTIVE_OP_ALLGATHER));
  auto h1 = Submit(Request(s1_, "m", b1_, 8, tributary::v1::COLLECTIVE_OP_REDUCE_SCATTER_SUM));
  ASSERT_TRUE(h0.ok() && h1.ok());
  EXPECT_EQ(runner_.num_starts(), 1u);
  for (const auto& [session, handle] : {std::pair{s0_, *h0}, std::pair{s1_, *h1}}) {
    absl::Status s = Result(session, handle);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(),
              "job 'job' tensor 'm' iteration 0: local rank 0 submitted 8 per process x float32 "
              "allgather but local rank 1 submitted 8 per process x float32 reduce_scatter_sum");
  }
}

TEST(ToReductionTest, ConvertsEachApiOpAndRejectsTheRest) {
  EXPECT_EQ(*ToReduction(tributary::v1::COLLECTIVE_OP_SUM), dataplane::Reduction::kSum);
  EXPECT_EQ(*ToReduction(tributary::v1::COLLECTIVE_OP_AVERAGE), dataplane::Reduction::kAverage);
  EXPECT_EQ(*ToReduction(tributary::v1::COLLECTIVE_OP_BROADCAST), dataplane::Reduction::kBroadcast);
  EXPECT_EQ(*ToReduction(tributary::v1::COLLECTIVE_OP_ALLGATHER), dataplane::Reduction::kAllGather);
  EXPECT_EQ(*ToReduction(tributary::v1::COLLECTIVE_OP_REDUCE_SCATTER_SUM),
            dataplane::Reduction::kReduceScatterSum);
  EXPECT_EQ(*ToReduction(tributary::v1::COLLECTIVE_OP_REDUCE_SCATTER_AVERAGE),
            dataplane::Reduction::kReduceScatterAverage);
  auto unspecified = ToReduction(tributary::v1::COLLECTIVE_OP_UNSPECIFIED);
  EXPECT_EQ(unspecified.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unspecified.status().message(), "unknown op 0");
  EXPECT_EQ(ToReduction(static_cast<tributary::v1::CollectiveOp>(-1)).status().message(),
            "unknown op -1");
}

// ---------------------------------------------------------------------------------------------
// The local gather

TEST_F(LocalServiceTest, LocalRanksBecomeOneNodeOperation) {
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  for (int i = 0; i < 16; ++i) {
    shm0_.as<float>()[i] = static_cast<float>(i);
    shm1_.as<float>()[8 + i] = static_cast<float>(100 + i);
  }
  auto req0 = Request(s0_, "grad", b0_, 16, tributary::v1::COLLECTIVE_OP_AVERAGE);
  req0.set_priority(5);
  auto req1 = Request(s1_, "grad", b1_, 16, tributary::v1::COLLECTIVE_OP_AVERAGE);
  req1.set_offset_bytes(8 * sizeof(float));
  req1.set_priority(-2);
  auto h0 = Submit(req0);
  ASSERT_TRUE(h0.ok()) << h0.status();
  EXPECT_EQ(runner_.num_starts(), 0u);  // waits for local rank 1
  auto h1 = Submit(req1);
  ASSERT_TRUE(h1.ok()) << h1.status();
  ASSERT_EQ(runner_.num_starts(), 1u);

  const FakeCollectiveRunner::StartCall call = runner_.start(0);
  EXPECT_EQ(call.job_id, "job");
  EXPECT_EQ(call.op.tensor_name, "grad");
  EXPECT_EQ(call.op.iteration, 0u);
  EXPECT_EQ(call.op.dtype, common::DataType::kFloat32);
  EXPECT_EQ(call.op.count, 16u);
  EXPECT_EQ(call.op.reduction, dataplane::Reduction::kAverage);
  EXPECT_EQ(call.op.priority, -2);  // the most urgent rank's
  ASSERT_EQ(call.op.buffers.size(), 2u);
  // Rank order, each at its own offset in its own process's memory.
  EXPECT_EQ(reinterpret_cast<const float*>(call.op.buffers[0])[3], 3.0f);
  EXPECT_EQ(reinterpret_cast<const float*>(call.op.buffers[1])[3], 103.0f);
  EXPECT_NE(call.op.keepalive, nullptr);
  EXPECT_FALSE(Await(s0_, *h0)->done);

  runner_.Complete(0, absl::OkStatus());
  EXPECT_TRUE(Result(s0_, *h0).ok());
  EXPECT_TRUE(Result(s1_, *h1).ok());
  // Reported results are forgotten.
  auto again = Await(s0_, *h0);
  EXPECT_EQ(again->status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(again->status.message(),
            "handle 1 is unknown in this session (its result was already reported?)");

  // The next submission of the name is its next iteration.
  ASSERT_TRUE(Submit(Request(s0_, "grad", b0_)).ok());
  ASSERT_TRUE(Submit(Request(s1_, "grad", b1_)).ok());
  ASSERT_EQ(runner_.num_starts(), 2u);
  EXPECT_EQ(runner_.start(1).op.iteration, 1u);
  EXPECT_EQ(runner_.start(1).op.reduction, dataplane::Reduction::kSum);
  EXPECT_THAT(runner_.aborts(), IsEmpty());
}

TEST_F(LocalServiceTest, BroadcastRootBecomesNodeAndLocalIndex) {
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  for (const auto& [session, buffer] : {std::pair{s0_, b0_}, std::pair{s1_, b1_}}) {
    auto req = Request(session, "emb", buffer, 16, tributary::v1::COLLECTIVE_OP_BROADCAST);
    req.set_root_rank(3);  // node 1, local rank 1
    ASSERT_TRUE(Submit(req).ok());
  }
  ASSERT_EQ(runner_.num_starts(), 1u);
  EXPECT_EQ(runner_.start(0).op.reduction, dataplane::Reduction::kBroadcast);
  EXPECT_EQ(runner_.start(0).op.root_node, 1u);
  EXPECT_EQ(runner_.start(0).op.root_local, 1u);
}

// Each case: what local rank 1 submits after rank 0's 16 x float32 sum, and the error.
struct MismatchCase {
  std::string name;
  uint64_t count;
  tributary::v1::DataType dtype;
  tributary::v1::CollectiveOp op;
  uint32_t root;
  std::string rank0;
  std::string rank1;
};

class LocalGatherMismatchTest : public LocalServiceTest,
                                public ::testing::WithParamInterface<MismatchCase> {};

TEST_P(LocalGatherMismatchTest, FailsEveryLocalRankWithInvalidArgument) {
  const MismatchCase& c = GetParam();
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  auto first = Request(s0_, "grad", b0_, 16,
                       c.op == tributary::v1::COLLECTIVE_OP_BROADCAST
                           ? tributary::v1::COLLECTIVE_OP_BROADCAST
                           : tributary::v1::COLLECTIVE_OP_SUM);
  auto second = Request(s1_, "grad", b1_, c.count, c.op);
  second.set_dtype(c.dtype);
  second.set_root_rank(c.root);
  auto h0 = Submit(first);
  auto h1 = Submit(second);
  ASSERT_TRUE(h0.ok()) << h0.status();
  ASSERT_TRUE(h1.ok()) << h1.status();
  const std::string message = "job 'job' tensor 'grad' iteration 0: local rank 0 submitted " +
                              c.rank0 + " but local rank 1 submitted " + c.rank1;
  for (const auto& [session, handle] : {std::pair{s0_, *h0}, std::pair{s1_, *h1}}) {
    const absl::Status s = Result(session, handle);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), message);
  }
  EXPECT_EQ(runner_.num_starts(), 0u);
  ASSERT_EQ(runner_.aborts().size(), 1u);
  EXPECT_EQ(runner_.aborts()[0].reason.message(), message);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LocalGatherMismatchTest,
    ::testing::Values(
        MismatchCase{"Count", 8, tributary::v1::DATA_TYPE_FLOAT32, tributary::v1::COLLECTIVE_OP_SUM,
                     0, "16 x float32 sum", "8 x float32 sum"},
        MismatchCase{"Dtype", 16, tributary::v1::DATA_TYPE_INT32, tributary::v1::COLLECTIVE_OP_SUM,
                     0, "16 x float32 sum", "16 x int32 sum"},
        MismatchCase{"Op", 16, tributary::v1::DATA_TYPE_FLOAT32,
                     tributary::v1::COLLECTIVE_OP_AVERAGE, 0, "16 x float32 sum",
                     "16 x float32 average"},
        MismatchCase{"BroadcastRoot", 16, tributary::v1::DATA_TYPE_FLOAT32,
                     tributary::v1::COLLECTIVE_OP_BROADCAST, 1,
                     "16 x float32 broadcast from rank 0", "16 x float32 broadcast from rank 1"}),
    [](const ::testing::TestParamInfo<MismatchCase>& info) { return info.param.name; });

TEST_F(LocalServiceTest, GatherMissingARankFailsAtItsJobsTimeout) {
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  auto handle = Submit(Request(s1_, "grad", b1_));
  ASSERT_TRUE(handle.ok());
  clock_.Advance(999ms);
  service_.Tick();
  EXPECT_FALSE(Await(s1_, *handle)->done);
  EXPECT_THAT(runner_.aborts(), IsEmpty());

  clock_.Advance(1ms);
  service_.Tick();
  const absl::Status s = Result(s1_, *handle);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(),
            "job 'job' tensor 'grad' iteration 0: local ranks [0] did not submit it within 1000 "
            "ms");
  ASSERT_EQ(runner_.aborts().size(), 1u);
  EXPECT_EQ(runner_.aborts()[0].reason, s);
}

TEST_F(LocalServiceTest, RunnerStartErrorFailsEveryRankAndAbortsThePeers) {
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  const absl::Status refused = absl::NotFoundError("job 'job' is unknown to the data plane");
  runner_.FailStartWith(refused);
  auto h0 = Submit(Request(s0_, "grad", b0_));
  auto h1 = Submit(Request(s1_, "grad", b1_));
  ASSERT_TRUE(h0.ok());
  ASSERT_TRUE(h1.ok());
  EXPECT_EQ(Result(s0_, *h0), refused);
  EXPECT_EQ(Result(s1_, *h1), refused);
  ASSERT_EQ(runner_.aborts().size(), 1u);
  EXPECT_EQ(runner_.aborts()[0].job_id, "job");
  EXPECT_EQ(runner_.aborts()[0].tensor, "grad");
  EXPECT_EQ(runner_.aborts()[0].iteration, 0u);
  EXPECT_EQ(runner_.aborts()[0].reason, refused);
}

TEST_F(LocalServiceTest, DataPlaneErrorReachesEveryRank) {
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  auto h0 = Submit(Request(s0_, "grad", b0_));
  auto h1 = Submit(Request(s1_, "grad", b1_));
  ASSERT_TRUE(h0.ok());
  ASSERT_TRUE(h1.ok());
  const absl::Status failed = absl::AbortedError("node w1 died during the push");
  runner_.Complete(0, failed);
  EXPECT_EQ(Result(s0_, *h0), failed);
  EXPECT_EQ(Result(s1_, *h1), failed);
}

// ---------------------------------------------------------------------------------------------
// Waits

TEST_F(LocalServiceTest, ParkedWaitIsAnsweredByCompletionOrByTickAfterItsTimeout) {
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  auto h0 = Submit(Request(s0_, "grad", b0_));
  ASSERT_TRUE(h0.ok());
  auto timed = Await(s0_, *h0, /*timeout_ms=*/500);
  clock_.Advance(499ms);
  service_.Tick();
  EXPECT_FALSE(timed->answered);
  clock_.Advance(1ms);
  service_.Tick();
  ASSERT_TRUE(timed->answered);
  EXPECT_TRUE(timed->status.ok());
  EXPECT_FALSE(timed->done);

  auto parked = Await(s0_, *h0, /*timeout_ms=*/500);
  auto h1 = Submit(Request(s1_, "grad", b1_));
  ASSERT_TRUE(h1.ok());
  EXPECT_FALSE(parked->answered);
  runner_.Complete(0, absl::OkStatus());
  ASSERT_TRUE(parked->answered);
  EXPECT_TRUE(parked->status.ok());
  EXPECT_TRUE(parked->done);
  // Delivered to a parked wait: the next Tick forgets the handle.
  service_.Tick();
  EXPECT_EQ(Await(s0_, *h0)->status.code(), absl::StatusCode::kNotFound);
  // Not yet waited for: still there.
  EXPECT_TRUE(Result(s1_, *h1).ok());
}

// ---------------------------------------------------------------------------------------------
// Retries after a retriable failure (epoch fencing)

TEST_F(LocalServiceTest, RetriableFailureMakesTheNextSubmissionRerunItsIterationOnANewerPlan) {
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  auto g0 = Submit(Request(s0_, "grad", b0_));
  auto g1 = Submit(Request(s1_, "grad", b1_));
  ASSERT_TRUE(g0.ok() && g1.ok());
  ASSERT_EQ(runner_.num_starts(), 1u);
  EXPECT_EQ(runner_.start(0).op.iteration, 0u);
  // The data plane fails iteration 0 as retriable: its plan (v7) changed under it.
  runner_.Complete(0, dataplane::PlanChangedError("job", 7, 8, "tensor 'grad' iteration 0"));
  absl::Status failed = Result(s0_, *g0);
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(failed.message(),
            "[retriable, plan v7] plan of job job changed from v7 to v8 during tensor 'grad' "
            "iteration 0; retry");
  EXPECT_EQ(Result(s1_, *g1).code(), absl::StatusCode::kUnavailable);

  // Both processes submit again: iteration 0 again (not 1), held until this node has a plan
  // newer than v7.
  auto r0 = Submit(Request(s0_, "grad", b0_));
  auto r1 = Submit(Request(s1_, "grad", b1_));
  ASSERT_TRUE(r0.ok() && r1.ok());
  EXPECT_EQ(runner_.num_starts(), 1u);
  EXPECT_EQ(service_.resubmissions(), 2u);
  LocalJob v8 = TwoByTwoJob();
  v8.plan_version = 8;
  service_.SetJobs({v8});
  ASSERT_EQ(runner_.num_starts(), 2u);
  EXPECT_EQ(runner_.start(1).op.iteration, 0u);
  runner_.Complete(1, absl::OkStatus());
  EXPECT_TRUE(Result(s0_, *r0).ok());
  EXPECT_TRUE(Result(s1_, *r1).ok());

  // The next submissions take the next iteration again.
  ASSERT_TRUE(Submit(Request(s0_, "grad", b0_)).ok());
  ASSERT_TRUE(Submit(Request(s1_, "grad", b1_)).ok());
  ASSERT_EQ(runner_.num_starts(), 3u);
  EXPECT_EQ(runner_.start(2).op.iteration, 1u);
}

TEST_F(LocalServiceTest, RetryOnAPlanThatIsAlreadyNewerStartsAtOnce) {
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  ASSERT_TRUE(Submit(Request(s0_, "grad", b0_)).ok());
  ASSERT_TRUE(Submit(Request(s1_, "grad", b1_)).ok());
  // A lost summation server failed it under v6 (the worker's epoch); this node runs v7 already.
  runner_.Complete(0, dataplane::WithEpoch(absl::UnavailableError("push of tensor 0x1 iteration 0 "
                                                                  "chunk 0/1 to summation server "
                                                                  "spare-1 failed: closed"),
                                           6));
  ASSERT_TRUE(Submit(Request(s0_, "grad", b0_)).ok());
  ASSERT_TRUE(Submit(Request(s1_, "grad", b1_)).ok());
  ASSERT_EQ(runner_.num_starts(), 2u);
  EXPECT_EQ(runner_.start(1).op.iteration, 0u);
}

TEST_F(LocalServiceTest, NonRetriableFailuresTakeTheNextIteration) {
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  ASSERT_TRUE(Submit(Request(s0_, "grad", b0_)).ok());
  ASSERT_TRUE(Submit(Request(s1_, "grad", b1_)).ok());
  // UNAVAILABLE without an epoch, and a deadline: not run again.
  runner_.Complete(0, absl::UnavailableError("send to rank 1 failed"));
  ASSERT_TRUE(Submit(Request(s0_, "grad", b0_)).ok());
  ASSERT_TRUE(Submit(Request(s1_, "grad", b1_)).ok());
  ASSERT_EQ(runner_.num_starts(), 2u);
  EXPECT_EQ(runner_.start(1).op.iteration, 1u);
  runner_.Complete(1, absl::DeadlineExceededError("timed out"));
  ASSERT_TRUE(Submit(Request(s0_, "grad", b0_)).ok());
  ASSERT_TRUE(Submit(Request(s1_, "grad", b1_)).ok());
  ASSERT_EQ(runner_.num_starts(), 3u);
  EXPECT_EQ(runner_.start(2).op.iteration, 2u);
  EXPECT_EQ(service_.resubmissions(), 0u);
}

TEST_F(LocalServiceTest, RetryWithoutANewerPlanFailsRetriableAtTheOpTimeout) {
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  ASSERT_TRUE(Submit(Request(s0_, "grad", b0_)).ok());
  ASSERT_TRUE(Submit(Request(s1_, "grad", b1_)).ok());
  runner_.Complete(0, dataplane::PlanChangedError("job", 7, 8, "tensor 'grad' iteration 0"));
  auto r0 = Submit(Request(s0_, "grad", b0_));
  auto r1 = Submit(Request(s1_, "grad", b1_));
  ASSERT_TRUE(r0.ok() && r1.ok());
  clock_.Advance(999ms);
  service_.Tick();
  EXPECT_FALSE(Await(s0_, *r0)->done);
  clock_.Advance(1ms);
  service_.Tick();
  absl::Status s = Result(s0_, *r0);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(),
            "[retriable, plan v7] job 'job' tensor 'grad' iteration 0 failed on plan v7 and no "
            "newer plan of the job reached this node within 1000 ms; retry");
  EXPECT_EQ(runner_.num_starts(), 1u);
  // Still iteration 0 on the next try, which runs once v8 is here.
  ASSERT_TRUE(Submit(Request(s0_, "grad", b0_)).ok());
  ASSERT_TRUE(Submit(Request(s1_, "grad", b1_)).ok());
  LocalJob v8 = TwoByTwoJob();
  v8.plan_version = 8;
  service_.SetJobs({v8});
  ASSERT_EQ(runner_.num_starts(), 2u);
  EXPECT_EQ(runner_.start(1).op.iteration, 0u);
}

// ---------------------------------------------------------------------------------------------
// Membership generations: a replaced process, Resync

class MembershipTest : public LocalServiceTest {
 protected:
  absl::StatusOr<tributary::v1::ResyncResponse> Resync(const std::string& session) {
    tributary::v1::ResyncRequest req;
    req.set_session_id(session);
    tributary::v1::ResyncResponse resp;
    absl::Status s = service_.Resync(req, &resp);
    if (!s.ok()) return s;
    return resp;
  }
  // The controller's answer to the replacement: the same plan at generation `g`, version `v`.
  void NewGeneration(uint64_t g, uint64_t v) {
    LocalJob job = TwoByTwoJob();
    job.generation = g;
    job.plan_version = v;
    service_.SetJobs({job});
  }
  // Both ranks run iterations 0..n-1 of "grad" (completed at once).
  void RunIterations(int n) {
    for (int i = 0; i < n; ++i) {
      const size_t start = runner_.num_starts();
      ASSERT_TRUE(Submit(Request(s0_, "grad", b0_)).ok());
      ASSERT_TRUE(Submit(Request(s1_, "grad", b1_)).ok());
      ASSERT_EQ(runner_.num_starts(), start + 1);
      runner_.Complete(start, absl::OkStatus());
    }
  }
};

TEST_F(MembershipTest, AReplacedProcessWaitsForANewGenerationThenEveryProcessStartsAgainAtZero) {
  int notified = 0;
  service_.SetMembershipChangeCallback([&] { ++notified; });
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  ASSERT_NO_FATAL_FAILURE(RunIterations(3));
  EXPECT_EQ(runner_.start(2).op.iteration, 2u);

  // Rank 1's process dies; a new one takes its place: refused (retriable) until the controller
  // moves the generation, and the node reports it.
  service_.EndSession(s1_, "its process disconnected");
  auto again = JoinAs(1);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(again.status().message(),
              HasSubstr("local rank 1 of this node was held by a process that ended"));
  EXPECT_EQ(notified, 1);
  ASSERT_EQ(service_.PendingMembershipChanges().size(), 1u);
  EXPECT_EQ(service_.PendingMembershipChanges()[0].job_id, "job");
  EXPECT_EQ(service_.PendingMembershipChanges()[0].generation, 0u);
  EXPECT_EQ(service_.PendingMembershipChanges()[0].local_rank, 1u);
  // Asked again, still refused; reported once.
  EXPECT_EQ(JoinAs(1).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(notified, 1);
  // The survivor's collectives are refused meanwhile, with the marker the client knows.
  absl::StatusOr<uint64_t> refused = Submit(Request(s0_, "grad", b0_));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::StartsWith("[membership changed] "));
  EXPECT_EQ(Resync(s0_).status().code(), absl::StatusCode::kUnavailable);

  NewGeneration(1, 8);
  EXPECT_THAT(service_.PendingMembershipChanges(), IsEmpty());
  EXPECT_EQ(service_.generation_changes(), 1u);
  auto joined = JoinAs(1);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->generation(), 1u);
  s1_ = joined->session_id();
  auto b1 = Register(s1_, shm1_, shm1_.size());
  ASSERT_TRUE(b1.ok());
  b1_ = *b1;
  // The survivor is bound to generation 0: refused until it resyncs.
  refused = Submit(Request(s0_, "grad", b0_));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::StartsWith("[membership changed, generation 1] job 'job' tensor 'grad'"));
  auto resynced = Resync(s0_);
  ASSERT_TRUE(resynced.ok()) << resynced.status();
  EXPECT_EQ(resynced->generation(), 1u);
  EXPECT_EQ(resynced->global_rank(), 2u);
  EXPECT_EQ(resynced->world_size(), 4u);
  EXPECT_EQ(resynced->plan_version(), 8u);
  EXPECT_EQ(service_.resyncs(), 1u);
  // Both count from 0 again, together.
  const size_t before = runner_.num_starts();
  ASSERT_NO_FATAL_FAILURE(RunIterations(1));
  EXPECT_EQ(runner_.start(before).op.iteration, 0u);
  // Resync within a generation changes nothing.
  ASSERT_TRUE(Resync(s0_).ok());
  EXPECT_EQ(service_.resyncs(), 1u);
  ASSERT_NO_FATAL_FAILURE(RunIterations(1));
  EXPECT_EQ(runner_.start(before + 1).op.iteration, 1u);
}

TEST_F(MembershipTest, ANewGenerationFailsOpenGathersAndForgetsPendingRetries) {
  ASSERT_NO_FATAL_FAILURE(JoinBoth());
  // An open gather (rank 1 has not submitted) and an iteration failed as retriable.
  ASSERT_TRUE(Submit(Request(s0_, "grad", b0_)).ok());
  ASSERT_TRUE(Submit(Request(s1_, "grad", b1_)).ok());
  runner_.Complete(0, dataplane::PlanChangedError("job", 7, 8, "tensor 'grad' iteration 0"));
  auto open = Submit(Request(s0_, "bias", b0_));
  ASSERT_TRUE(open.ok());

  NewGeneration(1, 9);  // e.g. another node's process was replaced
  absl::Status failed = Result(s0_, *open);
  EXPECT_EQ(failed.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(failed.message()),
              ::testing::StartsWith("[membership changed, generation 1] job 'job': the job's "
                                    "membership changed"));
  EXPECT_THAT(failed.message(), HasSubstr("tensor 'bias' iteration 0"));
  EXPECT_THAT(runner_.aborts(), IsEmpty());  // the data plane already runs the new plan

  ASSERT_TRUE(Resync(s0_).ok());
  ASSERT_TRUE(Resync(s1_).ok());
  // "grad" iteration 0 failed as retriable before the change: after the resync it is not a
  // retry but the first iteration of the new generation (and it starts at once).
  const size_t before = runner_.num_starts();
  ASSERT_TRUE(Submit(Request(s0_, "grad", b0_)).ok());
  ASSERT_TRUE(Submit(Request(s1_, "grad", b1_)).ok());
  ASSERT_EQ(runner_.num_starts(), before + 1);
  EXPECT_EQ(runner_.start(before).op.iteration, 0u);
  EXPECT_EQ(service_.resubmissions(), 0u);
}

TEST_F(MembershipTest, FirstJoinsAndParameterServerOpsAreNoMembershipChange) {
  int notified = 0;
  service_.SetMembershipChangeCallback([&] { ++notified; });
  // A rank that never had a session joins late: no change.
  s0_ = Join(0);
  EXPECT_EQ(notified, 0);
  // A rank still held: ALREADY_EXISTS, not a replacement.
  EXPECT_EQ(JoinAs(0).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(service_.PendingMembershipChanges(), IsEmpty());
  // A session that joined at a generation is bound to it, with nothing to resync.
  NewGeneration(3, 8);
  s1_ = Join(1);
  auto resynced = Resync(s1_);
  ASSERT_TRUE(resynced.ok());
  EXPECT_EQ(resynced->generation(), 3u);
  EXPECT_EQ(service_.resyncs(), 0u);
  EXPECT_EQ(Resync("no-such-session").status().code(), absl::StatusCode::kNotFound);
  service_.SetJobs({});
  EXPECT_EQ(Resync(s1_).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tributary::agent
