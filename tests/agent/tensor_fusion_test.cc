// Tensor fusion (agent/tensor_fusion.h): the leader's grouping, the plan's encoding, and N real
// data planes (TCP on loopback) behind FusingRunner: exact results per tensor, the same groups on
// every node, no fusion of tensors a process waits for one by one, and every failure of a fused
// group an error to every node, never a hang.
#include "agent/tensor_fusion.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/data_plane_runner.h"
#include "agent/fake_collective_runner.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/metrics/metrics.h"
#include "common/trace.h"
#include "dataplane/schedule/chunk_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "prometheus/registry.h"

namespace tributary::agent {
namespace {

using common::DataType;
using dataplane::Reduction;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using namespace std::chrono_literals;

uint64_t H(const std::string& name) { return common::StableHash64(name); }

// One observed all-reduce of `count` float32, started at `at_us`, as the seq-th event.
ObservedOp Seen(const std::string& name, uint64_t count, int at_us, uint64_t start_seq,
                std::optional<uint64_t> done_seq = std::nullopt,
                Reduction reduction = Reduction::kSum, DataType dtype = DataType::kFloat32) {
  ObservedOp o;
  o.name_hash = H(name);
  o.count = count;
  o.dtype = dtype;
  o.reduction = reduction;
  o.started = common::Clock::TimePoint(std::chrono::microseconds(at_us));
  o.start_seq = start_seq;
  o.done_seq = done_seq;
  return o;
}

std::vector<uint64_t> Members(const FusionGroup& g) {
  std::vector<uint64_t> out;
  for (const FusionMember& m : g.members) out.push_back(m.name_hash);
  return out;
}

TEST(PlanFusionGroupsTest, CutsConsecutiveSmallTensorsBySizeDtypeAndReduction) {
  std::vector<ObservedOp> seen = {
      Seen("a", 100, 0, 1),
      Seen("b", 100, 1, 2),
      Seen("big", 1 << 20, 2, 3),  // too large: not fused, does not break the group
      Seen("c", 100, 3, 4),
      Seen("d", 200, 4, 5),  // 400 + 400 + 400 + 800 > 1600: d starts anew
      Seen("e", 100, 5, 6),
      Seen("f", 10, 6, 7, std::nullopt, Reduction::kAverage),
      Seen("g", 10, 7, 8, std::nullopt, Reduction::kAverage),
      Seen("h", 10, 8, 9, std::nullopt, Reduction::kAverage, DataType::kFloat64),
  };
  const std::vector<FusionGroup> groups = PlanFusionGroups(seen, 1600, 1000us);
  ASSERT_THAT(groups, SizeIs(3));
  EXPECT_THAT(Members(groups[0]), ElementsAre(H("a"), H("b"), H("c")));
  EXPECT_THAT(Members(groups[1]), ElementsAre(H("d"), H("e")));
  EXPECT_THAT(Members(groups[2]), ElementsAre(H("f"), H("g")));  // h: another dtype, alone
  EXPECT_EQ(groups[2].reduction, Reduction::kAverage);
  EXPECT_EQ(groups[0].members[0].count, 100u);
}

TEST(PlanFusionGroupsTest, AGroupSpansAtMostOneCycleFromItsFirstTensor) {
  std::vector<ObservedOp> seen = {Seen("a", 1, 0, 1), Seen("b", 1, 400, 2), Seen("c", 1, 900, 3),
                                  Seen("d", 1, 1100, 4), Seen("e", 1, 1500, 5)};
  const std::vector<FusionGroup> groups = PlanFusionGroups(seen, 1 << 20, 1000us);
  ASSERT_THAT(groups, SizeIs(2));
  EXPECT_THAT(Members(groups[0]), ElementsAre(H("a"), H("b"), H("c")));
  EXPECT_THAT(Members(groups[1]), ElementsAre(H("d"), H("e")));
}

TEST(PlanFusionGroupsTest, NeverFusesATensorWithOneSubmittedAfterItCompleted) {
  // a completes (event 3) before c starts (event 4): a process that waits for a before it
  // submits c would never get a's result if they were fused.
  std::vector<ObservedOp> seen = {Seen("a", 1, 0, 1, 3), Seen("b", 1, 1, 2, 6),
                                  Seen("c", 1, 2, 4, 7), Seen("d", 1, 3, 5)};
  const std::vector<FusionGroup> groups = PlanFusionGroups(seen, 1 << 20, 1000us);
  ASSERT_THAT(groups, SizeIs(2));
  EXPECT_THAT(Members(groups[0]), ElementsAre(H("a"), H("b")));  // b started before a completed
  EXPECT_THAT(Members(groups[1]), ElementsAre(H("c"), H("d")));
}

TEST(PlanFusionGroupsTest, LeavesOutIneligibleAndRepeatedTensorsAndSingletons) {
  ObservedOp staged = Seen("s", 1, 1, 2);
  staged.eligible = false;
  std::vector<ObservedOp> seen = {Seen("a", 1, 0, 1), staged, Seen("twice", 1, 2, 3),
                                  Seen("twice", 1, 3, 4),
                                  Seen("bcast", 1, 4, 5, std::nullopt, Reduction::kBroadcast)};
  EXPECT_THAT(PlanFusionGroups(seen, 1 << 20, 1000us), IsEmpty());  // a alone
}

TEST(PlanFusionGroupsTest, TheAutomaticCycleIsTheMedianTimeWithinItsBounds) {
  // Median 2 ms: b (1.5 ms after a) joins, c (2.5 ms) does not.
  std::vector<ObservedOp> seen = {Seen("a", 1, 0, 1, 10), Seen("b", 1, 1500, 2, 11),
                                  Seen("c", 1, 2500, 3, 12), Seen("d", 1, 2600, 4, 13)};
  seen[0].seconds = 0.001;
  seen[1].seconds = 0.002;
  seen[2].seconds = 0.003;
  std::vector<FusionGroup> groups = PlanFusionGroups(seen, 1 << 20, 0us);
  ASSERT_THAT(groups, SizeIs(2));
  EXPECT_THAT(Members(groups[0]), ElementsAre(H("a"), H("b")));
  // Nothing completed: kMinFusionCycle (100 us).
  for (ObservedOp& o : seen) o.seconds.reset();
  groups = PlanFusionGroups(seen, 1 << 20, 0us);
  ASSERT_THAT(groups, SizeIs(1));
  EXPECT_THAT(Members(groups[0]), ElementsAre(H("c"), H("d")));
}

TEST(FusionPlanCodingTest, RoundTripsAndRejectsMalformedPlans) {
  std::vector<FusionGroup> groups(2);
  groups[0].members = {{H("a"), 3}, {H("b"), 5}};
  groups[1].dtype = DataType::kBFloat16;
  groups[1].reduction = Reduction::kAverage;
  groups[1].members = {{H("c"), 1}, {H("d"), 2}, {H("e"), 9}};
  std::vector<int64_t> words = EncodeFusionPlan(groups);
  ASSERT_EQ(words.size(), kFusionPlanWords);
  absl::StatusOr<std::vector<FusionGroup>> back = DecodeFusionPlan(words);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, groups);

  const auto broken = [&](size_t word, int64_t value) {
    std::vector<int64_t> w = words;
    w[word] = value;
    return DecodeFusionPlan(w).status();
  };
  EXPECT_THAT(broken(0, 7).message(), HasSubstr("magic"));
  EXPECT_THAT(broken(1, 2).message(), HasSubstr("version"));
  EXPECT_THAT(broken(3, 99).message(), HasSubstr("dtype"));
  EXPECT_THAT(broken(4, static_cast<int64_t>(Reduction::kBroadcast)).message(),
              HasSubstr("sum or average"));
  EXPECT_THAT(broken(5, 1).message(), HasSubstr("members"));
  EXPECT_THAT(broken(7, 0).message(), HasSubstr("elements"));
  EXPECT_THAT(broken(8, static_cast<int64_t>(H("a"))).message(), HasSubstr("twice"));
  EXPECT_THAT(broken(2, 1000).message(), HasSubstr("group 2 has unknown dtype 0"));
  EXPECT_EQ(broken(0, 7).code(), absl::StatusCode::kInvalidArgument);

