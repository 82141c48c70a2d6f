// Tensor fusion (Horovod's fusion buffer, decided by one node like Horovod's coordinator): small
// all-reduces that a job submits close together run as one collective, packed into one buffer per
// local process and unpacked on completion; every tensor keeps its exact result and its own
// completion.
//
// Which tensors may fuse. Worker rank 0 (the leader) watches the job's first iteration -- every
// operation started before the first one of iteration >= 1 -- and picks the all-reduces that
// had a partner to fuse with (PlanFusionGroups). At its first operation of iteration >= 1 every
// worker node joins one broadcast of that list from the leader (kFusionPlanTensor), then a sum
// over the worker nodes of whether each got it (kFusionAgreementTensor), and holds its
// operations of iteration >= kFirstFusedIteration (1) until both are done (each held operation
// at most the job's op timeout); from then on, those tensors are fusable on every node (when
// their count, dtype and reduction are the listed ones: the same test on every node). A list
// that fails to arrive at any node turns fusion off on every node, and so does a sum that fails
// on every node (one that fails on one node after completing on another leaves them differing:
// OnAgreement).
// Everything else runs as it is, at once.
//
// Which fuse together: the leader decides, from what it holds. It collects its fusable operations
// into a group until the group reaches fusion_bytes or kMaxGroupMembers, the last fusable tensor
// of its iteration joins it, a member would add a fifth iteration to it (kMaxDecisionIterations),
// or its first member has waited one cycle (the job's fusion_cycle;
// automatic: the median time of the leader's first-iteration all-reduces, within [kMinFusionCycle,
// kMaxFusionCycle]); then it makes decision k -- the members' (tensor, iteration) -- and runs fused
// collective k (FusedName(k), iteration k / kFusedNames). Decisions reach the other worker nodes in
// decision broadcasts (kFusionDecisionTensor, iteration b for the b-th; each carries all the
// decisions made while the previous one ran that fit in its FusionDecisionBroadcastWords), which
// go from the leader straight to each worker (Operation::control). A follower holds each fusable
// operation until a decision names it, keeping one decision broadcast posted while it holds any;
// fused collective k runs there once every member it names has been submitted. The leader only
// groups operations it has, and every node submits the same collectives, so no node waits for a
// tensor that will not come.
//
// Failures reach every member with the fused operation's status unchanged (a plan epoch
// included, so that a retry of the iteration is grouped again). A member aborted, or waiting past
// the job's op timeout, fails its fused collective on this node and aborts it for the others: an
// error to everyone, never a hang.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/collective_runner.h"
#include "common/clock.h"
#include "prometheus/collectable.h"

