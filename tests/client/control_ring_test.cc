// The client's fast path against the real agent service (LocalService, ControlRings and
// LocalGrpcService on a unix socket) with the fake data plane: collectives through the control
// ring with exact sums, many waiting threads, agent errors, the gRPC fallback (full ring, long
// names, an agent without the RPC) and waiters woken with an error when the session ends.
#include "client/control_ring.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/control_ring_host.h"
#include "agent/fake_collective_runner.h"
#include "agent/local_grpc_service.h"
#include "client/client.h"
#include "common/shm_ring.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/util/buffer_socket.h"

namespace tributary::client {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

class ControlRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    runner_.CompleteOnStart(true);
    service_.SetJobs({agent::LocalJob{.job_id = "pair", .num_nodes = 1, .procs_per_node = 2},
                      agent::LocalJob{.job_id = "solo", .num_nodes = 1, .procs_per_node = 1}});
    Serve(&rings_);
  }
  void TearDown() override { StopServing(); }

  // Serves the agent's local service, with the fast path unless `rings` is null.
  void Serve(agent::ControlRings* rings) {
    static int next = 0;
    socket_ = "/tmp/tributary-ring-test-" + std::to_string(getpid()) + "-" +
              std::to_string(next++) + ".sock";
    grpc_service_ = std::make_unique<agent::LocalGrpcService>(&service_, rings);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
    builder.RegisterService(grpc_service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    buffers_ = tributary::testing::ServeBuffers(service_, socket_);
    options_.agent_address = "unix:" + socket_;
    options_.rpc_timeout = 5000ms;
    options_.join_timeout = 5000ms;
  }
  void StopServing() {
    clients_.clear();
    rings_.Shutdown();
    service_.Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + 1s);
    buffers_.reset();
    unlink(socket_.c_str());
  }

  Client* Connect(const std::string& job, uint32_t rank, uint32_t size) {
    auto client = Client::Connect(options_, job, rank, size);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return nullptr;
    clients_.push_back(std::move(*client));
    return clients_.back().get();
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
  std::vector<std::unique_ptr<Client>> clients_;
};

// Rank r, element i, iteration k: exact in float32, and different per rank and iteration.
float Value(uint32_t rank, size_t i, int k) {
  return static_cast<float>((rank + 1) * (i % 7 + 1) + k);
}

