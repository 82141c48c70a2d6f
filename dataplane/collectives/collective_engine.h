// Peer-to-peer collectives (ring, halving-doubling all-reduce; ring broadcast) as non-blocking
// tasks over a Transport: Post starts an operation, incoming messages and send completions
// progress it, its done callback reports the result (DESIGN.md §1.4).
//
// An algorithm is a *schedule*: for this rank, a list of steps, each sending one element range
// to one peer and/or receiving one element range from one peer (summed into, or copied over, the
// buffer). The engine runs any schedule: it cuts each step's ranges into sub-chunks of at most
// partition_bytes, sends a sub-chunk as soon as the data it reads is final (so the transfer of
// chunk c overlaps the summation of chunk c + 1), and applies received sub-chunks in place.
// allreduce_ring.h and allreduce_halving_doubling.h build the schedules.
//
// "Final" is decided per step by SendAfter (when a send sub-chunk may leave) and ApplyAfter /
// apply_early (when a received sub-chunk may be summed or copied in). The range-based kinds
// (kEarlierStepsCoveringRange) let a schedule whose steps have different sub-chunk boundaries
// (halving-doubling: the range halves or doubles each step) overlap its steps: a sub-chunk waits
// only for the earlier steps' receives that write into its own element range.
//
// Messages carry the data plane's WireHeader (kinds kData, kError, kAbort; `algorithm` ring or
// halving-doubling); DataPlaneNode routes them here.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "dataplane/collectives/algorithm_selector.h"
#include "dataplane/collectives/collective_algorithm.h"
#include "dataplane/collectives/job_view.h"
#include "dataplane/collectives/operation.h"
#include "dataplane/collectives/wire.h"
#include "dataplane/reduce/reducer.h"
#include "dataplane/transport/transport.h"

namespace tributary::dataplane {

// ---------------------------------------------------------------------------------------------
// Schedules

// One step of one rank's schedule. All ranks' schedules of a collective have the same length;
// a step in which a rank has nothing to do has no peers.
struct ScheduleStep {
  // When the data a send reads is final.
  enum class SendAfter : uint8_t {
    kStart,              // the caller's input: at once
    kPrevStepSameChunk,  // sub-chunk c of the previous step's receive (same range: ring)
    kAllPreviousSteps,   // every receive of every earlier step
    kThisStepSameChunk,  // sub-chunk c of this step's receive (same range: forwarding)
    // Every element the sub-chunk reads is final: each earlier step's receive is applied on
    // its overlap with the sub-chunk's range (any boundaries: halving-doubling).
    kEarlierStepsCoveringRange,
  };
  // When a received sub-chunk may be applied (unless apply_early).
  enum class ApplyAfter : uint8_t {
    kAllPreviousSteps,  // every receive of every earlier step is applied
    // Every earlier step's receive is applied on its overlap with the sub-chunk's range (so each
    // element is still reduced in step order: the bits do not depend on timing), and every
    // earlier send that read an element of the range has completed (the transport no longer
    // borrows it). Other elements' steps may still be running.
    kEarlierStepsCoveringRange,
    // As kEarlierStepsCoveringRange, and this step's own sends of the range have completed too
    // (a step that sends the range it receives into: recursive doubling).
    kThisAndEarlierStepsCoveringRange,
  };
  enum class Action : uint8_t { kReduce, kCopy };

