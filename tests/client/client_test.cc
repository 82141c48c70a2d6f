// Client against a fake agent on a unix socket: join retries, buffers, submit/wait, errors,
// keepalive and leave. (The real agent is exercised by the integration tests.)
#include "client/client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "agent/buffer_socket.h"
#include "common/buffer_socket_protocol.h"
#include "common/rpc/grpc_status.h"
#include "common/shm_ring.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tributary/v1/agent.grpc.pb.h"

namespace tributary::client {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr uint32_t kWorldSize = 4;

// Emulates an agent whose job has kWorldSize identical ranks: an all-reduce sum multiplies
// every float32 element by kWorldSize. Tensor names steer failures: "bad" is rejected at
// submit, "fail" fails in Wait, "slow" never completes.
class FakeAgent final : public v1::Agent::Service {
 public:
  std::atomic<int> join_failures_left{0};
  std::atomic<int> joins{0};

  grpc::Status JoinJob(grpc::ServerContext*, const v1::JoinJobRequest* request,
                       v1::JoinJobResponse* response) override {
    ++joins;
    if (request->job_id() == "unknown") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "this node does not work for job unknown");
    }
    if (join_failures_left.fetch_sub(1) > 0) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no plan for the job yet");
    }
    response->set_session_id("session-1");
    response->set_global_rank(2 + request->local_rank());
    response->set_world_size(kWorldSize);
    response->set_plan_version(7);
    return grpc::Status::OK;
  }

  grpc::Status KeepAlive(grpc::ServerContext* context, const v1::KeepAliveRequest* request,
                         grpc::ServerWriter<v1::KeepAliveEvent>* writer) override {
    {
      std::lock_guard lock(mu_);
      keepalive_session_ = request->session_id();
      keepalive_open_ = true;
    }
    cv_.notify_all();
    v1::KeepAliveEvent event;
    event.set_message("session started");
    writer->Write(event);
    bool ended_by_agent = false;
    while (!context->IsCancelled() && !ended_by_agent) {
      std::this_thread::sleep_for(5ms);
      std::lock_guard lock(mu_);
      ended_by_agent = end_keepalive_;
    }
    {
      std::lock_guard lock(mu_);
      keepalive_open_ = false;
      keepalive_ended_ = true;
    }
    cv_.notify_all();
    if (ended_by_agent) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "agent shutting down");
    return grpc::Status::OK;
  }

  grpc::Status LeaveJob(grpc::ServerContext*, const v1::LeaveJobRequest* request,
                        v1::LeaveJobResponse*) override {
    std::lock_guard lock(mu_);
    ++leaves_;
    return grpc::Status::OK;
  }

  // What the agent's buffer socket hands over (agent/buffer_socket.h): the memfd, mapped here.
  absl::StatusOr<uint64_t> RegisterBuffer(const common::PeerCredentials&, const std::string&,
                                          uint64_t size_bytes, common::UniqueFd fd) {
    struct stat st;
    fstat(fd.get(), &st);
    if (static_cast<uint64_t>(st.st_size) != size_bytes) {
      return absl::InvalidArgumentError("size mismatch");
    }
    if ((fcntl(fd.get(), F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW)) !=
        (F_SEAL_SHRINK | F_SEAL_GROW)) {
      return absl::InvalidArgumentError("not sealed");
    }
    void* data = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    std::unique_lock lock(mu_);
    // A registration held up (until the test releases it) answers after the client gave up.
    cv_.wait_for(lock, 10s, [&] { return !block_registrations_; });
    const uint64_t id = next_buffer_id_++;
    buffers_[id] = {data, static_cast<size_t>(st.st_size)};
    return id;
  }

  grpc::Status UnregisterBuffer(grpc::ServerContext*, const v1::UnregisterBufferRequest* request,
                                v1::UnregisterBufferResponse*) override {
    std::lock_guard lock(mu_);
    auto it = buffers_.find(request->buffer_id());
    if (it == buffers_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such buffer");
    munmap(it->second.data, it->second.size);
    buffers_.erase(it);
    ++unregistered_;
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Submit(grpc::ServerContext*, const v1::SubmitRequest* request,
                      v1::SubmitResponse* response) override {
    std::lock_guard lock(mu_);
    submits_.push_back(*request);
    if (request->tensor_name() == "bad") {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "tensor bad: count 3 differs from rank 0's 4");
    }
    auto it = buffers_.find(request->buffer_id());
    if (it == buffers_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such buffer");
    if (request->op() == v1::COLLECTIVE_OP_SUM && request->dtype() == v1::DATA_TYPE_FLOAT32) {
      float* data =
          reinterpret_cast<float*>(static_cast<char*>(it->second.data) + request->offset_bytes());
      for (uint64_t i = 0; i < request->count(); ++i) data[i] *= kWorldSize;
    }
    const uint64_t handle = next_handle_++;
    names_[handle] = request->tensor_name();
    response->set_handle(handle);
    return grpc::Status::OK;
  }

  // Like the agent, every answer carries the answer trailer, except the transport failures
  // this fake plays ("flaky", "unreachable").
  grpc::Status Wait(grpc::ServerContext* context, const v1::WaitRequest* request,
                    v1::WaitResponse* response) override {
    std::string name;
    int rpc = 0;  // this RPC's number for its handle, from 1
    {
      std::unique_lock lock(mu_);
      ++waits_;
      max_wait_timeout_ms_ = std::max(max_wait_timeout_ms_, request->timeout_ms());
      auto it = names_.find(request->handle());
      if (it == names_.end()) {
        if (request->handle() == 0) ++probes_;
        // Frozen: no answer (until thawed, at most 10 s).
        cv_.wait_for(lock, 10s, [&] { return !frozen_; });
        context->AddTrailingMetadata(common::kAgentAnswerTrailer, "1");
        return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such handle");
      }
      name = it->second;
      rpc = ++rpcs_of_[request->handle()];
    }
    if (name == "flaky" && rpc == 1) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "failed to connect to all addresses");
    }
    if (name == "answer-lost" && rpc == 1) {
      // Answered past the RPC's deadline: the agent forgot the handle, the client saw nothing.
      std::lock_guard lock(mu_);
      names_.erase(request->handle());
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
    }
    if (name == "unreachable") {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "failed to connect to all addresses");
    }
    context->AddTrailingMetadata(common::kAgentAnswerTrailer, "1");
    if (name == "lost-node") {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "lost-node: node w3 is unreachable");
    }
    if (name == "gated") {
      // The agent forgets a handle once it reported its result: a second RPC while the first
      // is parked would get "not found" from it as soon as the first is answered. Played
      // here by answering it "not found" at once.
      std::unique_lock lock(mu_);
      gated_rpcs_++;
      cv_.notify_all();
      if (rpc > 1) return grpc::Status(grpc::StatusCode::NOT_FOUND, "handle unknown");
      cv_.wait_for(lock, 10s, [&] { return gate_open_; });
      response->set_done(true);
      return grpc::Status::OK;
    }
    if (name == "fail") {
      return grpc::Status(grpc::StatusCode::ABORTED, "fail: node w1 died during the push");
    }
    if (name == "slow") {
      std::this_thread::sleep_for(std::chrono::milliseconds(request->timeout_ms()));
      response->set_done(false);
      return grpc::Status::OK;
    }
    if (name == "done-at-second-wait") {
      std::lock_guard lock(mu_);
      response->set_done(++waits_of_[request->handle()] >= 2);
      return grpc::Status::OK;
    }
    response->set_done(true);
    return grpc::Status::OK;
  }

  // The fast path's attach, when offered: the ring is accepted and never served (its
  // submissions are never taken), as by an agent whose threads stopped.
  grpc::Status AttachControlRing(grpc::ServerContext*, const v1::AttachControlRingRequest*,
                                 v1::AttachControlRingResponse* response) override {
    std::lock_guard lock(mu_);
    if (!offer_ring_) return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no control ring");
    response->set_version(common::shm_ring::kVersion);
    return grpc::Status::OK;
  }
  void OfferRing() {
    std::lock_guard lock(mu_);
    offer_ring_ = true;
  }
  void Freeze(bool frozen) {
    std::lock_guard lock(mu_);
    frozen_ = frozen;
    cv_.notify_all();
  }
  int probes() {
    std::lock_guard lock(mu_);
    return probes_;
  }

  // Waits (at most `timeout`) until `n` Wait RPCs for "gated" arrived.
  bool WaitGatedRpcs(int n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return gated_rpcs_ >= n; });
  }
  void OpenGate() {
    std::lock_guard lock(mu_);
    gate_open_ = true;
    cv_.notify_all();
  }
  int gated_rpcs() {
    std::lock_guard lock(mu_);
    return gated_rpcs_;
  }
  void EndKeepAlive() {
    std::lock_guard lock(mu_);
    end_keepalive_ = true;
  }
  void BlockRegistrations(bool block) {
    std::lock_guard lock(mu_);
    block_registrations_ = block;
    cv_.notify_all();
  }
  int waits_for(uint64_t handle) {
    std::lock_guard lock(mu_);
    return rpcs_of_[handle];
  }

  bool WaitKeepAlive(bool open) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 5s, [&] { return open ? keepalive_open_ : keepalive_ended_; });
  }
  std::string keepalive_session() {
    std::lock_guard lock(mu_);
    return keepalive_session_;
  }
  int leaves() {
    std::lock_guard lock(mu_);
    return leaves_;
  }
  int unregistered() {
    std::lock_guard lock(mu_);
    return unregistered_;
  }
  bool WaitUnregistered(int n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 10s, [&] { return unregistered_ >= n; });
  }
  int waits() {
    std::lock_guard lock(mu_);
    return waits_;
  }
  uint32_t max_wait_timeout_ms() {
    std::lock_guard lock(mu_);
    return max_wait_timeout_ms_;
  }
  std::vector<v1::SubmitRequest> submits() {
    std::lock_guard lock(mu_);
    return submits_;
  }
  size_t registered() {
    std::lock_guard lock(mu_);
    return buffers_.size();
  }

 private:
  struct Mapping {
    void* data;
    size_t size;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  bool keepalive_open_ = false;
  bool keepalive_ended_ = false;
  std::string keepalive_session_;
  int leaves_ = 0;
  int unregistered_ = 0;
  int waits_ = 0;
  uint32_t max_wait_timeout_ms_ = 0;
  uint64_t next_buffer_id_ = 1;
  uint64_t next_handle_ = 100;
  std::map<uint64_t, Mapping> buffers_;
  std::map<uint64_t, std::string> names_;
  std::map<uint64_t, int> waits_of_;  // Guarded by mu_: Wait RPCs per handle.
  std::map<uint64_t, int> rpcs_of_;   // Guarded by mu_: Wait RPCs per handle, all names.
  int gated_rpcs_ = 0;
  bool gate_open_ = false;
  bool end_keepalive_ = false;
  bool block_registrations_ = false;
  bool offer_ring_ = false;
  bool frozen_ = false;
  int probes_ = 0;
  std::vector<v1::SubmitRequest> submits_;
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_path_ = "/tmp/tributary-client-test-" + std::to_string(getpid()) + ".sock";
    unlink(socket_path_.c_str());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_path_, grpc::InsecureServerCredentials());
    builder.RegisterService(&agent_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    auto buffers = agent::BufferSocketServer::Start(
        common::buffer_socket::PathFor(socket_path_), {},
        [this](const common::PeerCredentials& peer, const std::string& session, uint64_t size,
               common::UniqueFd fd) {
          return agent_.RegisterBuffer(peer, session, size, std::move(fd));
        },
        [this](const std::string& session, uint64_t id) {  // as agent/agent.cc does
          v1::UnregisterBufferRequest req;
          req.set_session_id(session);
          req.set_buffer_id(id);
          v1::UnregisterBufferResponse resp;
          grpc::ServerContext context;
          (void)agent_.UnregisterBuffer(&context, &req, &resp);
        });
    ASSERT_TRUE(buffers.ok()) << buffers.status();
    buffers_ = *std::move(buffers);
    options_.agent_address = "unix:" + socket_path_;
    options_.rpc_timeout = 2000ms;
    options_.join_timeout = 5000ms;
    // This fake agent serves no control ring: only the test of joining offers one.
    options_.control_ring = false;
  }
  void TearDown() override {
    if (buffers_) buffers_->Stop();
    server_->Shutdown(std::chrono::system_clock::now() + 1s);
    unlink(socket_path_.c_str());
  }

  std::unique_ptr<Client> Join() {
    auto client = Client::Connect(options_, "job", 1, 2);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  // A joined client with an all-reduce of 4 floats named `name` (the fake agent's names steer
  // its answers) started on a buffer of its own; nullopt (with the failure reported) if any
  // step failed.
  struct Started {
    std::unique_ptr<Client> client;
    std::shared_ptr<SharedBuffer> buffer;
    Handle handle;
  };
  std::optional<Started> StartAllReduce(const std::string& name) {
    std::unique_ptr<Client> client = Join();
    if (client == nullptr) return std::nullopt;
    auto buffer = client->AllocateBuffer(1024);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    if (!buffer.ok()) return std::nullopt;
    auto handle =
        client->AllReduceAsync(name, **buffer, 0, 4, common::DataType::kFloat32, ReduceOp::kSum);
    EXPECT_TRUE(handle.ok()) << handle.status();
    if (!handle.ok()) return std::nullopt;
    return Started{std::move(client), *std::move(buffer), *std::move(handle)};
  }

  std::string socket_path_;
  FakeAgent agent_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<agent::BufferSocketServer> buffers_;
  ClientOptions options_;
};

