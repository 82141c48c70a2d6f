// Push/pull all-reduce (DESIGN.md §1.1): every worker node pushes each chunk of a tensor to the
// summation server that owns it; the server adds the n contributions and sends the sum back to
// every worker. Broadcast uses the same path with one contributing worker.
//
// PushPullServer is the summation-service (SS) role, PushPullWorker the communication-service
// (CS) role; PushPull is both behind the CollectiveAlgorithm interface (DataPlaneNode routes
// their messages to it). All three are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "dataplane/collectives/collective_algorithm.h"
#include "dataplane/collectives/dataplane_metrics.h"
#include "dataplane/collectives/job_view.h"
#include "dataplane/collectives/operation.h"
#include "dataplane/collectives/wire.h"
#include "dataplane/reduce/reducer.h"
#include "dataplane/schedule/chunk_map.h"
#include "dataplane/schedule/miad_tuner.h"
#include "dataplane/transport/transport.h"

namespace tributary::dataplane {

// Counters for tests and metrics. Monotonic unless noted.
struct PushPullStats {
  std::atomic<uint64_t> pushes_received{0};
  std::atomic<uint64_t> bytes_summed{0};
  std::atomic<uint64_t> results_sent{0};
  std::atomic<uint64_t> collectives_failed_on_server{0};
  std::atomic<uint64_t> malformed_messages{0};
  std::atomic<uint64_t> chunks_pushed{0};
  std::atomic<uint64_t> bytes_pushed{0};
  std::atomic<uint64_t> bytes_pulled{0};
  std::atomic<uint64_t> ops_started{0};
  std::atomic<uint64_t> ops_completed{0};
  std::atomic<uint64_t> ops_failed{0};
  std::atomic<uint64_t> server_bytes_held{0};       // gauge: accumulators held now
  std::atomic<uint64_t> server_peak_bytes_held{0};  // high-water mark of the above
  std::atomic<uint64_t> worker_staging_bytes{0};    // gauge: staging held now
  std::atomic<uint64_t> worker_peak_staging_bytes{0};
  std::atomic<uint64_t> worker_bytes_in_flight{0};  // gauge
  std::atomic<uint64_t> worker_peak_bytes_in_flight{0};
  std::atomic<uint64_t> worker_chunks_in_flight{0};  // gauge
  std::atomic<uint64_t> worker_queued_chunks{0};     // gauge: waiting for credit
  std::atomic<uint64_t> credit_waits{0};             // a ready chunk found no credit
  // A ready chunk's connection was at its backlog (SetServerBacklog): its job's later chunks
  // waited.
  std::atomic<uint64_t> backlog_waits{0};
  std::atomic<uint64_t> ahead_waits{0};    // a ready chunk waited for earlier sums from its server
  std::atomic<uint64_t> staging_waits{0};  // a chunk waited for its input (StagedInput)
  std::atomic<uint64_t> send_failures{0};  // transport sends that failed
  std::atomic<uint64_t> ops_held{0};       // an op waited for iteration - 2 (partition tuning)
  // An op started with a partition other than the previous op of its tensor on this worker.
  std::atomic<uint64_t> partition_decisions_applied{0};
  // Epoch fencing: messages dropped because they belong to another epoch (plan version) of
  // their job than the receiver's collective (pushes, results, errors, aborts), never summed.
  std::atomic<uint64_t> fenced_messages{0};
  // A second push of one chunk by one worker in one epoch: dropped, never summed twice.
  std::atomic<uint64_t> duplicate_pushes{0};
  // Collectives failed as retriable (UNAVAILABLE, epoch attached) because their job's plan changed.
  std::atomic<uint64_t> plan_change_failures{0};
  // Peer recovery (see PushPullWorker): collectives that asked the other workers, those that
  // completed from another worker's copy of the sums, and chunks sent to a worker that asked.
  std::atomic<uint64_t> peer_recoveries_started{0};
  std::atomic<uint64_t> peer_recoveries{0};
  std::atomic<uint64_t> peer_chunks_served{0};
  std::atomic<uint64_t> worker_retained_bytes{0};  // gauge: memory of sums kept (peer recovery)
};

// Online partition tuning (DESIGN.md §1.3, MIAD), agreed by construction. The tensor's home
// server (the owner of chunk 0, whatever the chunk count) decides:
//  * every worker reports, in its push of chunk 0 of iteration i (WireHeader::step, KiB/s), the
//    throughput of its iteration i - 1 of the tensor (tensor bytes / (completion - start) on its
//    clock; 0 when it has none, e.g. i - 1 failed or still runs);
//  * once all n pushes of chunk 0 are in, the home server feeds the slowest report to the
//    tensor's MiadTuner (only if iteration i - 1 ran at the tuner's current size: decisions take
//    effect two iterations late) and writes the tuner's current size into the result of chunk 0
//    (WireHeader::reserved1, KiB), which every worker receives;
//  * a worker keeps the decisions of its completed ops (failed ops carry none) and cuts
//    iteration j by the newest decision of an iteration <= j - 2 (the plan's partition_bytes when
//    none). When j is posted while j - 2 still runs (or waits) here, j waits inside the worker,
//    deadline kept, until j - 2 completes or fails. A worker that missed a decision cuts
//    differently for one iteration, which the server fails with INVALID_ARGUMENT; the next
//    decision (each is the full size, not a step) realigns everyone.
// Range [kTuneMinPartition, min(kTuneMaxPartition, tensor bytes / servers)], from the plan's
// partition_bytes; tensors under 2 x kTuneMinPartition and jobs without tune_partition keep
// partition_bytes.
inline constexpr uint64_t kTuneMinPartition = uint64_t{64} << 10;
inline constexpr uint64_t kTuneMaxPartition = uint64_t{16} << 20;
bool PartitionTuned(const JobView& job, uint64_t tensor_bytes);

// How much longer than the job's op timeout a worker waits before it fails a push/pull
// collective on its own: op_timeout / 8, at least 250 ms and at most 5 s. A summation server
// fails a chunk op_timeout after its first push and tells every worker, so with this margin the
// server's verdict -- a sum, or an error naming the missing workers -- reaches all workers
// before any of them gives up, and all see the same outcome. (Without it, a contribution
// arriving just before the server's sweep completed the sum after the earliest workers had
// already timed out: OK for some workers, DEADLINE_EXCEEDED for others.) The worker's own
// deadline remains for a server that never answers.
std::chrono::milliseconds WorkerGrace(std::chrono::milliseconds op_timeout);

// The summation service of one node.
//
// Holds one accumulator per chunk in flight, created on the first push and freed once the sum
// has been sent to every worker: at most the chunks of the tensors its workers have submitted,
// and at most twice the bytes of those tensors this server owns. Pushes whose
// descriptors disagree (size, dtype, reduction) fail the whole collective for every worker
// with INVALID_ARGUMENT; chunks missing contributions past the job's timeout fail it with
// DEADLINE_EXCEEDED naming the missing ranks.
//
// Epoch fencing (the plan version is the job's epoch): a push of an older epoch than the
// server's plan is dropped and counted (stats().fenced_messages), and its sender alone is told
// UNAVAILABLE "plan ... changed ...; retry" for that epoch; a push of a newer epoch is parked
// until the plan arrives. When the plan moves on (SetJob) or the job leaves this node
// (RemoveJob), every collective still accumulating under the old epoch fails for every worker
// of the old plan with that retriable error, so a collective completes under one epoch or under
// none: no sum mixes epochs, and a failed one leaves nothing behind that a retry of the same
// iteration under the new epoch could be added to. A second push of one chunk by one worker is
// dropped (stats().duplicate_pushes). Failures are remembered per (collective, epoch).
class PushPullServer {
 public:
  PushPullServer(Transport* transport, Reducer* reducer, const common::Clock* clock,
                 PushPullStats* stats);