TEST_F(ControlRingTest, AllReduceThroughTheRingOfTwoProcessesSumsEveryElement) {
  constexpr size_t kCount = 1024;
  constexpr int kIterations = 50;
  Client* c[2] = {Connect("pair", 0, 2), Connect("pair", 1, 2)};
  ASSERT_TRUE(c[0] && c[1]);
  ASSERT_TRUE(c[0]->has_control_ring());
  ASSERT_TRUE(c[1]->has_control_ring());
  std::atomic<int> wrong{0}, errors{0}, via_grpc{0};
  std::vector<std::thread> ranks;
  for (uint32_t r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto buffer = c[r]->AllocateBuffer(kCount * sizeof(float));
      if (!buffer.ok()) {
        ++errors;
        return;
      }
      auto values = (*buffer)->as<float>();
      for (int k = 0; k < kIterations; ++k) {
        for (size_t i = 0; i < kCount; ++i) values[i] = Value(r, i, k);
        auto handle = c[r]->AllReduceAsync("grad", **buffer, 0, kCount, common::DataType::kFloat32,
                                           ReduceOp::kSum);
        if (!handle.ok() || !handle->Wait(10s).ok()) {
          ++errors;
          continue;
        }
        if (!handle->via_control_ring()) ++via_grpc;
        for (size_t i = 0; i < kCount; ++i) {
          if (values[i] != Value(0, i, k) + Value(1, i, k)) ++wrong;
        }
      }
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(via_grpc.load(), 0);
  EXPECT_EQ(runner_.num_starts(), static_cast<size_t>(kIterations));
}

// The fake data plane computes a one-node job: the two processes are the whole world.
TEST_F(ControlRingTest, AllGatherAndReduceScatterThroughTheRingOfTwoProcesses) {
  constexpr size_t kBlock = 100;
  Client* c[2] = {Connect("pair", 0, 2), Connect("pair", 1, 2)};
  ASSERT_TRUE(c[0] && c[1]);
  ASSERT_EQ(c[1]->global_rank(), 1u);
  ASSERT_EQ(c[1]->world_size(), 2u);
  std::atomic<int> wrong{0}, errors{0}, via_grpc{0};
  std::vector<std::thread> ranks;
  for (uint32_t r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto buffer = c[r]->AllocateBuffer(2 * kBlock * sizeof(float));
      if (!buffer.ok()) {
        ++errors;
        return;
      }
      auto values = (*buffer)->as<float>();
      // All-gather: only the own block is input.
      for (size_t i = 0; i < 2 * kBlock; ++i) values[i] = i / kBlock == r ? Value(r, i, 0) : -1;
      auto gather = c[r]->AllGatherAsync("ag", **buffer, 0, kBlock, common::DataType::kFloat32);
      if (!gather.ok() || !gather->Wait(10s).ok()) {
        ++errors;
        return;
      }
      if (!gather->via_control_ring()) ++via_grpc;
      for (size_t i = 0; i < 2 * kBlock; ++i) {
        if (values[i] != Value(static_cast<uint32_t>(i / kBlock), i, 0)) ++wrong;
      }
      // Reduce-scatter, sum then average: the own block holds the reduction of both regions.
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
        for (size_t i = 0; i < 2 * kBlock; ++i) values[i] = Value(r, i, 1);
        if (!c[r]->ReduceScatter("rs", **buffer, 0, kBlock, common::DataType::kFloat32, op).ok()) {
          ++errors;
          return;
        }
        for (size_t i = r * kBlock; i < (r + 1) * kBlock; ++i) {
          const float sum = Value(0, i, 1) + Value(1, i, 1);
          if (values[i] != (op == ReduceOp::kSum ? sum : sum / 2)) ++wrong;
        }
      }
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(via_grpc.load(), 0);
  EXPECT_EQ(runner_.num_starts(), 3u);
}

TEST_F(ControlRingTest, ManyThreadsWaitOnTheirOwnHandles) {
  constexpr int kThreads = 4;
  constexpr int kIterations = 40;
  constexpr size_t kCount = 64;
  Client* c[2] = {Connect("pair", 0, 2), Connect("pair", 1, 2)};
  ASSERT_TRUE(c[0] && c[1]);
  std::atomic<int> wrong{0}, errors{0};
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < 2; ++r) {
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, r, t] {
        auto buffer = c[r]->AllocateBuffer(kCount * sizeof(float));
        if (!buffer.ok()) {
          ++errors;
          return;
        }
        auto values = (*buffer)->as<float>();
        for (int k = 0; k < kIterations; ++k) {
          for (size_t i = 0; i < kCount; ++i) values[i] = Value(r, i, k + t);
          absl::Status s = c[r]->AllReduce("t" + std::to_string(t), **buffer, 0, kCount,
                                           common::DataType::kFloat32, ReduceOp::kSum);
          if (!s.ok()) ++errors;
          for (size_t i = 0; i < kCount; ++i) {
            if (values[i] != Value(0, i, k + t) + Value(1, i, k + t)) ++wrong;
          }
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(runner_.num_starts(), static_cast<size_t>(kThreads * kIterations));
}

TEST_F(ControlRingTest, BroadcastAverageAndAgentErrorsThroughTheRing) {
  Client* c = Connect("solo", 0, 1);
  ASSERT_NE(c, nullptr);
  auto buffer = c->AllocateBuffer(64);
  ASSERT_TRUE(buffer.ok());
  auto values = (*buffer)->as<float>();
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  auto bcast = c->BroadcastAsync("b", **buffer, 0, 16, common::DataType::kFloat32, 0);
  ASSERT_TRUE(bcast.ok());
  EXPECT_TRUE(bcast->via_control_ring());
  EXPECT_TRUE(bcast->Wait(10s).ok());
  EXPECT_EQ(*bcast->Test(), true);  // remembered
  EXPECT_EQ(c->AllReduce("avg", **buffer, 0, 16, common::DataType::kFloat32, ReduceOp::kAverage),
            absl::OkStatus());
  for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(values[i], static_cast<float>(i));

  // The fake data plane refuses float64 sums: the error crosses the ring with code and message.
  auto f64 = c->AllReduceAsync("f64", **buffer, 0, 2, common::DataType::kFloat64, ReduceOp::kSum);
  ASSERT_TRUE(f64.ok());
  EXPECT_TRUE(f64->via_control_ring());
  EXPECT_EQ(f64->Wait(10s), absl::UnimplementedError("the fake runner reduces float32 only"));
  EXPECT_EQ(f64->Test().status().code(), absl::StatusCode::kUnimplemented);
}

TEST_F(ControlRingTest, AFullRingAndALongNameGoThroughSubmit) {
  options_.control_ring_capacity = 2;
  Client* c[2] = {Connect("pair", 0, 2), Connect("pair", 1, 2)};
  ASSERT_TRUE(c[0] && c[1]);
  std::shared_ptr<SharedBuffer> buf[2];
  for (uint32_t r = 0; r < 2; ++r) {
    auto b = c[r]->AllocateBuffer(4 * 4 * sizeof(float));
    ASSERT_TRUE(b.ok());
    buf[r] = *b;
    auto v = buf[r]->as<float>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = Value(r, i, 0);
  }
  const std::string long_name(300, 'n');
  const std::vector<std::string> names = {"a", "b", "c", long_name};
  // Rank 0 alone: its operations wait for rank 1, so the ring fills after two.
  std::vector<Handle> h0;
  for (size_t n = 0; n < names.size(); ++n) {
    auto h = c[0]->AllReduceAsync(names[n], *buf[0], n * 4 * sizeof(float), 4,
                                  common::DataType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(h.ok()) << h.status();
    h0.push_back(*h);
  }
  EXPECT_TRUE(h0[0].via_control_ring());
  EXPECT_TRUE(h0[1].via_control_ring());
  EXPECT_FALSE(h0[2].via_control_ring());  // ring full: Submit
  EXPECT_FALSE(h0[3].via_control_ring());  // name too long for the ring
  EXPECT_EQ(*h0[0].Test(), false);
  for (size_t n = 0; n < names.size(); ++n) {
    ASSERT_TRUE(c[1]->AllReduce(names[n], *buf[1], n * 4 * sizeof(float), 4,
                                common::DataType::kFloat32, ReduceOp::kSum)
                    .ok());
  }
  for (auto& h : h0) EXPECT_TRUE(h.Wait(10s).ok()) << h.name();
  for (uint32_t r = 0; r < 2; ++r) {
    auto v = buf[r]->as<float>();
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], Value(0, i, 0) + Value(1, i, 0)) << i;
  }
}

TEST_F(ControlRingTest, WaitersAreWokenWithAnErrorWhenTheSessionEnds) {
  runner_.CompleteOnStart(false);  // started operations stay pending
  Client* c = Connect("solo", 0, 1);
  ASSERT_NE(c, nullptr);
  auto buffer = c->AllocateBuffer(64);
  ASSERT_TRUE(buffer.ok());
  std::vector<Handle> handles;
  for (const char* name : {"x", "y"}) {
    auto h = c->AllReduceAsync(name, **buffer, 0, 4, common::DataType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(h->via_control_ring());
    handles.push_back(*h);
  }
  // Both taken by the agent (else the agent could answer one with "session not found").
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (runner_.num_starts() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_EQ(runner_.num_starts(), 2u);
  std::vector<absl::Status> results(handles.size());
  std::vector<std::thread> waiters;
  for (size_t i = 0; i < handles.size(); ++i) {
    waiters.emplace_back([&, i] { results[i] = handles[i].Wait(60s); });
  }
  service_.EndSession(c->session_id(), "the test ended it");
  for (auto& w : waiters) w.join();
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(s.message(), ::testing::AnyOf(HasSubstr("ended"), HasSubstr("closed")));
  }
  EXPECT_EQ(handles[0].Wait(1s).code(), absl::StatusCode::kUnavailable);  // remembered
}

TEST_F(ControlRingTest, LeaveFailsWaitersWithTheLeftError) {
  Client* c = Connect("pair", 0, 2);
  ASSERT_NE(c, nullptr);
  auto buffer = c->AllocateBuffer(64);
  ASSERT_TRUE(buffer.ok());
  auto h = c->AllReduceAsync("x", **buffer, 0, 4, common::DataType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(h.ok());
  absl::Status result;
  std::thread waiter([&] { result = h->Wait(60s); });
  EXPECT_TRUE(c->Leave().ok());
  waiter.join();
  EXPECT_EQ(result.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.message(), HasSubstr("has left job 'pair'"));
}

// A client's ring with the agent's side played by the test: the same memory, mapped, and a
// producer of completions on it.
class ControlRingCloseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<internal::ControlRing>> ring = internal::ControlRing::Create(8);
    ASSERT_TRUE(ring.ok()) << ring.status();
    ring_ = *std::move(ring);
    memory_ =
        mmap(nullptr, ring_->size_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, ring_->memfd(), 0);
    ASSERT_NE(memory_, MAP_FAILED);
    absl::StatusOr<common::shm_ring::RingConfig> config =
        common::shm_ring::ReadHeader(memory_, ring_->size_bytes());
    ASSERT_TRUE(config.ok()) << config.status();
    const common::shm_ring::RingView view = common::shm_ring::ViewOf(memory_, *config);
    agent_.emplace(&view.header->cq, view.cq, config->cq_capacity);
  }
  void TearDown() override {
    if (memory_ != MAP_FAILED) munmap(memory_, ring_->size_bytes());
  }

  std::unique_ptr<internal::ControlRing> ring_;
  void* memory_ = MAP_FAILED;
  std::optional<common::shm_ring::RingProducer<common::shm_ring::CompletionEntry>> agent_;
};

// Once the client closed its ring (Leave), what the agent writes after is not read: here the
// agent's ring thread, slower than the process's Leave, answers the submission with "session not
// found" after the close, and the waiter -- however late it comes -- still gets the close's
// error. (An ASan run of LeaveFailsWaitersWithTheLeftError caught the old order: drain first.)
TEST_F(ControlRingCloseTest, CompletionsWrittenAfterTheCloseAreNotRead) {
  internal::RingSubmission submission;
  submission.tensor_name = "x";
  submission.count = 4;
  std::shared_ptr<internal::RingSlot> slot = ring_->TrySubmit(submission);
  ASSERT_NE(slot, nullptr);
  ring_->Close(absl::FailedPreconditionError("the client has left job 'pair'"));
  ASSERT_EQ(agent_->Push(common::shm_ring::MakeCompletion(
                slot->ticket, absl::NotFoundError("session 's' not found"))),
            common::shm_ring::RingResult::kOk);
  std::optional<absl::Status> result =
      ring_->Wait(*slot, std::chrono::steady_clock::now() + std::chrono::seconds(1));
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->code(), absl::StatusCode::kFailedPrecondition) << *result;
  EXPECT_THAT(result->message(), HasSubstr("has left job 'pair'"));
}