  // Groups that do not fit are left out, never cut.
  std::vector<FusionGroup> many(1);
  for (uint64_t m = 0; m < kFusionPlanWords; ++m) many[0].members.push_back({m + 1, 1});
  back = DecodeFusionPlan(EncodeFusionPlan(many));
  ASSERT_TRUE(back.ok());
  EXPECT_THAT(*back, IsEmpty());
}

// One decision broadcast carries consecutive decisions packed one after another, ended by a
// first word 0 or the broadcast's end; the first may follow a gap (a failed broadcast's
// decisions).
TEST(FusionPlanCodingTest, DecisionBroadcastsCarryConsecutiveDecisions) {
  const std::vector<uint64_t> list = {H("a"), H("b"), H("c")};
  std::vector<FusionDecision> decisions(3);
  for (uint64_t i = 0; i < decisions.size(); ++i) {
    decisions[i].index = 7 + i;
    decisions[i].members = {{H("a"), i}, {H("b"), i}};
  }
  decisions[1].members.push_back({H("c"), 1});
  decisions[2].reduction = Reduction::kAverage;
  decisions[2].lone = true;
  const auto encode = [&](const std::vector<FusionDecision>& ds) {
    std::vector<int64_t> words;
    for (const FusionDecision& d : ds) {
      absl::StatusOr<std::vector<int64_t>> one = EncodeFusionDecision(d, list);
      EXPECT_TRUE(one.ok()) << one.status();
      EXPECT_EQ(one->size(), FusionDecisionWords(1, list.size()));  // 7 words
      words.insert(words.end(), one->begin(), one->end());
    }
    words.resize(FusionDecisionBroadcastWords(list.size()), 0);
    return words;
  };
  DecodedFusionDecisions back = DecodeFusionDecisions(encode(decisions), 7, list);
  ASSERT_TRUE(back.error.ok()) << back.error;
  EXPECT_EQ(back.decisions, decisions);
  back = DecodeFusionDecisions(encode(decisions), 5, list);  // 5 and 6 went with a failure
  ASSERT_TRUE(back.error.ok()) << back.error;
  EXPECT_EQ(back.decisions.front().index, 7u);

  back = DecodeFusionDecisions(encode(decisions), 8, list);
  EXPECT_THAT(back.error.message(), HasSubstr("decision 7 where 8 or later was expected"));
  EXPECT_THAT(back.decisions, IsEmpty());
  std::vector<FusionDecision> gap = decisions;
  gap[1].index = 9;
  back = DecodeFusionDecisions(encode(gap), 7, list);
  EXPECT_THAT(back.error.message(), HasSubstr("decision 9 where 8 was expected"));
  EXPECT_THAT(back.decisions, SizeIs(1));  // the one before the problem
  EXPECT_THAT(DecodeFusionDecisions(encode({}), 0, list).error.message(), HasSubstr("none"));
  std::vector<int64_t> bad = encode(decisions);
  const size_t second = FusionDecisionWords(1, list.size());
  bad[second + 4] = 0;  // the second decision spanning no iteration
  back = DecodeFusionDecisions(bad, 7, list);
  EXPECT_EQ(back.error.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(back.error.message(), HasSubstr("0 iterations"));
  EXPECT_THAT(back.decisions, SizeIs(1));
  bad = encode(decisions);
  bad[second + 4] = 2;  // two iterations: past the end of these words
  bad.resize(second + FusionDecisionWords(1, list.size()));
  back = DecodeFusionDecisions(bad, 7, list);
  EXPECT_THAT(back.error.message(), HasSubstr("2 iterations, past the end"));
  EXPECT_THAT(back.decisions, SizeIs(1));
  bad = encode(decisions);
  bad[3] |= int64_t{1} << (kFusionDecisionLoneBit + 1);  // an unknown flag
  back = DecodeFusionDecisions(bad, 7, list);
  EXPECT_THAT(back.error.message(), HasSubstr("not a sum or average"));
  EXPECT_THAT(back.decisions, IsEmpty());
  bad = encode(decisions);
  bad[6] |= int64_t{1} << 3;  // the first decision names a fourth tensor of a list of three
  EXPECT_THAT(DecodeFusionDecisions(bad, 7, list).error.message(),
              HasSubstr("member 3 past the list's 3"));
  bad = encode(decisions);
  bad[6] = 0;  // its one iteration names nothing
  EXPECT_THAT(DecodeFusionDecisions(bad, 7, list).error.message(), HasSubstr("iteration 0 empty"));
  // A decision cut off by the end of the words, right after its header's first word.
  bad = encode({decisions[0]});
  bad.resize(2);
  EXPECT_THAT(DecodeFusionDecisions(bad, 0, list).error.message(),
              HasSubstr("shorter than its header"));
}

// A decision names up to kMaxGroupMembers members of up to kMaxDecisionIterations iterations,
// by their position in the list: every member in a bit, whatever the list's length (BERT-large's
// 243 small tensors in one fused collective take 10 words). Its members travel in their
// canonical order, which the leader adopts too.
TEST(FusionPlanCodingTest, DecisionsAreBitmapsOfTheListPerIteration) {
  std::vector<uint64_t> list;
  for (uint64_t t = 0; t < 1000; ++t) list.push_back(t * 7919 + 1);
  FusionDecision d;
  d.index = 3;
  for (uint64_t it = 5; it < 5 + kMaxDecisionIterations; ++it) {
    for (uint64_t t = it % 2; t < 500; t += 2) d.members.push_back({list[t], it});
  }
  ASSERT_EQ(d.members.size(), 1000u);
  absl::StatusOr<std::vector<int64_t>> words = EncodeFusionDecision(d, list);
  ASSERT_TRUE(words.ok()) << words.status();
  EXPECT_EQ(words->size(), FusionDecisionWords(kMaxDecisionIterations, list.size()));  // 73
  EXPECT_LE(words->size(), FusionDecisionBroadcastWords(list.size()));
  DecodedFusionDecisions back = DecodeFusionDecisions(*words, 3, list);
  ASSERT_TRUE(back.error.ok()) << back.error;
  ASSERT_THAT(back.decisions, SizeIs(1));
  EXPECT_EQ(back.decisions[0], d);

  // Any order in, the canonical order out.
  FusionDecision shuffled = d;
  std::reverse(shuffled.members.begin(), shuffled.members.end());
  words = EncodeFusionDecision(shuffled, list);
  ASSERT_TRUE(words.ok());
  EXPECT_EQ(DecodeFusionDecisions(*words, 3, list).decisions[0], d);
  CanonicalMemberOrder(shuffled.members, list);
  EXPECT_EQ(shuffled.members, d.members);

  FusionDecision wider = d;
  wider.members.push_back({list[0], 100});  // a fifth iteration
  EXPECT_THAT(EncodeFusionDecision(wider, list).status().message(),
              HasSubstr("1001 members in 5 iterations"));
  FusionDecision stranger = d;
  stranger.members[0].name_hash = 2;  // not on the list
  EXPECT_THAT(EncodeFusionDecision(stranger, list).status().message(),
              HasSubstr("is not on the fusable list"));
  EXPECT_FALSE(EncodeFusionDecision(FusionDecision{}, list).ok());  // no member
  FusionDecision twice = d;
  twice.members.push_back(d.members[7]);  // one bit for two members: refused, not merged
  EXPECT_THAT(EncodeFusionDecision(twice, list).status().message(), HasSubstr("twice"));
  FusionDecision far = d;
  far.members.resize(1);
  far.members[0].iteration = uint64_t{1} << 63;  // not an int64 word
  EXPECT_THAT(EncodeFusionDecision(far, list).status().message(), HasSubstr("out of range"));

  std::vector<int64_t> bad = *EncodeFusionDecision(d, list);
  const size_t block = 1 + (list.size() + 63) / 64;
  bad[kFusionDecisionHeaderWords + block] = 5;  // the second iteration again
  EXPECT_THAT(DecodeFusionDecision(bad, list).status().message(),
              HasSubstr("iteration 5 out of order"));
}

// --- N data planes behind FusingRunner ---

constexpr char kJob[] = "fusion-job";

struct Tensor {
  std::string name;
  uint64_t count;
  Reduction reduction = Reduction::kSum;
};

// N DataPlaneRunners (TCP on loopback) behind FusingRunners on one FakeClock, without the timer
// thread: the leader's groups close only when the test moves the clock and flushes them
// (Await).
class FusionCluster {
 public:
  FusionCluster(int nodes, dataplane::Algorithm algorithm, uint64_t fusion_bytes,
                uint64_t partition_bytes = 4096) {
    dataplane::JobView view;
    view.job_id = kJob;
    view.plan_version = 1;
    view.procs_per_node = 1;
    view.partition_bytes = partition_bytes;
    view.tune_partition = false;
    view.credit_bytes = 1 << 20;
    view.op_timeout = 20s;
    view.secret = "0123456789abcdef0123456789abcdef";
    view.fusion_bytes = fusion_bytes;
    FusingRunner::Options options;
    options.timer_thread = false;
    for (int i = 0; i < nodes; ++i) {
      DataPlaneRunner::Options data_plane;
      data_plane.transport = DataPlaneTransport::kTcp;
      data_plane.reducer_threads = 1;
      absl::StatusOr<std::unique_ptr<DataPlaneRunner>> runner =
          DataPlaneRunner::Create(data_plane, registry_, common::SystemClock::Get());
      EXPECT_TRUE(runner.ok()) << runner.status();
      view.worker_addresses.push_back((*runner)->address());
      view.server_addresses.push_back((*runner)->address());
      const uint64_t share = dataplane::ChunkMap::kWeightTotal / nodes;
      view.server_weights.push_back(
          i == nodes - 1 ? dataplane::ChunkMap::kWeightTotal - share * (nodes - 1) : share);
      runners_.push_back(std::make_unique<FusingRunner>(*std::move(runner), &clock_, options));
    }
    for (int i = 0; i < nodes; ++i) {
      view.my_worker_rank = i;
      view.my_server_index = i;
      runners_[i]->SetJob(view, algorithm);
    }
  }
  ~FusionCluster() {
    for (auto& r : runners_) r->Shutdown();
  }

  int size() const { return static_cast<int>(runners_.size()); }
  FusingRunner& node(int i) { return *runners_[i]; }
  common::FakeClock& clock() { return clock_; }

  // Node i's input of tensor t: exact in float32, and averages over 4 nodes exact too.
  static float Input(int node, size_t tensor, uint64_t e, uint64_t iteration) {
    return static_cast<float>((node + 1) * 4 + tensor * 3 + e % 5 + iteration);
  }

  // Starts (tensor t, iteration) on node i; the future holds its status, and `out` the result.
  std::future<absl::Status> Start(int i, size_t t, const Tensor& tensor, uint64_t iteration,
                                  std::vector<float>& out) {
    out.assign(tensor.count, 0);
    return Start(i, t, tensor, iteration, out.data());
  }
  // The same in place on `out` (tensor.count elements).
  std::future<absl::Status> Start(int i, size_t t, const Tensor& tensor, uint64_t iteration,
                                  float* out) {
    for (uint64_t e = 0; e < tensor.count; ++e) out[e] = Input(i, t, e, iteration);
    auto promise = std::make_shared<std::promise<absl::Status>>();
    std::future<absl::Status> future = promise->get_future();
    dataplane::Operation op;
    op.tensor_name = tensor.name;
    op.iteration = iteration;
    op.dtype = DataType::kFloat32;
    op.count = tensor.count;
    op.reduction = tensor.reduction;
    op.buffers = {reinterpret_cast<std::byte*>(out)};
    op.priority = static_cast<int32_t>(t);
    op.done = [promise](absl::Status s) { promise->set_value(std::move(s)); };
    absl::Status started = runners_[i]->Start(kJob, std::move(op));
    if (!started.ok()) promise->set_value(started);
    return future;
  }

  // Waits for `f` (at most 30 s), closing the leader's groups meanwhile: every 1 ms the clock
  // moves by the automatic cycle's upper bound and the leader flushes.
  // Without `flush`, nothing closes the leader's groups but what comes (a group's size, another
  // reduction, the last fusable tensor of an iteration).
  absl::Status Await(std::future<absl::Status>& f) {
    for (int i = 0; i < 30000; ++i) {
      if (f.wait_for(1ms) == std::future_status::ready) return f.get();
      if (!flush_) continue;
      clock_.Advance(kMaxFusionCycle);
      runners_[0]->FlushExpiredGroups();
    }
    return absl::DeadlineExceededError("the collective did not complete within 30 s");
  }

  void set_flush(bool flush) { flush_ = flush; }

  // Every element of node i's result of tensor t.
  size_t CountWrong(size_t t, const Tensor& tensor, uint64_t iteration,
                    const std::vector<float>& result) const {
    return CountWrong(t, tensor, iteration, result.data());
  }
  size_t CountWrong(size_t t, const Tensor& tensor, uint64_t iteration, const float* result) const {
    size_t wrong = 0;
    for (uint64_t e = 0; e < tensor.count; ++e) {
      float sum = 0;
      for (int i = 0; i < static_cast<int>(runners_.size()); ++i) sum += Input(i, t, e, iteration);
      const float expected =
          tensor.reduction == Reduction::kAverage ? sum / static_cast<float>(runners_.size()) : sum;
      wrong += result[e] != expected ? 1 : 0;
    }
    return wrong;
  }

 private:
  prometheus::Registry registry_;
  common::FakeClock clock_;
  bool flush_ = true;
  std::vector<std::unique_ptr<FusingRunner>> runners_;
};

const std::vector<Tensor> kModel = {{"first", 16},
                                    {"a", 100},
                                    {"b", 33},
                                    {"c", 1000},
                                    {"big", 40000},  // 160 KB: never
                                    {"d", 8, Reduction::kAverage},
                                    {"e", 24, Reduction::kAverage},
                                    {"f", 5}};

// Every node submits the iteration's tensors (`which`, default all) before waiting; node
// `reversed` in reverse order; nodes from the last to the first when `followers_first`.
// Returns the wrong elements over all nodes and tensors.
size_t RunIteration(FusionCluster& cluster, const std::vector<Tensor>& model, uint64_t iteration,
                    int reversed = -1, bool followers_first = false,
                    std::vector<size_t> which = {}) {
  if (which.empty()) {
    for (size_t t = 0; t < model.size(); ++t) which.push_back(t);
  }
  const int n = cluster.size();
  std::vector<std::vector<std::vector<float>>> out(n,
                                                   std::vector<std::vector<float>>(model.size()));
  std::vector<std::vector<std::future<absl::Status>>> futures(n);
  for (int k = 0; k < n; ++k) {
    const int i = followers_first ? n - 1 - k : k;
    futures[i].resize(model.size());
    for (size_t j = 0; j < which.size(); ++j) {
      const size_t t = which[i == reversed ? which.size() - 1 - j : j];
      futures[i][t] = cluster.Start(i, t, model[t], iteration, out[i][t]);
    }
  }
  size_t wrong = 0;
  for (int i = 0; i < n; ++i) {
    for (size_t t : which) {
      absl::Status s = cluster.Await(futures[i][t]);
      EXPECT_TRUE(s.ok()) << "node " << i << " " << model[t].name << " iteration " << iteration
                          << ": " << s;
      if (s.ok()) wrong += cluster.CountWrong(t, model[t], iteration, out[i][t]);
    }
  }
  return wrong;
}

// RunIteration with every node's tensors in one buffer, one after another in the model's order
// (node `reversed_layout`: in the reverse order), as a process keeping its gradients in one
// buffer submits them.
size_t RunIterationInOneBuffer(FusionCluster& cluster, const std::vector<Tensor>& model,
                               uint64_t iteration, int reversed_layout = -1) {
  const int n = cluster.size();
  std::vector<std::vector<float>> buffer(n);
  std::vector<std::vector<size_t>> offset(n, std::vector<size_t>(model.size()));
  for (int i = 0; i < n; ++i) {
    size_t at = 0;
    for (size_t k = 0; k < model.size(); ++k) {
      const size_t t = i == reversed_layout ? model.size() - 1 - k : k;
      offset[i][t] = at;
      at += model[t].count;
    }
    buffer[i].assign(at, 0);
  }
  std::vector<std::vector<std::future<absl::Status>>> futures(n);
  for (int i = 0; i < n; ++i) {
    for (size_t t = 0; t < model.size(); ++t) {
      futures[i].push_back(
          cluster.Start(i, t, model[t], iteration, buffer[i].data() + offset[i][t]));
    }
  }
  size_t wrong = 0;
  for (int i = 0; i < n; ++i) {
    for (size_t t = 0; t < model.size(); ++t) {
      absl::Status s = cluster.Await(futures[i][t]);
      EXPECT_TRUE(s.ok()) << "node " << i << " " << model[t].name << " iteration " << iteration
                          << ": " << s;
      if (s.ok()) {
        wrong += cluster.CountWrong(t, model[t], iteration, buffer[i].data() + offset[i][t]);
      }
    }
  }
  return wrong;
}

TEST(FusingRunnerTest, EveryNodeRunsTheLeadersDecisionsWithExactResults) {
  for (dataplane::Algorithm algorithm :
       {dataplane::Algorithm::kRing, dataplane::Algorithm::kPushPull}) {
    FusionCluster cluster(4, algorithm, 64 << 10);
    for (uint64_t it = 0; it < 5; ++it) {
      EXPECT_EQ(RunIteration(cluster, kModel, it, /*reversed=*/it >= 1 ? 2 : -1,
                             /*followers_first=*/it == 3),
                0u)
          << "iteration " << it;
    }
    for (int i = 0; i < cluster.size(); ++i) {
      // The fusable list: "first" marks iterations, "big" is too large, d and e average, f has
      // no partner.
      const std::vector<FusionGroup> groups = cluster.node(i).groups(kJob);
      ASSERT_THAT(groups, SizeIs(2)) << "node " << i;
      EXPECT_THAT(Members(groups[0]), ElementsAre(H("a"), H("b"), H("c")));
      EXPECT_THAT(Members(groups[1]), ElementsAre(H("d"), H("e")));
      const FusingRunner::Stats stats = cluster.node(i).stats();
      EXPECT_EQ(stats.plans_adopted, 1u);
      // Iterations 1 to 4: every fusable tensor in some fused collective, at least two a time
      // (a, b, c and d, e never share one: another reduction).
      EXPECT_EQ(stats.fused_tensors, 5u * 4) << "node " << i;
      EXPECT_GE(stats.fused_operations, 2u * 4) << "node " << i;
      EXPECT_EQ(stats.decisions, stats.fused_operations) << "node " << i;
      EXPECT_EQ(stats.in_place_operations, 0u) << "node " << i;  // each tensor its own buffer
      const std::vector<prometheus::MetricFamily> metrics =
          cluster.node(i).stats_collector()->Collect();
      const prometheus::ClientMetric* tensors =
          common::metrics::FindSample(metrics, "tributary_agent_fusion_tensors_total");
      ASSERT_NE(tensors, nullptr);
      EXPECT_EQ(tensors->counter.value, 20);
      ASSERT_NE(common::metrics::FindSample(metrics, "tributary_agent_fusion_operations_total"),
                nullptr);
    }
  }
}

TEST(FusingRunnerTest, FusionOffRunsEveryTensorAlone) {
  FusionCluster cluster(3, dataplane::Algorithm::kRing, 0);
  for (uint64_t it = 0; it < 4; ++it) EXPECT_EQ(RunIteration(cluster, kModel, it), 0u);
  EXPECT_EQ(cluster.node(0).stats().fused_operations, 0u);
  EXPECT_EQ(cluster.node(0).stats().plans_adopted, 0u);
}

// A job's decision broadcasts hold one decision of kMaxDecisionIterations iterations of the whole
// list, in 512-byte steps.
TEST(FusionPlanCodingTest, DecisionBroadcastsAreSizedByTheFusableList) {
  EXPECT_EQ(FusionDecisionBroadcastWords(0), 64u);
  EXPECT_EQ(FusionDecisionBroadcastWords(243), 64u);  // BERT-large's: 512 bytes (4 KiB before)
  EXPECT_EQ(FusionDecisionWords(kMaxDecisionIterations, 243), 25u);
  EXPECT_EQ(FusionDecisionBroadcastWords(64 * 13), 64u);       // 5 + 4 x (1 + 13) = 61
  EXPECT_EQ(FusionDecisionBroadcastWords(64 * 13 + 1), 128u);  // 5 + 4 x (1 + 14) = 65
  for (size_t f = 0; f <= kMaxGroupMembers; ++f) {
    ASSERT_GE(FusionDecisionBroadcastWords(f), FusionDecisionWords(kMaxDecisionIterations, f)) << f;
    ASSERT_EQ(FusionDecisionBroadcastWords(f) % 64, 0u) << f;
  }
}

// BERT-large's 243 small tensors, submitted together, run as one fused collective per iteration
// (no longer 61 at most: decisions are packed into the decision broadcast by their length).
TEST(FusingRunnerTest, ManySmallTensorsRunAsOneFusedCollective) {
  std::vector<Tensor> model = {{"first", 16}};
  for (uint64_t t = 0; t < 243; ++t) model.push_back({absl::StrCat("bias", t), 8 + t % 5});
  FusionCluster cluster(4, dataplane::Algorithm::kRing, 1 << 20);
  for (uint64_t it = 0; it < 3; ++it) ASSERT_EQ(RunIteration(cluster, model, it), 0u);
  for (int i = 0; i < cluster.size(); ++i) {
    const std::vector<FusionGroup> groups = cluster.node(i).groups(kJob);
    ASSERT_THAT(groups, SizeIs(1)) << "node " << i;
    EXPECT_THAT(groups[0].members, SizeIs(243));
    const FusingRunner::Stats stats = cluster.node(i).stats();
    EXPECT_EQ(stats.fused_tensors, 243u * 2) << "node " << i;
    EXPECT_EQ(stats.fused_operations, 2u) << "node " << i;  // iterations 1 and 2
    EXPECT_EQ(stats.lone_operations, 2u) << "node " << i;   // nothing else ran
    EXPECT_EQ(stats.decisions, 2u) << "node " << i;
  }
}

// Tensors that lie one after another in a process's buffer, in the leader's order, run in place:
// the fused collective works on that buffer, with no copy in or out, exactly. A node whose
// buffer holds them in another order copies them, and every node's results are exact alike.
TEST(FusingRunnerTest, AdjacentTensorsRunInPlace) {
  for (dataplane::Algorithm algorithm :
       {dataplane::Algorithm::kRing, dataplane::Algorithm::kPushPull}) {
    FusionCluster cluster(4, algorithm, 64 << 10);
    for (uint64_t it = 0; it < 4; ++it) {
      EXPECT_EQ(RunIterationInOneBuffer(cluster, kModel, it, /*reversed_layout=*/2), 0u)
          << "iteration " << it;
    }
    for (int i = 0; i < cluster.size(); ++i) {
      const FusingRunner::Stats stats = cluster.node(i).stats();
      EXPECT_EQ(stats.fused_tensors, 5u * 3) << "node " << i;  // a, b, c; d, e
      EXPECT_GE(stats.fused_operations, 2u * 3) << "node " << i;
      EXPECT_EQ(stats.in_place_operations, i == 2 ? 0u : stats.fused_operations) << "node " << i;
      const std::vector<prometheus::MetricFamily> metrics =
          cluster.node(i).stats_collector()->Collect();
      const prometheus::ClientMetric* in_place =
          common::metrics::FindSample(metrics, "tributary_agent_fusion_in_place_operations_total");
      ASSERT_NE(in_place, nullptr);
      EXPECT_EQ(in_place->counter.value, static_cast<double>(stats.in_place_operations));
    }
  }
}

// The leader decides its open group when the last fusable tensor of the iteration comes: with
// no cycle ever ending (no flush, the clock still), every iteration completes, in one fused
// collective per reduction.
TEST(FusingRunnerTest, TheLeaderDecidesAtTheLastFusableTensorOfTheIteration) {
  FusionCluster cluster(3, dataplane::Algorithm::kRing, 64 << 10);
  ASSERT_EQ(RunIteration(cluster, kModel, 0), 0u);  // observed: the cycles end here
  cluster.set_flush(false);
  for (uint64_t it = 1; it < 4; ++it) {
    EXPECT_EQ(RunIteration(cluster, kModel, it, /*reversed=*/it == 2 ? 1 : -1), 0u)
        << "iteration " << it;
  }
  for (int i = 0; i < cluster.size(); ++i) {
    const FusingRunner::Stats stats = cluster.node(i).stats();
    EXPECT_EQ(stats.fused_tensors, 5u * 3) << "node " << i;
    EXPECT_EQ(stats.fused_operations, 2u * 3) << "node " << i;  // {a, b, c} and {d, e}
  }
}

// A decision spans at most kMaxDecisionIterations iterations: the leader closes its group
// before a member of a fifth. Here only tensor a comes, of iterations 1 to 5 (no iteration is
// ever complete, and nothing else closes groups): a1-a4 run as one fused collective, a5 waits for
// its group's cycle.
TEST(FusingRunnerTest, TheLeaderClosesAGroupBeforeAFifthIteration) {
  FusionCluster cluster(3, dataplane::Algorithm::kRing, 64 << 10);
  ASSERT_EQ(RunIteration(cluster, kModel, 0), 0u);
  cluster.set_flush(false);
  constexpr size_t kA = 1;
  ASSERT_EQ(kModel[kA].name, "a");
  std::vector<std::vector<std::vector<float>>> out(
      cluster.size(), std::vector<std::vector<float>>(kMaxDecisionIterations + 2));
  std::vector<std::vector<std::future<absl::Status>>> futures(cluster.size());
  for (int i = 0; i < cluster.size(); ++i) {
    for (uint64_t it = 1; it <= kMaxDecisionIterations + 1; ++it) {
      futures[i].push_back(cluster.Start(i, kA, kModel[kA], it, out[i][it]));
    }
  }
  for (int i = 0; i < cluster.size(); ++i) {
    for (uint64_t it = 1; it <= kMaxDecisionIterations; ++it) {
      absl::Status s = cluster.Await(futures[i][it - 1]);
      ASSERT_TRUE(s.ok()) << "node " << i << " iteration " << it << ": " << s;
      EXPECT_EQ(cluster.CountWrong(kA, kModel[kA], it, out[i][it]), 0u);
    }
  }
  cluster.set_flush(true);
  for (int i = 0; i < cluster.size(); ++i) {
    const uint64_t it = kMaxDecisionIterations + 1;
    absl::Status s = cluster.Await(futures[i][it - 1]);
    ASSERT_TRUE(s.ok()) << "node " << i << ": " << s;
    EXPECT_EQ(cluster.CountWrong(kA, kModel[kA], it, out[i][it]), 0u);
  }
  for (int i = 0; i < cluster.size(); ++i) {
    // {a1, a2, a3, a4} and {a5}.
    EXPECT_EQ(cluster.node(i).stats().fused_operations, 2u) << "node " << i;
    EXPECT_EQ(cluster.node(i).stats().fused_tensors, kMaxDecisionIterations + 1) << "node " << i;
  }
}

// The leader marks a group lone when it and the job's other operations in flight there hold
// under kLoneFusionBytes; every node then launches the fused collective lone, with exact results
// either way. With 1 MiB partitions push/pull cuts the 64 KiB group into 3 chunks busy and 16
// lone, so a node that disagreed would fail it.
TEST(FusingRunnerTest, AGroupDecidedWithLittleElseInFlightRunsLone) {
  const std::vector<Tensor> model = {
      {"first", 4}, {"a", 4096}, {"b", 8192}, {"c", 4096}, {"big", kLoneFusionBytes / 4}};
  FusionCluster cluster(3, dataplane::Algorithm::kPushPull, 256 << 10, 1 << 20);
  for (uint64_t it = 0; it < 2; ++it) ASSERT_EQ(RunIteration(cluster, model, it), 0u);
  const auto stats = [&] {
    std::vector<FusingRunner::Stats> s;
    for (int i = 0; i < cluster.size(); ++i) s.push_back(cluster.node(i).stats());
    return s;
  };
  std::vector<std::vector<float>> big(3);
  std::vector<std::future<absl::Status>> big_done(3);
  const auto run_small = [&](uint64_t it) {
    std::vector<std::vector<std::vector<float>>> out(3, std::vector<std::vector<float>>(4));
    std::vector<std::future<absl::Status>> futures;
    for (int i = 0; i < 3; ++i) {
      for (size_t t = 0; t < 4; ++t)
        futures.push_back(cluster.Start(i, t, model[t], it, out[i][t]));
    }
    for (int i = 0; i < 3; ++i) {
      for (size_t t = 0; t < 4; ++t) {
        absl::Status s = cluster.Await(futures[i * 4 + t]);
        ASSERT_TRUE(s.ok()) << "node " << i << " " << model[t].name << ": " << s;
        EXPECT_EQ(cluster.CountWrong(t, model[t], it, out[i][t]), 0u);
      }
    }
  };
  // Iteration 2: the leader's 4 MiB "big" is in flight (it waits for the others') while the
  // group a, b, c is decided: not lone.
  const std::vector<FusingRunner::Stats> before = stats();
  big_done[0] = cluster.Start(0, 4, model[4], 2, big[0]);
  run_small(2);
  const std::vector<FusingRunner::Stats> busy = stats();
  for (int i = 1; i < 3; ++i) big_done[i] = cluster.Start(i, 4, model[4], 2, big[i]);
  for (int i = 0; i < 3; ++i) {
    absl::Status s = cluster.Await(big_done[i]);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(cluster.CountWrong(4, model[4], 2, big[i]), 0u);
  }
  // Iteration 3: nothing else runs.
  run_small(3);
  const std::vector<FusingRunner::Stats> after = stats();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(busy[i].fused_operations, before[i].fused_operations + 1) << "node " << i;
    EXPECT_EQ(busy[i].lone_operations, before[i].lone_operations) << "node " << i;
    EXPECT_EQ(after[i].fused_operations, busy[i].fused_operations + 1) << "node " << i;
    EXPECT_EQ(after[i].lone_operations, busy[i].lone_operations + 1) << "node " << i;
  }
}

// An all-reduce that runs unfused under kLoneFusionBytes -- a tensor with no partner, or any in
// a job without fusion -- runs lone, on every node alike (push/pull cuts it into small chunks);
// the results are exact.
TEST(FusingRunnerTest, AnUnfusedAllReduceUnderTheLoneBytesRunsLoneOnEveryNode) {
  const std::vector<Tensor> solo = {{"solo", 96 << 10}};  // 384 KiB
  for (uint64_t fusion_bytes : {uint64_t{0}, uint64_t{1} << 20}) {
    FusionCluster cluster(3, dataplane::Algorithm::kPushPull, fusion_bytes, 1 << 20);
    for (uint64_t it = 0; it < 3; ++it) {
      EXPECT_EQ(RunIteration(cluster, solo, it), 0u) << "fusion " << fusion_bytes << " it " << it;
    }
    for (int i = 0; i < cluster.size(); ++i) {
      EXPECT_EQ(cluster.node(i).stats().fused_operations, 0u) << "node " << i;
    }
  }
}

// With --trace each fused collective is a span "fusion <fused name>" from its first member's
// arrival to its launch, and the list and decision broadcasts are "control <tensor>" spans.
TEST(FusingRunnerTest, TracedFusedCollectivesAndBroadcastsAreSpans) {
  const std::string path =
      ::testing::TempDir() + "/fusion-trace-" + std::to_string(::getpid()) + ".json";
  ASSERT_TRUE(common::Trace::Start(path, "test").ok());
  {
    FusionCluster cluster(3, dataplane::Algorithm::kRing, 64 << 10);
    for (uint64_t it = 0; it < 2; ++it) ASSERT_EQ(RunIteration(cluster, kModel, it), 0u);
  }
  ASSERT_TRUE(common::Trace::Stop().ok());
  std::ifstream in(path);
  const nlohmann::json events = nlohmann::json::parse(in);
  std::map<std::string, int> begins;
  std::multiset<int64_t> members;
  for (const nlohmann::json& e : events) {
    if (e.value("ph", "") != "b") continue;
    const std::string name = e.value("name", "");
    begins[name]++;
    if (absl::StartsWith(name, "fusion ")) {
      members.insert(e["args"]["members"].get<int64_t>());
      EXPECT_GT(e["args"]["bytes"].get<int64_t>(), 0);
      EXPECT_TRUE(e["args"].contains("decided_us"));  // < 0: the decision came first
      EXPECT_GE(e["args"]["last_member_us"].get<int64_t>(), 0);
    }
  }
  // Iteration 1: a, b, c and d, e (another reduction) in two collectives, on each of 3 nodes.
  EXPECT_EQ(members, (std::multiset<int64_t>{2, 2, 2, 3, 3, 3}));
  EXPECT_EQ(begins["control __tributary/fusion-plan"], 3);
  EXPECT_GE(begins["control __tributary/fusion-decision"], 3);
  std::remove(path.c_str());
}

// The leader groups only what it holds: a fusable tensor that later comes alone, or with other
// partners, runs (fused with what came), never waits for partners that do not come.
TEST(FusingRunnerTest, AFusableTensorThatComesAloneRunsWithoutItsPartners) {
  FusionCluster cluster(3, dataplane::Algorithm::kRing, 64 << 10);
  for (uint64_t it = 0; it < 2; ++it) ASSERT_EQ(RunIteration(cluster, kModel, it), 0u);
  ASSERT_EQ(RunIteration(cluster, kModel, 2, -1, false, {1}), 0u);          // a alone
  ASSERT_EQ(RunIteration(cluster, kModel, 2, -1, true, {2, 5}), 0u);        // b and d
  ASSERT_EQ(RunIteration(cluster, kModel, 3, 1, false, {0, 3, 6, 7}), 0u);  // c, e (+ others)
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(cluster.node(i).stats().fused_tensors, 10u);  // iteration 1: 5; then a; b; d; c; e
}

// A process that waits for each tensor before it submits the next: fusing them would cost a
// cycle each, so they are not on the list.
TEST(FusingRunnerTest, TensorsAwaitedOneByOneAreNeverFused) {
  FusionCluster cluster(3, dataplane::Algorithm::kRing, 64 << 10);
  for (uint64_t it = 0; it < 4; ++it) {
    for (size_t t = 0; t < 4; ++t) {
      std::vector<std::vector<float>> out(3);
      std::vector<std::future<absl::Status>> futures;
      for (int i = 0; i < 3; ++i) futures.push_back(cluster.Start(i, t, kModel[t], it, out[i]));
      for (int i = 0; i < 3; ++i) {
        absl::Status s = cluster.Await(futures[i]);
        ASSERT_TRUE(s.ok()) << kModel[t].name << " iteration " << it << ": " << s;
        EXPECT_EQ(cluster.CountWrong(t, kModel[t], it, out[i]), 0u);
      }
    }
  }
  EXPECT_THAT(cluster.node(1).groups(kJob), IsEmpty());
  EXPECT_EQ(cluster.node(1).stats().plans_adopted, 1u);
  EXPECT_EQ(cluster.node(1).stats().fused_operations, 0u);
}

// Runs iterations 0 and 1, then starts iteration 2's fusable tensors a, b, c on every node but
// the `skip` ones on `skip_node`.
struct Iteration2 {
  std::vector<std::vector<std::vector<float>>> out;
  std::vector<std::vector<std::future<absl::Status>>> futures;
};
const std::vector<Tensor> kSmall = {{"first", 4}, {"a", 10}, {"b", 20}, {"c", 30}};

void StartIteration2(FusionCluster& cluster, Iteration2& run, int skip_node,
                     const std::vector<size_t>& skip) {
  for (uint64_t it = 0; it < 2; ++it) ASSERT_EQ(RunIteration(cluster, kSmall, it), 0u);
  const int n = cluster.size();
  run.out.assign(n, std::vector<std::vector<float>>(kSmall.size()));
  run.futures.resize(n);
  for (int i = 0; i < n; ++i) {
    for (size_t t = 1; t < kSmall.size(); ++t) {
      if (i == skip_node && std::count(skip.begin(), skip.end(), t)) continue;
      run.futures[i].push_back(cluster.Start(i, t, kSmall[t], 2, run.out[i][t]));
    }
  }
  ASSERT_THAT(cluster.node(0).groups(kJob), SizeIs(1));
}

TEST(FusingRunnerTest, AMemberMissingPastTheDeadlineFailsItsCollectiveOnEveryNode) {
  FusionCluster cluster(3, dataplane::Algorithm::kRing, 64 << 10);
  Iteration2 run;
  StartIteration2(cluster, run, /*skip_node=*/2, {2});  // node 2 never submits b
  // The leader decides a, b, c; node 1 runs them; node 2 waits for b.
  cluster.clock().Advance(kMaxFusionCycle);
  cluster.node(0).FlushExpiredGroups();
  EXPECT_EQ(run.futures[2][0].wait_for(100ms), std::future_status::timeout);
  cluster.node(2).Tick();
  EXPECT_EQ(run.futures[2][0].wait_for(0s), std::future_status::timeout);  // within the deadline
  cluster.clock().Advance(21s);
  cluster.node(2).Tick();
  absl::Status s = cluster.Await(run.futures[2][0]);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), HasSubstr("only 2 of its 3 tensors ('a', 'c')"));
  for (int i = 0; i < 2; ++i) {
    for (auto& future : run.futures[i]) {
      absl::Status other = cluster.Await(future);
      EXPECT_FALSE(other.ok()) << "node " << i;
      EXPECT_THAT(other.message(), HasSubstr("only 2 of its 3")) << "node " << i;
    }
  }
}