  // Pushes for a job (or plan version) this server does not have yet are parked, up to this many
  // bytes, and replayed by SetJob: a worker may learn of a plan before a server does.
  static constexpr uint64_t kMaxParkedBytes = uint64_t{256} << 20;
  static constexpr std::chrono::seconds kMaxParkedAge{10};

  // Called (on the transport thread, without locks held) when a push is parked, so that the
  // owner can fetch plans at once instead of at its next poll.
  void SetPlanMissingCallback(std::function<void()> cb) { on_plan_missing_ = std::move(cb); }

  // Adds or replaces the job's plan; a newer epoch fails the old epoch's unfinished collectives
  // (see the class comment).
  void SetJob(const JobView& view);
  // Forgets the job; its unfinished collectives fail for every worker (retriable).
  void RemoveJob(uint64_t job_hash);
  // Called on the transport thread with a validated header.
  void HandlePush(const WireHeader& h, std::span<const std::byte> payload);
  // A worker gave up on a collective before pushing (e.g. a local process died): fail it for
  // every worker now instead of at the deadline.
  void HandleAbort(const WireHeader& h, std::string_view message);
  // Fails collectives whose chunks are incomplete past the deadline; forgets old failures.
  void ExpireStale();

 private:
  struct ChunkState {
    WireHeader descriptor;  // of the first push
    std::vector<bool> received;
    uint32_t num_received = 0;
    std::shared_ptr<std::vector<std::byte>> sum;
    common::Clock::TimePoint started;
    std::chrono::steady_clock::time_point first_push_at;  // for the trace only
    // Chunk 0: the workers' throughput reports (WireHeader::step) received, and the slowest.
    uint32_t reports = 0;
    uint32_t slowest_report = UINT32_MAX;
  };
  // The partition tuner of one tensor at its home server.
  struct Tuning {
    MiadTuner tuner;
    std::map<uint64_t, uint64_t> decided;  // iteration -> decision sent with it, bytes (recent)
  };
  struct ChunkKey {
    CollectiveKey key;
    uint32_t chunk;
    friend auto operator<=>(const ChunkKey&, const ChunkKey&) = default;
  };
  struct Failure {
    absl::Status status;
    common::Clock::TimePoint expires;
  };
  struct Outgoing {
    std::string address;
    WireHeader header;
    std::shared_ptr<std::vector<std::byte>> payload;
  };
  struct Parked {
    WireHeader header;
    std::vector<std::byte> payload;
    common::Clock::TimePoint arrived;
  };