  int send_peer = -1;  // rank, -1: no send
  uint64_t send_offset = 0;
  uint64_t send_count = 0;
  SendAfter send_after = SendAfter::kStart;
  int recv_peer = -1;  // rank, -1: no receive
  uint64_t recv_offset = 0;
  uint64_t recv_count = 0;
  Action action = Action::kReduce;
  ApplyAfter apply_after = ApplyAfter::kAllPreviousSteps;
  // Whether this step's receives may be applied before earlier steps' receives are complete.
  // True only where no pending send reads the range and each element is reduced at most once
  // per rank (so the order of additions, and hence the bits, stay deterministic).
  bool apply_early = false;
};

// Element range [offset, offset + count) of block `index` of `num_blocks` near-equal blocks of
// `count` elements (the first count % num_blocks blocks are one element larger).
struct BlockRange {
  uint64_t offset = 0;
  uint64_t count = 0;
};
BlockRange GetBlock(uint64_t count, uint64_t num_blocks, uint64_t index);

// ---------------------------------------------------------------------------------------------
// The engine

// Counters for tests and metrics. Monotonic.
struct CollectiveEngineStats {
  std::atomic<uint64_t> ops_started{0};
  std::atomic<uint64_t> ops_completed{0};
  std::atomic<uint64_t> ops_failed{0};
  std::atomic<uint64_t> messages_sent{0};
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> messages_received{0};
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> malformed_messages{0};  // dropped: bad header, range, sender, duplicate
  std::atomic<uint64_t> early_messages{0};      // buffered before their operation started
  std::atomic<uint64_t> early_dropped{0};       // over the limit (SetEarlyMessageLimit) or expired
  std::atomic<uint64_t> late_messages{0};       // for an operation already failed or finished
  std::atomic<uint64_t> send_failures{0};       // transport sends that failed
  // Data of another epoch (plan version) than the running operation's: dropped, never summed;
  // the operation fails for every rank with UNAVAILABLE "plan of job ... changed ...; retry".
  std::atomic<uint64_t> fenced_messages{0};
};

// The peer-to-peer collectives of one node: ring and halving-doubling all-reduce, ring broadcast.
// Its ranks are the job's worker nodes (JobView::worker_addresses, my_worker_rank). An operation
// with several local buffers is first summed into buffers[0] (broadcast: the root's buffer takes
// part), runs among the nodes in place, and its result is then copied into every other buffer;
// average divides by JobView::world_size() (every process of the job).
//
// Ownership: borrows the transport, reducer and clock (they outlive the engine; shut the
// transport down before destroying the engine). Does not install a receive handler: the
// DataPlaneNode feeds it with HandleMessage.
// Threading: thread-safe. HandleMessage runs on the transport thread and never blocks on the
// network; sums run there under the engine's lock. Sends and done callbacks run outside locks.
// Invariants: an operation is identified by (job, tensor, iteration); messages of other
// iterations never touch its buffer. Messages for an operation not started here yet are copied
// and kept (at most kMaxEarlyBytes by default, for the longer of kTombstoneTtl and the job's op
// timeout: ranks may start one collective that far apart; a message over the limit fails its
// collective for every rank with RESOURCE_EXHAUSTED); a range of the buffer is rewritten
// only after every earlier send that read it has been received by its peer. A failure, or an
// abort, of an operation is told to every other rank at once; one that arrives before the
// operation starts here leaves a tombstone that fails it when it starts.
class CollectiveEngine : public CollectiveAlgorithm {
 public:
  static constexpr uint64_t kMaxEarlyBytes = uint64_t{256} << 20;
  // How long the memory of finished operations is kept, and that of failed ones and early
  // messages at least (EarlyTtlLocked: at least the job's op timeout).
  static constexpr std::chrono::seconds kTombstoneTtl{60};
  // A failed operation is completed once the transport has finished every send that reads its
  // buffer (the caller may free it when told), or after this long (ExpireStale).
  static constexpr std::chrono::seconds kFailedSendGrace{2};

  CollectiveEngine(Transport* transport, Reducer* reducer, const common::Clock* clock);
  ~CollectiveEngine() override;

  void SetJob(const JobView& view) override;
  void RemoveJob(uint64_t job_hash) override;

  // Ring serves everything; halving-doubling declines broadcast (UNIMPLEMENTED); push/pull is
  // not this engine's (FAILED_PRECONDITION).
  absl::Status CanServe(Algorithm algorithm, const Operation& op) const override;

  // Errors as CollectiveAlgorithm::Post; op.done then gets OK, INVALID_ARGUMENT (ranks disagree
  // on the descriptor), DEADLINE_EXCEEDED (ExpireStale, naming the step and the peer waited
  // on), UNAVAILABLE (a send failed), CANCELLED (job removed), or the error or abort another
  // rank reported.
  absl::Status Post(const std::string& job_id, Algorithm algorithm, Operation op) override;

  // Messages that do not fit the schedule are dropped and counted.
  void HandleMessage(const WireHeader& h, std::span<const std::byte> payload) override;

  void ExpireStale() override;

  // Fails the operation here if it runs (or leaves a tombstone that fails it when it starts)
  // and sends an abort to every other rank of the job, which does the same there.
  void Abort(const std::string& job_id, const std::string& tensor_name, uint64_t iteration,
             const absl::Status& reason) override;

  // The most bytes of early messages kept (kMaxEarlyBytes by default; counted with their
  // headers). A message that would pass it fails its collective here and at every other rank
  // (RESOURCE_EXHAUSTED, naming the tensor and the limit): the collective cannot complete
  // without it, and its ranks learn so at once rather than at their op timeouts.
  void SetEarlyMessageLimit(uint64_t bytes);

  const CollectiveEngineStats& stats() const { return stats_; }
  // Operations running now.
  size_t active_operations() const;

  // Whether halving-doubling operations posted from now on overlap their steps sub-chunk by
  // sub-chunk (default) or run each step after the whole previous one (the former schedule, kept
  // for comparison in benchmarks). Either way every element is reduced in the same order, the
  // messages are the same, and ranks with different settings interoperate.
  void SetHalvingDoublingPipelined(bool pipelined);