namespace tributary::agent {

inline constexpr char kFusionPlanTensor[] = "__tributary/fusion-plan";
// After the list's broadcast, every worker node adds 1 if it got the list (0 if not) in a sum
// over the worker nodes: fusion is on only when the sum is the number of worker nodes.
inline constexpr char kFusionAgreementTensor[] = "__tributary/fusion-agreement";
inline constexpr char kFusionDecisionTensor[] = "__tributary/fusion-decision";
inline constexpr char kFusedTensorPrefix[] = "__tributary/fused/";
// Fused collective k runs as tensor kFusedTensorPrefix + (k % kFusedNames), iteration
// k / kFusedNames: its home server (push/pull's chunk 0) rotates over the summation servers.
inline constexpr uint64_t kFusedNames = 64;
// A decision broadcast carries the decisions made while the previous one ran, packed, and a
// first word 0 ends them. A decision names its members by their position in the fusable-tensor
// list (the same on every node: the list is broadcast): kFusionDecisionHeaderWords, then for
// each iteration it spans (at most kMaxDecisionIterations) the iteration and a bitmap of the
// list. Its members are in that order: by iteration, then by position in the list.
// One broadcast after another, each carrying one decision, waited behind the gradients queued on
// the links (0.3-1.6 s on ResNet-50 with 4 spares at 125 Mbit/s), so the followers' last fused
// collectives of an iteration started at its very end. Until session 25 each decision took a
// fixed 1 KiB slot of the broadcast, at most 61 members: BERT-large's 243 small tensors needed at
// least 4 fused collectives, each after a decision broadcast, where Gloo runs one bucket. Until
// session 38 a member took two words (its name's hash and its iteration): BERT-large's decision
// broadcasts were 4 KiB, which the leader sends to each follower at the start of every
// iteration, and the last follower got its decision 1.0-1.4 ms after the leader made it at
// 125 Mbit/s (`--trace`). Now they take 512 bytes.
inline constexpr size_t kFusionDecisionHeaderWords = 5;
// The iterations one decision may span: the leader closes its group before a member of another.
inline constexpr size_t kMaxDecisionIterations = 4;
// The most members of one decision (and of one group).
inline constexpr size_t kMaxGroupMembers = 1021;
// The words of an encoded decision spanning `iterations` iterations of a list of `fusable`.
constexpr size_t FusionDecisionWords(size_t iterations, size_t fusable) {
  return kFusionDecisionHeaderWords + iterations * (1 + (fusable + 63) / 64);
}
// The words of a job's decision broadcasts when `fusable` tensors may fuse: one decision
// spanning kMaxDecisionIterations fits, rounded up to 64 words (512 bytes), at least 64. The
// same on every node: the list is broadcast. (The list holds at most about a thousand tensors:
// kFusionPlanWords.)
size_t FusionDecisionBroadcastWords(size_t fusable);
// Tensor names starting with this are the agent's own (LocalService refuses them).
inline constexpr char kReservedTensorPrefix[] = "__tributary/";
inline constexpr uint64_t kFirstFusedIteration = 1;
inline constexpr size_t kFusionPlanWords = 2048;  // 16 KiB
// The leader counts, per iteration, the fusable tensors it has taken, and decides its open group
// as soon as the last of an iteration comes (the cycle bounds the wait when one never does).
// It keeps the counts of this many iterations (a tensor a job skipped leaves its count short).
inline constexpr size_t kArrivalsKept = 4;
// The automatic cycle's bounds.
inline constexpr std::chrono::microseconds kMinFusionCycle{100};
inline constexpr std::chrono::microseconds kMaxFusionCycle{2000};

// One all-reduce of the leader's first iteration, in start order.
struct ObservedOp {
  uint64_t name_hash = 0;  // common::StableHash64 of the tensor name
  uint64_t count = 0;
  common::DataType dtype = common::DataType::kFloat32;
  dataplane::Reduction reduction = dataplane::Reduction::kSum;
  bool eligible = true;  // an all-reduce without staged input, not the job's first tensor
  common::Clock::TimePoint started{};
  uint64_t start_seq = 0;            // order of starts and completions, one counter
  std::optional<uint64_t> done_seq;  // unset: not complete when the plan was made
  std::optional<double> seconds;     // start to completion
};

struct FusionMember {
  uint64_t name_hash = 0;
  uint64_t count = 0;
  friend bool operator==(const FusionMember&, const FusionMember&) = default;
};

struct FusionGroup {
  common::DataType dtype = common::DataType::kFloat32;
  dataplane::Reduction reduction = dataplane::Reduction::kSum;
  std::vector<FusionMember> members;  // in the leader's start order; >= 2
  friend bool operator==(const FusionGroup&, const FusionGroup&) = default;
};

// Cuts the leader's first iteration into groups: consecutive eligible all-reduces (others in
// between do not break a group) of one dtype and reduction, each smaller than `fusion_bytes`,
// together at most `fusion_bytes`, started within `cycle` of the group's first, and every one
// started before any of the group completed (a process that waits for one tensor before it
// submits the next must never find them fused). A tensor seen twice is left out; groups of one
// are dropped. `cycle` 0: the median time of the eligible operations that completed, within
// [kMinFusionCycle, kMaxFusionCycle] (kMinFusionCycle when none did). Pure.
std::vector<FusionGroup> PlanFusionGroups(std::span<const ObservedOp> observed,
                                          uint64_t fusion_bytes, std::chrono::microseconds cycle);

// The cycle PlanFusionGroups uses: `cycle`, or (0) the median time of the eligible operations
// that completed, within [kMinFusionCycle, kMaxFusionCycle] (kMinFusionCycle when none did).
std::chrono::microseconds ResolveFusionCycle(std::span<const ObservedOp> observed,
                                             std::chrono::microseconds cycle);

// The plan as kFusionPlanWords int64 words (groups that do not fit are left out), and back.
// DecodeFusionPlan validates everything: INVALID_ARGUMENT naming what is wrong.
std::vector<int64_t> EncodeFusionPlan(const std::vector<FusionGroup>& groups);
absl::StatusOr<std::vector<FusionGroup>> DecodeFusionPlan(std::span<const int64_t> words);

// One decision of the leader: fused collective `index` of the job's generation carries these
// members, in this order.
struct FusionDecision {
  uint64_t index = 0;
  common::DataType dtype = common::DataType::kFloat32;
  dataplane::Reduction reduction = dataplane::Reduction::kSum;
  struct Member {
    uint64_t name_hash = 0;
    uint64_t iteration = 0;
    friend bool operator==(const Member&, const Member&) = default;
  };
  std::vector<Member> members;  // 1 to kMaxGroupMembers
  // When the leader decided, this group and the job's other operations in flight there -- those
  // passed through and the fused collectives still running -- held under kLoneFusionBytes: too
  // little to hide a pipeline's fill and drain behind, so every node launches the fused
  // collective with Operation::lone (push/pull then cuts it finer; dataplane/schedule/
  // chunk_map.h). Travels as bit kFusionDecisionLoneBit of the reduction's word.
  bool lone = false;
  friend bool operator==(const FusionDecision&, const FusionDecision&) = default;
};
inline constexpr int kFusionDecisionLoneBit = 8;
// With 64 KiB chunks and 4 workers, push/pull's fill and drain cost about 2 x 4 x 64 KiB of link
// time, an eighth of 4 MiB.
inline constexpr uint64_t kLoneFusionBytes = uint64_t{4} << 20;
// An all-reduce of under kLoneFusionBytes that FusingRunner passes through unfused runs lone
// (Operation::lone) on every node: it is fused on none (the fusable-tensor list is the same
// everywhere), so every node decides the same. Such a tensor was submitted alone -- a DDP
// bucket, a single tensor, iteration 0 -- and its time is push/pull's fill and drain: at 4
// spares and 125 Mbit/s a single 1.23 MiB all-reduce in 64 KiB chunks took 145 ms where its
// model is 83 ms and the ring's 125 (0.87x Gloo's ring). Control operations keep their own.
bool IsLonePassThrough(const dataplane::Operation& op);
// The fusable-tensor list as decisions name it: the name hashes in the list's order, and each
// one's position (built once, with the list).
class FusableList {
 public:
  FusableList() = default;
  FusableList(std::vector<uint64_t> hashes);  // NOLINT: a list is its hashes
  size_t size() const { return hashes_.size(); }
  uint64_t hash(size_t position) const { return hashes_[position]; }
  // Where `hash` is in the list (nullopt: not in it).
  std::optional<size_t> position(uint64_t hash) const;

