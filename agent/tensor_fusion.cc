#include "agent/tensor_fusion.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <deque>
#include <limits>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/buffer_pool.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/metrics/metrics.h"
#include "common/thread_name.h"
#include "common/trace.h"

namespace tributary::agent {
namespace {

constexpr auto Log = common::ComponentLog<"agent">;

constexpr int64_t kPlanMagic = 0x4e4f495355465254;  // "TRFUSION"
constexpr int64_t kPlanVersion = 1;

bool IsAllReduce(dataplane::Reduction r) {
  return r == dataplane::Reduction::kSum || r == dataplane::Reduction::kAverage;
}

}  // namespace

std::chrono::microseconds ResolveFusionCycle(std::span<const ObservedOp> observed,
                                             std::chrono::microseconds cycle) {
  if (cycle.count() > 0) return cycle;
  std::vector<double> seconds;
  for (const ObservedOp& op : observed) {
    if (op.eligible && op.seconds) seconds.push_back(*op.seconds);
  }
  if (seconds.empty()) return kMinFusionCycle;
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  const auto median =
      std::chrono::microseconds(static_cast<int64_t>(seconds[seconds.size() / 2] * 1e6));
  return std::clamp(median, kMinFusionCycle, kMaxFusionCycle);
}

std::vector<FusionGroup> PlanFusionGroups(std::span<const ObservedOp> observed,
                                          uint64_t fusion_bytes, std::chrono::microseconds cycle) {
  cycle = ResolveFusionCycle(observed, cycle);
  std::unordered_map<uint64_t, int> seen;
  for (const ObservedOp& op : observed) seen[op.name_hash]++;

  std::vector<FusionGroup> groups;
  FusionGroup current;
  uint64_t bytes = 0;
  common::Clock::TimePoint first{};
  uint64_t first_done = std::numeric_limits<uint64_t>::max();
  const auto close = [&] {
    if (current.members.size() >= 2) groups.push_back(std::move(current));
    current = FusionGroup{};
    bytes = 0;
    first_done = std::numeric_limits<uint64_t>::max();
  };
  for (const ObservedOp& op : observed) {
    if (!op.eligible || !IsAllReduce(op.reduction) || seen[op.name_hash] > 1) continue;
    const uint64_t op_bytes = op.count * common::DataTypeSize(op.dtype);
    if (op_bytes == 0 || op_bytes >= fusion_bytes) continue;
    const bool fits = !current.members.empty() && current.dtype == op.dtype &&
                      current.reduction == op.reduction && bytes + op_bytes <= fusion_bytes &&
                      op.started - first <= cycle && op.start_seq < first_done;
    if (!fits) {
      close();
      current.dtype = op.dtype;
      current.reduction = op.reduction;
      first = op.started;
    }
    current.members.push_back({op.name_hash, op.count});
    bytes += op_bytes;
    if (op.done_seq) first_done = std::min(first_done, *op.done_seq);
  }
  close();
  return groups;
}

std::vector<int64_t> EncodeFusionPlan(const std::vector<FusionGroup>& groups) {
  std::vector<int64_t> words(kFusionPlanWords, 0);
  words[0] = kPlanMagic;
  words[1] = kPlanVersion;
  size_t at = 3;
  int64_t written = 0;
  for (const FusionGroup& g : groups) {
    const size_t need = 3 + 2 * g.members.size();
    if (at + need > words.size()) break;
    words[at++] = static_cast<int64_t>(g.dtype);
    words[at++] = static_cast<int64_t>(g.reduction);
    words[at++] = static_cast<int64_t>(g.members.size());
    for (const FusionMember& m : g.members) {
      words[at++] = static_cast<int64_t>(m.name_hash);
      words[at++] = static_cast<int64_t>(m.count);
    }
    ++written;
  }
  words[2] = written;
  return words;
}

absl::StatusOr<std::vector<FusionGroup>> DecodeFusionPlan(std::span<const int64_t> words) {
  const auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("malformed fusion plan: ", what));
  };
  if (words.size() < 3) return bad("shorter than its header");
  if (words[0] != kPlanMagic) return bad("wrong magic");
  if (words[2] < 0) return bad("negative group count");
  if (words[1] != kPlanVersion) return bad(absl::StrCat("version ", words[1], ", expected 1"));
  std::vector<FusionGroup> groups;
  std::unordered_set<uint64_t> hashes;
  size_t at = 3;
  for (int64_t g = 0; g < words[2]; ++g) {
    if (at + 3 > words.size()) return bad(absl::StrCat("group ", g, " past the end"));
    FusionGroup group;
    const int64_t dtype = words[at++];
    const int64_t reduction = words[at++];
    const int64_t members = words[at++];
    if (dtype < 0 || dtype > 255 || !common::IsValidDataType(static_cast<uint32_t>(dtype))) {
      return bad(absl::StrCat("group ", g, " has unknown dtype ", dtype));
    }
    if (reduction != static_cast<int64_t>(dataplane::Reduction::kSum) &&
        reduction != static_cast<int64_t>(dataplane::Reduction::kAverage)) {
      return bad(absl::StrCat("group ", g, " is not a sum or average (", reduction, ")"));
    }
    if (members < 2 || static_cast<uint64_t>(members) > (words.size() - at) / 2) {
      return bad(absl::StrCat("group ", g, " has ", members, " members"));
    }
    group.dtype = static_cast<common::DataType>(dtype);
    group.reduction = static_cast<dataplane::Reduction>(reduction);
    for (int64_t m = 0; m < members; ++m) {
      const auto hash = static_cast<uint64_t>(words[at++]);
      const int64_t count = words[at++];
      if (count <= 0 || count > (int64_t{1} << 40)) {
        return bad(absl::StrCat("group ", g, " member ", m, " has ", count, " elements"));
      }
      if (!hashes.insert(hash).second) {
        return bad(absl::StrCat("group ", g, " member ", m, " is in the plan twice"));
      }
      group.members.push_back({hash, static_cast<uint64_t>(count)});
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

// "DECISIO2": the bitmap form (session 38; "DECISION" was a hash and an iteration per member).
constexpr int64_t kDecisionMagic = 0x324f495349434544;

FusableList::FusableList(std::vector<uint64_t> hashes) : hashes_(std::move(hashes)) {
  positions_.reserve(hashes_.size());
  for (size_t i = 0; i < hashes_.size(); ++i) positions_.emplace(hashes_[i], i);
}

std::optional<size_t> FusableList::position(uint64_t hash) const {
  auto it = positions_.find(hash);
  if (it == positions_.end()) return std::nullopt;
  return it->second;
}

void CanonicalMemberOrder(std::vector<FusionDecision::Member>& members, const FusableList& list) {
  // Each member's list position looked up once, not in every comparison (a group of BERT-large's
  // 243 tensors took ~4,000 hash lookups, on the leader's path from its last tensor to the
  // decision).
  std::vector<std::pair<std::pair<uint64_t, size_t>, FusionDecision::Member>> keyed;
  keyed.reserve(members.size());
  for (const FusionDecision::Member& m : members) {
    keyed.push_back({{m.iteration, list.position(m.name_hash).value_or(list.size())}, m});
  }
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  for (size_t i = 0; i < keyed.size(); ++i) members[i] = keyed[i].second;
}

absl::StatusOr<std::vector<int64_t>> EncodeFusionDecision(const FusionDecision& d,
                                                          const FusableList& list) {
  const size_t bitmap_words = (list.size() + 63) / 64;
  // Iteration -> its bitmap.
  std::map<uint64_t, std::vector<uint64_t>> blocks;
  for (const FusionDecision::Member& m : d.members) {
    const std::optional<size_t> at = list.position(m.name_hash);
    if (!at) {
      return absl::InvalidArgumentError(absl::StrCat("fusion decision ", d.index, ": member ",
                                                     m.name_hash, " is not on the fusable list"));
    }
    if (m.iteration > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("fusion decision ", d.index, ": iteration ", m.iteration, " out of range"));
    }
    std::vector<uint64_t>& bits = blocks[m.iteration];
    bits.resize(bitmap_words, 0);
    const uint64_t bit = uint64_t{1} << (*at % 64);
    if ((bits[*at / 64] & bit) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("fusion decision ", d.index, ": member ",
                                                     m.name_hash, " iteration ", m.iteration,
                                                     " twice"));
    }
    bits[*at / 64] |= bit;
  }
  if (blocks.empty() || blocks.size() > kMaxDecisionIterations ||
      d.members.size() > kMaxGroupMembers) {
    return absl::InvalidArgumentError(absl::StrCat("fusion decision ", d.index, ": ",
                                                   d.members.size(), " members in ", blocks.size(),
                                                   " iterations"));
  }
  std::vector<int64_t> words;
  words.reserve(FusionDecisionWords(blocks.size(), list.size()));
  words.push_back(kDecisionMagic);
  words.push_back(static_cast<int64_t>(d.index));
  words.push_back(static_cast<int64_t>(d.dtype));
  words.push_back(static_cast<int64_t>(d.reduction) | (int64_t{d.lone} << kFusionDecisionLoneBit));
  words.push_back(static_cast<int64_t>(blocks.size()));
  for (const auto& [iteration, bits] : blocks) {
    words.push_back(static_cast<int64_t>(iteration));
    for (uint64_t w : bits) words.push_back(static_cast<int64_t>(w));
  }
  return words;
}