TEST_F(ClientTest, ConnectRetriesWhileTheAgentHasNoPlan) {
  agent_.join_failures_left = 2;
  options_.control_ring = true;
  std::unique_ptr<Client> client = Join();
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(agent_.joins.load(), 3);
  EXPECT_EQ(client->session_id(), "session-1");
  EXPECT_EQ(client->global_rank(), 3u);
  EXPECT_EQ(client->world_size(), kWorldSize);
  EXPECT_EQ(client->plan_version(), 7u);
  EXPECT_FALSE(client->has_control_ring());  // this fake agent lacks AttachControlRing
  // The ring's memory was registered to offer it, and unregistered when the agent declined.
  EXPECT_EQ(agent_.registered(), 0u);
  EXPECT_EQ(agent_.unregistered(), 1);
  EXPECT_EQ(client->local_rank(), 1u);
  EXPECT_EQ(client->local_size(), 2u);
  ASSERT_TRUE(agent_.WaitKeepAlive(/*open=*/true));
  EXPECT_EQ(agent_.keepalive_session(), "session-1");
}

TEST_F(ClientTest, ConnectGivesUpAfterJoinTimeoutWithTheLastError) {
  agent_.join_failures_left = 1000;
  options_.join_timeout = 300ms;
  const auto start = std::chrono::steady_clock::now();
  auto client = Client::Connect(options_, "job", 0, 1);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(client.status().message(), HasSubstr("job 'job'"));
  EXPECT_THAT(client.status().message(), HasSubstr("no plan for the job yet"));
  EXPECT_GE(elapsed, 250ms);
  EXPECT_LT(elapsed, 1500ms);
  EXPECT_GE(agent_.joins.load(), 3);
}

