// The agent's end of the control ring, driven by a hand-made client that writes raw entries
// (it can do what a hostile or broken process would): gathers with exact sums, refused entries
// answered with errors naming the problem while the session goes on, results that wait for a
// full completion queue, corrupt counters that end only their session, attach errors.
#include "agent/control_ring_host.h"

#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "agent/fake_collective_runner.h"
#include "agent/local_grpc_service.h"
#include "common/shm_ring.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/agent/shm_test_util.h"

namespace tributary::agent {
namespace {

namespace ring = common::shm_ring;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr auto kDeadline = 10s;

// A training process's end of one ring, written against the layout directly.
class RawClient {
 public:
  explicit RawClient(ring::RingConfig config)
      : shm_(ring::TotalBytes(config.sq_capacity, config.cq_capacity)) {
    EXPECT_TRUE(ring::InitializeHeader(shm_.as<void>(), shm_.size(), config).ok());
    view_ = ring::ViewOf(shm_.as<void>(), config);
    sq_ =
        ring::RingProducer<ring::SubmissionEntry>(&view_.header->sq, view_.sq, config.sq_capacity);
    cq_ =
        ring::RingConsumer<ring::CompletionEntry>(&view_.header->cq, view_.cq, config.cq_capacity);
  }

  const testing::ScopedShm& shm() const { return shm_; }
  ring::ControlRingHeader* header() const { return view_.header; }

  static ring::SubmissionEntry Entry(uint64_t ticket, const std::string& name, uint64_t buffer,
                                     uint64_t count) {
    ring::SubmissionEntry e{};
    e.ticket = ticket;
    e.buffer_id = buffer;
    e.count = count;
    e.dtype = tributary::v1::DATA_TYPE_FLOAT32;
    e.op = tributary::v1::COLLECTIVE_OP_SUM;
    e.name_bytes = static_cast<uint32_t>(name.size());
    std::memcpy(e.name, name.data(), std::min<size_t>(name.size(), ring::kMaxTensorName));
    return e;
  }
  void Push(const ring::SubmissionEntry& e) {
    ASSERT_EQ(sq_.Push(e), ring::RingResult::kOk);
    sq_.Notify();
  }
  // Pushes without ringing the doorbell: only a polling ring thread sees it before its next
  // idle wake.
  void PushQuietly(const ring::SubmissionEntry& e) {
    ASSERT_EQ(sq_.Push(e), ring::RingResult::kOk);
  }
  // Pops what is there, as a client does (ringing the agent when it holds results back).
  std::vector<ring::CompletionEntry> Drain() {
    std::vector<ring::CompletionEntry> out;
    ring::CompletionEntry e;
    while (cq_.Pop(&e) == ring::RingResult::kOk) out.push_back(e);
    if (!out.empty() && std::atomic_ref(view_.header->cq_blocked).load() != 0) {
      ring::Ring(&view_.header->sq.doorbell);
    }
    return out;
  }
  // Waits (on the completion doorbell) until `n` completions arrived; fewer on timeout.
  std::vector<ring::CompletionEntry> Await(size_t n) {
    std::vector<ring::CompletionEntry> out;
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
      for (auto& e : Drain()) out.push_back(e);
      if (out.size() < n) cq_.Sleep(100ms, [] { return false; });
    }
    return out;
  }
  // Completions readable now, without popping them.
  uint64_t published() const { return std::atomic_ref(view_.header->cq.head).load(); }