  void HandlePushLocked(const JobView& job, const WireHeader& h, std::span<const std::byte> payload,
                        std::vector<Outgoing>& out);
  // Fails every collective of `job` that still accumulates, with the retriable plan-change
  // error (new_version 0: the job left this node). mu_ held.
  void FailEpochLocked(const JobView& job, uint64_t new_version, std::vector<Outgoing>& out);
  // Sends `status` to the sender of `h` only. mu_ held.
  void ReplyErrorLocked(const JobView& job, const WireHeader& h, const absl::Status& status,
                        std::vector<Outgoing>& out);
  // Sends the error to every worker of the job and drops the collective's state. mu_ held.
  void FailLocked(const JobView& job, const WireHeader& h, absl::Status status,
                  std::vector<Outgoing>& out);
  void SendAll(std::vector<Outgoing> out);
  void AddHeld(int64_t delta);
  // Feeds chunk 0's reports to the tensor's tuner; returns the decision for its result (KiB, 0:
  // none). mu_ held.
  uint32_t DecideLocked(const JobView& job, const ChunkState& st);

  Transport* transport_;
  Reducer* reducer_;
  const common::Clock* clock_;
  PushPullStats* stats_;
  std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<const JobView>> jobs_;
  std::map<uint64_t, ChunkMap> maps_;  // per job, from its weights
  std::map<ChunkKey, ChunkState> chunks_;
  std::map<std::pair<CollectiveKey, uint64_t>, Failure> failures_;  // by (collective, epoch)
  std::map<std::pair<uint64_t, uint64_t>, Tuning> tuning_;          // by (job, tensor)
  std::deque<Parked> parked_;
  uint64_t parked_bytes_ = 0;
  std::function<void()> on_plan_missing_;
};

// The communication service of one worker node: cuts local operations into chunks, aggregates
// the local buffers chunk by chunk into staging (at most the credit window), pushes, and writes
// the pulled sums back. Chunks of all operations are sent in priority order (lower first, then
// submission order) while the bytes handed to the transport and not yet sent stay within the
// job's credit (as BytePS's scheduling credit: it bounds the send queue, so that a chunk of a
// later, more urgent tensor overtakes the ones still queued). The credit is not held until the
// sum comes back: a worker waiting for other workers' pushes to free its own window would
// deadlock when workers submit their tensors in different orders.
// How many chunks of one operation a worker may have pushed to one server before their sums come
// back. TCP flows that share a link do not share it evenly; without this bound the worker whose
// flow to a server is fast runs ahead of the one whose flow to that server is slow, the server
// sums at the pace of the slowest while the slow flow's backlog (send queue and socket buffer)
// grows, and that backlog becomes the operation's tail: on the emulated cluster (4 workers, 4
// spare hosts, 250 Mbit/s, 64 MiB in 512 KiB chunks) the last push of a chunk reached its
// server up to 1.1 s after the first. With 4: 2.42-2.44 s per all-reduce, 0.90 of the model's;
// 2: 2.88 s; 8: 2.54 s; unbounded: 2.98 s. Per operation, so workers that submit tensors in
// different orders never wait for each other's windows (each operation's first chunks always
// go).
inline constexpr uint32_t kPushPullAhead = 4;
// The same bound for a lone operation (Operation::lone: its chunks are 4-8 KiB and nothing else
// of the job is in flight): one chunk per server until its sum comes back. Deeper windows let
// the workers' small pushes queue up at the servers' links out of step, and each sum waits for
// the last of its pushes: with 4 spares at 125 Mbit/s, 64 KiB took 4.98 ms in step against
// 7.24 with 4 ahead, 128 KiB 10.4 against 13.1, 1 MiB 73.7 against 79.6 (2 ahead: 5.20, 10.7,
// 74.0; 16: 7.08, 17.9, 128), and BERT-large's fused small tensors 95 ms against 99
// (bench/results/lone_ahead_125mbit_s44/).
inline constexpr uint32_t kLonePushPullAhead = 1;
// The agent's PushPullWorker::SetServerBacklog by default: 256 KiB, with the connections to spare
// servers at kDefaultSpareServerUnsent. ResNet-50's gradients with 4 spares at 125 Mbit/s, one
// cluster each, 3 runs: 7133 ms per iteration (runs 7082-7379) against 7357 ms (7332-7974)
// without, 1.43x Gloo's ring against 1.38x; 64 MiB and every k = 0 config unchanged
// (bench/results/spare_lowat_125mbit_s26/). Session 24 had found the same with the low-water
// mark on every connection, which slowed the ring on this CPU-short machine, and the backlog with
// the kernel's buffers alone gained less (bench/results/push_backlog_125mbit_s24/).
inline constexpr uint64_t kDefaultServerBacklog = 256 << 10;
// The agent's PushPullWorker::SetSpareServerUnsentLimit by default: 128 KiB, 8 ms at 125 Mbit/s
// (64 KiB to 1 MiB measured alike in session 24).
inline constexpr uint32_t kDefaultSpareServerUnsent = 128 << 10;

// Peer recovery: closes the "fan-out hole". A summation server that dies (or freezes) part-way
// through sending a chunk's sum to the workers leaves the collective complete on the workers that
// got the sum and incomplete on the others; a retry of the iteration under the next epoch would
// then wait for workers that have moved on. So:
//  * every worker of a job with several workers and a dedicated summation server (a spare: one
//    that is not also a worker) keeps the sums of the last completed collective of each tensor
//    (the bytes the servers sent, within a budget, kDefaultRetainBytes), until the tensor's next
//    collective completes here (by then every worker has the earlier one). Jobs whose servers
//    are all workers keep nothing: such a server dies only with its worker, which ends the
//    iteration for every worker anyway (a membership change);
//  * a worker that would fail a collective on its own -- a summation server left the plan, its
//    deadline passed, or a server timed the chunk out -- first asks every other worker
//    (kPeerQuery) whether it completed it (under this epoch, or, when this is a retry, an
//    earlier one), and pushes nothing more. A worker answers (kPeerAnswer) once it knows: yes if it
//    keeps the sums; no if its own attempt failed or is recovering too, it runs a later epoch, or
//    it has not started the collective (a running attempt answers when it ends). Kept sums count
//    only for the same membership generation (a new one counts its iterations from 0 again), and
//    answers and copies go by the current plan's ranks and addresses;
//  * on the first yes it fetches its missing chunks from that worker (kPeerFetch, answered with
//    kResult messages carrying the worker's rank; should that one have lost them, from the next
//    that said yes) and completes as if the servers had sent them;
//    when every worker said no, or no answer came within WorkerGrace past the deadline, it fails
//    with the error it had, and the agent's retry runs the iteration again under the new epoch.
// A worker completes from the servers' sums or from a copy of them: never a different sum.
// Kept sums also go RetainedLifetime after their collective completed here: a tensor name that
// never comes again (PyTorch DDP's buckets before it rebuilds them, one-off collectives) would
// otherwise hold its copy, and the budget, for as long as the job runs.
inline constexpr uint64_t kDefaultRetainBytes = uint64_t{4} << 30;
// How long kept sums stay after their collective completed: 8 x (op_timeout + WorkerGrace), and
// at least 2 minutes. Every worker had pushed before this one completed, so a worker that needs
// the copy asks when its own attempt fails (its deadline, op_timeout + WorkerGrace, then up to
// WorkerGrace of recovery), or when a retry of it fails in turn: each retry may wait up to an
// op timeout in its agent (for the node's other processes or a newer plan) and then runs as
// long again, about 2 x (op_timeout + WorkerGrace), so the attempt and the client's default
// three retries (ClientOptions::max_retries) lie within this. A query later than that finds no
// copy, and fails as it would without peer recovery.
std::chrono::milliseconds RetainedLifetime(std::chrono::milliseconds op_timeout);

class PushPullWorker {
 public:
  PushPullWorker(Transport* transport, Reducer* reducer, const common::Clock* clock,
                 PushPullStats* stats);
  ~PushPullWorker();