TEST_F(ClientTest, ConnectFailsAtOnceForAJobThisNodeDoesNotServe) {
  const auto start = std::chrono::steady_clock::now();
  auto client = Client::Connect(options_, "unknown", 0, 1);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(client.status().message(), HasSubstr("this node does not work for job unknown"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  EXPECT_EQ(agent_.joins.load(), 1);
}

TEST_F(ClientTest, ConnectValidatesRanks) {
  EXPECT_EQ(Client::Connect(options_, "job", 2, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Client::Connect(options_, "", 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientTest, AllReduceRunsOnTheRegisteredBuffer) {
  std::unique_ptr<Client> client = Join();
  ASSERT_NE(client, nullptr);
  auto buffer = client->AllocateBuffer(64 * sizeof(float));
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_NE((*buffer)->id(), 0u);
  EXPECT_EQ(agent_.registered(), 1u);
  auto values = (*buffer)->as<float>();
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);

  // Elements 8..23 only.
  ASSERT_TRUE(client
                  ->AllReduce("grad.0", **buffer, 8 * sizeof(float), 16, common::DataType::kFloat32,
                              ReduceOp::kSum, /*priority=*/-3)
                  .ok());
  for (size_t i = 0; i < values.size(); ++i) {
    const float expected = (i >= 8 && i < 24) ? i * kWorldSize : i;
    ASSERT_EQ(values[i], expected) << i;
  }
  const auto submits = agent_.submits();
  ASSERT_EQ(submits.size(), 1u);
  EXPECT_EQ(submits[0].session_id(), "session-1");
  EXPECT_EQ(submits[0].tensor_name(), "grad.0");
  EXPECT_EQ(submits[0].buffer_id(), (*buffer)->id());
  EXPECT_EQ(submits[0].offset_bytes(), 32u);
  EXPECT_EQ(submits[0].count(), 16u);
  EXPECT_EQ(submits[0].dtype(), v1::DATA_TYPE_FLOAT32);
  EXPECT_EQ(submits[0].op(), v1::COLLECTIVE_OP_SUM);
  EXPECT_EQ(submits[0].priority(), -3);

  auto handle = client->BroadcastAsync("emb", **buffer, 0, 4, common::DataType::kBFloat16, 3);
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(handle->name(), "emb");
  EXPECT_TRUE(handle->Wait(1s).ok());
  EXPECT_EQ(agent_.submits()[1].op(), v1::COLLECTIVE_OP_BROADCAST);
  EXPECT_EQ(agent_.submits()[1].root_rank(), 3u);
  EXPECT_EQ(agent_.submits()[1].dtype(), v1::DATA_TYPE_BFLOAT16);
  auto avg =
      client->AllReduceAsync("x", **buffer, 0, 1, common::DataType::kFloat64, ReduceOp::kAverage);
  ASSERT_TRUE(avg.ok());
  EXPECT_EQ(agent_.submits()[2].op(), v1::COLLECTIVE_OP_AVERAGE);
  // A completed handle remembers its result: no further RPC.
  const int waits = agent_.waits();
  EXPECT_TRUE(handle->Wait(1s).ok());
  EXPECT_EQ(*handle->Test(), true);
  EXPECT_EQ(agent_.waits(), waits);
}

TEST_F(ClientTest, AgentErrorsKeepTheirCodeAndMessage) {
  std::unique_ptr<Client> client = Join();
  ASSERT_NE(client, nullptr);
  auto buffer = client->AllocateBuffer(4096);
  ASSERT_TRUE(buffer.ok());
  absl::Status bad =
      client->AllReduce("bad", **buffer, 0, 3, common::DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "tensor bad: count 3 differs from rank 0's 4");

  auto handle =
      client->AllReduceAsync("fail", **buffer, 0, 3, common::DataType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(handle.ok());
  absl::Status failed = handle->Wait(1s);
  EXPECT_EQ(failed.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(failed.message(), "fail: node w1 died during the push");
  EXPECT_EQ(handle->Test().status().code(), absl::StatusCode::kAborted);
}

TEST_F(ClientTest, SubmitChecksTheRegionBeforeCallingTheAgent) {
  std::unique_ptr<Client> client = Join();
  ASSERT_NE(client, nullptr);
  auto buffer = client->AllocateBuffer(1024);
  ASSERT_TRUE(buffer.ok());
  EXPECT_EQ(
      client->AllReduce("t", **buffer, 0, 257, common::DataType::kFloat32, ReduceOp::kSum).code(),
      absl::StatusCode::kOutOfRange);
  EXPECT_EQ(
      client->AllReduce("t", **buffer, 2, 1, common::DataType::kFloat32, ReduceOp::kSum).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Broadcast("t", **buffer, 0, 1, common::DataType::kFloat32, kWorldSize).code(),
            absl::StatusCode::kInvalidArgument);
  auto foreign = SharedBuffer::Create(1024);
  ASSERT_TRUE(foreign.ok());
  EXPECT_EQ(
      client->AllReduce("t", **foreign, 0, 1, common::DataType::kFloat32, ReduceOp::kSum).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(agent_.submits().empty());
}

TEST_F(ClientTest, AllGatherAndReduceScatterSendTheirOpAndBlockCount) {
  std::unique_ptr<Client> client = Join();
  ASSERT_NE(client, nullptr);
  auto buffer = client->AllocateBuffer(1024);
  ASSERT_TRUE(buffer.ok());
  // 4 processes x 16 float32 = 256 bytes at offset 512.
  ASSERT_TRUE(client->AllGather("ag", **buffer, 512, 16, common::DataType::kFloat32, 2).ok());
  auto rs = client->ReduceScatterAsync("rs", **buffer, 0, 64, common::DataType::kFloat32,
                                       ReduceOp::kSum, -1);
  ASSERT_TRUE(rs.ok()) << rs.status();
  EXPECT_TRUE(rs->Wait(1s).ok());
  ASSERT_TRUE(
      client->ReduceScatter("ra", **buffer, 0, 1, common::DataType::kInt64, ReduceOp::kAverage)
          .ok());
  auto ag = client->AllGatherAsync("ah", **buffer, 8, 2, common::DataType::kFloat16);
  ASSERT_TRUE(ag.ok()) << ag.status();
  const auto submits = agent_.submits();
  ASSERT_EQ(submits.size(), 4u);
  EXPECT_EQ(submits[0].op(), v1::COLLECTIVE_OP_ALLGATHER);
  EXPECT_EQ(submits[0].count(), 16u);  // the block, not the region
  EXPECT_EQ(submits[0].offset_bytes(), 512u);
  EXPECT_EQ(submits[0].priority(), 2);
  EXPECT_EQ(submits[1].op(), v1::COLLECTIVE_OP_REDUCE_SCATTER_SUM);
  EXPECT_EQ(submits[1].count(), 64u);
  EXPECT_EQ(submits[1].priority(), -1);
  EXPECT_EQ(submits[2].op(), v1::COLLECTIVE_OP_REDUCE_SCATTER_AVERAGE);
  EXPECT_EQ(submits[2].dtype(), v1::DATA_TYPE_INT64);
  EXPECT_EQ(submits[3].op(), v1::COLLECTIVE_OP_ALLGATHER);
  EXPECT_EQ(submits[3].dtype(), v1::DATA_TYPE_FLOAT16);
}

TEST_F(ClientTest, AllGatherAndReduceScatterCheckTheWholeRegion) {
  std::unique_ptr<Client> client = Join();
  ASSERT_NE(client, nullptr);
  auto buffer = client->AllocateBuffer(1024);
  ASSERT_TRUE(buffer.ok());
  // 4 x 65 float32 = 1040 bytes: one block fits, the region does not.
  absl::Status s = client->AllGather("t", **buffer, 0, 65, common::DataType::kFloat32);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_THAT(s.message(), HasSubstr("260 elements"));
  EXPECT_EQ(client->ReduceScatter("t", **buffer, 4, 64, common::DataType::kFloat32, ReduceOp::kSum)
                .code(),
            absl::StatusCode::kOutOfRange);
  s = client->ReduceScatter("t", **buffer, 0, 0, common::DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("at least 1"));
  s = client->AllGather("t", **buffer, 0, SIZE_MAX / 2, common::DataType::kFloat32);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_THAT(s.message(), HasSubstr("overflow"));
  EXPECT_EQ(client->AllGather("t", **buffer, 2, 1, common::DataType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  auto foreign = SharedBuffer::Create(1024);
  ASSERT_TRUE(foreign.ok());
  EXPECT_EQ(client->AllGather("t", **foreign, 0, 1, common::DataType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(agent_.submits().empty());
}

TEST_F(ClientTest, WaitTimesOutWhileTheOperationGoesOn) {
  std::unique_ptr<Client> client = Join();
  ASSERT_NE(client, nullptr);
  auto buffer = client->AllocateBuffer(1024);
  ASSERT_TRUE(buffer.ok());
  auto handle =
      client->AllReduceAsync("slow", **buffer, 0, 4, common::DataType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(handle.ok());
  EXPECT_EQ(*handle->Test(), false);
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = handle->Wait(300ms);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status.message(), HasSubstr("operation slow not done after"));
  EXPECT_GE(elapsed, 290ms);
  EXPECT_LT(elapsed, 2s);
  EXPECT_LE(agent_.max_wait_timeout_ms(), 300u);

  // No limit: milliseconds::max() waits as long as it takes (it overflowed into a deadline in
  // the past, and the wait gave up after the first Wait RPC said not done).
  auto later = client->AllReduceAsync("done-at-second-wait", **buffer, 0, 4,
                                      common::DataType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(later.ok());
  EXPECT_TRUE(later->Wait(std::chrono::milliseconds::max()).ok());
}

// One Wait RPC per handle at a time: a second thread waiting on the same handle gets the
// result the first one's RPC brought, not the agent's "not found" for a handle it already
// reported. (The bounded wait below is for an RPC that must not come.)
TEST_F(ClientTest, ThreadsWaitingOnOneHandleAllGetItsResult) {
  std::unique_ptr<Client> client = Join();
  ASSERT_NE(client, nullptr);
  auto buffer = client->AllocateBuffer(1024);
  ASSERT_TRUE(buffer.ok());
  auto handle =
      client->AllReduceAsync("gated", **buffer, 0, 4, common::DataType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(handle.ok());
  absl::Status first, second;
  std::thread a([&] { first = handle->Wait(20s); });
  ASSERT_TRUE(agent_.WaitGatedRpcs(1, 5s));
  std::thread b([&] { second = handle->Wait(20s); });
  EXPECT_FALSE(agent_.WaitGatedRpcs(2, 300ms)) << "a second Wait RPC was sent for the handle";
  EXPECT_FALSE(*handle->Test());  // does not send one either while the first is in flight
  agent_.OpenGate();
  a.join();
  b.join();
  EXPECT_TRUE(first.ok()) << first;
  EXPECT_TRUE(second.ok()) << second;
  EXPECT_EQ(agent_.gated_rpcs(), 1);
}

// A Wait RPC that failed before the agent answered (no answer trailer) is not the operation's
// result: the client asks again. An error the agent gave, of the same code, is the result.
TEST_F(ClientTest, AWaitRpcThatFailedInTransportIsAskedAgain) {
  std::unique_ptr<Client> client = Join();
  ASSERT_NE(client, nullptr);
  auto buffer = client->AllocateBuffer(1024);
  ASSERT_TRUE(buffer.ok());
  auto flaky =
      client->AllReduceAsync("flaky", **buffer, 0, 4, common::DataType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(flaky.ok());
  EXPECT_TRUE(flaky->Wait(20s).ok());
  EXPECT_EQ(agent_.waits_for(flaky->id()), 2);

  auto lost = client->AllReduceAsync("lost-node", **buffer, 0, 4, common::DataType::kFloat32,
                                     ReduceOp::kSum);
  ASSERT_TRUE(lost.ok());
  absl::Status status = lost->Wait(20s);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(status.message(), "lost-node: node w3 is unreachable");
  EXPECT_EQ(agent_.waits_for(lost->id()), 1);
}

// An answer lost on the way back: the agent no longer knows the handle when asked again. That is
// UNAVAILABLE "result lost", not the agent's NOT_FOUND.
TEST_F(ClientTest, AResultLostOnTheWayBackIsUnavailable) {
  std::optional<Started> op = StartAllReduce("answer-lost");
  ASSERT_TRUE(op);
  absl::Status status = op->handle.Wait(20s);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("operation answer-lost: its result was lost"));
}

// An agent that does not answer, with the session still open (frozen, not gone): the wait ends
// after max_unanswered_wait, not at its own deadline.
TEST_F(ClientTest, AWaitEndsWhenTheAgentHasNotAnsweredForTheLimit) {
  options_.max_unanswered_wait = 200ms;
  std::optional<Started> op = StartAllReduce("unreachable");
  ASSERT_TRUE(op);
  absl::Status status = op->handle.Wait(std::chrono::milliseconds::max());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("the agent has not answered Wait RPCs for"));
  EXPECT_GE(agent_.waits_for(op->handle.id()), 2);
  options_.max_unanswered_wait = -1ms;
  EXPECT_EQ(Client::Connect(options_, "job", 1, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A limit of milliseconds::max() means never (it overflowed in the clock's nanoseconds into a
// limit already passed, and the second unanswered RPC ended the wait).
TEST_F(ClientTest, AnUnansweredWaitLimitOfMaxNeverEndsTheWait) {
  options_.max_unanswered_wait = std::chrono::milliseconds::max();
  std::optional<Started> op = StartAllReduce("unreachable");
  ASSERT_TRUE(op);
  absl::Status status = op->handle.Wait(300ms);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_GE(agent_.waits_for(op->handle.id()), 2);
}

// On the control ring a frozen agent shows only as results that do not come: after each
// max_unanswered_wait without the result the client asks the agent whether it answers. While it
// does, the wait runs to its own deadline; once it does not, the wait ends with UNAVAILABLE.
TEST_F(ClientTest, ARingWaitAsksTheAgentAndEndsWhenItDoesNotAnswer) {
  agent_.OfferRing();
  options_.control_ring = true;
  options_.max_unanswered_wait = 100ms;
  options_.rpc_timeout = 2s;  // an answered question within it, even under sanitizers
  std::optional<Started> op = StartAllReduce("t");
  ASSERT_TRUE(op);
  ASSERT_TRUE(op->client->has_control_ring());
  ASSERT_TRUE(op->handle.via_control_ring());

  absl::Status status = op->handle.Wait(1s);  // answered each time: to the deadline
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_GE(agent_.probes(), 2);

  agent_.Freeze(true);
  status = op->handle.Wait(std::chrono::milliseconds::max());
  agent_.Freeze(false);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("operation t: no result on the control ring for"));
  EXPECT_THAT(status.message(), HasSubstr("the agent did not answer"));
}

// ... until the session ended: then the wait ends with that, long before its deadline.
TEST_F(ClientTest, AWaitOnAnUnreachableAgentEndsWhenTheSessionEnds) {
  std::unique_ptr<Client> client = Join();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(agent_.WaitKeepAlive(/*open=*/true));
  auto buffer = client->AllocateBuffer(1024);
  ASSERT_TRUE(buffer.ok());
  auto handle = client->AllReduceAsync("unreachable", **buffer, 0, 4, common::DataType::kFloat32,
                                       ReduceOp::kSum);
  ASSERT_TRUE(handle.ok());
  agent_.EndKeepAlive();
  absl::Status status = handle->Wait(std::chrono::milliseconds::max());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("ended (keepalive stream"));
  EXPECT_THAT(status.message(), HasSubstr("the last Wait RPC"));
  EXPECT_GE(agent_.waits_for(handle->id()), 1);
}

// A registration that timed out leaves the buffer socket's stream out of step; the client
// shuts it down, and the next AllocateBuffer connects again instead of failing for good. The
// agent's late answer then cannot be sent, so the agent releases that buffer: nothing stays
// mapped under an id nobody knows.
TEST_F(ClientTest, AllocateBufferConnectsAgainAfterATimedOutRegistration) {
  options_.rpc_timeout = 300ms;
  std::unique_ptr<Client> client = Join();
  ASSERT_NE(client, nullptr);
  agent_.BlockRegistrations(true);
  auto late = client->AllocateBuffer(1024);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  EXPECT_THAT(late.status().message(), HasSubstr("the agent releases the buffer"));
  agent_.BlockRegistrations(false);
  ASSERT_TRUE(agent_.WaitUnregistered(1));
  EXPECT_EQ(agent_.registered(), 0u);
  EXPECT_EQ(buffers_->released_registrations(), 1u);
  auto buffer = client->AllocateBuffer(1024);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_TRUE(
      client->AllReduce("t", **buffer, 0, 4, common::DataType::kFloat32, ReduceOp::kSum).ok());
  EXPECT_EQ(agent_.registered(), 1u);
}

TEST_F(ClientTest, LeaveEndsTheSessionAndBuffersCleanUp) {
  std::unique_ptr<Client> client = Join();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(agent_.WaitKeepAlive(/*open=*/true));
  auto kept = client->AllocateBuffer(1024);
  ASSERT_TRUE(kept.ok());
  {
    auto dropped = client->AllocateBuffer(1024);
    ASSERT_TRUE(dropped.ok());
  }
  EXPECT_EQ(agent_.unregistered(), 1);
  EXPECT_EQ(agent_.registered(), 1u);

  client.reset();  // Leaves the job and cancels the keepalive stream.
  EXPECT_EQ(agent_.leaves(), 1);
  EXPECT_TRUE(agent_.WaitKeepAlive(/*open=*/false));
  // The buffer outlives the client: it still unmaps, without RPCs.
  kept->reset();
  EXPECT_EQ(agent_.unregistered(), 1);
}

TEST_F(ClientTest, CallsAfterLeaveFail) {
  std::unique_ptr<Client> client = Join();
  ASSERT_NE(client, nullptr);
  auto buffer = client->AllocateBuffer(1024);
  ASSERT_TRUE(buffer.ok());
  EXPECT_TRUE(client->Leave().ok());
  EXPECT_TRUE(client->Leave().ok());  // Idempotent.
  EXPECT_EQ(agent_.leaves(), 1);
  EXPECT_EQ(client->AllocateBuffer(16).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      client->AllReduce("t", **buffer, 0, 1, common::DataType::kFloat32, ReduceOp::kSum).code(),
      absl::StatusCode::kFailedPrecondition);
}

TEST_F(ClientTest, ConcurrentCallsFromManyThreads) {
  std::unique_ptr<Client> client = Join();
  ASSERT_NE(client, nullptr);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto buffer = client->AllocateBuffer(256 * sizeof(float));
      if (!buffer.ok()) {
        ++failures;
        return;
      }
      auto values = (*buffer)->as<float>();
      for (int iter = 0; iter < 10; ++iter) {
        for (float& v : values) v = static_cast<float>(t + 1);
        absl::Status s = client->AllReduce("t" + std::to_string(t), **buffer, 0, values.size(),
                                           common::DataType::kFloat32, ReduceOp::kSum);
        if (!s.ok() || values[255] != (t + 1) * kWorldSize) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(ClientTest, RegisterCudaBufferFailsClearlyWithoutCudaOrADevice) {
  std::unique_ptr<Client> client = Join();
  ASSERT_NE(client, nullptr);
  float host[4] = {};
  auto buffer = client->RegisterCudaBuffer(host, sizeof(host), /*device=*/0);
  ASSERT_FALSE(buffer.ok());
  if (buffer.status().code() == absl::StatusCode::kFailedPrecondition) {
    // A client built without CUDA, or a machine without a CUDA device.
    EXPECT_THAT(buffer.status().message(),
                ::testing::AnyOf(HasSubstr("this client was built without CUDA"),
                                 HasSubstr("no CUDA device")));
  } else {
    // With a GPU: host memory is no cudaMalloc allocation.
    EXPECT_EQ(buffer.status().code(), absl::StatusCode::kInvalidArgument) << buffer.status();
  }
  EXPECT_EQ(agent_.registered(), 0u);  // refused before anything reached the agent
  // The client goes on with shared memory.
  auto shm = client->AllocateBuffer(1024);
  ASSERT_TRUE(shm.ok()) << shm.status();
  EXPECT_FALSE((*shm)->is_cuda());
}

TEST(ClientConnectTest, NoAgentFailsWithUnavailableWithinTheJoinTimeout) {
  ClientOptions options;
  options.agent_address = "unix:/tmp/tributary-no-such-agent-" + std::to_string(getpid());
  options.join_timeout = 400ms;
  options.rpc_timeout = 1000ms;
  const auto start = std::chrono::steady_clock::now();
  auto client = Client::Connect(options, "job-x", 0, 1);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable) << client.status();
  EXPECT_THAT(client.status().message(), HasSubstr("job-x"));
  EXPECT_LT(elapsed, 1500ms);
}

}  // namespace
}  // namespace tributary::client
