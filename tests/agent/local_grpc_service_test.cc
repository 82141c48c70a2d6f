// The gRPC adapter over a real server on a unix socket: codes and messages cross unchanged,
// KeepAlive streams end with their sessions and end them when cancelled, Submit/Wait report
// `done`. The logic behind it is LocalService's (local_service_test.cc).
#include "agent/local_grpc_service.h"

#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "agent/cuda_buffer.h"
#include "agent/fake_collective_runner.h"
#include "common/rpc/grpc_status.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/agent/shm_test_util.h"

namespace tributary::agent {
namespace {

using namespace std::chrono_literals;

class LocalGrpcServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_.SetJobs({LocalJob{.job_id = "job",
                               .plan_version = 1,
                               .node_rank = 0,
                               .num_nodes = 1,
                               .procs_per_node = 2,
                               .op_timeout = 1000ms}});
    static int next = 0;
    address_ = "unix:/tmp/tributary-agent-test-" + std::to_string(getpid()) + "-" +
               std::to_string(next++) + ".sock";
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address_, grpc::InsecureServerCredentials());
    builder.RegisterService(&grpc_service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = tributary::v1::Agent::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    service_.Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + 1s);
    unlink(address_.substr(5).c_str());
  }

  static std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + 10s);
    return ctx;
  }
  absl::StatusOr<std::string> Join(uint32_t local_rank, const std::string& job_id = "job") {
    tributary::v1::JoinJobRequest req;
    req.set_job_id(job_id);
    req.set_local_rank(local_rank);
    req.set_local_size(2);
    tributary::v1::JoinJobResponse resp;
    absl::Status s = common::FromGrpcStatus(stub_->JoinJob(Context().get(), req, &resp));
    if (!s.ok()) return s;
    return resp.session_id();
  }
  // Buffers come over the buffer socket, not gRPC: straight into the service here.
  uint64_t Register(const std::string& session, const testing::ScopedShm& shm) {
    absl::StatusOr<uint64_t> id = testing::RegisterShm(service_, session, shm);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(0);
  }
  absl::StatusOr<uint64_t> Submit(const std::string& session, uint64_t buffer) {
    tributary::v1::SubmitRequest req;
    req.set_session_id(session);
    req.set_tensor_name("grad");
    req.set_buffer_id(buffer);
    req.set_count(16);
    req.set_dtype(tributary::v1::DATA_TYPE_FLOAT32);
    req.set_op(tributary::v1::COLLECTIVE_OP_SUM);
    tributary::v1::SubmitResponse resp;
    absl::Status s = common::FromGrpcStatus(stub_->Submit(Context().get(), req, &resp));
    if (!s.ok()) return s;
    return resp.handle();
  }
  // One Wait RPC; *done tells whether the operation had finished.
  absl::Status Wait(const std::string& session, uint64_t handle, bool* done) {
    tributary::v1::WaitRequest req;
    req.set_session_id(session);
    req.set_handle(handle);
    req.set_timeout_ms(0);
    tributary::v1::WaitResponse resp;
    absl::Status s = common::FromGrpcStatus(stub_->Wait(Context().get(), req, &resp));
    *done = resp.done();
    return s;
  }
  // A future that becomes ready when the session ends.
  std::future<void> Ended(const std::string& session) {
    auto ended = std::make_shared<std::promise<void>>();
    EXPECT_TRUE(service_.WatchSession(session, [ended] { ended->set_value(); }).ok());
    return ended->get_future();
  }

  common::FakeClock clock_;
  FakeCollectiveRunner runner_;
  LocalService service_{&runner_, &clock_};
  LocalGrpcService grpc_service_{&service_};
  std::string address_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<tributary::v1::Agent::Stub> stub_;
};