TEST(FusingRunnerTest, AnAbortedMemberFailsItsCollectiveOnEveryNode) {
  for (int aborting : {0, 1}) {  // the leader, a follower
    FusionCluster cluster(3, dataplane::Algorithm::kRing, 64 << 10);
    Iteration2 run;
    StartIteration2(cluster, run, aborting, {2, 3});  // the aborting node has only a
    cluster.node(aborting).Abort(kJob, "a", 2, absl::CancelledError("a process gave up"));
    for (int i = 0; i < 3; ++i) {
      absl::Status s = cluster.Await(run.futures[i][0]);
      EXPECT_THAT(s.message(), HasSubstr("a process gave up"))
          << "aborting " << aborting << " node " << i;
    }
    if (aborting == 0) {
      // The leader decided a alone: b and c of the others wait for a decision until their
      // deadline.
      cluster.clock().Advance(21s);
      for (int i = 1; i < 3; ++i) cluster.node(i).Tick();
    }
    for (int i = 0; i < 3; ++i) {
      if (i == aborting) continue;
      for (size_t t = 1; t < run.futures[i].size(); ++t) {
        absl::Status s = cluster.Await(run.futures[i][t]);
        EXPECT_THAT(s.message(), HasSubstr(aborting == 0 ? "fusion decision" : "a process gave up"))
            << "aborting " << aborting << " node " << i << " tensor " << t;
      }
    }
  }
}

