// The client's transparent retry against the real agent service (LocalService, ControlRings and
// LocalGrpcService on a unix socket) with the fake data plane, which the test fails on purpose:
// a retriable failure is submitted again with the region's original inputs, as the same
// iteration, once the agent has a newer plan; the switch and the bound on retries hold.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent/control_ring_host.h"
#include "agent/fake_collective_runner.h"
#include "agent/local_grpc_service.h"
#include "client/client.h"
#include "dataplane/collectives/operation.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/util/buffer_socket.h"

namespace tributary::client {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using namespace std::chrono_literals;

constexpr size_t kCount = 64;

agent::LocalJob Solo(uint64_t version) {
  return agent::LocalJob{
      .job_id = "solo", .plan_version = version, .num_nodes = 1, .procs_per_node = 1};
}

class RetryTest : public ::testing::TestWithParam<bool /*control ring*/> {
 protected:
  void SetUp() override {
    service_.SetJobs({Solo(1)});
    socket_ = "/tmp/tributary-retry-test-" + std::to_string(getpid()) + ".sock";
    grpc_service_ = std::make_unique<agent::LocalGrpcService>(&service_, &rings_);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
    builder.RegisterService(grpc_service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    buffers_ = tributary::testing::ServeBuffers(service_, socket_);
    options_.agent_address = "unix:" + socket_;
    options_.rpc_timeout = 5000ms;
    options_.join_timeout = 5000ms;
    options_.control_ring = GetParam();
  }
  void TearDown() override {
    client_.reset();
    rings_.Shutdown();
    service_.Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + 1s);
    buffers_.reset();
    unlink(socket_.c_str());
  }

  void Connect() {
    auto c = Client::Connect(options_, "solo", 0, 1);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    EXPECT_EQ(client_->has_control_ring(), GetParam());
    auto b = client_->AllocateBuffer(kCount * sizeof(float));
    ASSERT_TRUE(b.ok()) << b.status();
    buffer_ = *b;
    for (size_t i = 0; i < kCount; ++i) buffer_->as<float>()[i] = static_cast<float>(i + 1);
  }

  // Waits (bounded) until the fake data plane has seen `n` starts.
  bool StartsReach(size_t n) {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (runner_.num_starts() < n) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::yield();
    }
    return true;
  }

  // The data plane fails start `index` as a plan change from `epoch` after writing "sums" into
  // the first half of the region, as push/pull does with chunks that came back.
  void FailAfterPartialResults(size_t index, uint64_t epoch) {
    float* region = reinterpret_cast<float*>(runner_.start(index).op.buffers[0]);
    for (size_t i = 0; i < kCount / 2; ++i) region[i] = -7.0f;
    runner_.Complete(
        index, dataplane::PlanChangedError("solo", epoch, epoch + 1, "tensor 'g' iteration 0"));
  }

  bool RegionHoldsInputs(size_t index) {
    const float* region = reinterpret_cast<const float*>(runner_.start(index).op.buffers[0]);
    for (size_t i = 0; i < kCount; ++i) {
      if (region[i] != static_cast<float>(i + 1)) return false;
    }
    return true;
  }

  common::FakeClock clock_;
  agent::FakeCollectiveRunner runner_;
  agent::LocalService service_{&runner_, &clock_};
  agent::ControlRings rings_{&service_};
  std::unique_ptr<agent::LocalGrpcService> grpc_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<agent::BufferSocketServer> buffers_;
  std::string socket_;
  ClientOptions options_;
  std::unique_ptr<Client> client_;
  std::shared_ptr<SharedBuffer> buffer_;
};