// What the agent wrote before the ring closed is read: the keepalive stream's end closes the
// ring when the agent shuts down, and results it completed first are the operations' results,
// not the close's "lost" error.
TEST_F(ControlRingCloseTest, CompletionsWrittenBeforeTheCloseAreTheResults) {
  internal::RingSubmission submission;
  submission.tensor_name = "x";
  submission.count = 4;
  std::shared_ptr<internal::RingSlot> done = ring_->TrySubmit(submission);
  std::shared_ptr<internal::RingSlot> failed = ring_->TrySubmit(submission);
  std::shared_ptr<internal::RingSlot> pending = ring_->TrySubmit(submission);
  ASSERT_TRUE(done != nullptr && failed != nullptr && pending != nullptr);
  ASSERT_EQ(agent_->Push(common::shm_ring::MakeCompletion(done->ticket, absl::OkStatus())),
            common::shm_ring::RingResult::kOk);
  ASSERT_EQ(agent_->Push(common::shm_ring::MakeCompletion(
                failed->ticket, absl::DataLossError("x: checksum mismatch"))),
            common::shm_ring::RingResult::kOk);
  ring_->Close(absl::UnavailableError("session s ended; the operation's result is lost"));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  std::optional<absl::Status> result = ring_->Wait(*done, deadline);
  ASSERT_TRUE(result.has_value());
  EXPECT_TRUE(result->ok()) << *result;
  result = ring_->Wait(*failed, deadline);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(*result, absl::DataLossError("x: checksum mismatch"));
  result = ring_->Wait(*pending, deadline);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->code(), absl::StatusCode::kUnavailable) << *result;
  EXPECT_THAT(result->message(), HasSubstr("result is lost"));
}