// An abort of a fusable tensor a node has not submitted: the leader names it in a decision of
// its own and fails it; a follower keeps asking for decisions until one names it. Either way
// the others' copies fail with the reason, and the rest runs.
TEST(FusingRunnerTest, AnAbortedTensorNeverSubmittedHereFailsOnEveryNode) {
  for (int aborting : {0, 1}) {
    FusionCluster cluster(3, dataplane::Algorithm::kRing, 64 << 10);
    Iteration2 run;
    StartIteration2(cluster, run, aborting, {1});  // the aborting node has b and c only
    cluster.node(aborting).Abort(kJob, "a", 2, absl::CancelledError("process gave up on a"));
    for (int i = 0; i < 3; ++i) {
      const bool has_a = i != aborting;
      for (size_t t = 0; t < run.futures[i].size(); ++t) {
        absl::Status s = cluster.Await(run.futures[i][t]);
        if (has_a && t == 0) {
          EXPECT_THAT(s.message(), HasSubstr("process gave up on a"))
              << "aborting " << aborting << " node " << i;
        } else if (aborting == 0) {
          // The leader decided a alone: b and c run fused, exactly.
          EXPECT_TRUE(s.ok()) << "node " << i << " tensor " << t << ": " << s;
          const size_t tensor = has_a ? t + 1 : t + 2;
          if (s.ok()) {
            EXPECT_EQ(cluster.CountWrong(tensor, kSmall[tensor], 2, run.out[i][tensor]), 0u);
          }
        } else {
          // The leader decided a, b, c together: all of it fails.
          EXPECT_THAT(s.message(), HasSubstr("process gave up on a"))
              << "node " << i << " tensor " << t;
        }
      }
    }
  }
}