TEST_P(RetryTest, RetriableFailureIsSubmittedAgainWithTheOriginalInputsAsTheSameIteration) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  auto h =
      client_->AllReduceAsync("g", *buffer_, 0, kCount, common::DataType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(h.ok()) << h.status();
  absl::Status result;
  std::thread waiter([&] { result = h->Wait(20s); });
  ASSERT_TRUE(StartsReach(1));
  EXPECT_EQ(runner_.start(0).op.iteration, 0u);
  FailAfterPartialResults(0, 1);
  service_.SetJobs({Solo(2)});  // the re-plan (before or after the resubmission: both work)
  ASSERT_TRUE(StartsReach(2));
  EXPECT_EQ(runner_.start(1).op.iteration, 0u);  // the same iteration, not the next
  EXPECT_TRUE(RegionHoldsInputs(1));             // the partial sums were undone
  runner_.Complete(1, absl::OkStatus());
  waiter.join();
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_EQ(h->retries(), 1u);
  EXPECT_EQ(service_.resubmissions(), 1u);
  // The next submission of the name is the next iteration.
  auto next =
      client_->AllReduceAsync("g", *buffer_, 0, kCount, common::DataType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(next.ok());
  ASSERT_TRUE(StartsReach(3));
  EXPECT_EQ(runner_.start(2).op.iteration, 1u);
  runner_.Complete(2, absl::OkStatus());
  EXPECT_TRUE(next->Wait(10s).ok());
}

TEST_P(RetryTest, BlockingAllReduceRetriesToo) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  absl::Status result;
  std::thread caller([&] {
    result =
        client_->AllReduce("g", *buffer_, 0, kCount, common::DataType::kFloat32, ReduceOp::kSum);
  });
  ASSERT_TRUE(StartsReach(1));
  FailAfterPartialResults(0, 1);
  service_.SetJobs({Solo(2)});
  ASSERT_TRUE(StartsReach(2));
  EXPECT_TRUE(RegionHoldsInputs(1));
  runner_.Complete(1, absl::OkStatus());
  caller.join();
  EXPECT_TRUE(result.ok()) << result;
}

TEST_P(RetryTest, RetriesAreBoundedAndCanBeTurnedOff) {
  options_.max_retries = 2;
  ASSERT_NO_FATAL_FAILURE(Connect());
  auto h =
      client_->AllReduceAsync("g", *buffer_, 0, kCount, common::DataType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(h.ok());
  absl::Status result;
  std::thread waiter([&] { result = h->Wait(20s); });
  for (size_t attempt = 0; attempt < 3; ++attempt) {
    ASSERT_TRUE(StartsReach(attempt + 1));
    EXPECT_EQ(runner_.start(attempt).op.iteration, 0u);
    FailAfterPartialResults(attempt, attempt + 1);
    service_.SetJobs({Solo(attempt + 2)});
  }
  waiter.join();
  EXPECT_EQ(result.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(result.message()),
              StartsWith("[retriable, plan v3] plan of job solo changed"));
  EXPECT_EQ(h->retries(), 2u);
  EXPECT_EQ(runner_.num_starts(), 3u);
}

TEST_P(RetryTest, WithRetriesOffTheFailureIsReturnedAsItIs) {
  options_.retry_collectives = false;
  ASSERT_NO_FATAL_FAILURE(Connect());
  auto h =
      client_->AllReduceAsync("g", *buffer_, 0, kCount, common::DataType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(StartsReach(1));
  FailAfterPartialResults(0, 1);
  absl::Status s = h->Wait(10s);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("plan of job solo changed from v1 to v2"));
  EXPECT_EQ(h->retries(), 0u);
  EXPECT_EQ(buffer_->as<float>()[0], -7.0f);  // nothing restored: the caller decides
  EXPECT_EQ(runner_.num_starts(), 1u);
}

TEST_P(RetryTest, OtherFailuresAreNotRetried) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  auto h =
      client_->AllReduceAsync("g", *buffer_, 0, kCount, common::DataType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(StartsReach(1));
  runner_.Complete(0, absl::UnavailableError("send to rank 1 failed"));  // no epoch: not marked
  EXPECT_EQ(h->Wait(10s), absl::UnavailableError("send to rank 1 failed"));
  EXPECT_EQ(h->retries(), 0u);
  EXPECT_EQ(runner_.num_starts(), 1u);
}

INSTANTIATE_TEST_SUITE_P(RingAndSubmit, RetryTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("ControlRing") : std::string("Submit");
                         });

}  // namespace
}  // namespace tributary::client