absl::StatusOr<FusionDecision> DecodeFusionDecision(std::span<const int64_t> words,
                                                    const FusableList& list) {
  const auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("malformed fusion decision: ", what));
  };
  if (words.size() < kFusionDecisionHeaderWords) return bad("shorter than its header");
  if (words[0] != kDecisionMagic) return bad("wrong magic");
  FusionDecision d;
  if (words[1] < 0) return bad("negative index");
  d.index = static_cast<uint64_t>(words[1]);
  if (words[2] < 0 || words[2] > 255 || !common::IsValidDataType(static_cast<uint32_t>(words[2]))) {
    return bad(absl::StrCat("unknown dtype ", words[2]));
  }
  d.dtype = static_cast<common::DataType>(words[2]);
  const int64_t lone = int64_t{1} << kFusionDecisionLoneBit;
  const int64_t reduction = words[3] & ~lone;
  if (reduction != static_cast<int64_t>(dataplane::Reduction::kSum) &&
      reduction != static_cast<int64_t>(dataplane::Reduction::kAverage)) {
    return bad(absl::StrCat("not a sum or average (", words[3], ")"));
  }
  d.reduction = static_cast<dataplane::Reduction>(reduction);
  d.lone = (words[3] & lone) != 0;
  const int64_t blocks = words[4];
  if (blocks < 1 || static_cast<uint64_t>(blocks) > kMaxDecisionIterations) {
    return bad(absl::StrCat(blocks, " iterations"));
  }
  const size_t bitmap_words = (list.size() + 63) / 64;
  if (FusionDecisionWords(static_cast<size_t>(blocks), list.size()) > words.size()) {
    return bad(absl::StrCat(blocks, " iterations, past the end of the broadcast"));
  }
  size_t at = kFusionDecisionHeaderWords;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t iteration = words[at++];
    if (iteration < 0 ||
        (!d.members.empty() && static_cast<uint64_t>(iteration) <= d.members.back().iteration)) {
      return bad(absl::StrCat("iteration ", iteration, " out of order"));
    }
    const size_t before = d.members.size();
    for (size_t w = 0; w < bitmap_words; ++w) {
      uint64_t bits = static_cast<uint64_t>(words[at++]);
      while (bits != 0) {
        const size_t position = w * 64 + static_cast<size_t>(std::countr_zero(bits));
        bits &= bits - 1;
        if (position >= list.size()) {
          return bad(absl::StrCat("member ", position, " past the list's ", list.size()));
        }
        if (d.members.size() == kMaxGroupMembers) {
          return bad(absl::StrCat("more than ", kMaxGroupMembers, " members"));
        }
        d.members.push_back({list.hash(position), static_cast<uint64_t>(iteration)});
      }
    }
    if (d.members.size() == before) return bad(absl::StrCat("iteration ", iteration, " empty"));
  }
  return d;
}

DecodedFusionDecisions DecodeFusionDecisions(std::span<const int64_t> words,
                                             uint64_t first_at_least, const FusableList& list) {
  DecodedFusionDecisions out;
  std::vector<FusionDecision>& ds = out.decisions;
  for (size_t at = 0; at < words.size();) {
    if (words[at] == 0) break;  // no more decisions in this broadcast
    absl::StatusOr<FusionDecision> d = DecodeFusionDecision(words.subspan(at), list);
    if (!d.ok()) {
      out.error = d.status();
      return out;
    }
    if (ds.empty() ? d->index < first_at_least : d->index != ds.back().index + 1) {
      out.error = absl::InvalidArgumentError(
          absl::StrCat("malformed fusion decisions: decision ", d->index, " where ",
                       ds.empty() ? absl::StrCat(first_at_least, " or later")
                                  : absl::StrCat(ds.back().index + 1),
                       " was expected"));
      return out;
    }
    at += FusionDecisionWords(static_cast<size_t>(words[at + 4]), list.size());
    ds.push_back(*std::move(d));
  }
  if (ds.empty()) out.error = absl::InvalidArgumentError("malformed fusion decisions: none");
  return out;
}

size_t FusionDecisionBroadcastWords(size_t fusable) {
  const size_t widest = FusionDecisionWords(kMaxDecisionIterations, fusable);
  return std::max<size_t>((widest + 63) / 64 * 64, 64);
}

std::string FusedName(uint64_t index) {
  return absl::StrCat(kFusedTensorPrefix, index % kFusedNames);
}

// --- FusingRunner ---

namespace {

using Key = std::pair<uint64_t, uint64_t>;  // (name hash, iteration)

struct Fusable {
  uint64_t count = 0;
  common::DataType dtype = common::DataType::kFloat32;
  dataplane::Reduction reduction = dataplane::Reduction::kSum;
};

struct Held {
  dataplane::Operation op;
  common::Clock::TimePoint since;
  common::Trace::TimePoint arrived = std::chrono::steady_clock::now();  // for the trace
};

struct AbortedWaiting {
  std::string tensor;
  uint64_t iteration;
  absl::Status reason;
};

struct FusedState;

// One decision's fused collective on this node.
struct Fused {
  FusionDecision decision;
  uint64_t bytes = 0;                                    // the members' (per process)
  std::vector<std::optional<dataplane::Operation>> ops;  // by member position
  size_t present = 0;
  common::Clock::TimePoint since{};
  bool launched = false;
  std::shared_ptr<FusedState> state;  // once launched
  // For the trace: when its first and last members came to this node, and the decision.
  std::optional<common::Trace::TimePoint> first_member, last_member;
  common::Trace::TimePoint adopted{};
  void MemberArrived(common::Trace::TimePoint t) {
    first_member = first_member ? std::min(*first_member, t) : t;
    last_member = last_member ? std::max(*last_member, t) : t;
  }
};

// What a running fused operation keeps alive: its buffers and its members.
struct FusedState {
  // One per local process; empty when the collective runs in place on its members' buffers.
  std::vector<std::shared_ptr<std::byte[]>> storage;  // from common::BufferPool::Process()
  std::vector<dataplane::Operation> members;
  std::vector<uint64_t> offsets;  // elements
  size_t element = 0;
  // Launched under mu_, started on the inner runner later (FusingRunner::Options::
  // launcher_thread): a failure in between is kept here, and the start then fails the members
  // with it instead. Guarded by mu_.
  std::optional<absl::Status> aborted;
  bool started = false;
  bool in_place() const { return storage.empty(); }
  // Copies the members' inputs into the storage, or (after the collective) its result back.
  void CopyIn() {
    EachMember(
        [](std::byte* slice, std::byte* member, size_t n) { std::memcpy(slice, member, n); });
  }
  void CopyOut() {
    EachMember(
        [](std::byte* slice, std::byte* member, size_t n) { std::memcpy(member, slice, n); });
  }