// An abort of a tensor that waits here for the fusion list (the first fused iteration, before
// the list's broadcast has completed), or that this node has not submitted while the list is on
// its way: once the list arrives the abort reaches the others' copies, which fail with its reason
// at once rather than at their deadline; the rest of the iteration runs exactly or fails with the
// same reason.
TEST(FusingRunnerTest, AnAbortBeforeTheListArrivesFailsTheTensorOnEveryNode) {
  for (bool submitted : {true, false}) {
    for (int aborting : {0, 1}) {  // the leader, a follower
      FusionCluster cluster(3, dataplane::Algorithm::kRing, 64 << 10);
      ASSERT_EQ(RunIteration(cluster, kSmall, 0), 0u);
      const uint64_t it = kFirstFusedIteration;
      const std::string where =
          absl::StrCat(submitted ? "submitted" : "not submitted", ", aborting ", aborting);
      std::vector<std::vector<std::vector<float>>> out(
          3, std::vector<std::vector<float>>(kSmall.size()));
      std::vector<std::vector<std::future<absl::Status>>> futures(3);
      for (auto& f : futures) f.resize(kSmall.size());
      // The aborting node's first operation of the iteration (a, or b when a is never submitted
      // there) posts its side of the list's broadcast; a follower's list cannot arrive before the
      // leader posts it, which it does only when its own first operation starts (below).
      const size_t first = submitted ? 1 : 2;
      futures[aborting][first] =
          cluster.Start(aborting, first, kSmall[first], it, out[aborting][first]);
      cluster.node(aborting).Abort(kJob, "a", it, absl::CancelledError("process gave up on a"));
      if (submitted) {
        ASSERT_EQ(futures[aborting][1].wait_for(0s), std::future_status::ready) << where;
        EXPECT_THAT(futures[aborting][1].get().message(), HasSubstr("process gave up on a"));
      }
      for (int i = 0; i < 3; ++i) {
        for (size_t t = 1; t < kSmall.size(); ++t) {
          if (i == aborting && t <= first) continue;
          futures[i][t] = cluster.Start(i, t, kSmall[t], it, out[i][t]);
        }
      }
      for (int i = 0; i < 3; ++i) {
        for (size_t t = 1; t < kSmall.size(); ++t) {
          if (i == aborting && t == 1) continue;
          absl::Status s = cluster.Await(futures[i][t]);
          if (t == 1 || !s.ok()) {
            EXPECT_THAT(s.message(), HasSubstr("process gave up on a"))
                << where << ", node " << i << ", tensor " << t;
          } else {
            EXPECT_EQ(cluster.CountWrong(t, kSmall[t], it, out[i][t]), 0u);
          }
        }
      }
      // a was in the list: the abort went through a decision, not around it.
      const std::vector<FusionGroup> groups = cluster.node(0).groups(kJob);
      ASSERT_THAT(groups, SizeIs(1)) << where;
      EXPECT_TRUE(std::any_of(groups[0].members.begin(), groups[0].members.end(),
                              [](const FusionMember& m) { return m.name_hash == H("a"); }))
          << where;
    }
  }
}

