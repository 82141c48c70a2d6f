// Pipelined halving-doubling and recursive doubling: the engine's range-based step dependencies
// (kEarlierStepsCoveringRange, kThisAndEarlierStepsCoveringRange). Exact sums for every rank
// count, size, sub-chunking, dtype and reduction; bit-identical results that do not depend on
// timing (checked against a bulk-synchronous replay of the schedule on order-sensitive float32
// inputs); and, with a transport that holds chosen messages, proof that a step's sub-chunks leave
// while the previous step is still being received (and that the non-pipelined schedule never does
// so), and that no receive rewrites elements a send still borrowed by the transport reads.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dataplane/collectives/allreduce_halving_doubling.h"
#include "dataplane/collectives/allreduce_recursive_doubling.h"
#include "dataplane/collectives/collective_engine.h"
#include "dataplane/collectives/data_plane_node.h"
#include "dataplane/collectives/wire.h"
#include "dataplane/reduce/cpu/cpu_reducer.h"
#include "dataplane/transport/inprocess/inprocess_transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/cluster_harness.h"
#include "tests/util/typed_values.h"

namespace tributary::dataplane {
namespace {

using common::DataType;
using testing::Await;
using testing::GetValue;
using ::testing::HasSubstr;
using testing::PutValue;

using HdBuffers = std::vector<std::vector<std::byte>>;

testing::ClusterOptions Options(int n, uint64_t partition_bytes,
                                Algorithm algorithm = Algorithm::kHalvingDoubling) {
  testing::ClusterOptions o;
  o.workers = n;
  o.job_id = "job-hd";
  o.algorithm = algorithm;
  o.partition_bytes = partition_bytes;
  o.address_prefix = "rank-";
  return o;
}

Operation MakeOp(const std::string& name, uint64_t iteration, DataType t, uint64_t count,
                 Reduction reduction, std::vector<std::byte>& buffer) {
  Operation op;
  op.tensor_name = name;
  op.iteration = iteration;
  op.dtype = t;
  op.count = count;
  op.reduction = reduction;
  op.buffers = {buffer.data()};
  return op;
}

// Posts one all-reduce of bufs[r] on every rank r and waits for all of them.
absl::Status RunAll(testing::Cluster& cluster, const std::string& name, uint64_t iteration,
                    DataType t, uint64_t count, Reduction reduction, HdBuffers& bufs,
                    Algorithm algorithm = Algorithm::kHalvingDoubling) {
  std::vector<std::future<absl::Status>> futures;
  for (int r = 0; r < cluster.workers(); ++r) {
    futures.push_back(
        cluster.Post(r, algorithm, MakeOp(name, iteration, t, count, reduction, bufs[r])));
  }
  absl::Status result;
  for (int r = 0; r < cluster.workers(); ++r) {
    absl::Status s = Await(futures[r]);
    if (!s.ok() && result.ok())
      result = absl::Status(s.code(), absl::StrCat("rank ", r, ": ", s.message()));
  }
  return result;
}

// ---------------------------------------------------------------------------------------------
// The schedule

TEST(HalvingDoublingScheduleTest, PipelinedWaitsByRangeAndKeepsTheSameRanges) {
  for (int n = 2; n <= 9; ++n) {
    for (int r = 0; r < n; ++r) {
      const std::vector<ScheduleStep> piped = HalvingDoublingSchedule(1000, n, r);
      const std::vector<ScheduleStep> plain = HalvingDoublingSchedule(1000, n, r, false);
      ASSERT_EQ(piped.size(), plain.size());
      for (size_t s = 0; s < piped.size(); ++s) {
        const ScheduleStep& a = piped[s];
        const ScheduleStep& b = plain[s];
        EXPECT_EQ(a.send_peer, b.send_peer);
        EXPECT_EQ(a.send_offset, b.send_offset);
        EXPECT_EQ(a.send_count, b.send_count);
        EXPECT_EQ(a.recv_peer, b.recv_peer);
        EXPECT_EQ(a.recv_offset, b.recv_offset);
        EXPECT_EQ(a.recv_count, b.recv_count);
        EXPECT_EQ(a.action, b.action);
        EXPECT_FALSE(a.apply_early);
        EXPECT_EQ(a.apply_after, ScheduleStep::ApplyAfter::kEarlierStepsCoveringRange);
        EXPECT_EQ(b.apply_after, ScheduleStep::ApplyAfter::kAllPreviousSteps);
        // The fold's send reads the caller's input; every other send waits for its range.
        const bool fold_send = s == 0 && a.send_peer >= 0;
        EXPECT_EQ(a.send_after, fold_send ? ScheduleStep::SendAfter::kStart
                                          : ScheduleStep::SendAfter::kEarlierStepsCoveringRange)
            << "n " << n << " rank " << r << " step " << s;
        EXPECT_EQ(b.send_after, fold_send ? ScheduleStep::SendAfter::kStart
                                          : ScheduleStep::SendAfter::kAllPreviousSteps);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Exact sums

struct Case {
  int n;
  uint64_t partition_bytes;
};

class ExactTest : public ::testing::TestWithParam<Case> {};

// Every element of every rank, every dtype and reduction, counts from 1 to ~1 MiB; the partition
// sizes give one sub-chunk per step (64 MiB) or many (64 B: 16 float32 per message; 16 KiB).
TEST_P(ExactTest, SumAndAverageAreExactAndBitIdenticalOnEveryRank) {
  const auto [n, partition_bytes] = GetParam();
  testing::Cluster cluster(Options(n, partition_bytes));
  std::vector<uint64_t> counts = {1, 3, static_cast<uint64_t>(n - 1), 4097};
  // ~1 MiB of float32: many thousands of messages per rank with 64-byte partitions, so only with
  // the larger ones.
  if (partition_bytes >= (16 << 10)) counts.push_back((1 << 18) + 3);
  uint64_t iteration = 0;
  for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kInt32, DataType::kInt64}) {
    for (Reduction reduction : {Reduction::kSum, Reduction::kAverage}) {
      for (uint64_t count : counts) {
        if (count == 0) continue;
        const size_t es = common::DataTypeSize(t);
        HdBuffers bufs(n, std::vector<std::byte>(count * es));
        // Sum: (r + 1) + i % 7, exact in every dtype. Average: i % 5 + 2r, whose mean is
        // i % 5 + (n - 1).
        const auto value = [reduction](int r, uint64_t i) {
          return reduction == Reduction::kSum ? (r + 1) + static_cast<double>(i % 7)
                                              : static_cast<double>(i % 5) + 2 * r;
        };
        const auto expect = [reduction, n](uint64_t i) {
          return reduction == Reduction::kSum ? n * (n + 1) / 2.0 + n * static_cast<double>(i % 7)
                                              : static_cast<double>(i % 5) + (n - 1);
        };
        for (int r = 0; r < n; ++r) {
          for (uint64_t i = 0; i < count; ++i) PutValue(t, bufs[r].data(), i, value(r, i));
        }
        const std::string what = absl::StrCat(
            "n ", n, " partition ", partition_bytes, " ", std::string(common::DataTypeName(t)), " ",
            std::string(ReductionName(reduction)), " count ", count);
        ASSERT_TRUE(RunAll(cluster, "g", iteration++, t, count, reduction, bufs).ok()) << what;
        uint64_t wrong = 0;
        for (uint64_t i = 0; i < count; ++i) {
          if (GetValue(t, bufs[0].data(), i) != expect(i)) ++wrong;
        }
        EXPECT_EQ(wrong, 0u) << what;
        for (int r = 1; r < n; ++r) {
          EXPECT_EQ(std::memcmp(bufs[r].data(), bufs[0].data(), bufs[0].size()), 0)
              << what << ": rank " << r << " differs from rank 0";
        }
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(cluster.node(r).engine().stats().malformed_messages, 0u);
    EXPECT_EQ(cluster.node(r).engine().active_operations(), 0u);
  }
}

std::vector<Case> ExactCases() {
  std::vector<Case> cases;
  for (int n = 2; n <= 8; ++n) {
    for (uint64_t p : {uint64_t{64}, uint64_t{16} << 10, uint64_t{64} << 20})
      cases.push_back({n, p});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(RanksAndPartitions, ExactTest, ::testing::ValuesIn(ExactCases()),
                         [](const auto& info) {
                           return absl::StrCat("n", info.param.n, "_p", info.param.partition_bytes);
                         });

// ---------------------------------------------------------------------------------------------
// Determinism: the order of additions per element is the schedule's step order, whatever the
// timing and sub-chunking.

// The result of the schedule run step by step in lockstep (every rank's step s reads its peers'
// buffers as they were after step s - 1), in float32 arithmetic: the order of additions the
// engine must reproduce.
std::vector<std::vector<float>> ReplaySchedule(const std::vector<std::vector<float>>& inputs,
                                               bool recursive_doubling = false) {
  const int n = static_cast<int>(inputs.size());
  const uint64_t count = inputs[0].size();
  std::vector<std::vector<ScheduleStep>> schedules;
  for (int r = 0; r < n; ++r) {
    schedules.push_back(recursive_doubling ? RecursiveDoublingSchedule(count, n, r)
                                           : HalvingDoublingSchedule(count, n, r));
  }
  std::vector<std::vector<float>> bufs = inputs;
  for (size_t s = 0; s < schedules[0].size(); ++s) {
    const std::vector<std::vector<float>> before = bufs;
    for (int r = 0; r < n; ++r) {
      const ScheduleStep& step = schedules[r][s];
      if (step.recv_peer < 0) continue;
      for (uint64_t i = step.recv_offset; i < step.recv_offset + step.recv_count; ++i) {
        const float in = before[step.recv_peer][i];
        bufs[r][i] = step.action == ScheduleStep::Action::kReduce ? bufs[r][i] + in : in;
      }
    }
  }
  return bufs;
}

TEST(DeterminismTest, Float32BitsFollowTheScheduleOrderPipelinedOrNot) {
  const uint64_t count = 4097;
  for (int n : {3, 4, 5, 6, 7, 8}) {
    // Values of very different magnitudes: their float32 sum depends on the order of additions.
    std::mt19937 rng(1234 + n);
    std::uniform_real_distribution<float> mantissa(-1, 1);
    std::uniform_int_distribution<int> exponent(-24, 24);
    std::vector<std::vector<float>> inputs(n, std::vector<float>(count));
    for (auto& v : inputs) {
      for (float& x : v) x = std::ldexp(mantissa(rng), exponent(rng));
    }
    const std::vector<std::vector<float>> want = ReplaySchedule(inputs);
    // The inputs are order-sensitive: summing in rank order and in reverse rank order gives
    // different bits for many elements (else this test could not tell a wrong order from the
    // schedule's).
    uint64_t order_sensitive = 0;
    for (uint64_t i = 0; i < count; ++i) {
      float forward = 0;
      float backward = 0;
      for (int r = 0; r < n; ++r) forward += inputs[r][i];
      for (int r = n - 1; r >= 0; --r) backward += inputs[r][i];
      if (forward != backward) ++order_sensitive;
    }
    EXPECT_GT(order_sensitive, count / 10) << "n " << n;

    for (uint64_t partition_bytes : {uint64_t{16}, uint64_t{100}, uint64_t{64} << 20}) {
      for (bool pipelined : {true, false}) {
        testing::Cluster cluster(Options(n, partition_bytes));
        for (int r = 0; r < n; ++r) cluster.node(r).engine().SetHalvingDoublingPipelined(pipelined);
        HdBuffers bufs(n, std::vector<std::byte>(count * 4));
        for (int r = 0; r < n; ++r) std::memcpy(bufs[r].data(), inputs[r].data(), count * 4);
        ASSERT_TRUE(RunAll(cluster, "d", 0, DataType::kFloat32, count, Reduction::kSum, bufs).ok());
        for (int r = 0; r < n; ++r) {
          // Every rank holds the replay's result (the owner's sum, copied everywhere), bit for bit.
          EXPECT_EQ(std::memcmp(bufs[r].data(), want[0].data(), count * 4), 0)
              << "n " << n << " partition " << partition_bytes << " pipelined " << pipelined
              << " rank " << r;
          EXPECT_EQ(std::memcmp(want[r].data(), want[0].data(), count * 4), 0);
        }
      }
    }
  }
}

// Recursive doubling: every addition has two operands and the partners add the same two values
// (x + y here, y + x there), so every rank ends with the replay's bits whatever the sub-chunking.
TEST(DeterminismTest, RecursiveDoublingGivesEveryRankTheSameBits) {
  const uint64_t count = 2049;
  for (int n : {2, 3, 4, 5, 6, 7, 8}) {
    std::mt19937 rng(99 + n);
    std::uniform_real_distribution<float> mantissa(-1, 1);
    std::uniform_int_distribution<int> exponent(-24, 24);
    std::vector<std::vector<float>> inputs(n, std::vector<float>(count));
    for (auto& v : inputs) {
      for (float& x : v) x = std::ldexp(mantissa(rng), exponent(rng));
    }
    const std::vector<std::vector<float>> want = ReplaySchedule(inputs, true);
    for (int r = 1; r < n; ++r) {
      ASSERT_EQ(std::memcmp(want[r].data(), want[0].data(), count * 4), 0) << "n " << n;
    }
    for (uint64_t partition_bytes : {uint64_t{16}, uint64_t{100}, uint64_t{64} << 20}) {
      testing::Cluster cluster(Options(n, partition_bytes, Algorithm::kRecursiveDoubling));
      HdBuffers bufs(n, std::vector<std::byte>(count * 4));
      for (int r = 0; r < n; ++r) std::memcpy(bufs[r].data(), inputs[r].data(), count * 4);
      ASSERT_TRUE(RunAll(cluster, "d", 0, DataType::kFloat32, count, Reduction::kSum, bufs,
                         Algorithm::kRecursiveDoubling)
                      .ok());
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(std::memcmp(bufs[r].data(), want[0].data(), count * 4), 0)
            << "n " << n << " partition " << partition_bytes << " rank " << r;
      }
    }
  }
}

TEST(DeterminismTest, RanksWithDifferentSettingsInteroperate) {
  // Same messages, same order of additions: a mixed job still agrees bit for bit.
  const int n = 6;
  const uint64_t count = 999;
  testing::Cluster cluster(Options(n, 32));
  for (int r = 0; r < n; r += 2) cluster.node(r).engine().SetHalvingDoublingPipelined(false);
  HdBuffers bufs(n, std::vector<std::byte>(count * 8));
  for (int r = 0; r < n; ++r) {
    for (uint64_t i = 0; i < count; ++i)
      PutValue(DataType::kInt64, bufs[r].data(), i, r * 1000 + i);
  }
  ASSERT_TRUE(RunAll(cluster, "m", 0, DataType::kInt64, count, Reduction::kSum, bufs).ok());
  for (int r = 0; r < n; ++r) {
    for (uint64_t i = 0; i < count; ++i) {
      ASSERT_EQ(GetValue(DataType::kInt64, bufs[r].data(), i), 15000.0 + n * static_cast<double>(i))
          << "rank " << r << " element " << i;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Pipelining, observed

// What every node of a MonitoredCluster sends and receives. Messages for which `hold` says so are
// kept instead of delivered, until Release; the completions of sends for which `hold_done` says
// so (from: the sender) are kept until ReleaseCompletions (the transport still borrows their
// payload meanwhile). Counts what is in flight so that a test can wait for the moment nothing
// more can happen (Quiescent) instead of sleeping.
class Monitor {
 public:
  // to: the receiving node's address.
  using HoldFn = std::function<bool(const std::string& to, const WireHeader& h)>;

  explicit Monitor(HoldFn hold, HoldFn hold_done = nullptr)
      : hold_(std::move(hold)), hold_done_(std::move(hold_done)) {}

  void OnSend(const std::string& from, std::span<const std::byte> header, size_t payload) {
    absl::StatusOr<WireHeader> h = ParseHeader(header, payload);
    std::lock_guard lock(mu_);
    sent_++;
    if (h.ok() && h->kind == static_cast<uint8_t>(MessageKind::kData)) {
      sends_by_step_[{from, h->step}]++;
    }
  }
  void OnSendDone() { Bump(completed_); }
  bool ShouldHoldDone(const std::string& from, std::span<const std::byte> header, size_t payload) {
    absl::StatusOr<WireHeader> h = ParseHeader(header, payload);
    std::lock_guard lock(mu_);
    return h.ok() && hold_done_ && hold_done_(from, *h);
  }
  // `payload` is what the held send reads, `sent` a copy of it when it was sent: until the
  // completion the engine must not rewrite it (counted by borrowed_rewritten at release).
  void HoldDone(std::function<void()> complete, std::span<const std::byte> payload,
                std::vector<std::byte> sent) {
    std::lock_guard lock(mu_);
    held_done_.push_back({std::move(complete), payload, std::move(sent)});
    cv_.notify_all();
  }
  void ReleaseCompletions() {
    std::vector<HeldCompletion> held;
    {
      std::lock_guard lock(mu_);
      held.swap(held_done_);
      hold_done_ = nullptr;
    }
    for (auto& h : held) {
      if (!std::equal(h.payload.begin(), h.payload.end(), h.sent.begin(), h.sent.end())) {
        std::lock_guard lock(mu_);
        borrowed_rewritten_++;
      }
      h.complete();
    }
  }
  // Held sends whose payload had changed by the time they were released.
  uint64_t borrowed_rewritten() {
    std::lock_guard lock(mu_);
    return borrowed_rewritten_;
  }
  size_t held_completions() {
    std::lock_guard lock(mu_);
    return held_done_.size();
  }
  void OnHandled() { Bump(handled_); }
  // Keeps the message if `hold` says so: then `deliver` runs at Release; else returns false.
  bool MaybeHold(const std::string& to, std::span<const std::byte> header, size_t payload,
                 const std::function<std::function<void()>()>& deliver) {
    absl::StatusOr<WireHeader> h = ParseHeader(header, payload);
    std::lock_guard lock(mu_);
    if (!h.ok() || !hold_(to, *h)) return false;
    held_.push_back({*h, deliver()});
    cv_.notify_all();
    return true;
  }

  // Waits until every message sent is handled or held and every send completed: from then on
  // nothing happens until something is released. False after the deadline.
  bool WaitQuiescent(std::chrono::seconds deadline = std::chrono::seconds(20)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, deadline, [this] {
      return sent_ == handled_ + held_.size() && sent_ == completed_ + held_done_.size();
    });
  }
  // Data messages `from` sent in `step` so far.
  uint64_t SendsInStep(const std::string& from, uint32_t step) {
    std::lock_guard lock(mu_);
    auto it = sends_by_step_.find({from, step});
    return it == sends_by_step_.end() ? 0 : it->second;
  }
  size_t held() {
    std::lock_guard lock(mu_);
    return held_.size();
  }
  // Delivers what is held (on this thread; the nodes are thread-safe) and holds nothing more:
  // first, twice each, the messages `twice` selects, then the others in the order they came.
  void Release(const std::function<bool(const WireHeader&)>& twice = nullptr) {
    std::vector<std::pair<WireHeader, std::function<void()>>> held;
    {
      std::lock_guard lock(mu_);
      held.swap(held_);
      hold_ = [](const std::string&, const WireHeader&) { return false; };
    }
    if (twice) {
      for (auto& [h, deliver] : held) {
        if (!twice(h)) continue;
        deliver();
        deliver();
      }
    }
    for (auto& [h, deliver] : held) {
      if (!twice || !twice(h)) deliver();
    }
  }

 private:
  void Bump(uint64_t& counter) {
    std::lock_guard lock(mu_);
    counter++;
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  HoldFn hold_;
  HoldFn hold_done_;
  struct HeldCompletion {
    std::function<void()> complete;
    std::span<const std::byte> payload;
    std::vector<std::byte> sent;
  };
  std::vector<HeldCompletion> held_done_;
  uint64_t borrowed_rewritten_ = 0;
  uint64_t sent_ = 0;
  uint64_t handled_ = 0;
  uint64_t completed_ = 0;
  std::vector<std::pair<WireHeader, std::function<void()>>> held_;
  std::map<std::pair<std::string, uint32_t>, uint64_t> sends_by_step_;
};

// An in-process endpoint that reports to a Monitor.
class MonitoredTransport final : public Transport {
 public:
  MonitoredTransport(std::unique_ptr<Transport> inner, Monitor* monitor)
      : inner_(std::move(inner)), monitor_(monitor) {}

  std::string Address() const override { return inner_->Address(); }
  void SetReceiveHandler(ReceiveHandler handler) override {
    handler_ = std::move(handler);
    inner_->SetReceiveHandler(
        [this](std::span<const std::byte> header, std::span<const std::byte> payload) {
          const bool held = monitor_->MaybeHold(Address(), header, payload.size(), [&] {
            return [this, h = std::vector<std::byte>(header.begin(), header.end()),
                    p = std::vector<std::byte>(payload.begin(), payload.end())] {
              handler_(h, p);
              monitor_->OnHandled();
            };
          });
          if (held) return;
          handler_(header, payload);
          monitor_->OnHandled();
        });
  }
  void Send(const std::string& peer, std::span<const std::byte> header,
            std::span<const std::byte> payload, SendCallback done) override {
    monitor_->OnSend(Address(), header, payload.size());
    const bool hold_done = monitor_->ShouldHoldDone(Address(), header, payload.size());
    std::vector<std::byte> sent;
    if (hold_done) sent.assign(payload.begin(), payload.end());
    inner_->Send(peer, header, payload,
                 [this, hold_done, payload, sent = std::move(sent),
                  done = std::move(done)](absl::Status s) mutable {
                   auto complete = [this, done = std::move(done), s = std::move(s)]() mutable {
                     done(std::move(s));
                     monitor_->OnSendDone();
                   };
                   if (hold_done) {
                     monitor_->HoldDone(std::move(complete), payload, std::move(sent));
                   } else {
                     complete();
                   }
                 });
  }
  void Shutdown() override { inner_->Shutdown(); }

 private:
  std::unique_ptr<Transport> inner_;
  Monitor* monitor_;
  ReceiveHandler handler_;
};

// n halving-doubling (or `algorithm`) ranks over monitored in-process endpoints.
class MonitoredCluster {
 public:
  MonitoredCluster(int n, uint64_t partition_bytes, bool pipelined, Monitor* monitor,
                   Algorithm algorithm = Algorithm::kHalvingDoubling)
      : reducer_(1), algorithm_(algorithm) {
    JobView view;
    view.job_id = "job-m";
    view.plan_version = 1;
    view.partition_bytes = partition_bytes;
    for (int i = 0; i < n; ++i) view.worker_addresses.push_back(absl::StrCat("rank-", i));
    view.server_addresses = view.worker_addresses;
    for (int i = 0; i < n; ++i) view.server_weights.push_back((uint64_t{1} << 32) / n);
    view.server_weights[0] += (uint64_t{1} << 32) % n;
    for (int i = 0; i < n; ++i) {
      transports_.push_back(std::make_unique<MonitoredTransport>(
          network_.CreateEndpoint(view.worker_addresses[i]), monitor));
      nodes_.push_back(
          std::make_unique<DataPlaneNode>(transports_.back().get(), &reducer_, &clock_));
      nodes_.back()->engine().SetHalvingDoublingPipelined(pipelined);
      view.my_worker_rank = i;
      view.my_server_index = i;
      nodes_.back()->SetJob(view, algorithm);
    }
  }
  ~MonitoredCluster() {
    for (auto& t : transports_) t->Shutdown();
  }

  DataPlaneNode& node(int i) { return *nodes_[i]; }
  common::FakeClock& clock() { return clock_; }
  std::future<absl::Status> Post(int rank, Operation op) {
    auto promise = std::make_shared<std::promise<absl::Status>>();
    auto future = promise->get_future();
    op.done = [promise](absl::Status s) { promise->set_value(std::move(s)); };
    absl::Status s = nodes_[rank]->engine().Post("job-m", algorithm_, std::move(op));
    if (!s.ok()) promise->set_value(s);
    return future;
  }

 private:
  common::FakeClock clock_;
  CpuReducer reducer_;
  Algorithm algorithm_;
  InProcessNetwork network_;
  std::vector<std::unique_ptr<MonitoredTransport>> transports_;
  std::vector<std::unique_ptr<DataPlaneNode>> nodes_;
};

// For every step s and a rank r that receives in s and sends in s + 1: hold back only the last
// sub-chunk of r's step-s receive, let everything else run until nothing more can happen, and
// count r's step-(s+1) sends. Pipelined, some have left (they read elements that step s's held
// sub-chunk does not write); not pipelined, none has (the step waits for all of step s). Then
// the held message is released and the result must be exact.
void CheckOverlap(bool pipelined) {
  const uint64_t count = 512;  // int32, 4 per message: every step has >= 16 sub-chunks
  const uint64_t partition_bytes = 16;
  const uint64_t chunk_elems = partition_bytes / 4;
  int cases = 0;
  for (int n : {2, 3, 4, 5, 6, 8}) {
    const size_t num_steps = HalvingDoublingSchedule(count, n, 0).size();
    for (size_t s = 0; s + 1 < num_steps; ++s) {
      int rank = -1;
      uint64_t recv_chunks = 0;
      for (int r = 0; r < n && rank < 0; ++r) {
        const std::vector<ScheduleStep> steps = HalvingDoublingSchedule(count, n, r);
        if (steps[s].recv_peer >= 0 && steps[s + 1].send_peer >= 0) {
          rank = r;
          recv_chunks = (steps[s].recv_count + chunk_elems - 1) / chunk_elems;
        }
      }
      if (rank < 0) continue;
      ASSERT_GE(recv_chunks, 4u);
      const std::string addr = absl::StrCat("rank-", rank);
      const std::string what =
          absl::StrCat("n ", n, " rank ", rank, " step ", s, " pipelined ", pipelined);
      Monitor monitor([&](const std::string& to, const WireHeader& h) {
        return to == addr && h.kind == static_cast<uint8_t>(MessageKind::kData) && h.step == s &&
               h.chunk == recv_chunks - 1;
      });
      MonitoredCluster cluster(n, partition_bytes, pipelined, &monitor);
      HdBuffers bufs(n, std::vector<std::byte>(count * 4));
      for (int r = 0; r < n; ++r) {
        for (uint64_t i = 0; i < count; ++i) PutValue(DataType::kInt32, bufs[r].data(), i, r + i);
      }
      std::vector<std::future<absl::Status>> futures;
      for (int r = 0; r < n; ++r) {
        futures.push_back(
            cluster.Post(r, MakeOp("o", 0, DataType::kInt32, count, Reduction::kSum, bufs[r])));
      }
      ASSERT_TRUE(monitor.WaitQuiescent()) << what;
      ASSERT_EQ(monitor.held(), 1u) << what;
      const uint64_t early_sends = monitor.SendsInStep(addr, static_cast<uint32_t>(s + 1));
      if (pipelined) {
        EXPECT_GT(early_sends, 0u) << what << ": no step " << s + 1 << " sub-chunk left while step "
                                   << s << " was incomplete";
      } else {
        EXPECT_EQ(early_sends, 0u) << what;
      }
      // The rank whose receive is held cannot have finished (others may have).
      ASSERT_EQ(futures[rank].wait_for(std::chrono::seconds(0)), std::future_status::timeout)
          << what << ": " << futures[rank].get();
      monitor.Release();
      for (auto& f : futures) ASSERT_TRUE(Await(f).ok()) << what;
      for (int r = 0; r < n; ++r) {
        for (uint64_t i = 0; i < count; ++i) {
          ASSERT_EQ(GetValue(DataType::kInt32, bufs[r].data(), i),
                    n * (n - 1) / 2.0 + n * static_cast<double>(i))
              << what << " rank " << r << " element " << i;
        }
      }
      ++cases;
    }
  }
  EXPECT_GE(cases, 20);  // every reduce-scatter, all-gather and fold step of six world sizes
}

TEST(PipeliningTest, NextStepSubChunksLeaveBeforeTheStepIsFullyReceived) { CheckOverlap(true); }

TEST(PipeliningTest, NonPipelinedStepsWaitForTheWholePreviousStep) { CheckOverlap(false); }

// Recursive doubling sends the range it receives into in the same step: a received sub-chunk may
// be added only once the transport is done with this rank's own send of those elements. Rank 0's
// send completions are held: nothing may be added into its buffer meanwhile (every element is in
// one of its held sends), every held payload is intact at release, and then the sums are exact.
// (With ApplyAfter::kEarlierStepsCoveringRange, which ignores the step's own sends, rank 0 adds
// its partner's sub-chunks at once and this test fails.)
TEST(PipeliningTest, RecursiveDoublingAddsOnlyWhatItsOwnSendNoLongerReads) {
  for (int n : {2, 3, 4, 8}) {
    const uint64_t count = 64;  // int32, 4 per message
    Monitor monitor([](const std::string&, const WireHeader&) { return false; },
                    [](const std::string& from, const WireHeader& h) {
                      return from == "rank-0" && h.kind == static_cast<uint8_t>(MessageKind::kData);
                    });
    MonitoredCluster cluster(n, 16, true, &monitor, Algorithm::kRecursiveDoubling);
    HdBuffers bufs(n, std::vector<std::byte>(count * 4));
    for (int r = 0; r < n; ++r) {
      for (uint64_t i = 0; i < count; ++i) PutValue(DataType::kInt32, bufs[r].data(), i, r + i);
    }
    const HdBuffers inputs = bufs;
    std::vector<std::future<absl::Status>> futures;
    for (int r = 0; r < n; ++r) {
      futures.push_back(
          cluster.Post(r, MakeOp("rd", 0, DataType::kInt32, count, Reduction::kSum, bufs[r])));
    }
    ASSERT_TRUE(monitor.WaitQuiescent()) << "n " << n;
    EXPECT_EQ(monitor.held_completions(), count / 4) << "n " << n;  // its first exchange, whole
    EXPECT_EQ(std::memcmp(bufs[0].data(), inputs[0].data(), count * 4), 0)
        << "n " << n << ": rank 0's buffer changed while its sends were borrowed";
    ASSERT_EQ(futures[0].wait_for(std::chrono::seconds(0)), std::future_status::timeout);
    monitor.ReleaseCompletions();  // and holds no more
    EXPECT_EQ(monitor.borrowed_rewritten(), 0u) << "n " << n;
    for (auto& f : futures) ASSERT_TRUE(Await(f).ok()) << "n " << n;
    for (int r = 0; r < n; ++r) {
      for (uint64_t i = 0; i < count; ++i) {
        ASSERT_EQ(GetValue(DataType::kInt32, bufs[r].data(), i),
                  n * (n - 1) / 2.0 + n * static_cast<double>(i))
            << "n " << n << " rank " << r << " element " << i;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Failures of the pipelined schedule

TEST(PipelinedFailureTest, MissingRankTurnsIntoDeadlineExceededOnEveryRank) {
  const int n = 5;                                     // with a fold
  HdBuffers bufs(n, std::vector<std::byte>(100 * 4));  // outlives the cluster
  testing::Cluster cluster(Options(n, 16));
  std::vector<std::future<absl::Status>> futures;
  for (int r = 0; r < n - 1; ++r) {  // rank 4 never starts
    futures.push_back(
        cluster.Post(r, Algorithm::kHalvingDoubling,
                     MakeOp("g", 0, DataType::kFloat32, 100, Reduction::kSum, bufs[r])));
  }
  cluster.clock().Advance(cluster.view().op_timeout + std::chrono::milliseconds(1));
  for (int r = 0; r < n - 1; ++r) {
    cluster.node(r).engine().ExpireStale();
    absl::Status s = Await(futures[r]);
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << "rank " << r << s;
    EXPECT_THAT(s.message(), HasSubstr("timed out"));
    EXPECT_THAT(s.message(), HasSubstr("waiting for rank"));
  }
}

// The caller may free an operation's buffer once told it failed, so a failure waits for the sends
// the transport still holds (they read the buffer): here rank 0's sends never complete until
// released, and its deadline passes with rank 1 absent. Until kFailedSendGrace: then it is
// completed anyway (every wait has a deadline).
TEST(PipelinedFailureTest, AFailureIsReportedOnlyOnceTheTransportIsDoneWithTheBuffer) {
  for (const bool past_grace : {false, true}) {
    std::vector<std::byte> buffer(64 * 4);  // outlives the cluster
    Monitor monitor([](const std::string&, const WireHeader&) { return false; },
                    [](const std::string& from, const WireHeader& h) {
                      return from == "rank-0" && h.kind == static_cast<uint8_t>(MessageKind::kData);
                    });
    MonitoredCluster cluster(2, 16, /*pipelined=*/true, &monitor);
    std::future<absl::Status> failed =
        cluster.Post(0, MakeOp("g", 0, DataType::kInt32, 64, Reduction::kSum, buffer));
    ASSERT_TRUE(monitor.WaitQuiescent());
    cluster.clock().Advance(JobView{}.op_timeout + std::chrono::milliseconds(1));
    cluster.node(0).engine().ExpireStale();
    EXPECT_EQ(failed.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout)
        << "completed while the transport still reads the buffer";
    if (past_grace) {
      cluster.clock().Advance(CollectiveEngine::kFailedSendGrace);
      cluster.node(0).engine().ExpireStale();
    } else {
      monitor.ReleaseCompletions();
    }
    ASSERT_EQ(failed.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    absl::Status s = failed.get();
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(s.message(), HasSubstr("waiting for rank 1")) << s;
    monitor.ReleaseCompletions();  // what is still held (past the grace)
    EXPECT_TRUE(monitor.WaitQuiescent());
  }
}

TEST(PipelinedFailureTest, DuplicateOfADeferredSubChunkIsDroppedNotAppliedTwice) {
  // n = 4, 64 int32, 4 per message: rank 0 reduces [0, 32) in step 1 and [0, 16) in step 2. With
  // its step-1 receives held, its step-2 sub-chunks wait (deferred); a second copy of each
  // arrives meanwhile and must be dropped as a duplicate, not summed twice.
  const int n = 4;
  const auto to_rank0 = [](const std::string& to, const WireHeader& h) {
    return to == "rank-0" && h.kind == static_cast<uint8_t>(MessageKind::kData) &&
           (h.step == 1 || h.step == 2);
  };
  Monitor monitor(to_rank0);
  MonitoredCluster cluster(n, 16, true, &monitor);
  const uint64_t count = 64;
  HdBuffers bufs(n, std::vector<std::byte>(count * 4));
  for (int r = 0; r < n; ++r) {
    for (uint64_t i = 0; i < count; ++i) PutValue(DataType::kInt32, bufs[r].data(), i, r + 1);
  }
  std::vector<std::future<absl::Status>> futures;
  for (int r = 0; r < n; ++r) {
    futures.push_back(
        cluster.Post(r, MakeOp("dup", 0, DataType::kInt32, count, Reduction::kSum, bufs[r])));
  }
  ASSERT_TRUE(monitor.WaitQuiescent());
  ASSERT_EQ(monitor.held(), 8u + 4u);  // step 1: [0, 32); step 2: [0, 16)
  monitor.Release([](const WireHeader& h) { return h.step == 2; });
  for (auto& f : futures) ASSERT_TRUE(Await(f).ok());
  EXPECT_EQ(cluster.node(0).engine().stats().malformed_messages, 4u);
  for (int r = 0; r < n; ++r) {
    for (uint64_t i = 0; i < count; ++i) {
      ASSERT_EQ(GetValue(DataType::kInt32, bufs[r].data(), i), 10) << "rank " << r << " " << i;
    }
  }
}

TEST(PipelinedFailureTest, ARangeIsNotRewrittenWhileTheTransportStillBorrowsIt) {
  // n = 3: rank 0 folds its whole buffer into rank 1 (step 0) and gets the result back (step 3).
  // While the transport has not completed rank 0's fold sends, their payload is still borrowed:
  // the result must wait (deferred), not overwrite it; once the sends complete it is applied.
  const int n = 3;
  Monitor monitor([](const std::string&, const WireHeader&) { return false; },
                  [](const std::string& from, const WireHeader& h) {
                    return from == "rank-0" && h.kind == static_cast<uint8_t>(MessageKind::kData) &&
                           h.step == 0;
                  });
  MonitoredCluster cluster(n, 16, true, &monitor);
  const uint64_t count = 40;
  HdBuffers bufs(n, std::vector<std::byte>(count * 4));
  for (int r = 0; r < n; ++r) {
    for (uint64_t i = 0; i < count; ++i) PutValue(DataType::kInt32, bufs[r].data(), i, r + 1);
  }
  std::vector<std::future<absl::Status>> futures;
  for (int r = 0; r < n; ++r) {
    futures.push_back(
        cluster.Post(r, MakeOp("borrow", 0, DataType::kInt32, count, Reduction::kSum, bufs[r])));
  }
  ASSERT_TRUE(monitor.WaitQuiescent());
  // Rank 1 and 2 are done; rank 0 holds the result, deferred, its own input untouched.
  ASSERT_TRUE(Await(futures[1]).ok());
  ASSERT_TRUE(Await(futures[2]).ok());
  EXPECT_EQ(futures[0].wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  EXPECT_GT(monitor.SendsInStep("rank-1", 3), 0u);
  for (uint64_t i = 0; i < count; ++i) {
    ASSERT_EQ(GetValue(DataType::kInt32, bufs[0].data(), i), 1) << "element " << i;
  }
  monitor.ReleaseCompletions();
  ASSERT_TRUE(Await(futures[0]).ok());
  for (int r = 0; r < n; ++r) {
    for (uint64_t i = 0; i < count; ++i)
      ASSERT_EQ(GetValue(DataType::kInt32, bufs[r].data(), i), 6);
  }
}

}  // namespace
}  // namespace tributary::dataplane