 private:
  // f(storage slice, member buffer, bytes) for every member and local process.
  template <typename F>
  void EachMember(F f) {
    for (size_t m = 0; m < members.size(); ++m) {
      for (size_t p = 0; p < members[m].buffers.size(); ++p) {
        f(storage[p].get() + offsets[m] * element, members[m].buffers[p],
          members[m].count * element);
      }
    }
  }
};

// Whether every process's buffers of `ops` (in this order) follow one another without a gap,
// as a process that keeps its gradients in one buffer (DDP's bucket views, the bench's
// workloads) submits them: then the fused collective runs on them in place, with no copy in and
// none out.
bool Adjacent(const std::vector<std::optional<dataplane::Operation>>& ops, size_t element) {
  for (size_t m = 1; m < ops.size(); ++m) {
    for (size_t p = 0; p < ops[m]->buffers.size(); ++p) {
      if (ops[m]->buffers[p] != ops[m - 1]->buffers[p] + ops[m - 1]->count * element) {
        return false;
      }
    }
  }
  return true;
}

enum class PlanState { kLearning, kPosted, kReady, kOff };

uint64_t OperationBytes(const dataplane::Operation& op) {
  return op.count * common::DataTypeSize(op.dtype);
}

struct InFused {
  uint64_t index = 0;   // the decision's
  size_t position = 0;  // the member's in it
};

std::shared_ptr<std::vector<std::vector<int64_t>>> WordBuffers(uint32_t procs, size_t words) {
  return std::make_shared<std::vector<std::vector<int64_t>>>(std::max<uint32_t>(1, procs),
                                                             std::vector<int64_t>(words, 0));
}

// A broadcast of int64 words from worker rank 0's first buffer into every buffer of every node.
dataplane::Operation WordBroadcast(const std::string& tensor, uint64_t iteration,
                                   std::shared_ptr<std::vector<std::vector<int64_t>>> buffers) {
  dataplane::Operation op;
  op.tensor_name = tensor;
  op.iteration = iteration;
  op.dtype = common::DataType::kInt64;
  op.count = (*buffers)[0].size();
  op.reduction = dataplane::Reduction::kBroadcast;
  op.root_node = 0;
  op.root_local = 0;
  for (auto& b : *buffers) op.buffers.push_back(reinterpret_cast<std::byte*>(b.data()));
  op.priority = std::numeric_limits<int32_t>::min();
  op.keepalive = std::move(buffers);
  op.control = true;
  return op;
}

// A sum of int64 words over every buffer of every worker node.
dataplane::Operation WordSum(const std::string& tensor, uint64_t iteration,
                             std::shared_ptr<std::vector<std::vector<int64_t>>> buffers) {
  dataplane::Operation op = WordBroadcast(tensor, iteration, std::move(buffers));
  op.reduction = dataplane::Reduction::kSum;
  return op;
}

}  // namespace

bool IsLonePassThrough(const dataplane::Operation& op) {
  const uint64_t bytes = OperationBytes(op);
  return !op.control && IsAllReduce(op.reduction) && bytes > 0 && bytes < kLoneFusionBytes;
}

struct FusingRunner::Job {
  dataplane::JobView view;
  bool enabled = false;
  bool leader = false;
  PlanState state = PlanState::kLearning;
  std::string first_tensor;
  std::vector<ObservedOp> observed;  // the leader's first iteration
  std::chrono::microseconds cycle{0};
  std::vector<FusionGroup> groups;  // the fusable-tensor list
  std::unordered_map<uint64_t, Fusable> fusable;
  FusableList list;  // the fusable tensors, in the list's order
  // The list as this node got it (or why not), until every worker node agreed (OnAgreement).
  std::optional<absl::StatusOr<std::vector<FusionGroup>>> received;
  std::vector<Held> waiting;  // iteration >= kFirstFusedIteration, before the list arrived
  std::vector<AbortedWaiting> aborted_waiting;  // aborted while waiting; handled with the list
  std::map<Key, Held> undecided;                // fusable, in no decision yet
  // The leader's open group.
  std::vector<Key> open;
  std::set<uint64_t> open_iterations;  // of its members
  uint64_t open_bytes = 0;
  common::Clock::TimePoint open_since{};
  common::DataType open_dtype = common::DataType::kFloat32;
  dataplane::Reduction open_reduction = dataplane::Reduction::kSum;
  // Leader: per iteration, its fusable tensors held here so far (the last few iterations).
  std::map<uint64_t, size_t> arrived;
  uint64_t next_decision = 0;  // leader: the next to make; follower: the next to adopt
  uint64_t next_batch = 0;     // the next decision broadcast (its iteration)
  size_t decision_words = 0;   // of each decision broadcast (FusionDecisionBroadcastWords)
  bool batch_posted = false;   // one of this node's decision broadcasts is running
  // Leader: made, in no broadcast yet (index, encoded).
  std::deque<std::pair<uint64_t, std::vector<int64_t>>> unsent;
  std::map<uint64_t, Fused> fused;
  // Member -> its decision's index and its position there, until the decision completes.
  std::map<Key, InFused> in_fused;
  std::map<Key, absl::Status> failed;  // members of failed decisions not submitted yet
  // A follower's operations failed here before a decision named them: it keeps asking for
  // decisions until one does, so that the others learn of the failure.
  std::set<Key> failed_undecided;
  // Bytes of the operations passed through to the inner runner and not complete yet (leader).
  uint64_t passing_bytes = 0;
  // Operations of a listed tensor passed through because their count, dtype or reduction is
  // not the listed one (a dynamic shape), until they complete: an abort of one goes to the
  // inner runner, which has it, not to a decision.
  std::set<Key> passed_listed;
};

namespace {

// Forgets that `key` is a member of decision `index`. A retry of the member may already be in a
// later decision (a fused collective that failed on the leader is retried and decided again
// while it still runs here): that entry stays.
void EraseInFused(std::map<Key, InFused>& in_fused, const Key& key, uint64_t index) {
  if (auto in = in_fused.find(key); in != in_fused.end() && in->second.index == index) {
    in_fused.erase(in);
  }
}

}  // namespace

FusingRunner::FusingRunner(std::unique_ptr<CollectiveRunner> inner, const common::Clock* clock,
                           Options options)
    : clock_(clock), use_launcher_(options.launcher_thread), inner_(std::move(inner)) {
  if (options.timer_thread) timer_ = std::thread([this] { TimerLoop(); });
  if (use_launcher_) launcher_ = std::thread([this] { LauncherLoop(); });
}

FusingRunner::~FusingRunner() {
  bool shut_down;
  {
    std::lock_guard lock(mu_);
    shut_down = shut_down_;
  }
  if (!shut_down) Shutdown();  // every held operation completes
}

absl::Status FusingRunner::StartPassedThrough(const std::string& job_id, dataplane::Operation op) {
  if (IsLonePassThrough(op)) op.lone = true;
  return inner_->Start(job_id, std::move(op));
}

void FusingRunner::StartLater(const std::string& job_id, dataplane::Operation op, After& after) {
  after.push_back([this, job_id, op = std::move(op)]() mutable {
    std::function<void(absl::Status)> done = op.done;
    absl::Status started = inner_->Start(job_id, std::move(op));
    if (!started.ok()) done(started);  // Start refused it: its done is ours to run
  });
}

void FusingRunner::Run(After& after) {
  for (auto& f : after) f();
  after.clear();
}

void FusingRunner::Launch(After& after) {
  if (after.empty()) return;
  bool queued = false;
  {
    std::lock_guard lock(launch_mu_);
    if (use_launcher_ && !launcher_stop_) {  // else none, or stopped: run it here
      launches_.push_back(std::move(after));
      queued = true;
    }
  }
  if (!queued) {
    Run(after);
    return;
  }
  after.clear();
  launch_cv_.notify_one();
}

void FusingRunner::LauncherLoop() {
  common::SetCurrentThreadName("trib-launch");
  std::unique_lock lock(launch_mu_);
  while (true) {
    launch_cv_.wait(lock, [&] { return launcher_stop_ || !launches_.empty(); });
    if (launches_.empty()) return;  // stopping, and everything queued has run
    After after = std::move(launches_.front());
    launches_.pop_front();
    lock.unlock();
    Run(after);
    lock.lock();
  }
}