  // A failed operation is completed once the transport is done with its pushes (a single local
  // buffer is pushed without a copy, and the caller may reuse it once told), or after this long
  // (ExpireStale), whichever comes first.
  static constexpr std::chrono::seconds kFailedSendGrace{2};

  // Adds or replaces a job's view. Operations already running keep the view they started with.
  void SetJob(const JobView& view);
  // Forgets the job; its running operations fail with CANCELLED.
  void RemoveJob(uint64_t job_hash);

  // Starts `op`. Returns an error (and never calls op.done) when it cannot start: unknown job
  // (NOT_FOUND), this node is not a worker (FAILED_PRECONDITION), bad sizes or buffers
  // (INVALID_ARGUMENT), the same tensor and iteration already running (ALREADY_EXISTS).
  absl::Status Start(const std::string& job_id, Operation op);
  // Sends what may go now: after an operation's StagedInput advanced.
  void Pump();

  // Tells the collective's home server (the owner of chunk 0, whatever the tensor's size) that
  // this node cannot take part in (tensor, iteration), so every worker fails at once.
  void Abort(const std::string& job_id, const std::string& tensor_name, uint64_t iteration,
             const absl::Status& reason);

  void HandleResult(const WireHeader& h, std::span<const std::byte> payload);
  void HandleError(const WireHeader& h, std::string_view message);
  // kPeerQuery, kPeerAnswer and kPeerFetch (see kDefaultRetainBytes).
  void HandlePeer(const WireHeader& h, std::span<const std::byte> payload);
  // Per summation server's address, the bytes of pushes handed to the transport and not yet
  // sent, at most (0: off, the class's default). When the queue's next chunk, in priority order, is
  // for a server at its limit, its job hands nothing further down the queue until that connection
  // drains: every server's pushes advance together. Left to TCP, the flows of one worker's
  // pushes to its servers share its link unevenly (25-36 Mbit/s each at 125 Mbit/s); the
  // slowest flow into a server gates that server's sums for every worker, so its results, and
  // the iteration, end last. Chunks held by a full window (kPushPullAhead: the server's sums,
  // not this connection, are late) are still passed over. Needs a transport whose completions
  // follow the wire to bind early (SetSpareServerUnsentLimit; with the kernel's default buffers
  // it binds only once a flow's socket is full). kDefaultServerBacklog for agents.
  void SetServerBacklog(uint64_t bytes) {
    std::lock_guard lock(mu_);
    server_backlog_bytes_ = bytes;
  }
  // With a backlog set: the unsent bytes a connection to a spare summation server (one that is
  // not a worker of the job) may hold in the kernel (Transport::SetPeerUnsentLimit, set by
  // SetJob), so that the backlog binds on what is about to leave rather than on a full socket
  // buffer. Only those connections: the ones among workers also carry the ring, which a small
  // limit slows where the CPU is short (kDefaultSpareServerUnsent): an address that is a worker
  // of any job here keeps the transport's default, and one that no job has as a spare any more
  // goes back to it. 0: the transport's default. Takes effect at the next SetJob or RemoveJob.
  void SetSpareServerUnsentLimit(uint32_t bytes) {
    std::lock_guard lock(mu_);
    spare_unsent_limit_ = bytes;
  }
  // Bytes of sums kept for peer recovery at most (kDefaultRetainBytes); 0 keeps none.
  void SetRetainBudget(uint64_t bytes) {
    std::lock_guard lock(mu_);
    retain_budget_ = bytes;
  }
  // Fails operations past their deadline with DEADLINE_EXCEEDED.
  void ExpireStale();