 private:
  testing::ScopedShm shm_;
  ring::RingView view_;
  ring::RingProducer<ring::SubmissionEntry> sq_;
  ring::RingConsumer<ring::CompletionEntry> cq_;
};

class ControlRingHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_.SetJobs({LocalJob{.job_id = "pair", .num_nodes = 1, .procs_per_node = 2},
                      LocalJob{.job_id = "solo", .num_nodes = 1, .procs_per_node = 1},
                      LocalJob{.job_id = "other", .num_nodes = 1, .procs_per_node = 1}});
  }
  void TearDown() override {
    rings_.Shutdown();
    service_.Shutdown();
  }

  std::string Join(const std::string& job, uint32_t rank, uint32_t size) {
    tributary::v1::JoinJobRequest req;
    req.set_job_id(job);
    req.set_local_rank(rank);
    req.set_local_size(size);
    tributary::v1::JoinJobResponse resp;
    EXPECT_TRUE(service_.Join(req, &resp).ok());
    return resp.session_id();
  }
  uint64_t Register(const std::string& session, const testing::ScopedShm& shm) {
    absl::StatusOr<uint64_t> id = testing::RegisterShm(service_, session, shm);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(0);
  }
  absl::Status Attach(const std::string& session, const RawClient& client) {
    return AttachTo(rings_, session, client);
  }
  // The session's ring, registered and attached to `rings` (a test's own options).
  absl::Status AttachTo(ControlRings& rings, const std::string& session, const RawClient& client) {
    absl::StatusOr<uint64_t> id = testing::RegisterShm(service_, session, client.shm());
    if (!id.ok()) return id.status();
    tributary::v1::AttachControlRingRequest req;
    req.set_session_id(session);
    req.set_buffer_id(*id);
    tributary::v1::AttachControlRingResponse resp;
    absl::Status s = rings.Attach(req, &resp);
    if (s.ok()) EXPECT_EQ(resp.version(), ring::kVersion);
    return s;
  }
  std::future<void> Ended(const std::string& session) {
    auto ended = std::make_shared<std::promise<void>>();
    EXPECT_TRUE(service_.WatchSession(session, [ended] { ended->set_value(); }).ok());
    return ended->get_future();
  }

  common::FakeClock clock_;
  FakeCollectiveRunner runner_;
  LocalService service_{&runner_, &clock_};
  ControlRings rings_{&service_, {.idle_wake = 20ms}};
};

TEST_F(ControlRingHostTest, RingSubmissionsOfBothLocalRanksBecomeOneOperationWithExactSums) {
  runner_.CompleteOnStart(true);
  constexpr uint64_t kCount = 1000;
  testing::ScopedShm buf0(kCount * sizeof(float)), buf1(kCount * sizeof(float));
  RawClient c0({8, 8}), c1({8, 8});
  const std::string s0 = Join("pair", 0, 2), s1 = Join("pair", 1, 2);
  ASSERT_TRUE(Attach(s0, c0).ok());
  ASSERT_TRUE(Attach(s1, c1).ok());
  const uint64_t b0 = Register(s0, buf0), b1 = Register(s1, buf1);
  for (int iter = 0; iter < 3; ++iter) {
    for (uint64_t i = 0; i < kCount; ++i) {
      buf0.as<float>()[i] = static_cast<float>(i % 7 + 1 + iter);
      buf1.as<float>()[i] = static_cast<float>(2 * (i % 5) + 1);
    }
    c0.Push(RawClient::Entry(10 + iter, "grad", b0, kCount));
    c1.Push(RawClient::Entry(20 + iter, "grad", b1, kCount));
    auto r0 = c0.Await(1), r1 = c1.Await(1);
    ASSERT_EQ(r0.size(), 1u);
    ASSERT_EQ(r1.size(), 1u);
    EXPECT_EQ(r0[0].ticket, 10u + iter);
    EXPECT_EQ(r1[0].ticket, 20u + iter);
    EXPECT_TRUE(ring::StatusOf(r0[0]).ok()) << ring::StatusOf(r0[0]);
    EXPECT_TRUE(ring::StatusOf(r1[0]).ok());
    for (uint64_t i = 0; i < kCount; ++i) {
      const float expected = static_cast<float>(i % 7 + 1 + iter + 2 * (i % 5) + 1);
      ASSERT_EQ(buf0.as<float>()[i], expected) << i;
      ASSERT_EQ(buf1.as<float>()[i], expected) << i;
    }
  }
  EXPECT_EQ(runner_.num_starts(), 3u);
}

// With a spin budget the ring thread polls when its idle spells are short: submissions pushed
// without the doorbell are served, and the thread never announces itself as sleeping. (With
// no budget it sleeps at once and sets `waiting`, which the loop below would see.)
TEST_F(ControlRingHostTest, APollingRingThreadServesSubmissionsWithoutTheDoorbell) {
  runner_.CompleteOnStart(true);
  ControlRings polling(&service_, {.idle_wake = 20ms, .spin = 60s});
  constexpr uint64_t kCount = 64;
  testing::ScopedShm buf(kCount * sizeof(float));
  RawClient c({8, 8});
  const std::string session = Join("solo", 0, 1);
  ASSERT_TRUE(AttachTo(polling, session, c).ok());
  const uint64_t b = Register(session, buf);
  bool saw_sleeper = false;
  for (uint64_t op = 1; op <= 20; ++op) {
    for (uint64_t i = 0; i < kCount; ++i) buf.as<float>()[i] = static_cast<float>(i + op);
    c.PushQuietly(RawClient::Entry(op, "t", b, kCount));
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    while (c.published() < op && std::chrono::steady_clock::now() < deadline) {
      saw_sleeper = saw_sleeper || std::atomic_ref(c.header()->sq.waiting).load() != 0;
    }
    auto results = c.Drain();
    ASSERT_EQ(results.size(), 1u) << "op " << op;
    EXPECT_EQ(results[0].ticket, op);
    EXPECT_TRUE(ring::StatusOf(results[0]).ok()) << ring::StatusOf(results[0]);
    for (uint64_t i = 0; i < kCount; ++i) ASSERT_EQ(buf.as<float>()[i], float(i + op));
  }
  EXPECT_FALSE(saw_sleeper);
  polling.Shutdown();  // ends the thread's poll at once
}