FusingRunner::Stats FusingRunner::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

std::shared_ptr<prometheus::Collectable> FusingRunner::stats_collector() {
  return std::make_shared<common::metrics::FunctionCollector>([this] {
    using common::metrics::AddSample;
    using common::metrics::MakeFamily;
    const Stats s = stats();
    std::vector<prometheus::MetricFamily> out;
    out.push_back(MakeFamily("tributary_agent_fusion_operations_total",
                             "Fused collectives started (tensor fusion).",
                             prometheus::MetricType::Counter));
    AddSample(out.back(), static_cast<double>(s.fused_operations));
    out.push_back(MakeFamily("tributary_agent_fusion_lone_operations_total",
                             "Fused collectives started lone: decided with little else of the "
                             "job in flight, and cut finer by push/pull.",
                             prometheus::MetricType::Counter));
    AddSample(out.back(), static_cast<double>(s.lone_operations));
    out.push_back(MakeFamily("tributary_agent_fusion_in_place_operations_total",
                             "Fused collectives run in place on their tensors' buffers (adjacent "
                             "in every process's buffer), with no copy in or out.",
                             prometheus::MetricType::Counter));
    AddSample(out.back(), static_cast<double>(s.in_place_operations));
    out.push_back(MakeFamily("tributary_agent_fusion_tensors_total",
                             "Tensors that ran inside a fused collective.",
                             prometheus::MetricType::Counter));
    AddSample(out.back(), static_cast<double>(s.fused_tensors));
    out.push_back(MakeFamily("tributary_agent_fusion_decisions_total",
                             "Fusion decisions made (worker rank 0) or received (other nodes).",
                             prometheus::MetricType::Counter));
    AddSample(out.back(), static_cast<double>(s.decisions));
    out.push_back(MakeFamily("tributary_agent_fusion_lists_total",
                             "Fusable-tensor lists adopted (one per job and membership "
                             "generation).",
                             prometheus::MetricType::Counter));
    AddSample(out.back(), static_cast<double>(s.plans_adopted));
    return out;
  });
}

FusingRunner::Job* FusingRunner::FindJobLocked(const std::string& job_id, uint64_t generation) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second->view.generation != generation) return nullptr;
  return it->second.get();
}

std::vector<FusionGroup> FusingRunner::groups(const std::string& job_id) const {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? std::vector<FusionGroup>{} : it->second->groups;
}

void FusingRunner::SetJob(const dataplane::JobView& view, dataplane::Algorithm algorithm) {
  After after;
  {
    std::lock_guard lock(mu_);
    std::unique_ptr<Job>& job = jobs_[view.job_id];
    if (job && (job->view.generation != view.generation ||
                job->view.my_worker_rank != view.my_worker_rank ||
                job->view.num_workers() != view.num_workers())) {
      ResetLocked(*job,
                  absl::UnavailableError(absl::StrCat(
                      "job ", view.job_id,
                      "'s membership changed while this collective waited to be fused; retry")),
                  after);
      job.reset();
    }
    if (!job) job = std::make_unique<Job>();
    job->view = view;
    job->enabled = view.fusion_bytes > 0 && view.my_worker_rank >= 0 && !view.async_mode;
    job->leader = view.my_worker_rank == 0;
  }
  inner_->SetJob(view, algorithm);
  Run(after);
}

void FusingRunner::RemoveJob(const std::string& job_id) {
  After after;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(job_id);
    if (it != jobs_.end()) {
      ResetLocked(*it->second,
                  absl::FailedPreconditionError(
                      absl::StrCat("job ", job_id, " is no longer planned on this node")),
                  after);
      jobs_.erase(it);
    }
  }
  inner_->RemoveJob(job_id);
  Run(after);
}

void FusingRunner::ResetLocked(Job& job, const absl::Status& reason, After& after) {
  const auto fail = [&](dataplane::Operation& op) {
    after.push_back([done = std::move(op.done), reason] { done(reason); });
  };
  for (Held& w : job.waiting) fail(w.op);
  job.waiting.clear();
  job.aborted_waiting.clear();
  for (auto& [key, held] : job.undecided) fail(held.op);
  job.undecided.clear();
  job.open.clear();
  job.open_iterations.clear();
  job.arrived.clear();
  for (auto& [index, f] : job.fused) {
    if (f.launched) {
      // The inner runner fails it, or, not started there yet, its start does.
      if (!f.state->started) f.state->aborted = reason;
      continue;
    }
    for (auto& op : f.ops) {
      if (op) fail(*op);
    }
  }
  std::erase_if(job.fused, [](const auto& kv) { return !kv.second.launched; });
  std::erase_if(job.in_fused, [&](const auto& kv) { return !job.fused.contains(kv.second.index); });
  job.failed.clear();
  job.failed_undecided.clear();
}

absl::Status FusingRunner::Start(const std::string& job_id, dataplane::Operation op) {
  After after;
  bool taken = false;
  bool counted = false;
  uint64_t generation = 0;
  uint64_t bytes = 0;
  bool copy_in = false;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(job_id);
    if (!shut_down_ && it != jobs_.end() && it->second->enabled) {
      // Only this call's copies count: the other paths that launch (decisions, the timer's
      // flush, aborts) run their copies where they are and leave the flag behind.
      copy_in_queued_ = false;
      StartLocked(job_id, *it->second, op, taken, after);
      copy_in = copy_in_queued_;
      if (!taken && it->second->leader) {
        bytes = CountPassingLocked(job_id, *it->second, op);
        counted = true;
        generation = it->second->view.generation;
      }
    }
  }
  // A copy into a fused buffer goes to the launcher thread (with what was queued before it), so
  // that this thread takes the next tensor at once. Without one -- decision broadcasts, fused
  // collectives in place -- it all runs here: a hop to the launcher cost the leader's decision
  // 0.2-2.3 ms at BERT-large's start on a busy machine.
  if (copy_in) {
    Launch(after);
  } else {
    Run(after);
  }
  if (taken) return absl::OkStatus();
  const Key key{common::StableHash64(op.tensor_name), op.iteration};
  absl::Status started = StartPassedThrough(job_id, std::move(op));
  if (!started.ok()) {  // no done runs
    if (counted) PassedThroughDone(job_id, generation, bytes);
    std::lock_guard lock(mu_);
    if (auto it = jobs_.find(job_id); it != jobs_.end()) it->second->passed_listed.erase(key);
  }
  return started;
}

uint64_t FusingRunner::CountPassingLocked(const std::string& job_id, Job& job,
                                          dataplane::Operation& op) {
  const uint64_t bytes = OperationBytes(op);
  job.passing_bytes += bytes;
  op.done = [this, job_id, generation = job.view.generation, bytes,
             done = std::move(op.done)](absl::Status s) {
    PassedThroughDone(job_id, generation, bytes);
    if (done) done(std::move(s));
  };
  return bytes;
}

void FusingRunner::PassedThroughDone(const std::string& job_id, uint64_t generation,
                                     uint64_t bytes) {
  std::lock_guard lock(mu_);
  if (Job* job = FindJobLocked(job_id, generation); job != nullptr) {
    job->passing_bytes -= std::min(job->passing_bytes, bytes);
  }
}