 private:
  std::vector<uint64_t> hashes_;
  std::unordered_map<uint64_t, size_t> positions_;
};

// A decision in the words above, and back; `list` is the fusable-tensor list. Encoding fails
// (INVALID_ARGUMENT) for a member not in the list, more than kMaxDecisionIterations iterations or
// no member. DecodeFusionDecision reads one decision from the start of `words` (which may go on
// past it) and validates it; its members come in their canonical order (CanonicalMemberOrder).
absl::StatusOr<std::vector<int64_t>> EncodeFusionDecision(const FusionDecision& decision,
                                                          const FusableList& list);
absl::StatusOr<FusionDecision> DecodeFusionDecision(std::span<const int64_t> words,
                                                    const FusableList& list);
// Sorts `members` by iteration, then by position in `list` (where every member must be): the
// order in which a decision's members travel and are packed, on every node.
void CanonicalMemberOrder(std::vector<FusionDecision::Member>& members, const FusableList& list);
// The decisions of one decision broadcast: encoded decisions one after another, up to the end of
// `words` or a first word 0. At least one; consecutive indexes, the first >= first_at_least (a
// failed broadcast before may have carried the ones in between). `decisions` are the well-formed
// ones before the first that is not (`error`, else OK).
struct DecodedFusionDecisions {
  std::vector<FusionDecision> decisions;
  absl::Status error;
};
DecodedFusionDecisions DecodeFusionDecisions(std::span<const int64_t> words,
                                             uint64_t first_at_least, const FusableList& list);

// "__tributary/fused/<k % kFusedNames>".
std::string FusedName(uint64_t index);

// A CollectiveRunner that fuses small all-reduces of the jobs whose view has fusion_bytes > 0
// and passes everything else to `inner`. Thread-safe; `done` callbacks run without its lock.
class FusingRunner final : public CollectiveRunner {
 public:
  struct Options {
    // A thread closes the leader's groups when their cycle ends. Off: only FlushExpiredGroups
    // does (tests, with a FakeClock).
    bool timer_thread = true;
    // A thread runs what a submission (Start) sets off when that includes a copy into a fused
    // buffer -- the copy, with the decision broadcasts and launches queued with it -- so that
    // the thread submitting (a process's control ring) takes the next tensor at once.
    // BERT-large's 243 small tensors reached the leader over 2-16 ms where the process
    // submitted them in under 1 ms: each launch (a 1 MiB copy then) held the ring's thread
    // 1-7 ms, and the leader's cycle cut the iteration into 2-5 groups. Without a copy Start
    // runs it all before it returns: the hop cost the decision 0.2-2.3 ms. Off: Start always
    // runs it before it returns (tests that look at the inner runner right after a Start).
    bool launcher_thread = true;
  };
  struct Stats {
    uint64_t fused_operations = 0;     // fused collectives started
    uint64_t lone_operations = 0;      // of them, lone (FusionDecision::lone)
    uint64_t in_place_operations = 0;  // of them, run on their members' buffers (no copies)
    uint64_t fused_tensors = 0;        // member operations they carried
    uint64_t plans_adopted = 0;        // fusable-tensor lists received
    uint64_t decisions = 0;            // decisions made (leader) or received (follower)
  };