// A client whose ring is full falls back to the Submit RPC; the RPC first submits what the ring
// still holds, so a later submission of the same tensor name cannot take an earlier iteration
// than one pushed into the ring before it. (Here the ring's thread takes nothing: its in-flight
// bound is 0, as if it were descheduled.) The RPC goes through the agent's gRPC service on a
// unix socket, whose Submit drains the ring.
TEST_F(ControlRingHostTest, TheSubmitRpcSubmitsWhatTheRingHoldsFirst) {
  ControlRings stalled{&service_, {.idle_wake = 20ms, .max_in_flight = 0}};
  testing::ScopedShm buf(2 * sizeof(float));
  RawClient client({8, 8});
  const std::string s = Join("solo", 0, 1);
  ASSERT_TRUE(AttachTo(stalled, s, client).ok());
  const uint64_t b = Register(s, buf);
  client.Push(RawClient::Entry(1, "grad", b, 1));  // iteration 0, at offset 0
  ASSERT_EQ(runner_.num_starts(), 0u);             // the thread takes nothing (bound 0)
  LocalGrpcService grpc_service(&service_, &stalled);
  const std::string address =
      "unix:/tmp/tributary-ring-host-test-" + std::to_string(getpid()) + ".sock";
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.RegisterService(&grpc_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  absl::Cleanup stop = [&] {
    server->Shutdown(std::chrono::system_clock::now() + 1s);
    unlink(address.substr(5).c_str());
  };
  std::unique_ptr<tributary::v1::Agent::Stub> stub = tributary::v1::Agent::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  tributary::v1::SubmitRequest req;
  req.set_session_id(s);
  req.set_tensor_name("grad");
  req.set_buffer_id(b);
  req.set_offset_bytes(sizeof(float));  // iteration 1, at offset 4
  req.set_count(1);
  req.set_dtype(tributary::v1::DATA_TYPE_FLOAT32);
  req.set_op(tributary::v1::COLLECTIVE_OP_SUM);
  tributary::v1::SubmitResponse resp;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 10s);
  const grpc::Status submitted = stub->Submit(&context, req, &resp);
  ASSERT_TRUE(submitted.ok()) << submitted.error_message();
  ASSERT_EQ(runner_.num_starts(), 2u);
  EXPECT_EQ(runner_.start(0).op.iteration, 0u);
  EXPECT_EQ(runner_.start(1).op.iteration, 1u);
  EXPECT_EQ(runner_.start(1).op.buffers[0] - runner_.start(0).op.buffers[0],
            static_cast<std::ptrdiff_t>(sizeof(float)));
  stalled.Shutdown();
}