  // Test hook: given a completed tuned op's measured throughput (bytes/s on the injected clock),
  // returns the throughput to report instead. Called with the worker's lock held: it must not
  // call into the worker.
  using ThroughputHook =
      std::function<double(const std::string& tensor_name, uint64_t iteration,
                           uint64_t partition_bytes, uint32_t num_chunks, double measured)>;
  void SetThroughputHook(ThroughputHook hook) {
    std::lock_guard lock(mu_);
    throughput_hook_ = std::move(hook);
  }

 private:
  struct OpState;
  struct QueuedChunk {
    int32_t priority;
    uint64_t seq;
    uint32_t position;  // place in the operation's send order (see SendOrder)
    uint32_t chunk;
    CollectiveKey key;
    // Fixed when queued, so that the pump need not look them up for every chunk it passes.
    uint32_t server = 0;  // OpState::map.ServerOf
    uint64_t bytes = 0;   // OpState::ChunkBytes
    friend auto operator<=>(const QueuedChunk&, const QueuedChunk&) = default;
  };
  using Completion = std::pair<std::function<void(absl::Status)>, absl::Status>;
  // An op waiting for iteration - 2 of its tensor (see kTuneMinPartition).
  struct Held {
    std::string job_id;
    Operation op;
    common::Clock::TimePoint deadline;
  };
  // The sums of the last completed collective of one tensor (peer recovery).
  struct Retained {
    uint64_t iteration = 0;
    uint64_t count = 0;
    uint8_t dtype = 0;
    uint32_t num_chunks = 0;
    uint32_t decision_kib = 0;  // carried by chunk 0's sum
    std::shared_ptr<const JobView> job;
    std::shared_ptr<std::byte[]> sums;
    common::Clock::TimePoint expires;  // RetainedLifetime after the collective completed
  };
  // Partition tuning of one tensor at this worker.
  struct TensorTuning {
    std::map<uint64_t, uint64_t> decisions;  // iteration -> decision carried by it, bytes
    uint64_t last_partition = 0;             // of the last op started (0: none yet)
    bool has_report = false;
    uint64_t reported_iteration = 0;  // the last completed op, and its throughput
    uint32_t report_kib_s = 0;
  };