// A waiter whose recent waits were short polls the completion queue (here with a budget far
// above the test's run) instead of announcing itself and sleeping: the agent's side, which
// does not ring, never sees it waiting, and the result arrives. With no budget the waiter
// announces itself and sleeps at once, and the doorbell wakes it. (SpinPolicy's choice between
// the two is tested in shm_ring_test.)
TEST(ControlRingSpinTest, AWaiterPollsWithABudgetAndSleepsAtOnceWithout) {
  using SteadyClock = std::chrono::steady_clock;
  for (const auto budget : {std::chrono::nanoseconds(60s), std::chrono::nanoseconds(0)}) {
    SCOPED_TRACE(budget.count() > 0 ? "polling" : "sleeping");
    absl::StatusOr<std::unique_ptr<internal::ControlRing>> ring =
        internal::ControlRing::Create(8, budget);
    ASSERT_TRUE(ring.ok()) << ring.status();
    void* memory = mmap(nullptr, (*ring)->size_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED,
                        (*ring)->memfd(), 0);
    ASSERT_NE(memory, MAP_FAILED);
    absl::StatusOr<common::shm_ring::RingConfig> config =
        common::shm_ring::ReadHeader(memory, (*ring)->size_bytes());
    ASSERT_TRUE(config.ok()) << config.status();
    const common::shm_ring::RingView view = common::shm_ring::ViewOf(memory, *config);
    common::shm_ring::RingProducer<common::shm_ring::CompletionEntry> agent(
        &view.header->cq, view.cq, config->cq_capacity);
    auto waiting = [&] { return std::atomic_ref(view.header->cq.waiting).load() != 0; };
    internal::RingSubmission submission;
    submission.tensor_name = "x";
    submission.count = 4;
    for (int op = 0; op < 3; ++op) {
      std::shared_ptr<internal::RingSlot> slot = (*ring)->TrySubmit(submission);
      ASSERT_NE(slot, nullptr);
      std::optional<absl::Status> result;
      std::thread waiter([&] { result = (*ring)->Wait(*slot, SteadyClock::now() + 60s); });
      bool saw_sleeper = false;
      if (budget.count() > 0) {
        // Give the waiter time to settle into its poll; it must never announce a sleep.
        for (int i = 0; i < 100000; ++i) saw_sleeper = saw_sleeper || waiting();
      } else {
        const auto deadline = SteadyClock::now() + 60s;
        while (!waiting() && SteadyClock::now() < deadline) {
        }
        saw_sleeper = waiting();
      }
      ASSERT_EQ(agent.Push(common::shm_ring::MakeCompletion(slot->ticket, absl::OkStatus())),
                common::shm_ring::RingResult::kOk);
      EXPECT_EQ(agent.Notify(), saw_sleeper);
      waiter.join();
      ASSERT_TRUE(result.has_value());
      EXPECT_TRUE(result->ok()) << *result;
      EXPECT_EQ(saw_sleeper, budget.count() == 0);
    }
  }
}