TEST_F(LocalGrpcServiceTest, ErrorsKeepTheirCodeAndMessage) {
  auto unknown = Join(0, "other");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(unknown.status().message(),
            "job 'other' has no plan on this node yet: create it with this node as a worker, "
            "then retry");
  auto no_session = Submit("nobody", 1);
  EXPECT_EQ(no_session.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(no_session.status().message(),
            "session 'nobody' not found: call JoinJob first (sessions end when the process "
            "disconnects or leaves)");
}

TEST_F(LocalGrpcServiceTest, SubmitAndWaitReportDone) {
  testing::ScopedShm shm0(64), shm1(64);
  auto s0 = Join(0);
  auto s1 = Join(1);
  ASSERT_TRUE(s0.ok() && s1.ok());
  auto h0 = Submit(*s0, Register(*s0, shm0));
  auto h1 = Submit(*s1, Register(*s1, shm1));
  ASSERT_TRUE(h0.ok()) << h0.status();
  ASSERT_TRUE(h1.ok()) << h1.status();
  bool done = true;
  EXPECT_TRUE(Wait(*s0, *h0, &done).ok());
  EXPECT_FALSE(done);
  ASSERT_EQ(runner_.num_starts(), 1u);
  runner_.Complete(0, absl::DataLossError("checksum mismatch"));
  absl::Status result = Wait(*s0, *h0, &done);
  EXPECT_EQ(result.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(result.message(), "checksum mismatch");
}

// Every Wait answer, the operation's error included, carries the answer trailer: the client
// retries only a Wait RPC without it (one that failed before the agent answered).
TEST_F(LocalGrpcServiceTest, WaitAnswersCarryTheAnswerTrailer) {
  testing::ScopedShm shm0(64);
  auto s0 = Join(0);
  ASSERT_TRUE(s0.ok());
  auto h0 = Submit(*s0, Register(*s0, shm0));
  ASSERT_TRUE(h0.ok()) << h0.status();
  auto wait = [&](uint32_t timeout_ms, grpc::StatusCode* code) {
    tributary::v1::WaitRequest req;
    req.set_session_id(*s0);
    req.set_handle(*h0);
    req.set_timeout_ms(timeout_ms);
    tributary::v1::WaitResponse resp;
    auto context = Context();
    *code = stub_->Wait(context.get(), req, &resp).error_code();
    return context->GetServerTrailingMetadata().contains(common::kAgentAnswerTrailer);
  };
  grpc::StatusCode code;
  EXPECT_TRUE(wait(0, &code));  // not done yet, answered at once
  EXPECT_EQ(code, grpc::StatusCode::OK);
  // Answered with the operation's error, of a code gRPC itself also gives.
  auto s1 = Join(1);
  testing::ScopedShm shm1(64);
  ASSERT_TRUE(s1.ok());
  ASSERT_TRUE(Submit(*s1, Register(*s1, shm1)).ok());
  ASSERT_EQ(runner_.num_starts(), 1u);
  runner_.Complete(0, absl::UnavailableError("node w3 is unreachable"));
  EXPECT_TRUE(wait(5000, &code));
  EXPECT_EQ(code, grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(wait(0, &code));  // reported: the handle is unknown now
  EXPECT_EQ(code, grpc::StatusCode::NOT_FOUND);
}

TEST_F(LocalGrpcServiceTest, CancelledKeepAliveEndsTheSessionAndFailsItsPeersGathers) {
  testing::ScopedShm shm0(64);
  auto s0 = Join(0);
  auto s1 = Join(1);
  ASSERT_TRUE(s0.ok() && s1.ok());
  auto h0 = Submit(*s0, Register(*s0, shm0));
  ASSERT_TRUE(h0.ok());
  std::future<void> ended = Ended(*s1);

  grpc::ClientContext keepalive;
  tributary::v1::KeepAliveRequest req;
  req.set_session_id(*s1);
  auto stream = stub_->KeepAlive(&keepalive, req);
  stream->WaitForInitialMetadata();  // the agent watches the session
  keepalive.TryCancel();             // the process died
  ASSERT_EQ(ended.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(service_.num_sessions(), 1u);

  bool done = false;
  absl::Status failed = Wait(*s0, *h0, &done);
  EXPECT_EQ(failed.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(failed.message(),
            "job 'job' tensor 'grad' iteration 0: local rank 1 ended (its process "
            "disconnected) before submitting it");
}

TEST_F(LocalGrpcServiceTest, LeaveEndsTheKeepAliveStream) {
  auto s0 = Join(0);
  ASSERT_TRUE(s0.ok());
  grpc::ClientContext keepalive;
  keepalive.set_deadline(std::chrono::system_clock::now() + 10s);
  tributary::v1::KeepAliveRequest req;
  req.set_session_id(*s0);
  auto stream = stub_->KeepAlive(&keepalive, req);
  stream->WaitForInitialMetadata();  // the agent watches the session

  tributary::v1::LeaveJobRequest leave;
  leave.set_session_id(*s0);
  tributary::v1::LeaveJobResponse left;
  ASSERT_TRUE(stub_->LeaveJob(Context().get(), leave, &left).ok());
  ASSERT_TRUE(stub_->LeaveJob(Context().get(), leave, &left).ok());  // idempotent
  tributary::v1::KeepAliveEvent event;
  EXPECT_FALSE(stream->Read(&event));
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(LocalGrpcServiceTest, KeepAliveForAnUnknownSessionEndsWithNotFound) {
  grpc::ClientContext keepalive;
  keepalive.set_deadline(std::chrono::system_clock::now() + 10s);
  tributary::v1::KeepAliveRequest req;
  req.set_session_id("nobody");
  auto stream = stub_->KeepAlive(&keepalive, req);
  tributary::v1::KeepAliveEvent event;
  EXPECT_FALSE(stream->Read(&event));
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "session 'nobody' not found");
}

TEST_F(LocalGrpcServiceTest, AttachControlRingIsUnimplementedWithoutRings) {
  auto s0 = Join(0);
  ASSERT_TRUE(s0.ok());
  tributary::v1::AttachControlRingRequest req;
  req.set_session_id(*s0);
  req.set_buffer_id(1);
  tributary::v1::AttachControlRingResponse resp;
  const grpc::Status status = stub_->AttachControlRing(Context().get(), req, &resp);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(status.error_message(), "this agent serves no control rings");
}

TEST_F(LocalGrpcServiceTest, RegisterCudaBufferRefusalsCrossWithTheirCodeAndMessage) {
  auto s0 = Join(0);
  ASSERT_TRUE(s0.ok());
  tributary::v1::RegisterCudaBufferRequest req;
  req.set_session_id(*s0);
  req.set_record("not a record");
  tributary::v1::RegisterCudaBufferResponse resp;
  const absl::Status status =
      common::FromGrpcStatus(stub_->RegisterCudaBuffer(Context().get(), req, &resp));
  if (AgentHasCuda()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(status.message(), "CUDA buffer of session '" + *s0 +
                                    "': a CUDA IPC buffer record has 160 bytes, not 12");
  } else {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_THAT(std::string(status.message()),
                ::testing::HasSubstr("this agent was built without CUDA"));
  }
  // The agent keeps serving the session.
  testing::ScopedShm shm(64);
  EXPECT_NE(Register(*s0, shm), 0u);
}

}  // namespace
}  // namespace tributary::agent