  // Start without the lock; `deadline` is kept by an op that was held. Leaves `op` untouched
  // when it returns an error. mu_ held.
  absl::Status StartLocked(const std::string& job_id, Operation& op,
                           std::optional<common::Clock::TimePoint> deadline);
  bool IsHeldLocked(const CollectiveKey& key) const;
  // Starts the ops held for `key` (which completed or failed); failures go to `done`.
  void ReleaseHeldLocked(const CollectiveKey& key, std::vector<Completion>& done);

  // Moves ready chunks into flight while the credit allows; returns the sends to make.
  void PumpLocked(std::vector<std::function<void()>>& sends);
  // Sets the transport's per-peer unsent limits to what the jobs now want
  // (SetSpareServerUnsentLimit).
  void UpdateUnsentLimitsLocked();
  void FailLocked(const CollectiveKey& key, absl::Status status, std::vector<Completion>& done);
  void Flush(std::vector<std::function<void()>> sends, std::vector<Completion> done);
  void SendChunk(std::shared_ptr<OpState> op, uint32_t chunk);
  void AddInFlight(int64_t delta);
  // Returns a chunk's bytes to its job's credit window. mu_ held.
  void ReleaseCreditLocked(OpState& op, uint32_t chunk);
  // Marks a chunk summed and its send complete; the operation completes with its last chunk.
  void ChunkDoneLocked(const std::shared_ptr<OpState>& op, uint32_t chunk,
                       std::vector<Completion>& done);
  // Fails the operation, or, when another worker may have completed it, starts peer recovery
  // (see kDefaultRetainBytes) and fails it with `status` only if that finds no copy. mu_ held.
  void FailOrRecoverLocked(const CollectiveKey& key, absl::Status status,
                           std::vector<Completion>& done);
  // Queues a peer message (no payload) to worker `rank` of `job`, sent after the lock is released
  // (as a completion in `done`). mu_ held.
  void SendPeerLocked(const JobView& job, MessageKind kind, const WireHeader& about, uint32_t rank,
                      uint64_t plan_version, absl::StatusCode code, std::vector<Completion>& done,
                      std::shared_ptr<std::vector<uint32_t>> chunks = nullptr);
  // Tells the workers that asked about `op` whether it completed here. mu_ held.
  void AnswerQueriesLocked(OpState& op, bool have, std::vector<Completion>& done);
  // Asks the next peer that said yes for every chunk still without its sum. mu_ held.
  void FetchNextLocked(OpState& op, std::vector<Completion>& done);
  // A recovering op heard from every peer, none with the sums: fail it. mu_ held.
  void MaybeEndRecoveryLocked(const CollectiveKey& key, std::vector<Completion>& done);
  // Records the chunk's phases in the trace (common/trace.h). mu_ held.
  void TraceChunkLocked(const OpState& op, uint32_t chunk, uint32_t server);
  // Removes a chunk from queue_ (and queued_bytes_); returns the next. mu_ held.
  // `op`: the chunk's operation, whose per-server queued count drops (nullptr: it has ended).
  std::set<QueuedChunk>::iterator EraseQueuedLocked(std::set<QueuedChunk>::iterator it,
                                                    OpState* op);