void FusingRunner::StartLocked(const std::string& job_id, Job& job, dataplane::Operation& op,
                               bool& taken, After& after) {
  taken = false;
  if (op.iteration >= 1 && job.state == PlanState::kLearning) PostPlanLocked(job_id, job, after);
  if (job.state == PlanState::kLearning) {
    if (job.first_tensor.empty()) job.first_tensor = op.tensor_name;
    if (!job.leader) return;
    ObservedOp o;
    o.name_hash = common::StableHash64(op.tensor_name);
    o.count = op.count;
    o.dtype = op.dtype;
    o.reduction = op.reduction;
    o.eligible = IsAllReduce(op.reduction) && op.staged == nullptr &&
                 op.tensor_name != job.first_tensor &&
                 !absl::StartsWith(op.tensor_name, kReservedTensorPrefix);
    o.started = clock_->Now();
    o.start_seq = ++seq_;
    const size_t index = job.observed.size();
    job.observed.push_back(o);
    // Its completion tells the list whether the process waited for it before going on.
    op.done = [this, job_id, generation = job.view.generation, index,
               done = std::move(op.done)](absl::Status s) {
      {
        std::lock_guard lock(mu_);
        Job* job = FindJobLocked(job_id, generation);
        if (job != nullptr && index < job->observed.size()) {
          ObservedOp& o = job->observed[index];
          o.done_seq = ++seq_;
          o.seconds = std::chrono::duration<double>(clock_->Now() - o.started).count();
        }
      }
      done(std::move(s));
    };
    return;
  }
  if (op.iteration < kFirstFusedIteration || job.state == PlanState::kOff) return;
  if (job.state == PlanState::kPosted) {
    job.waiting.push_back({std::move(op), clock_->Now()});
    taken = true;
    return;
  }
  const uint64_t hash = common::StableHash64(op.tensor_name);
  auto f = job.fusable.find(hash);
  // Anything else runs as it is -- on every node alike, as the test reads only the list and
  // the operation's own count, dtype and reduction.
  if (f == job.fusable.end()) return;
  const Key key{hash, op.iteration};
  if (f->second.count != op.count || f->second.dtype != op.dtype ||
      f->second.reduction != op.reduction) {
    job.passed_listed.insert(key);
    op.done = [this, job_id, generation = job.view.generation, key,
               done = std::move(op.done)](absl::Status s) {
      {
        std::lock_guard lock(mu_);
        if (Job* job = FindJobLocked(job_id, generation); job != nullptr) {
          job->passed_listed.erase(key);
        }
      }
      if (done) done(std::move(s));
    };
    return;
  }
  if (auto failed = job.failed.find(key); failed != job.failed.end()) {
    after.push_back([done = std::move(op.done), s = failed->second] { done(s); });
    job.failed.erase(failed);
    taken = true;
    return;
  }
  if (auto in = job.in_fused.find(key); in != job.in_fused.end()) {
    // A decision named it before it came here.
    auto found = job.fused.find(in->second.index);
    if (found == job.fused.end()) return;
    Fused& fused = found->second;
    std::optional<dataplane::Operation>& slot = fused.ops[in->second.position];
    if (!slot) {
      slot = std::move(op);
      fused.present++;
      fused.MemberArrived(std::chrono::steady_clock::now());
      taken = true;
      MaybeLaunchLocked(job_id, job, in->second.index, after);
      return;
    }
    // A second submission of a member still running: the inner runner knows the member only
    // as its fused collective, so it would run it alone and wait out the deadline.
    after.push_back([done = std::move(op.done), name = op.tensor_name, it = op.iteration] {
      done(absl::AlreadyExistsError(absl::StrCat("tensor '", name, "' iteration ", it,
                                                 " is already running in a fused collective")));
    });
    taken = true;
    return;
  }
  if (job.undecided.contains(key)) {
    after.push_back([done = std::move(op.done), name = op.tensor_name, it = op.iteration] {
      done(absl::AlreadyExistsError(absl::StrCat("tensor '", name, "' iteration ", it,
                                                 " is already held for a fusion decision")));
    });
    taken = true;
    return;
  }
  job.undecided.emplace(key, Held{std::move(op), clock_->Now()});
  taken = true;
  if (!job.leader) {
    MaybePostDecisionLocked(job_id, job, after);
    return;
  }
  const uint64_t bytes = f->second.count * common::DataTypeSize(f->second.dtype);
  // A decision spans at most kMaxDecisionIterations iterations (its encoding's bound).
  const bool another_iteration = job.open_iterations.size() >= kMaxDecisionIterations &&
                                 !job.open_iterations.contains(key.second);
  if (!job.open.empty() &&
      (job.open_dtype != f->second.dtype || job.open_reduction != f->second.reduction ||
       job.open_bytes + bytes > job.view.fusion_bytes || job.open.size() >= kMaxGroupMembers ||
       another_iteration)) {
    CloseGroupLocked(job_id, job, after);
  }
  if (job.open.empty()) {
    job.open_since = clock_->Now();
    job.open_dtype = f->second.dtype;
    job.open_reduction = f->second.reduction;
    timer_cv_.notify_all();
  }
  job.open.push_back(key);
  job.open_iterations.insert(key.second);
  job.open_bytes += bytes;
  // The last fusable tensor of its iteration: nothing more can join the group, which is decided
  // now rather than a cycle after its first member (BERT-large's 243 small tensors, all
  // submitted at once, waited a cycle for nothing). The count is not per attempt: a retry of an
  // iteration in the same generation may reach it early and split its group, which costs the
  // rest a cycle, never a result.
  bool last = false;
  if (size_t& n = job.arrived[key.second]; ++n >= job.fusable.size()) {
    job.arrived.erase(key.second);
    last = true;
  }
  while (job.arrived.size() > kArrivalsKept) job.arrived.erase(job.arrived.begin());
  if (last || job.open.size() >= kMaxGroupMembers) {
    CloseGroupLocked(job_id, job, after);
  }
}

void FusingRunner::PostPlanLocked(const std::string& job_id, Job& job, After& after) {
  job.state = PlanState::kPosted;
  auto buffers = WordBuffers(job.view.procs_per_node, kFusionPlanWords);
  if (job.leader) {
    job.cycle = ResolveFusionCycle(job.observed, job.view.fusion_cycle);
    (*buffers)[0] =
        EncodeFusionPlan(PlanFusionGroups(job.observed, job.view.fusion_bytes, job.cycle));
  }
  dataplane::Operation plan = WordBroadcast(kFusionPlanTensor, 0, buffers);
  plan.done = [this, job_id, generation = job.view.generation, buffers](absl::Status s) {
    OnPlan(job_id, generation, s, buffers);
  };
  StartLater(job_id, std::move(plan), after);
}

void FusingRunner::OnPlan(const std::string& job_id, uint64_t generation,
                          const absl::Status& status,
                          std::shared_ptr<std::vector<std::vector<int64_t>>> buffers) {
  After after;
  {
    std::lock_guard lock(mu_);
    Job* found = shut_down_ ? nullptr : FindJobLocked(job_id, generation);
    if (found == nullptr) return;
    Job& job = *found;
    if (job.state != PlanState::kPosted || job.received) return;
    job.received = status.ok() ? DecodeFusionPlan((*buffers)[0])
                               : absl::StatusOr<std::vector<FusionGroup>>(status);
    // Whether every worker node got the list: the root's broadcast completes once it has sent
    // it, so without this a node that gave up waiting (the root came after the op timeout) ran
    // with fusion off while the others ran with it on, and every fusable collective failed.
    auto flags = WordBuffers(job.view.procs_per_node, 1);
    (*flags)[0][0] = job.received->ok() ? 1 : 0;
    dataplane::Operation agree = WordSum(kFusionAgreementTensor, 0, flags);
    agree.done = [this, job_id, generation, flags](absl::Status s) {
      OnAgreement(job_id, generation, s, flags);
    };
    StartLater(job_id, std::move(agree), after);
  }
  Run(after);
}

void FusingRunner::OnAgreement(const std::string& job_id, uint64_t generation,
                               const absl::Status& status,
                               std::shared_ptr<std::vector<std::vector<int64_t>>> flags) {
  After after;
  {
    std::lock_guard lock(mu_);
    Job* found = shut_down_ ? nullptr : FindJobLocked(job_id, generation);
    if (found == nullptr) return;
    Job& job = *found;
    if (job.state != PlanState::kPosted || !job.received) return;
    absl::StatusOr<std::vector<FusionGroup>> groups = *std::move(job.received);
    job.received.reset();
    const int64_t nodes = job.view.num_workers();
    if (!status.ok()) {
      groups = absl::Status(status.code(),
                            absl::StrCat("agreeing on the fusion list: ", status.message()));
    } else if ((*flags)[0][0] != nodes && groups.ok()) {
      groups = absl::UnavailableError(absl::StrCat(nodes - (*flags)[0][0], " of ", nodes,
                                                   " worker nodes did not get the fusion list"));
    }
    AdoptPlanLocked(job_id, job, std::move(groups), after);
  }
  Run(after);
}