TEST(ControlRingFallbackTest, AnAgentWithoutTheRpcIsServedThroughSubmit) {
  common::FakeClock clock;
  agent::FakeCollectiveRunner runner;
  runner.CompleteOnStart(true);
  agent::LocalService service(&runner, &clock);
  service.SetJobs({agent::LocalJob{.job_id = "solo", .num_nodes = 1, .procs_per_node = 1}});
  agent::LocalGrpcService grpc_service(&service, /*rings=*/nullptr);  // answers UNIMPLEMENTED
  const std::string socket = "/tmp/tributary-ring-test-" + std::to_string(getpid()) + "-old.sock";
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  builder.RegisterService(&grpc_service);
  auto server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto buffers = tributary::testing::ServeBuffers(service, socket);
  {
    ClientOptions options;
    options.agent_address = "unix:" + socket;
    options.join_timeout = 5000ms;
    auto client = Client::Connect(options, "solo", 0, 1);
    ASSERT_TRUE(client.ok()) << client.status();
    EXPECT_FALSE((*client)->has_control_ring());
    auto buffer = (*client)->AllocateBuffer(64);
    ASSERT_TRUE(buffer.ok());
    (*buffer)->as<float>()[0] = 3;
    auto h =
        (*client)->AllReduceAsync("x", **buffer, 0, 1, common::DataType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(h.ok());
    EXPECT_FALSE(h->via_control_ring());
    EXPECT_TRUE(h->Wait(10s).ok());
    EXPECT_EQ((*buffer)->as<float>()[0], 3.0f);
  }
  service.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + 1s);
  unlink(socket.c_str());
}

TEST(ControlRingOptionsTest, ABadCapacityIsRejectedByConnect) {
  ClientOptions options;
  options.agent_address = "unix:/tmp/tributary-no-agent-" + std::to_string(getpid());
  options.control_ring_capacity = 100;
  auto client = Client::Connect(options, "job", 0, 1);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(client.status().message(), HasSubstr("control_ring_capacity 100"));
}

}  // namespace
}  // namespace tributary::client