// A 2-node ring job with 64 KiB fusion, seen from worker rank `my_worker_rank` (0: the leader),
// for the tests that drive one FusingRunner over a FakeCollectiveRunner.
dataplane::JobView TwoNodeJob(int my_worker_rank) {
  dataplane::JobView view;
  view.job_id = kJob;
  view.worker_addresses = {"n0", "n1"};
  view.my_worker_rank = my_worker_rank;
  view.op_timeout = 5s;
  view.fusion_bytes = 1 << 16;
  return view;
}

// Completes started operation `index`, the sum of the worker nodes that got the fusion list, as
// `sum` (TwoNodeJob's two: every one got it).
void Agree(FakeCollectiveRunner* inner, size_t index, int64_t sum = 2) {
  const dataplane::Operation op = inner->start(index).op;
  ASSERT_EQ(op.tensor_name, kFusionAgreementTensor);
  ASSERT_EQ(op.reduction, Reduction::kSum);
  ASSERT_TRUE(op.control);
  *reinterpret_cast<int64_t*>(op.buffers[0]) = sum;
  inner->Complete(index, absl::OkStatus());
}

// The leader of TwoNodeJob on a FakeCollectiveRunner, with the launcher thread (unless told not
// to) and without the timer thread. Buffers the runner reads must be declared before it (they
// outlive it).
struct FakeLeader {
  explicit FakeLeader(bool launcher_thread = true) {
    auto fake = std::make_unique<FakeCollectiveRunner>();
    inner = fake.get();
    FusingRunner::Options options;
    options.timer_thread = false;
    options.launcher_thread = launcher_thread;
    runner = std::make_unique<FusingRunner>(std::move(fake), &clock, options);
    runner->SetJob(TwoNodeJob(/*my_worker_rank=*/0), dataplane::Algorithm::kRing);
  }
  common::FakeClock clock;
  FakeCollectiveRunner* inner = nullptr;
  std::unique_ptr<FusingRunner> runner;
};

// A one-float all-reduce of `name` at `at`.
dataplane::Operation OneFloat(
    const std::string& name, uint64_t iteration, float* at,
    std::function<void(absl::Status)> done = [](absl::Status) {}) {
  dataplane::Operation o;
  o.tensor_name = name;
  o.iteration = iteration;
  o.count = 1;
  o.buffers = {reinterpret_cast<std::byte*>(at)};
  o.done = std::move(done);
  return o;
}

// Before the plan has arrived, an operation of iteration >= 2 waits for it (here: forever, as
// no other node joins the plan's broadcast), and fails at the job's deadline.
TEST(FusingRunnerTest, AnOperationWaitingForThePlanFailsAtTheDeadline) {
  auto fake = std::make_unique<FakeCollectiveRunner>();
  FakeCollectiveRunner* inner = fake.get();
  common::FakeClock clock;
  FusingRunner::Options options;
  options.timer_thread = false;
  options.launcher_thread = false;
  FusingRunner runner(std::move(fake), &clock, options);
  runner.SetJob(TwoNodeJob(/*my_worker_rank=*/1), dataplane::Algorithm::kRing);
  std::vector<absl::Status> results;
  const auto op = [&](const std::string& name, uint64_t iteration) {
    dataplane::Operation o;
    o.tensor_name = name;
    o.iteration = iteration;
    o.count = 1;
    o.done = [&results](absl::Status s) { results.push_back(s); };
    return o;
  };
  ASSERT_TRUE(runner.Start(kJob, op("x", 0)).ok());
  ASSERT_TRUE(runner.Start(kJob, op("x", 1)).ok());  // posts the list's broadcast, then waits
  ASSERT_EQ(inner->num_starts(), 2u);
  EXPECT_EQ(inner->start(1).op.tensor_name, kFusionPlanTensor);
  EXPECT_EQ(inner->start(1).op.reduction, Reduction::kBroadcast);
  EXPECT_TRUE(inner->start(1).op.control);
  clock.Advance(5s);
  runner.Tick();
  EXPECT_THAT(results, IsEmpty());
  clock.Advance(1ms);
  runner.Tick();
  ASSERT_THAT(results, SizeIs(1));
  EXPECT_EQ(results[0].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(results[0].message(), HasSubstr("fusion list from worker rank 0"));
  // The broadcast fails: this node says so in the agreement, which fails too (rank 0 is gone);
  // fusion is off, and later operations pass straight through.
  inner->Complete(1, absl::AbortedError("rank 0 is gone"));
  ASSERT_EQ(inner->num_starts(), 3u);
  ASSERT_EQ(inner->start(2).op.tensor_name, kFusionAgreementTensor);
  EXPECT_EQ(*reinterpret_cast<const int64_t*>(inner->start(2).op.buffers[0]), 0);
  inner->Complete(2, absl::AbortedError("rank 0 is gone"));
  ASSERT_TRUE(runner.Start(kJob, op("x", 2)).ok());
  EXPECT_EQ(inner->num_starts(), 4u);
  EXPECT_EQ(inner->start(3).op.tensor_name, "x");
}

// With the launcher thread, a fused collective is launched under the runner's lock and started
// on the inner runner later: an abort of a member in between fails it there, with the abort's
// reason, and it never starts.
TEST(FusingRunnerTest, AnAbortBeforeTheLaunchedCollectiveStartsFailsItUnstarted) {
  // Before the runner: its shutdown may still complete operations into them.
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, absl::Status> results;
  // Each tensor in its own float, a gap between them: a fused group is copied in, which is what
  // the launcher thread runs (a group in place starts on the submitting thread).
  std::map<std::string, std::array<float, 2>> memory;
  FakeLeader leader;
  FusingRunner& runner = *leader.runner;
  FakeCollectiveRunner* inner = leader.inner;
  const auto op = [&](const std::string& name, uint64_t iteration) {
    return OneFloat(name, iteration, memory[name].data(),
                    [&, key = absl::StrCat(name, iteration)](absl::Status s) {
                      std::lock_guard lock(mu);
                      results[key] = s;
                      cv.notify_all();
                    });
  };
  // Iteration 0: observed; a and b, submitted together, may fuse.
  for (const char* name : {"x", "a", "b"}) ASSERT_TRUE(runner.Start(kJob, op(name, 0)).ok());
  for (size_t i = 0; i < 3; ++i) inner->Complete(i, absl::OkStatus());
  // Iteration 1: x waits for the list's broadcast, then passes through.
  ASSERT_TRUE(runner.Start(kJob, op("x", 1)).ok());
  ASSERT_TRUE(inner->WaitForStarts(4, 10s));
  ASSERT_EQ(inner->start(3).op.tensor_name, kFusionPlanTensor);
  inner->Complete(3, absl::OkStatus());
  ASSERT_TRUE(inner->WaitForStarts(5, 10s));
  Agree(inner, 4);
  ASSERT_TRUE(inner->WaitForStarts(6, 10s));
  EXPECT_EQ(inner->start(5).op.tensor_name, "x");
  ASSERT_EQ(runner.groups(kJob).size(), 1u);
  // b is the iteration's last fusable tensor: the group is decided, and the launcher thread
  // starts the decision broadcast -- held there -- before the copy in and the fused collective.
  // (Starts on this thread are not held: run here, they would show below as a collective that
  // started.)
  inner->HoldStarts();
  absl::Cleanup release = [inner] { inner->ReleaseStarts(); };  // also when an ASSERT fails
  ASSERT_TRUE(runner.Start(kJob, op("a", 1)).ok());
  ASSERT_TRUE(runner.Start(kJob, op("b", 1)).ok());
  runner.Abort(kJob, "a", 1, absl::CancelledError("the process gave up on a"));
  inner->ReleaseStarts();
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(
        cv.wait_for(lock, 10s, [&] { return results.contains("a1") && results.contains("b1"); }));
    EXPECT_EQ(results["a1"].code(), absl::StatusCode::kCancelled);
    EXPECT_EQ(results["b1"].code(), absl::StatusCode::kCancelled);
    EXPECT_THAT(results["b1"].message(), HasSubstr("gave up on a"));
  }
  // Only the decision broadcast started, on the launcher thread; the fused collective's abort
  // still reached the others.
  ASSERT_EQ(inner->num_starts(), 7u);
  EXPECT_EQ(inner->start(6).op.tensor_name, kFusionDecisionTensor);
  EXPECT_NE(inner->start(6).thread, std::this_thread::get_id());
  const std::vector<FakeCollectiveRunner::AbortCall> aborts = inner->aborts();
  ASSERT_THAT(aborts, SizeIs(1));
  EXPECT_EQ(aborts[0].tensor, FusedName(0));
  runner.Shutdown();
}