TEST_F(ControlRingHostTest, RefusedEntriesGetAnErrorNamingTheProblemAndTheSessionGoesOn) {
  runner_.CompleteOnStart(true);
  testing::ScopedShm buf(64);
  RawClient c({8, 8});
  const std::string s = Join("solo", 0, 1);
  ASSERT_TRUE(Attach(s, c).ok());
  const uint64_t b = Register(s, buf);

  c.Push(RawClient::Entry(1, "t", 9, 4));  // no buffer 9
  auto out_of_range = RawClient::Entry(2, "t", b, 4);
  out_of_range.offset_bytes = 56;  // 16 bytes at 56 of 64
  c.Push(out_of_range);
  auto bad_dtype = RawClient::Entry(3, "t", b, 4);
  bad_dtype.dtype = 99;
  c.Push(bad_dtype);
  auto bad_op = RawClient::Entry(4, "t", b, 4);
  bad_op.op = 42;
  c.Push(bad_op);
  auto no_name = RawClient::Entry(5, "", b, 4);
  c.Push(no_name);
  auto huge_name = RawClient::Entry(6, "t", b, 4);
  huge_name.name_bytes = 100000;
  c.Push(huge_name);
  c.Push(RawClient::Entry(7, "t", b, 16));  // fine

  auto got = c.Await(7);
  ASSERT_EQ(got.size(), 7u);
  for (uint64_t i = 0; i < 7; ++i) EXPECT_EQ(got[i].ticket, i + 1);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(ring::StatusOf(got[i]).code(), absl::StatusCode::kInvalidArgument) << i;
  }
  EXPECT_EQ(ring::StatusOf(got[0]).message(),
            "job 'solo' tensor 't': buffer 9 is not registered in this session");
  EXPECT_EQ(ring::StatusOf(got[1]).message(),
            "job 'solo' tensor 't': bytes [56, 72) do not fit buffer " + std::to_string(b) +
                " of 64 bytes");
  EXPECT_EQ(ring::StatusOf(got[2]).message(), "job 'solo' tensor 't': unknown dtype 99");
  EXPECT_THAT(ring::StatusOf(got[3]).message(), HasSubstr("op 42"));
  EXPECT_THAT(ring::StatusOf(got[4]).message(), HasSubstr("tensor name length 0"));
  EXPECT_THAT(ring::StatusOf(got[5]).message(), HasSubstr("tensor name length 100000"));
  EXPECT_TRUE(ring::StatusOf(got[6]).ok()) << ring::StatusOf(got[6]);
  EXPECT_EQ(service_.num_sessions(), 1u);
  EXPECT_EQ(rings_.num_active(), 1u);
  EXPECT_EQ(runner_.num_starts(), 1u);
}

TEST_F(ControlRingHostTest, ResultsThatFindTheCompletionQueueFullWaitAndNoneIsLost) {
  testing::ScopedShm buf(64);
  RawClient c({16, 4});  // more submissions in flight than completion slots
  const std::string s = Join("solo", 0, 1);
  ASSERT_TRUE(Attach(s, c).ok());
  const uint64_t b = Register(s, buf);
  constexpr uint64_t kOps = 12;
  for (uint64_t t = 1; t <= kOps; ++t) c.Push(RawClient::Entry(t, "op" + std::to_string(t), b, 1));
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (runner_.num_starts() < kOps && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_EQ(runner_.num_starts(), kOps);
  // Completed on this thread: 4 go into the queue, 8 wait in the agent.
  for (size_t i = 0; i < kOps; ++i) {
    runner_.Complete(
        i, i % 3 == 0 ? absl::DataLossError("lost op " + std::to_string(i + 1)) : absl::OkStatus());
  }
  EXPECT_EQ(c.published(), 4u);
  EXPECT_EQ(c.header()->cq_blocked, 1u);

  auto got = c.Await(kOps);
  ASSERT_EQ(got.size(), kOps);
  for (uint64_t i = 0; i < kOps; ++i) {
    EXPECT_EQ(got[i].ticket, i + 1);
    const absl::Status status = ring::StatusOf(got[i]);
    if (i % 3 == 0) {
      EXPECT_EQ(status, absl::DataLossError("lost op " + std::to_string(i + 1)));
    } else {
      EXPECT_TRUE(status.ok()) << i << ": " << status;
    }
  }
  EXPECT_EQ(c.header()->cq_blocked, 0u);
}

// A ring thread at its in-flight bound waits for results to leave. When results wait for a full
// completion queue, only the client's ring after it frees slots wakes the thread, and that ring
// can fall between the thread's last look at the queue and its reading of the doorbell. Here the
// client drains and rings exactly there (the test seam, on the ring thread): the thread must
// publish the waiting results, not sleep out its idle wake (an hour).
TEST_F(ControlRingHostTest, AThrottledRingThreadSeesTheClientsRingThatCameBeforeItSlept) {
  runner_.CompleteOnStart(true);
  testing::ScopedShm buf(64);
  RawClient c({8, 2});
  std::promise<std::vector<ring::CompletionEntry>> drained;
  bool first = true;
  ControlRings throttled(&service_,
                         {.idle_wake = 3600s, .max_in_flight = 2, .before_throttled_sleep = [&] {
                            if (!std::exchange(first, false)) return;
                            drained.set_value(c.Drain());  // rings: cq_blocked
                          }});
  const std::string session = Join("solo", 0, 1);
  ASSERT_TRUE(AttachTo(throttled, session, c).ok());
  const uint64_t b = Register(session, buf);
  buf.as<float>()[0] = 3.0f;
  // Results 1 and 2 fill the completion queue, 3 and 4 wait in the agent at the bound of 2.
  for (uint64_t t = 1; t <= 4; ++t) c.PushQuietly(RawClient::Entry(t, "t", b, 1));
  ring::Ring(&c.header()->sq.doorbell);
  std::future<std::vector<ring::CompletionEntry>> first_two = drained.get_future();
  ASSERT_EQ(first_two.wait_for(kDeadline), std::future_status::ready);
  std::vector<ring::CompletionEntry> got = first_two.get();
  ASSERT_EQ(got.size(), 2u);
  for (auto& e : c.Await(2)) got.push_back(e);
  ASSERT_EQ(got.size(), 4u) << "results 3 and 4 were not published within " << kDeadline;
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(got[i].ticket, i + 1);
    EXPECT_TRUE(ring::StatusOf(got[i]).ok()) << ring::StatusOf(got[i]);
  }
  EXPECT_EQ(buf.as<float>()[0], 3.0f);
  throttled.Shutdown();
}