void FusingRunner::AdoptPlanLocked(const std::string& job_id, Job& job,
                                   absl::StatusOr<std::vector<FusionGroup>> groups, After& after) {
  if (!groups.ok()) {
    job.state = PlanState::kOff;
    Log()->warn("job {}: no tensor fusion list from worker rank 0 ({}); fusion is off for the job",
                job_id, groups.status());
  } else {
    job.state = PlanState::kReady;
    std::vector<uint64_t> list;
    for (const FusionGroup& g : *groups) {
      for (const FusionMember& m : g.members) {
        job.fusable[m.name_hash] = {m.count, g.dtype, g.reduction};
        list.push_back(m.name_hash);  // the plan holds each once (DecodeFusionPlan)
      }
    }
    job.list = FusableList(std::move(list));
    job.groups = *std::move(groups);
    job.decision_words = FusionDecisionBroadcastWords(job.fusable.size());
    stats_.plans_adopted++;
    Log()->info("job {}: tensor fusion: {} tensors may fuse, decisions in {}-byte broadcasts{}",
                job_id, job.fusable.size(), job.decision_words * sizeof(int64_t),
                job.leader ? absl::StrCat(", cycle ", job.cycle.count(), " us") : "");
  }
  // Aborted while they waited for the list: a fusable one fails in a decision, as if aborted
  // now; the others (fusion off, or not in the list) run alone, so their abort goes to the
  // inner runner.
  std::vector<AbortedWaiting> aborted = std::move(job.aborted_waiting);
  job.aborted_waiting.clear();
  for (AbortedWaiting& a : aborted) {
    const Key key{common::StableHash64(a.tensor), a.iteration};
    if (job.state == PlanState::kReady && job.fusable.contains(key.first)) {
      FailUnsubmittedLocked(job_id, job, key, a.reason, after);
    } else {
      after.push_back([this, job_id, a = std::move(a)] {
        inner_->Abort(job_id, a.tensor, a.iteration, a.reason);
      });
    }
  }
  std::vector<Held> waiting = std::move(job.waiting);
  job.waiting.clear();
  for (Held& w : waiting) {
    bool taken = false;
    StartLocked(job_id, job, w.op, taken, after);
    if (taken) continue;
    if (job.leader) CountPassingLocked(job_id, job, w.op);  // a refused start runs its done
    after.push_back([this, job_id, op = std::move(w.op)]() mutable {
      const std::string tensor = op.tensor_name;
      const uint64_t iteration = op.iteration;
      const bool staged = op.staged != nullptr;
      std::function<void(absl::Status)> done = op.done;
      absl::Status started = StartPassedThrough(job_id, std::move(op));
      if (!started.ok()) {
        done(started);
      } else if (staged) {
        // Its input may have advanced while it waited here.
        inner_->StagedInputAdvanced(job_id, tensor, iteration);
      }
    });
  }
}

void FusingRunner::CloseGroupLocked(const std::string& job_id, Job& job, After& after) {
  if (job.open.empty()) return;
  FusionDecision d;
  d.index = job.next_decision++;
  d.dtype = job.open_dtype;
  d.reduction = job.open_reduction;
  uint64_t running = job.passing_bytes;
  for (const auto& [index, f] : job.fused) running += f.bytes;
  d.lone = running + job.open_bytes < kLoneFusionBytes;
  for (const Key& key : job.open) d.members.push_back({key.first, key.second});
  CanonicalMemberOrder(d.members, job.list);  // as the followers decode it
  job.open.clear();
  job.open_iterations.clear();
  job.open_bytes = 0;
  stats_.decisions++;
  // The group holds listed tensors of at most kMaxDecisionIterations iterations: it encodes.
  absl::StatusOr<std::vector<int64_t>> words = EncodeFusionDecision(d, job.list);
  if (!words.ok()) {
    // Not sent: the others wait for its members until their deadline; it fails here now.
    Log()->error("job {}: {}", job_id, words.status());
    AdoptDecisionLocked(job_id, job, d, after);
    FailFusedLocked(job_id, job, d.index,
                    absl::InternalError(absl::StrCat("tensor fusion: ", words.status().message())),
                    after);
    return;
  }
  job.unsent.emplace_back(d.index, *std::move(words));
  MaybePostDecisionLocked(job_id, job, after);
  AdoptDecisionLocked(job_id, job, d, after);
}

void FusingRunner::MaybePostDecisionLocked(const std::string& job_id, Job& job, After& after) {
  if (job.batch_posted) return;
  if (!job.leader) {
    if (job.undecided.empty() && job.failed_undecided.empty()) return;
    PostDecisionLocked(job_id, job, {}, {}, after);
    return;
  }
  if (job.unsent.empty()) return;
  std::vector<int64_t> words;
  std::vector<uint64_t> indexes;
  // One always fits an empty broadcast (FusionDecisionBroadcastWords), so each goes.
  while (!job.unsent.empty() &&
         (words.empty() || words.size() + job.unsent.front().second.size() <= job.decision_words)) {
    const auto& [index, one] = job.unsent.front();
    words.insert(words.end(), one.begin(), one.end());
    indexes.push_back(index);
    job.unsent.pop_front();
  }
  PostDecisionLocked(job_id, job, std::move(words), std::move(indexes), after);
}

void FusingRunner::PostDecisionLocked(const std::string& job_id, Job& job,
                                      std::vector<int64_t> words, std::vector<uint64_t> indexes,
                                      After& after) {
  job.batch_posted = true;
  const uint64_t batch = job.next_batch++;
  auto buffers = WordBuffers(job.view.procs_per_node, job.decision_words);
  std::copy(words.begin(), words.end(), (*buffers)[0].begin());  // the rest stays 0: no decision
  dataplane::Operation broadcast = WordBroadcast(kFusionDecisionTensor, batch, buffers);
  broadcast.done = [this, job_id, generation = job.view.generation, batch, buffers,
                    indexes = std::move(indexes)](absl::Status s) {
    OnDecision(job_id, generation, batch, s, buffers, indexes);
  };
  StartLater(job_id, std::move(broadcast), after);
}

void FusingRunner::OnDecision(const std::string& job_id, uint64_t generation, uint64_t batch,
                              const absl::Status& status,
                              std::shared_ptr<std::vector<std::vector<int64_t>>> buffers,
                              const std::vector<uint64_t>& indexes) {
  After after;
  {
    std::lock_guard lock(mu_);
    Job* found = shut_down_ ? nullptr : FindJobLocked(job_id, generation);
    if (found == nullptr) return;
    Job& job = *found;
    job.batch_posted = false;
    if (job.leader) {
      // The others may never learn these decisions: their fused collectives fail everywhere.
      if (!status.ok()) {
        for (uint64_t index : indexes) FailFusedLocked(job_id, job, index, status, after);
      }
    } else {
      DecodedFusionDecisions got;
      if (status.ok()) {
        got = DecodeFusionDecisions((*buffers)[0], job.next_decision, job.list);
      } else {
        got.error = status;
      }
      // Every well-formed decision naming only listed tensors is adopted; a bad one fails what
      // still waits here for a decision (below), as the decisions after it may not name it.
      absl::Status failed = got.error;
      for (const FusionDecision& d : got.decisions) {
        job.next_decision = d.index + 1;
        const bool listed = std::all_of(d.members.begin(), d.members.end(), [&](const auto& m) {
          auto f = job.fusable.find(m.name_hash);
          return f != job.fusable.end() && f->second.dtype == d.dtype &&
                 f->second.reduction == d.reduction;
        });
        if (!listed) {
          if (failed.ok()) {
            failed = absl::InvalidArgumentError(absl::StrCat(
                "decision ", d.index, " names a tensor that is not on the fusable list"));
          }
          continue;
        }
        stats_.decisions++;
        AdoptDecisionLocked(job_id, job, d, after);
      }
      if (!failed.ok()) {
        // Their members are unknown here: whatever waits for a decision fails with the reason.
        Log()->warn("job {}: tensor fusion decision broadcast {} failed: {}", job_id, batch,
                    failed);
        const absl::Status reason(failed.code(),
                                  absl::StrCat("tensor fusion decision broadcast ", batch,
                                               " from worker rank 0 failed: ", failed.message()));
        for (auto& [key, held] : job.undecided) {
          after.push_back([done = std::move(held.op.done), reason] { done(reason); });
          job.failed[key] = reason;  // a later decision naming it fails at once
        }
        job.undecided.clear();
        job.failed_undecided.clear();
      }
    }
    MaybePostDecisionLocked(job_id, job, after);
  }
  Run(after);
}