// A group in place needs no copy, so the thread that submits its last member starts the
// decision broadcast and the fused collective before Start returns: no hop to the launcher
// thread, which sat 0.2-2.3 ms between the leader's decision and its broadcast at
// BERT-large's start on a busy machine.
TEST(FusingRunnerTest, AGroupInPlaceStartsOnTheSubmittingThread) {
  std::array<float, 3> memory{};  // x, a, b one after another
  FakeLeader leader;
  FusingRunner& runner = *leader.runner;
  FakeCollectiveRunner* inner = leader.inner;
  const auto op = [&](size_t index, uint64_t iteration) {
    return OneFloat(std::string(1, "xab"[index]), iteration, &memory[index]);
  };
  for (size_t t = 0; t < 3; ++t) ASSERT_TRUE(runner.Start(kJob, op(t, 0)).ok());
  for (size_t i = 0; i < 3; ++i) inner->Complete(i, absl::OkStatus());
  ASSERT_TRUE(runner.Start(kJob, op(0, 1)).ok());  // the list's broadcast, then x itself
  ASSERT_EQ(inner->num_starts(), 4u);
  ASSERT_EQ(inner->start(3).op.tensor_name, kFusionPlanTensor);
  inner->Complete(3, absl::OkStatus());
  Agree(inner, 4);
  ASSERT_TRUE(inner->WaitForStarts(6, 10s));
  ASSERT_TRUE(runner.Start(kJob, op(1, 1)).ok());
  ASSERT_EQ(inner->num_starts(), 6u);  // a waits for b
  ASSERT_TRUE(runner.Start(kJob, op(2, 1)).ok());
  // b was the iteration's last fusable tensor: both started on this thread, before its Start
  // returned.
  ASSERT_EQ(inner->num_starts(), 8u);
  EXPECT_EQ(inner->start(6).op.tensor_name, kFusionDecisionTensor);
  EXPECT_EQ(inner->start(6).thread, std::this_thread::get_id());
  EXPECT_EQ(inner->start(7).op.tensor_name, FusedName(0));
  EXPECT_EQ(inner->start(7).thread, std::this_thread::get_id());
  EXPECT_EQ(inner->start(7).op.buffers[0], reinterpret_cast<std::byte*>(&memory[1]));  // in place
  EXPECT_EQ(runner.stats().in_place_operations, 1u);
  runner.Shutdown();
}

// A copied group launched outside Start (here the leader's flush of an expired cycle) runs its
// copy where it is; the next Start, whose group is in place, still starts it on its own thread
// rather than on the launcher.
TEST(FusingRunnerTest, ACopyLaunchedElsewhereDoesNotSendTheNextGroupToTheLauncher) {
  std::map<std::string, std::array<float, 2>> memory;  // a gap after each tensor: copied
  FakeLeader leader;
  FusingRunner& runner = *leader.runner;
  FakeCollectiveRunner* inner = leader.inner;
  const auto op = [&](const std::string& name, uint64_t iteration) {
    return OneFloat(name, iteration, memory[name].data());
  };
  for (const char* name : {"x", "a", "b", "c"}) ASSERT_TRUE(runner.Start(kJob, op(name, 0)).ok());
  for (size_t i = 0; i < 4; ++i) inner->Complete(i, absl::OkStatus());
  ASSERT_TRUE(runner.Start(kJob, op("x", 1)).ok());  // the list's broadcast, then x itself
  ASSERT_EQ(inner->num_starts(), 5u);
  ASSERT_EQ(inner->start(4).op.tensor_name, kFusionPlanTensor);
  inner->Complete(4, absl::OkStatus());
  Agree(inner, 5);
  ASSERT_TRUE(inner->WaitForStarts(7, 10s));
  // a and b wait for c; their cycle ends first, and the flush decides them: copied, started here.
  ASSERT_TRUE(runner.Start(kJob, op("a", 1)).ok());
  ASSERT_TRUE(runner.Start(kJob, op("b", 1)).ok());
  ASSERT_EQ(inner->num_starts(), 7u);
  leader.clock.Advance(1s);
  runner.FlushExpiredGroups();
  ASSERT_EQ(inner->num_starts(), 9u);
  EXPECT_EQ(inner->start(7).op.tensor_name, kFusionDecisionTensor);
  EXPECT_EQ(inner->start(8).op.tensor_name, FusedName(0));
  EXPECT_EQ(runner.stats().in_place_operations, 0u);
  inner->Complete(7, absl::OkStatus());  // the decision broadcast: the next one may go
  // c alone is in place: its decision and collective start on this thread, before Start returns.
  ASSERT_TRUE(runner.Start(kJob, op("c", 1)).ok());
  ASSERT_EQ(inner->num_starts(), 11u);
  EXPECT_EQ(inner->start(9).op.tensor_name, kFusionDecisionTensor);
  EXPECT_EQ(inner->start(9).thread, std::this_thread::get_id());
  EXPECT_EQ(inner->start(10).op.tensor_name, FusedName(1));
  EXPECT_EQ(inner->start(10).thread, std::this_thread::get_id());
  runner.Shutdown();
}

// An operation held until the fusion list arrives and then passed through runs lone as one
// started after the list does: the leader's and a follower's chunking must agree.
TEST(FusingRunnerTest, AnOperationReleasedByTheListRunsLoneAsOneStartedAfterIt) {
  float data[3] = {};
  FakeLeader leader(/*launcher_thread=*/false);
  FakeCollectiveRunner* inner = leader.inner;
  FusingRunner& runner = *leader.runner;
  ASSERT_TRUE(runner.Start(kJob, OneFloat("x", 0, &data[0])).ok());
  ASSERT_TRUE(runner.Start(kJob, OneFloat("x", 1, &data[1])).ok());  // held for the list
  ASSERT_EQ(inner->num_starts(), 2u);
  EXPECT_EQ(inner->start(0).op.tensor_name, "x");
  EXPECT_TRUE(inner->start(0).op.lone);
  EXPECT_EQ(inner->start(1).op.tensor_name, kFusionPlanTensor);
  EXPECT_FALSE(inner->start(1).op.lone);  // the agent's own
  inner->Complete(1, absl::OkStatus());   // the list (empty: x had no partner) arrives
  Agree(inner, 2);
  ASSERT_EQ(inner->num_starts(), 4u);
  EXPECT_EQ(inner->start(3).op.tensor_name, "x");
  EXPECT_EQ(inner->start(3).op.iteration, 1u);
  EXPECT_TRUE(inner->start(3).op.lone);
  ASSERT_TRUE(runner.Start(kJob, OneFloat("x", 2, &data[2])).ok());
  ASSERT_EQ(inner->num_starts(), 5u);
  EXPECT_TRUE(inner->start(4).op.lone);
  runner.Shutdown();
}

// The list's broadcast completes on the leader once sent, and here a node did not get it (it
// gave up waiting: rank 0 came after the op timeout). The worker nodes' sum says so, and fusion
// is off on the leader too, as on that node: a and b, listed (submitted together after x in
// iteration 0), run alone. With every node's 1 they are held for their group.
TEST(FusingRunnerTest, FusionIsOffEverywhereWhenANodeDidNotGetTheList) {
  for (const int64_t sum : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("sum ", sum));
    float data[9] = {};
    FakeLeader leader(/*launcher_thread=*/false);
    FakeCollectiveRunner* inner = leader.inner;
    FusingRunner& runner = *leader.runner;
    const char* names[] = {"x", "a", "b"};
    for (int t = 0; t < 3; ++t)
      ASSERT_TRUE(runner.Start(kJob, OneFloat(names[t], 0, &data[t])).ok());
    for (size_t i = 0; i < 3; ++i) inner->Complete(i, absl::OkStatus());
    ASSERT_TRUE(runner.Start(kJob, OneFloat("x", 1, &data[3])).ok());  // held for the list
    ASSERT_EQ(inner->num_starts(), 4u);
    ASSERT_EQ(inner->start(3).op.tensor_name, kFusionPlanTensor);
    inner->Complete(3, absl::OkStatus());
    ASSERT_EQ(inner->num_starts(), 5u);
    EXPECT_EQ(*reinterpret_cast<const int64_t*>(inner->start(4).op.buffers[0]), 1);  // got it
    Agree(inner, 4, sum);
    ASSERT_EQ(inner->num_starts(), 6u);
    EXPECT_EQ(inner->start(5).op.tensor_name, "x");  // released; not listed
    ASSERT_TRUE(runner.Start(kJob, OneFloat("a", 1, &data[4])).ok());
    if (sum == 1) {
      ASSERT_EQ(inner->num_starts(), 7u);
      EXPECT_EQ(inner->start(6).op.tensor_name, "a");  // alone, at once
      EXPECT_EQ(runner.stats().plans_adopted, 0u);
      EXPECT_THAT(runner.groups(kJob), IsEmpty());
    } else {
      EXPECT_EQ(inner->num_starts(), 6u);  // held: a waits for b
      EXPECT_EQ(runner.stats().plans_adopted, 1u);
      EXPECT_THAT(runner.groups(kJob), SizeIs(1));
    }
    runner.Shutdown();
  }
}