  FusingRunner(std::unique_ptr<CollectiveRunner> inner, const common::Clock* clock,
               Options options);
  FusingRunner(std::unique_ptr<CollectiveRunner> inner, const common::Clock* clock)
      : FusingRunner(std::move(inner), clock, Options()) {}
  ~FusingRunner() override;

  CollectiveRunner& inner() { return *inner_; }
  Stats stats() const;
  // The groups of the job's fusable-tensor list (empty until it arrived).
  std::vector<FusionGroup> groups(const std::string& job_id) const;
  // Closes the leader's groups whose cycle has ended (the timer thread calls it).
  void FlushExpiredGroups();
  // The scrape-time collector of stats() (tributary_agent_fusion_*_total); valid while the
  // runner lives.
  std::shared_ptr<prometheus::Collectable> stats_collector();

  void SetJob(const dataplane::JobView& view, dataplane::Algorithm algorithm) override;
  void RemoveJob(const std::string& job_id) override;
  absl::Status Start(const std::string& job_id, dataplane::Operation op) override;
  void StagedInputAdvanced(const std::string& job_id, const std::string& tensor,
                           uint64_t iteration) override;
  void Abort(const std::string& job_id, const std::string& tensor, uint64_t iteration,
             const absl::Status& reason) override;
  void Tick() override;
  std::map<std::string, JobObservation> TakeObservations() override {
    return inner_->TakeObservations();
  }
  uint64_t bytes_sent() const override { return inner_->bytes_sent(); }
  uint64_t bytes_received() const override { return inner_->bytes_received(); }
  void SetPlanMissingCallback(std::function<void()> callback) override {
    inner_->SetPlanMissingCallback(std::move(callback));
  }
  void Shutdown() override;

 private:
  struct Job;
  // Work decided under mu_ and run after it is released (inner calls, `done` callbacks).
  using After = std::vector<std::function<void()>>;