void FusingRunner::AdoptDecisionLocked(const std::string& job_id, Job& job, const FusionDecision& d,
                                       After& after) {
  Fused& fused = job.fused[d.index];
  fused.decision = d;
  for (const FusionDecision::Member& m : d.members) {
    if (auto f = job.fusable.find(m.name_hash); f != job.fusable.end()) {
      fused.bytes += f->second.count * common::DataTypeSize(f->second.dtype);
    }
  }
  fused.ops.resize(d.members.size());
  fused.since = clock_->Now();
  fused.adopted = std::chrono::steady_clock::now();
  std::optional<absl::Status> failed;
  std::set<Key> failed_here;
  for (size_t m = 0; m < d.members.size(); ++m) {
    const Key key{d.members[m].name_hash, d.members[m].iteration};
    job.in_fused[key] = {d.index, m};
    if (auto held = job.undecided.find(key); held != job.undecided.end()) {
      fused.ops[m] = std::move(held->second.op);
      fused.present++;
      fused.MemberArrived(held->second.arrived);
      job.undecided.erase(held);
    } else if (auto f = job.failed.find(key); f != job.failed.end()) {
      failed = f->second;  // failed here before the decision arrived
      failed_here.insert(key);
      job.failed.erase(f);
      job.failed_undecided.erase(key);
    }
  }
  if (failed) {
    FailFusedLocked(job_id, job, d.index, *failed, after, failed_here);
    return;
  }
  MaybeLaunchLocked(job_id, job, d.index, after);
}

void FusingRunner::MaybeLaunchLocked(const std::string& job_id, Job& job, uint64_t index,
                                     After& after) {
  auto found = job.fused.find(index);
  if (found == job.fused.end()) return;
  Fused& fused = found->second;
  if (fused.launched || fused.present < fused.ops.size()) return;
  for (const auto& op : fused.ops) {
    if (op->staged != nullptr && !op->staged->complete()) return;
  }
  const size_t procs = fused.ops[0]->buffers.size();
  for (const auto& op : fused.ops) {
    if (op->buffers.size() != procs) {
      FailFusedLocked(
          job_id, job, index,
          absl::InvalidArgumentError(absl::StrCat(
              "tensor '", op->tensor_name, "' iteration ", op->iteration, " has ",
              op->buffers.size(), " local buffers but the tensors fused with it have ", procs)),
          after);
      return;
    }
  }
  fused.launched = true;
  auto state = std::make_shared<FusedState>();
  fused.state = state;
  state->element = common::DataTypeSize(fused.decision.dtype);
  uint64_t total = 0;
  int32_t priority = std::numeric_limits<int32_t>::max();
  state->offsets.reserve(fused.ops.size());
  for (const auto& op : fused.ops) {
    state->offsets.push_back(total);
    total += op->count;
    priority = std::min(priority, op->priority);
  }
  if (common::Trace::enabled()) {
    // "fusion <fused name>": from its first member's arrival here to its launch.
    const common::Trace::TimePoint now = std::chrono::steady_clock::now();
    const common::Trace::TimePoint first = fused.first_member.value_or(fused.adopted);
    const auto us = [&](common::Trace::TimePoint t) {
      return static_cast<int64_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(t - first).count());
    };
    common::Trace::Async(absl::StrCat("fusion ", FusedName(index)), index, first, now,
                         {{"decision", static_cast<int64_t>(index)},
                          {"members", static_cast<int64_t>(fused.ops.size())},
                          {"bytes", static_cast<int64_t>(total * state->element)},
                          {"decided_us", us(fused.adopted)},
                          {"last_member_us", us(fused.last_member.value_or(first))}});
  }
  dataplane::Operation op;
  if (Adjacent(fused.ops, state->element)) {
    op.buffers = fused.ops[0]->buffers;
  } else {
    // Allocated here, filled from the members once mu_ is released (below).
    for (size_t p = 0; p < procs; ++p) {
      state->storage.push_back(common::BufferPool::Process().Get(total * state->element));
      op.buffers.push_back(state->storage.back().get());
    }
  }
  state->members.reserve(fused.ops.size());  // each member moved once, not at every doubling
  for (auto& member : fused.ops) state->members.push_back(std::move(*member));
  op.tensor_name = FusedName(index);
  op.iteration = index / kFusedNames;
  op.dtype = fused.decision.dtype;
  op.count = total;
  op.reduction = fused.decision.reduction;
  op.priority = priority;
  op.lone = fused.decision.lone;
  op.keepalive = state;
  op.done = [this, job_id, index, generation = job.view.generation, state](absl::Status s) {
    if (s.ok() && !state->in_place()) state->CopyOut();
    {
      std::lock_guard lock(mu_);
      if (Job* job = FindJobLocked(job_id, generation); job != nullptr) {
        if (auto f = job->fused.find(index); f != job->fused.end()) {
          for (const FusionDecision::Member& m : f->second.decision.members) {
            EraseInFused(job->in_fused, {m.name_hash, m.iteration}, index);
          }
          job->fused.erase(f);
        }
      }
    }
    for (dataplane::Operation& member : state->members) {
      std::function<void(absl::Status)> done = std::move(member.done);
      member.done = nullptr;
      if (done) done(s);
    }
  };
  stats_.fused_operations++;
  if (op.lone) stats_.lone_operations++;
  if (state->in_place()) stats_.in_place_operations++;
  stats_.fused_tensors += state->members.size();
  if (!state->in_place()) {
    // The copy in runs after the decision broadcasts queued before it (the leader's), and
    // without mu_: submissions and decisions go on meanwhile. The members are the state's.
    after.push_back([state] { state->CopyIn(); });
    copy_in_queued_ = true;
  }
  after.push_back([this, job_id, state, op = std::move(op)]() mutable {
    std::optional<absl::Status> aborted;
    {
      std::lock_guard lock(mu_);
      aborted = state->aborted;
      state->started = !aborted;
    }
    std::function<void(absl::Status)> done = op.done;
    absl::Status started = aborted ? *aborted : inner_->Start(job_id, std::move(op));
    if (!started.ok()) done(started);  // refused, or failed before it started: done is ours
  });
}

void FusingRunner::FailFusedLocked(const std::string& job_id, Job& job, uint64_t index,
                                   const absl::Status& reason, After& after,
                                   const std::set<std::pair<uint64_t, uint64_t>>& done_here) {
  auto found = job.fused.find(index);
  if (found != job.fused.end() && !found->second.launched) {
    Fused& fused = found->second;
    for (size_t m = 0; m < fused.ops.size(); ++m) {
      const Key key{fused.decision.members[m].name_hash, fused.decision.members[m].iteration};
      EraseInFused(job.in_fused, key, index);
      if (fused.ops[m]) {
        after.push_back([done = std::move(fused.ops[m]->done), reason] { done(reason); });
      } else if (!done_here.contains(key)) {
        job.failed[key] = reason;  // fails when it comes
      }
    }
    job.fused.erase(found);
  } else if (found != job.fused.end() && !found->second.state->started) {
    found->second.state->aborted = reason;  // its start fails it
  }
  after.push_back([this, job_id, index, reason] {
    inner_->Abort(job_id, FusedName(index), index / kFusedNames, reason);
  });
}

void FusingRunner::FailUnsubmittedLocked(const std::string& job_id, Job& job, const Key& key,
                                         const absl::Status& reason, After& after) {
  // Not submitted here, but the others hold it as fusable: the leader names it in a decision of
  // its own and fails that; a follower waits for the decision that names it.
  job.failed[key] = reason;
  if (job.leader) {
    CloseGroupLocked(job_id, job, after);
    const Fusable& f = job.fusable.at(key.first);
    job.open = {key};
    job.open_iterations = {key.second};
    job.open_bytes = f.count * common::DataTypeSize(f.dtype);
    job.open_dtype = f.dtype;
    job.open_reduction = f.reduction;
    job.open_since = clock_->Now();
    CloseGroupLocked(job_id, job, after);
  } else {
    job.failed_undecided.insert(key);
    MaybePostDecisionLocked(job_id, job, after);
  }
}