// Which passed-through operations run lone: all-reduces (sum, average) under kLoneFusionBytes;
// not the agent's own control operations, other collectives or larger all-reduces.
TEST(FusingRunnerTest, OnlySmallAllReducesPassedThroughRunLone) {
  std::vector<float> data(kLoneFusionBytes / sizeof(float));
  FakeLeader leader;
  const auto started_lone = [&](dataplane::Operation op) {
    const size_t index = leader.inner->num_starts();
    EXPECT_TRUE(leader.runner->Start(kJob, std::move(op)).ok());
    return leader.inner->start(index).op.lone;
  };
  dataplane::Operation small = OneFloat("small", 0, data.data());
  small.count = 1000;
  EXPECT_TRUE(started_lone(small));
  dataplane::Operation average = small;
  average.tensor_name = "average";
  average.reduction = Reduction::kAverage;
  EXPECT_TRUE(started_lone(average));
  dataplane::Operation largest_lone = small;
  largest_lone.tensor_name = "largest";
  largest_lone.count = kLoneFusionBytes / sizeof(float) - 1;
  EXPECT_TRUE(started_lone(largest_lone));
  dataplane::Operation big = small;
  big.tensor_name = "big";
  big.count = kLoneFusionBytes / sizeof(float);
  EXPECT_FALSE(started_lone(big));
  dataplane::Operation broadcast = small;
  broadcast.tensor_name = "broadcast";
  broadcast.reduction = Reduction::kBroadcast;
  EXPECT_FALSE(started_lone(broadcast));
  dataplane::Operation control = small;
  control.tensor_name = "control";
  control.control = true;
  EXPECT_FALSE(started_lone(control));
}

// A follower of TwoNodeJob over a FakeCollectiveRunner, without the launcher and timer threads,
// that has run iteration 0 of x, a, b and c and been given the list {a, b, c} (one float each):
// a of iteration 1 is held, and the follower's first decision broadcast is started. The test
// plays the leader by writing decisions into the broadcasts it completes (Deliver).
struct FakeFollower {
  FakeFollower() {
    auto fake = std::make_unique<FakeCollectiveRunner>();
    inner = fake.get();
    FusingRunner::Options options;
    options.timer_thread = false;
    options.launcher_thread = false;
    runner = std::make_unique<FusingRunner>(std::move(fake), &clock, options);
    runner->SetJob(TwoNodeJob(/*my_worker_rank=*/1), dataplane::Algorithm::kRing);
    for (const char* name : {"x", "a", "b", "c"}) Start(name, 0);
    for (size_t i = 0; i < 4; ++i) inner->Complete(i, absl::OkStatus());
    Start("a", 1);
    EXPECT_EQ(inner->start(4).op.tensor_name, kFusionPlanTensor);
    FusionGroup group;
    group.members = {{H("a"), 1}, {H("b"), 1}, {H("c"), 1}};
    Deliver(4, EncodeFusionPlan({group}));
    Agree(inner, 5);
    EXPECT_EQ(LastStart().tensor_name, kFusionDecisionTensor);
  }
  ~FakeFollower() { runner->Shutdown(); }

  // Starts `name` of `iteration` on its own float; its status lands in results[name + iteration].
  void Start(const std::string& name, uint64_t iteration) {
    const std::string key = absl::StrCat(name, iteration);
    results.erase(key);
    absl::Status started =
        runner->Start(kJob, OneFloat(name, iteration, &memory[key], [this, key](absl::Status s) {
                        std::lock_guard lock(mu);
                        results[key] = s;
                      }));
    EXPECT_TRUE(started.ok()) << started;
  }
  std::optional<absl::Status> Result(const std::string& key) {
    std::lock_guard lock(mu);
    auto it = results.find(key);
    if (it == results.end()) return std::nullopt;
    return it->second;
  }
  dataplane::Operation LastStart() const { return inner->start(inner->num_starts() - 1).op; }
  // Writes `words` (the rest zero) into every buffer of started broadcast `index` and completes
  // it.
  void Deliver(size_t index, const std::vector<int64_t>& words) {
    const dataplane::Operation op = inner->start(index).op;
    ASSERT_LE(words.size(), op.count);
    for (std::byte* b : op.buffers) {
      int64_t* w = reinterpret_cast<int64_t*>(b);
      std::fill(w, w + op.count, 0);
      std::copy(words.begin(), words.end(), w);
    }
    inner->Complete(index, absl::OkStatus());
  }
  // Delivers decision `index` naming `members` (of iteration 1) into the last started operation,
  // which must be a decision broadcast.
  void DeliverDecision(uint64_t index, const std::vector<std::string>& members) {
    ASSERT_EQ(LastStart().tensor_name, kFusionDecisionTensor);
    FusionDecision d;
    d.index = index;
    for (const std::string& m : members) d.members.push_back({H(m), 1});
    const std::vector<uint64_t> list = {H("a"), H("b"), H("c")};  // the plan's, above
    absl::StatusOr<std::vector<int64_t>> words = EncodeFusionDecision(d, list);
    ASSERT_TRUE(words.ok()) << words.status();
    Deliver(inner->num_starts() - 1, *words);
  }

  std::mutex mu;
  std::map<std::string, absl::Status> results;
  std::map<std::string, float> memory;  // before the runner: it outlives it
  common::FakeClock clock;
  FakeCollectiveRunner* inner = nullptr;
  std::unique_ptr<FusingRunner> runner;
};

// A fused collective that fails here after the leader already decided the retry of its members
// (it failed on the leader first, whose process resubmitted at once): the failure must not take
// the retry's members out of the later decision, or their retry here waits for a decision that
// never comes.
TEST(FusingRunnerTest, AFusedCollectiveFailingAfterItsRetryWasDecidedLeavesTheRetryDecided) {
  FakeFollower f;
  f.Start("b", 1);
  f.DeliverDecision(0, {"a", "b"});  // both here: fused collective 0 runs
  const size_t first = f.inner->num_starts() - 1;
  ASSERT_EQ(f.LastStart().tensor_name, FusedName(0));
  f.Start("c", 1);                        // held: the follower asks for the next decision
  f.DeliverDecision(1, {"a", "b", "c"});  // the leader's retry of a and b, with c
  f.inner->Complete(first, absl::UnavailableError("the plan changed"));
  ASSERT_EQ(f.Result("a1"), absl::UnavailableError("the plan changed"));
  ASSERT_EQ(f.Result("b1"), absl::UnavailableError("the plan changed"));
  f.Start("a", 1);  // the process retries
  f.Start("b", 1);
  const dataplane::Operation retry = f.LastStart();
  EXPECT_EQ(retry.tensor_name, FusedName(1));
  EXPECT_EQ(retry.count, 3u);
  f.inner->Complete(f.inner->num_starts() - 1, absl::OkStatus());
  for (const char* key : {"a1", "b1", "c1"}) EXPECT_EQ(f.Result(key), absl::OkStatus()) << key;
}

// A follower's tensor that waited past the op timeout for a decision fails here, and the
// follower goes on asking for decisions until one names it, which then fails that fused
// collective for the other nodes too (an abort, not their own deadline).
TEST(FusingRunnerTest, AFollowersTensorPastTheDeadlineFailsItsCollectiveForTheOthers) {
  FakeFollower f;
  f.clock.Advance(TwoNodeJob(1).op_timeout + 1ms);
  f.runner->Tick();
  ASSERT_TRUE(f.Result("a1").has_value());
  EXPECT_EQ(f.Result("a1")->code(), absl::StatusCode::kDeadlineExceeded);
  f.DeliverDecision(0, {"b"});  // a decision that does not name it
  f.DeliverDecision(1, {"a"});  // so the follower has asked again
  const std::vector<FakeCollectiveRunner::AbortCall> aborts = f.inner->aborts();
  ASSERT_THAT(aborts, SizeIs(1));
  EXPECT_EQ(aborts[0].tensor, FusedName(1));
  EXPECT_EQ(aborts[0].reason.code(), absl::StatusCode::kDeadlineExceeded);
}

// A second submission of a tensor the runner already holds or runs fused fails at once with
// ALREADY_EXISTS (passed through, it would wait out the deadline under its own name).
TEST(FusingRunnerTest, ASecondSubmissionOfAHeldOrFusedTensorIsAlreadyExists) {
  FakeFollower f;
  float again = 0;
  std::optional<absl::Status> second;
  const auto submit_again = [&](const std::string& name) {
    second.reset();
    ASSERT_TRUE(
        f.runner->Start(kJob, OneFloat(name, 1, &again, [&](absl::Status s) { second = s; })).ok());
  };
  submit_again("a");  // held for a decision
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(second->message(), HasSubstr("held for a fusion decision"));
  f.Start("b", 1);
  f.DeliverDecision(0, {"a", "b"});
  ASSERT_EQ(f.LastStart().tensor_name, FusedName(0));
  submit_again("b");  // running fused
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(second->message(), HasSubstr("already running in a fused collective"));
  EXPECT_EQ(f.Result("a1"), std::nullopt);  // the first submissions are untouched
}

// A listed tensor submitted with another count (a dynamic shape) runs unfused: an abort of it
// goes to the inner runner, which has it, and makes no decision.
TEST(FusingRunnerTest, AnAbortOfAListedTensorPassedThroughWithAnotherCountReachesTheInnerRunner) {
  FakeFollower f;
  std::array<float, 2> two = {1, 2};
  dataplane::Operation op = OneFloat("b", 1, two.data());
  op.count = 2;
  const size_t before = f.inner->num_starts();
  ASSERT_TRUE(f.runner->Start(kJob, std::move(op)).ok());
  ASSERT_EQ(f.inner->num_starts(), before + 1);
  EXPECT_EQ(f.LastStart().tensor_name, "b");
  f.runner->Abort(kJob, "b", 1, absl::CancelledError("staging failed"));
  const std::vector<FakeCollectiveRunner::AbortCall> aborts = f.inner->aborts();
  ASSERT_THAT(aborts, SizeIs(1));
  EXPECT_EQ(aborts[0].tensor, "b");
  EXPECT_EQ(aborts[0].iteration, 1u);
  f.inner->Complete(before, absl::CancelledError("staging failed"));
}

}  // namespace
}  // namespace tributary::agent