  // Takes `op` (taken = true) or leaves it to be passed through (taken = false).
  void StartLocked(const std::string& job_id, Job& job, dataplane::Operation& op, bool& taken,
                   After& after);
  void PostPlanLocked(const std::string& job_id, Job& job, After& after);
  void OnPlan(const std::string& job_id, uint64_t generation, const absl::Status& status,
              std::shared_ptr<std::vector<std::vector<int64_t>>> buffers);
  // The worker nodes' sum of "got the list" (kFusionAgreementTensor): fusion goes on only when
  // every one did. Every node then turns it on, unless its own sum fails after another's
  // completed (its last hop lost, or its op timeout passing within that hop): no exchange over
  // links that may fail makes every node sure (the two generals), and that node then runs with
  // fusion off until the membership changes, as every node did before the agreement when the
  // list came late.
  void OnAgreement(const std::string& job_id, uint64_t generation, const absl::Status& status,
                   std::shared_ptr<std::vector<std::vector<int64_t>>> flags);
  // Fusion on with `groups`, or off (an error): releases what waited for the list.
  void AdoptPlanLocked(const std::string& job_id, Job& job,
                       absl::StatusOr<std::vector<FusionGroup>> groups, After& after);
  // Leader: closes the open group (decision, fused collective).
  void CloseGroupLocked(const std::string& job_id, Job& job, After& after);
  // Posts the next decision broadcast unless this node has one running or has nothing for it
  // (leader: no decision not yet sent; follower: nothing waits for a decision).
  void MaybePostDecisionLocked(const std::string& job_id, Job& job, After& after);
  // Decision broadcast `batch` ended; on the leader `indexes` are the decisions it carried.
  void OnDecision(const std::string& job_id, uint64_t generation, uint64_t batch,
                  const absl::Status& status,
                  std::shared_ptr<std::vector<std::vector<int64_t>>> buffers,
                  const std::vector<uint64_t>& indexes);
  // Decision `index` is known here: takes its members from the undecided operations.
  void AdoptDecisionLocked(const std::string& job_id, Job& job, const FusionDecision& decision,
                           After& after);
  // Launches fused collective `index` if every member is there.
  void MaybeLaunchLocked(const std::string& job_id, Job& job, uint64_t index, After& after);
  // Fails fused collective `index` on this node with `reason` and aborts it for the others;
  // members in `done_here` already completed here.
  void FailFusedLocked(const std::string& job_id, Job& job, uint64_t index,
                       const absl::Status& reason, After& after,
                       const std::set<std::pair<uint64_t, uint64_t>>& done_here = {});
  // Fails fusable (tensor, iteration) `key`, which this node never submitted, on every node: the
  // leader names it in a decision of its own, a follower asks for decisions until one names it.
  void FailUnsubmittedLocked(const std::string& job_id, Job& job,
                             const std::pair<uint64_t, uint64_t>& key, const absl::Status& reason,
                             After& after);
  void ResetLocked(Job& job, const absl::Status& reason, After& after);
  void FlushExpiredLocked(After& after);
  void TimerLoop();
  // The job's state if it is still in `generation`, else null.
  Job* FindJobLocked(const std::string& job_id, uint64_t generation);
  // Posts the job's next decision broadcast: the leader's decisions (encoded one after another
  // in `words`, their indexes in `indexes`), or nothing on a follower.
  void PostDecisionLocked(const std::string& job_id, Job& job, std::vector<int64_t> words,
                          std::vector<uint64_t> indexes, After& after);
  // Leader: counts `op`, about to be passed through to the inner runner, in the job's bytes in
  // flight until its done runs (which it wraps). Returns its bytes.
  uint64_t CountPassingLocked(const std::string& job_id, Job& job, dataplane::Operation& op);
  // An operation passed through to the inner runner completed (or was refused).
  void PassedThroughDone(const std::string& job_id, uint64_t generation, uint64_t bytes);
  // Starts `op`, which runs unfused, on the inner runner (mu_ not held): every operation the
  // processes submitted that is not fused goes through here, lone where IsLonePassThrough says.
  absl::Status StartPassedThrough(const std::string& job_id, dataplane::Operation op);
  // Starts `op` on the inner runner once mu_ is released; a refused start goes to its done.
  void StartLater(const std::string& job_id, dataplane::Operation op, After& after);
  static void Run(After& after);
  // Runs `after` on the launcher thread (in the order given), or here without one.
  void Launch(After& after);
  void LauncherLoop();

  const common::Clock* clock_;
  const bool use_launcher_;  // Options::launcher_thread
  mutable std::mutex mu_;
  std::condition_variable timer_cv_;
  std::map<std::string, std::unique_ptr<Job>> jobs_;  // guarded by mu_
  uint64_t seq_ = 0;                                  // guarded by mu_
  Stats stats_;                                       // guarded by mu_
  bool shut_down_ = false;                            // guarded by mu_
  // A copy into a fused buffer was queued (MaybeLaunchLocked); Start clears it before its
  // StartLocked and sends the work to the launcher when it is set after.
  bool copy_in_queued_ = false;  // guarded by mu_
  std::thread timer_;
  std::mutex launch_mu_;
  std::condition_variable launch_cv_;
  std::deque<After> launches_;  // guarded by launch_mu_
  bool launcher_stop_ = false;  // guarded by launch_mu_
  std::thread launcher_;
  // Last: destroyed first, while the operations it fails can still reach the state above.
  std::unique_ptr<CollectiveRunner> inner_;
};

}  // namespace tributary::agent