 private:
  struct OpState;
  struct Outgoing;
  struct Early {
    WireHeader header;
    std::vector<std::byte> payload;
    common::Clock::TimePoint arrived;
    // What it counts against kMaxEarlyBytes.
    size_t bytes() const { return payload.size() + sizeof(WireHeader); }
  };
  struct Tombstone {
    absl::Status status;  // OK: finished
    common::Clock::TimePoint expires;
    // The plan version (epoch) the collective ran under: after a membership change the job's
    // iterations count from 0 again under a newer epoch, and an older tombstone of the same
    // (tensor, iteration) is another collective's.
    uint64_t epoch = 0;
    // A failure found here that the other ranks have not been told of (the job was not known
    // when it happened): Post tells them when it fails the collective.
    bool tell_peers = false;
  };
  using Completion = std::pair<std::function<void(absl::Status)>, absl::Status>;

  // All *Locked methods run with mu_ held and queue their side effects in out / done.
  // The first epoch of the job's current membership generation.
  uint64_t GenerationStartLocked(uint64_t job) const;
  void DeliverLocked(const std::shared_ptr<OpState>& op, const WireHeader& h,
                     std::span<const std::byte> payload, std::vector<Outgoing>& out,
                     std::vector<Completion>& done);
  void ApplyLocked(OpState& op, const WireHeader& h, std::span<const std::byte> payload);
  // Applies the deferred receives that may be applied now and posts the sends that may leave,
  // until neither makes progress; completes the operation when everything is done.
  void AdvanceLocked(const std::shared_ptr<OpState>& op, std::vector<Outgoing>& out,
                     std::vector<Completion>& done);
  bool ApplyDeferredLocked(OpState& op);
  bool PostSendsLocked(const std::shared_ptr<OpState>& op, std::vector<Outgoing>& out);
  void FailLocked(const std::shared_ptr<OpState>& op, absl::Status status, bool tell_peers,
                  std::vector<Outgoing>& out, std::vector<Completion>& done);
  // The failure of `op` held for its sends (FailLocked), now. mu_ held.
  void CompleteFailureLocked(const std::shared_ptr<OpState>& op, std::vector<Completion>& done);
  // Sends an abort (h with kind kAbort and status's code; its message as the payload) to every
  // other worker of the job.
  void TellPeersLocked(const JobView& view, WireHeader h, const absl::Status& status,
                       std::vector<Outgoing>& out);
  // A message of a collective not started here that would pass max_early_bytes_: fails the
  // collective here (tombstone) and at every other rank (when the job is not known here yet,
  // when this rank posts it). A straggler of an older membership generation is only dropped.
  void FailAtEarlyLimitLocked(const CollectiveKey& key, const WireHeader& h, size_t bytes,
                              std::vector<Outgoing>& out);
  // Remembers how the collective `key` ended: finished (OK) for kTombstoneTtl, failed for
  // EarlyTtlLocked (a rank that starts it up to an op timeout later fails at once with the
  // reason, rather than waiting out its own op timeout for peers that are done with it).
  void SetTombstoneLocked(const CollectiveKey& key, absl::Status status, uint64_t epoch);
  void OnSendDone(const std::shared_ptr<OpState>& op, int peer, uint32_t step, uint32_t chunk,
                  absl::Status status);
  void Flush(std::vector<Outgoing> out, std::vector<Completion> done);

  Transport* transport_;
  Reducer* reducer_;
  const common::Clock* clock_;
  CollectiveEngineStats stats_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<const JobView>> jobs_;
  // How long messages of a collective not started here yet, and failures of one, are kept:
  // kTombstoneTtl, or the job's op timeout when longer. A rank may start a collective up to an op
  // timeout after another (its own intake, fusion and earlier collectives come first): BERT-large's
  // fused collectives on a 4-rank ring at 125 Mbit/s started up to 80 s apart, and a first step
  // dropped after 60 s left the receiver waiting for it until the op timeout, and the whole ring
  // with it (session 41).
  std::chrono::nanoseconds EarlyTtlLocked(uint64_t job) const;
  // Collectives failed at max_early_bytes_ since the last ExpireStale (the first is logged).
  uint64_t early_capped_since_sweep_ = 0;
  std::map<CollectiveKey, std::shared_ptr<OpState>> ops_;
  std::map<CollectiveKey, std::deque<Early>> early_;
  uint64_t early_bytes_ = 0;
  uint64_t max_early_bytes_ = kMaxEarlyBytes;
  std::map<CollectiveKey, Tombstone> tombstones_;
  // (expires, key) of every finished operation's tombstone, in the order set (they all live
  // kTombstoneTtl: expiry order), and of every failure's in a min-heap (they live EarlyTtlLocked,
  // which depends on the job); an entry whose key was set again later, or removed, is skipped
  // when it comes up.
  using Expiry = std::pair<common::Clock::TimePoint, CollectiveKey>;
  std::deque<Expiry> tombstone_expiry_;
  std::priority_queue<Expiry, std::vector<Expiry>, std::greater<>> failure_expiry_;
  // Failed operations waiting for their sends (OpState::failure_pending).
  std::vector<std::shared_ptr<OpState>> draining_;
  // Per job hash: its membership generation and the first plan version (epoch) seen in it (0
  // when the job was first seen in it: no older generation is known here).
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> generations_;
  bool hd_pipelined_ = true;
};

}  // namespace tributary::dataplane