  Transport* transport_;
  Reducer* reducer_;
  const common::Clock* clock_;
  PushPullStats* stats_;
  std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<const JobView>> jobs_;
  std::map<CollectiveKey, std::shared_ptr<OpState>> ops_;
  // Failed operations waiting for sends the transport still holds (OpState::sends_at_failure).
  std::vector<std::shared_ptr<OpState>> draining_;
  std::set<QueuedChunk> queue_;
  // Per job, the sizes of its queued chunks: the pump stops walking the queue once no queued
  // chunk of any job fits within its job's credit (PumpLocked).
  std::map<uint64_t, std::multiset<uint64_t>> queued_bytes_;
  std::map<uint64_t, uint64_t> in_flight_bytes_;  // per job
  // Per summation server address: bytes handed to the transport whose send has not completed.
  std::map<std::string, uint64_t, std::less<>> server_unsent_;
  uint64_t server_backlog_bytes_ = 0;
  uint32_t spare_unsent_limit_ = 0;
  // The limits set on the transport (UpdateUnsentLimitsLocked), by peer address.
  std::map<std::string, uint32_t> unsent_limits_;
  uint64_t next_seq_ = 0;
  std::map<CollectiveKey, std::vector<Held>> held_;               // by the key they wait for
  std::map<std::pair<uint64_t, uint64_t>, TensorTuning> tuning_;  // by (job, tensor)
  std::map<std::pair<uint64_t, uint64_t>, Retained> retained_;    // by (job, tensor)
  std::map<uint64_t, bool> dedicated_servers_;  // per job: a server that is not a worker
  uint64_t retain_budget_ = kDefaultRetainBytes;
  ThroughputHook throughput_hook_;
};

// Both roles of one node as one CollectiveAlgorithm: the server takes pushes and aborts, the
// worker posts operations and takes results and errors. Serves Algorithm::kPushPull only, and
// declines nothing else it is asked (sizes are checked at Post).
class PushPull : public CollectiveAlgorithm {
 public:
  PushPull(Transport* transport, Reducer* reducer, const common::Clock* clock);

  void SetJob(const JobView& view) override;
  void RemoveJob(uint64_t job_hash) override;
  absl::Status CanServe(Algorithm algorithm, const Operation& op) const override;
  absl::Status Post(const std::string& job_id, Algorithm algorithm, Operation op) override;
  void HandleMessage(const WireHeader& h, std::span<const std::byte> payload) override;
  void ExpireStale() override;
  // Tells the collective's home server, which fails it for every worker (see
  // PushPullWorker::Abort).
  void Abort(const std::string& job_id, const std::string& tensor_name, uint64_t iteration,
             const absl::Status& reason) override;

  PushPullServer& server() { return server_; }
  PushPullWorker& worker() { return worker_; }
  const PushPullStats& stats() const { return stats_; }

 private:
  PushPullStats stats_;
  PushPullServer server_;
  PushPullWorker worker_;
};

}  // namespace tributary::dataplane