void FusingRunner::StagedInputAdvanced(const std::string& job_id, const std::string& tensor,
                                       uint64_t iteration) {
  After after;
  bool handled = false;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(job_id);
    if (it != jobs_.end()) {
      Job& job = *it->second;
      const Key key{common::StableHash64(tensor), iteration};
      if (auto in = job.in_fused.find(key); in != job.in_fused.end()) {
        MaybeLaunchLocked(job_id, job, in->second.index, after);
        handled = true;
      }
      // Looked at again when it is decided or released.
      if (job.undecided.contains(key)) handled = true;
      for (const Held& w : job.waiting) {
        if (w.op.tensor_name == tensor && w.op.iteration == iteration) handled = true;
      }
    }
  }
  Run(after);
  if (!handled) inner_->StagedInputAdvanced(job_id, tensor, iteration);
}

void FusingRunner::Abort(const std::string& job_id, const std::string& tensor, uint64_t iteration,
                         const absl::Status& reason) {
  After after;
  bool fused = false;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(job_id);
    if (it != jobs_.end()) {
      Job& job = *it->second;
      const Key key{common::StableHash64(tensor), iteration};
      bool was_waiting = false;
      for (auto w = job.waiting.begin(); w != job.waiting.end(); ++w) {
        if (w->op.tensor_name == tensor && w->op.iteration == iteration) {
          after.push_back([done = std::move(w->op.done), reason] { done(reason); });
          job.waiting.erase(w);
          was_waiting = true;
          break;
        }
      }
      if (was_waiting || (job.state == PlanState::kPosted && iteration >= kFirstFusedIteration)) {
        // Waiting for the fusion list, or not submitted here while the list is on its way:
        // whether the others fuse it is not known yet, so the abort waits for the list too
        // (OnPlan).
        job.aborted_waiting.push_back({tensor, iteration, reason});
        fused = true;
      } else if (auto held = job.undecided.find(key); held != job.undecided.end()) {
        // Held, not decided yet: the decision that names it fails the collective for everyone.
        after.push_back([done = std::move(held->second.op.done), reason] { done(reason); });
        job.undecided.erase(held);
        job.failed[key] = reason;
        if (job.leader && std::find(job.open.begin(), job.open.end(), key) != job.open.end()) {
          // The leader decides its open group now and adopts it as failed: the fused collective
          // is never started here, so it cannot complete on the others before the abort
          // reaches them (started and then aborted, it could: the leader's input may already
          // have been sent).
          CloseGroupLocked(job_id, job, after);
        } else {
          job.failed_undecided.insert(key);
          MaybePostDecisionLocked(job_id, job, after);
        }
        fused = true;
      } else if (auto in = job.in_fused.find(key); in != job.in_fused.end()) {
        FailFusedLocked(job_id, job, in->second.index, reason, after);
        fused = true;
      } else if (job.state == PlanState::kReady && iteration >= kFirstFusedIteration &&
                 job.fusable.contains(key.first) && !job.passed_listed.contains(key)) {
        FailUnsubmittedLocked(job_id, job, key, reason, after);
        fused = true;
      }
    }
  }
  Run(after);
  if (!fused) inner_->Abort(job_id, tensor, iteration, reason);
}

void FusingRunner::FlushExpiredGroups() {
  After after;
  {
    std::lock_guard lock(mu_);
    FlushExpiredLocked(after);
  }
  Run(after);
}

void FusingRunner::FlushExpiredLocked(After& after) {
  const common::Clock::TimePoint now = clock_->Now();
  for (auto& [job_id, job] : jobs_) {
    if (job->leader && !job->open.empty() && now - job->open_since >= job->cycle) {
      CloseGroupLocked(job_id, *job, after);
    }
  }
}

void FusingRunner::TimerLoop() {
  common::SetCurrentThreadName("trib-fusion");
  std::unique_lock lock(mu_);
  while (!shut_down_) {
    std::optional<common::Clock::TimePoint> next;
    for (const auto& [job_id, job] : jobs_) {
      if (job->leader && !job->open.empty()) {
        const common::Clock::TimePoint due = job->open_since + job->cycle;
        if (!next || due < *next) next = due;
      }
    }
    if (!next) {
      timer_cv_.wait(lock);
      continue;
    }
    const common::Clock::TimePoint now = clock_->Now();
    if (*next > now) {
      timer_cv_.wait_for(lock, *next - now);
      continue;
    }
    After after;
    FlushExpiredLocked(after);
    lock.unlock();
    Run(after);
    lock.lock();
  }
}

void FusingRunner::Tick() {
  After after;
  {
    std::lock_guard lock(mu_);
    const common::Clock::TimePoint now = clock_->Now();
    for (auto& [job_id, job] : jobs_) {
      const auto timeout = job->view.op_timeout;
      const auto expire = [&](auto& held, const char* what) {
        for (auto it = held.begin(); it != held.end();) {
          Held& h = [&]() -> Held& {
            if constexpr (std::is_same_v<std::decay_t<decltype(*it)>, Held>) {
              return *it;
            } else {
              return it->second;
            }
          }();
          if (now - h.since <= timeout) {
            ++it;
            continue;
          }
          after.push_back([done = std::move(h.op.done),
                           s = absl::DeadlineExceededError(absl::StrCat(
                               "tensor '", h.op.tensor_name, "' iteration ", h.op.iteration,
                               " waited ", timeout.count(), " ms for ", what))] { done(s); });
          it = held.erase(it);
        }
      };
      expire(job->waiting,
             "the job's tensor fusion list from worker rank 0 and the worker nodes' agreement on "
             "it");
      if (!job->leader) {  // the leader's own close within a cycle
        bool expired_undecided = false;
        for (const auto& [key, held] : job->undecided) {
          if (now - held.since > timeout) {
            job->failed[key] = absl::DeadlineExceededError(
                "a node's tensor waited past the op timeout for worker rank 0's tensor fusion "
                "decision");
            // This node keeps asking for decisions until one names it, so that the others'
            // copies fail too rather than wait out their own deadline.
            job->failed_undecided.insert(key);
            expired_undecided = true;
          }
        }
        expire(job->undecided, "worker rank 0's tensor fusion decision");
        if (expired_undecided) MaybePostDecisionLocked(job_id, *job, after);
      }
      std::vector<uint64_t> expired;
      for (const auto& [index, f] : job->fused) {
        if (!f.launched && now - f.since > timeout) expired.push_back(index);
      }
      for (uint64_t index : expired) {
        const Fused& f = job->fused[index];
        std::string present;
        for (const auto& op : f.ops) {
          if (op) absl::StrAppend(&present, present.empty() ? "" : ", ", "'", op->tensor_name, "'");
        }
        FailFusedLocked(
            job_id, *job, index,
            absl::DeadlineExceededError(absl::StrCat(
                "fused collective ", index, " of job ", job_id, ": only ", f.present, " of its ",
                f.ops.size(), " tensors (", present,
                ") were submitted on this node within the job's op timeout (", timeout.count(),
                " ms) after worker rank 0 fused them; every node must submit the same "
                "collectives")),
            after);
      }
    }
  }
  Run(after);
  inner_->Tick();
}

void FusingRunner::Shutdown() {
  After after;
  {
    std::lock_guard lock(mu_);
    shut_down_ = true;
    for (auto& [job_id, job] : jobs_) {
      ResetLocked(*job, absl::UnavailableError("the agent is shutting down"), after);
    }
  }
  timer_cv_.notify_all();
  if (timer_.joinable()) timer_.join();
  {
    std::lock_guard lock(launch_mu_);
    launcher_stop_ = true;
  }
  launch_cv_.notify_all();
  if (launcher_.joinable()) launcher_.join();  // after what was queued has run
  Run(after);
  inner_->Shutdown();
}

}  // namespace tributary::agent