TEST_F(ControlRingHostTest, ACorruptSubmissionHeadEndsOnlyThatSession) {
  runner_.CompleteOnStart(true);
  testing::ScopedShm buf(64);
  RawClient bad({8, 8}), good({8, 8});
  const std::string s_bad = Join("solo", 0, 1), s_good = Join("other", 0, 1);
  ASSERT_TRUE(Attach(s_bad, bad).ok());
  ASSERT_TRUE(Attach(s_good, good).ok());
  const uint64_t b = Register(s_good, buf);
  std::future<void> ended = Ended(s_bad);

  std::atomic_ref(bad.header()->sq.head).store(1000);  // 1000 entries in an 8-slot ring
  ring::Ring(&bad.header()->sq.doorbell);
  ASSERT_EQ(ended.wait_for(kDeadline), std::future_status::ready);
  EXPECT_EQ(service_.num_sessions(), 1u);

  good.Push(RawClient::Entry(1, "t", b, 16));
  auto got = good.Await(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(ring::StatusOf(got[0]).ok());
  EXPECT_EQ(std::atomic_ref(bad.header()->agent_closed).load(), 1u);
}

TEST_F(ControlRingHostTest, ACorruptCompletionTailEndsTheSession) {
  runner_.CompleteOnStart(true);
  testing::ScopedShm buf(64);
  RawClient c({8, 8});
  const std::string s = Join("solo", 0, 1);
  ASSERT_TRUE(Attach(s, c).ok());
  const uint64_t b = Register(s, buf);
  std::future<void> ended = Ended(s);
  std::atomic_ref(c.header()->cq.tail).store(5);  // popped 5 of the 0 ever written
  c.Push(RawClient::Entry(1, "t", b, 16));
  ASSERT_EQ(ended.wait_for(kDeadline), std::future_status::ready);
  EXPECT_EQ(service_.num_sessions(), 0u);
}

TEST_F(ControlRingHostTest, TheRingStopsWhenItsSessionEnds) {
  RawClient c({8, 8});
  const std::string s = Join("solo", 0, 1);
  ASSERT_TRUE(Attach(s, c).ok());
  EXPECT_EQ(rings_.num_active(), 1u);
  service_.EndSession(s, "it left the job");
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (std::atomic_ref(c.header()->agent_closed).load() == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    ring::FutexWait(&c.header()->cq.doorbell, std::atomic_ref(c.header()->cq.doorbell).load(),
                    100ms);
  }
  EXPECT_EQ(std::atomic_ref(c.header()->agent_closed).load(), 1u);
}

TEST_F(ControlRingHostTest, AttachErrors) {
  RawClient c({8, 8});
  tributary::v1::AttachControlRingResponse resp;
  EXPECT_EQ(Attach("nobody", c).code(), absl::StatusCode::kNotFound);
  const std::string s = Join("solo", 0, 1);

  tributary::v1::AttachControlRingRequest missing;
  missing.set_session_id(s);
  missing.set_buffer_id(12345);  // never registered
  EXPECT_EQ(rings_.Attach(missing, &resp).code(), absl::StatusCode::kNotFound);

  c.header()->version = 9;
  absl::Status version = Attach(s, c);
  EXPECT_EQ(version.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(version.message(), HasSubstr("layout version 9 is not supported"));
  EXPECT_THAT(version.message(), HasSubstr(s));
  c.header()->version = ring::kVersion;

  ASSERT_TRUE(Attach(s, c).ok());
  EXPECT_EQ(Attach(s, c).code(), absl::StatusCode::kAlreadyExists);
  rings_.Shutdown();
  EXPECT_EQ(rings_.num_active(), 0u);
  EXPECT_EQ(Attach(s, c).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tributary::agent
