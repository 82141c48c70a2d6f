// Peer-to-peer collectives (ring, halving-doubling all-reduce; ring broadcast) as non-blocking
// tasks over a Transport: Start posts an operation, incoming messages and send completions
// progress it, its done callback reports the result (DESIGN.md §1.4).
//
// An algorithm is a *schedule*: for this rank, a list of steps, each sending one element range
// to one peer and/or receiving one element range from one peer (summed into, or copied over, the
// buffer). The engine runs any schedule: it cuts each step's ranges into sub-chunks of at most
// partition_bytes, sends a sub-chunk as soon as the data it reads is final (so the transfer of
// chunk c overlaps the summation of chunk c + 1), and applies received sub-chunks in place.
// allreduce_ring.h and allreduce_halving_doubling.h build the schedules.
//
// Messages carry a CollectiveHeader whose first fields (magic, version, kind) are those of the
// push/pull WireHeader, with kinds >= kFirstCollectiveKind: see IsCollectiveMessage for the
// dispatch rule when both protocols share a transport.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "dataplane/collectives/algorithm_selector.h"
#include "dataplane/collectives/wire.h"
#include "dataplane/reduce/reducer.h"
#include "dataplane/transport/transport.h"

namespace tributary::dataplane {

// ---------------------------------------------------------------------------------------------
// Wire format

// Message kinds of this protocol; push/pull uses 1..3. Everything >= 16 belongs to this engine.
inline constexpr uint8_t kFirstCollectiveKind = 16;
enum class CollectiveMessageKind : uint8_t {
  kData = 16,   // one sub-chunk of one step; payload: its elements
  kError = 17,  // the collective failed on the sender; payload: the reason (text)
};

// What the collective computes; values travel on the wire.
enum class CollectiveKind : uint8_t { kSum = 1, kAverage = 2, kBroadcast = 3 };

#pragma pack(push, 1)
struct CollectiveHeader {
  static constexpr uint8_t kVersion = 1;

  uint32_t magic = WireHeader::kMagic;  // same first 6 bytes as WireHeader
  uint8_t version = kVersion;
  uint8_t kind = 0;       // CollectiveMessageKind (byte offset 5)
  uint8_t dtype = 0;      // common::DataType
  uint8_t algorithm = 0;  // Algorithm
  uint8_t op = 0;         // CollectiveKind
  uint8_t reserved0[3] = {0, 0, 0};
  uint64_t job = 0;        // StableHash64(job id)
  uint64_t tensor = 0;     // StableHash64(tensor name)
  uint64_t iteration = 0;  // n-th submission of this tensor name in the job
  uint64_t plan_version = 0;
  uint64_t tensor_count = 0;  // elements in the whole tensor
  uint32_t world_size = 0;    // ranks in the collective
  uint32_t sender = 0;        // rank of the sender
  uint32_t root = 0;          // broadcast: root rank; 0 otherwise
  uint32_t step = 0;          // index into the receiver's schedule
  uint32_t chunk = 0;         // sub-chunk of the step's range
  uint32_t num_chunks = 0;    // sub-chunks of the step's range (>= 1)
  uint64_t offset = 0;        // first element of this sub-chunk in the tensor
  uint64_t count = 0;         // elements in this sub-chunk (0 only when the step's range is empty)
  uint32_t error_code = 0;    // absl::StatusCode, kError only
  uint32_t reserved1 = 0;
};
#pragma pack(pop)
static_assert(sizeof(CollectiveHeader) <= Transport::kMaxHeaderBytes);

inline std::span<const std::byte> AsBytes(const CollectiveHeader& h) {
  return {reinterpret_cast<const std::byte*>(&h), sizeof(h)};
}

// The dispatch rule for a transport shared with push/pull: a header of at least 6 bytes whose
// magic is WireHeader::kMagic and whose byte 5 (kind) is >= kFirstCollectiveKind goes to
// CollectiveEngine::HandleMessage; everything else to the push/pull node.
bool IsCollectiveMessage(std::span<const std::byte> header);

// Parses and validates a header against its payload length: magic, version, kind, dtype,
// algorithm, operation, ranks, sub-chunk range and payload size. INVALID_ARGUMENT otherwise.
absl::StatusOr<CollectiveHeader> ParseCollectiveHeader(std::span<const std::byte> header,
                                                       size_t payload_bytes);

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

// What one node knows about a job from the job's current plan.
struct RankView {
  std::string job_id;
  uint64_t plan_version = 0;
  std::vector<std::string> rank_addresses;  // data-plane address of each rank
  int my_rank = -1;
  uint64_t partition_bytes = 4 << 20;           // largest sub-chunk (one message), bytes
  std::chrono::milliseconds op_timeout{30000};  // deadline of one collective

  uint64_t job_hash() const;
  int world_size() const { return static_cast<int>(rank_addresses.size()); }
};

// One collective as this rank submits it: in place on one buffer.
struct CollectiveOperation {
  std::string tensor_name;
  uint64_t iteration = 0;  // n-th submission of this name in the job, same on every rank
  common::DataType dtype = common::DataType::kFloat32;
  uint64_t count = 0;  // elements in `buffer`, >= 1
  CollectiveKind kind = CollectiveKind::kSum;
  uint32_t root = 0;            // broadcast: the rank whose buffer is sent to all
  std::byte* buffer = nullptr;  // read and written in place until done runs
  int32_t priority = 0;         // lower goes first (recorded; see README_algorithms.md)
  // Keeps `buffer` valid until done has run and, after a failure, until sends already handed to
  // the transport have completed.
  std::shared_ptr<void> keepalive;
  // Runs exactly once, on the calling thread of Start or on the transport's thread, without
  // engine locks held.
  std::function<void(absl::Status)> done;
};

// Counters for tests and metrics. Monotonic.
struct CollectiveEngineStats {
  std::atomic<uint64_t> ops_started{0};
  std::atomic<uint64_t> ops_completed{0};
  std::atomic<uint64_t> ops_failed{0};
  std::atomic<uint64_t> fallbacks{0};  // Start ran another algorithm than asked
  std::atomic<uint64_t> messages_sent{0};
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> messages_received{0};
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> malformed_messages{0};  // dropped: bad header, range, sender, duplicate
  std::atomic<uint64_t> early_messages{0};      // buffered before their operation started
  std::atomic<uint64_t> early_dropped{0};       // over kMaxEarlyBytes or expired
  std::atomic<uint64_t> late_messages{0};       // for an operation already failed or finished
  std::atomic<uint64_t> send_failures{0};       // transport sends that failed
};

// The peer-to-peer collectives of one node.
//
// Ownership: borrows the transport, reducer and clock (they outlive the engine; shut the
// transport down before destroying the engine). Does not install a receive handler: the owner's
// dispatcher feeds it with HandleMessage (see IsCollectiveMessage).
// Threading: thread-safe. HandleMessage runs on the transport thread and never blocks on the
// network; sums run there under the engine's lock. Sends and done callbacks run outside locks.
// Invariants: an operation is identified by (job, tensor, iteration); messages of other
// iterations never touch its buffer. Messages for an operation not started here yet are copied
// and kept (at most kMaxEarlyBytes, at most kTombstoneTtl); a range of the buffer is rewritten
// only after every earlier send that read it has been received by its peer.
class CollectiveEngine {
 public:
  static constexpr uint64_t kMaxEarlyBytes = uint64_t{256} << 20;
  // How long early messages, and the memory of failed and finished operations, are kept.
  static constexpr std::chrono::seconds kTombstoneTtl{60};

  CollectiveEngine(Transport* transport, Reducer* reducer, const common::Clock* clock);
  ~CollectiveEngine();

  // Adds or replaces a job's view. Running operations keep the view they started with.
  void SetJob(const RankView& view);
  void RemoveJob(const std::string& job_id);

  // Whether `algorithm` can run `op` over `world_size` ranks: OK, or UNIMPLEMENTED /
  // FAILED_PRECONDITION saying why not (push/pull is not this engine's).
  static absl::Status CanServe(Algorithm algorithm, const CollectiveOperation& op, int world_size);

  // Starts `op` with `algorithm` (or, when that one declines, ring). Returns an error (and never
  // calls op.done) when it cannot start: unknown job (NOT_FOUND), this node has no rank
  // (FAILED_PRECONDITION), bad sizes, root or buffer (INVALID_ARGUMENT), the same tensor and
  // iteration already running (ALREADY_EXISTS). Otherwise op.done runs exactly once: OK,
  // INVALID_ARGUMENT (ranks disagree on the descriptor), DEADLINE_EXCEEDED (ExpireStale, naming
  // the step and the peer waited on), UNAVAILABLE (a send failed), CANCELLED (job removed), or
  // the error another rank reported.
  absl::Status Start(const std::string& job_id, Algorithm algorithm, CollectiveOperation op);

  // Feeds one incoming message (header and payload valid only during the call). Messages that do
  // not parse, or do not fit the schedule, are dropped and counted.
  void HandleMessage(std::span<const std::byte> header, std::span<const std::byte> payload);

  // Fails operations past their deadline with DEADLINE_EXCEEDED (and tells the other ranks);
  // drops expired early messages and tombstones. Call periodically.
  void ExpireStale();

  const CollectiveEngineStats& stats() const { return stats_; }
  // Operations running now.
  size_t active_operations() const;

 private:
  struct OpState;
  struct Outgoing;
  struct Early {
    CollectiveHeader header;
    std::vector<std::byte> payload;
    common::Clock::TimePoint arrived;
  };
  struct Tombstone {
    absl::Status status;  // OK: finished
    common::Clock::TimePoint expires;
  };
  using Completion = std::pair<std::function<void(absl::Status)>, absl::Status>;

  // All *Locked methods run with mu_ held and queue their side effects in out / done.
  void DeliverLocked(const std::shared_ptr<OpState>& op, const CollectiveHeader& h,
                     std::span<const std::byte> payload, std::vector<Outgoing>& out,
                     std::vector<Completion>& done);
  void ApplyLocked(OpState& op, const CollectiveHeader& h, std::span<const std::byte> payload);
  void AdvanceLocked(const std::shared_ptr<OpState>& op, std::vector<Outgoing>& out,
                     std::vector<Completion>& done);
  void FailLocked(const std::shared_ptr<OpState>& op, absl::Status status, bool tell_peers,
                  std::vector<Outgoing>& out, std::vector<Completion>& done);
  void OnSendDone(const std::shared_ptr<OpState>& op, int peer, absl::Status status);
  void Flush(std::vector<Outgoing> out, std::vector<Completion> done);

  Transport* transport_;
  Reducer* reducer_;
  const common::Clock* clock_;
  CollectiveEngineStats stats_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<const RankView>> jobs_;
  std::map<CollectiveKey, std::shared_ptr<OpState>> ops_;
  std::map<CollectiveKey, std::deque<Early>> early_;
  uint64_t early_bytes_ = 0;
  std::map<CollectiveKey, Tombstone> tombstones_;
};

}  // namespace tributary::dataplane
