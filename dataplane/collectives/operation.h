// One collective as a node submits it, from the agent down to the wire.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"

namespace tributary::dataplane {

// What a collective computes. Values match tributary.v1.CollectiveOp and travel on the wire
// (WireHeader::reduce) for every algorithm.
enum class Reduction : uint8_t {
  kSum = 1,
  kAverage = 2,    // the sum divided by the job's number of training processes
  kBroadcast = 3,  // the root process's buffer copied to every process
  // Block-wise collectives: each buffer holds world_size() * count elements, block g (count
  // elements) belonging to the process of global rank g = node rank * procs_per_node + local
  // index, so a node's processes own one contiguous super-block of procs_per_node * count.
  kAllGather = 4,             // every process's block copied into every buffer
  kReduceScatterSum = 5,      // block g of process g: the sum of block g over all processes
  kReduceScatterAverage = 6,  // the same divided by the job's number of training processes
  // Asynchronous parameter-server jobs (parameter_server.h): one process's operation on the
  // parameters its job's summation servers hold, never gathered across processes.
  kPsInit = 7,   // global rank 0: push the initial values; others: wait for them and copy them
  kPsDelta = 8,  // params += scale * buffer on the servers, exactly once
  kPsPull = 9,   // copy the current params into the buffer (bounded staleness)
};

// "sum", "average", "broadcast", "allgather", "reduce_scatter_sum", "reduce_scatter_average".
std::string_view ReductionName(Reduction r);
bool IsValidReduction(uint32_t raw);
// All-gather or reduce-scatter: `count` is a block and the buffers hold world_size() blocks.
bool IsBlockwise(Reduction r);
bool IsReduceScatter(Reduction r);
// kPsInit, kPsDelta or kPsPull: served by ParameterServer only.
bool IsParameterServer(Reduction r);

// Retriable failures (epoch fencing). A job's plan version is its epoch: every data-plane
// message carries the epoch its sender runs the collective under, and messages of another epoch
// than the receiver's collective are dropped and counted, never summed. A collective that cannot
// complete under its epoch because the plan changed (a summation server left it, a server moved
// on to a newer plan) fails with UNAVAILABLE carrying the epoch it ran under (`EpochOf`), so that
// the agent can run the same iteration again once it has a newer plan.
inline constexpr char kEpochPayloadUrl[] = "type.tributary.dev/plan-epoch";
// UNAVAILABLE "plan of job J changed from vA to vB during <what>; retry", carrying epoch A.
absl::Status PlanChangedError(absl::string_view job_id, uint64_t from, uint64_t to,
                              absl::string_view what);
// `status` with `epoch` attached (the epoch the failed attempt ran under).
absl::Status WithEpoch(absl::Status status, uint64_t epoch);
// The epoch attached by WithEpoch / PlanChangedError; nullopt when there is none.
std::optional<uint64_t> EpochOf(const absl::Status& status);

// An operation's input that arrives while the collective runs, and its result handed back as it
// becomes final: a training process's GPU tensor, copied to host memory a chunk at a time
// (agent/mirror_stager.h) so that the copies overlap the network instead of preceding and
// following it.
//
// The producer fills bytes [0, ready()) of every buffer (a prefix that only grows) and calls
// Advance, then tells the data plane (DataPlaneNode::StagedInputAdvanced). An algorithm that
// supports it (push/pull's sum and average) touches bytes [b, e) of the buffers -- reads them or
// writes a result there -- only once ready() >= e, and calls Final(b, e) as soon as those bytes of
// every buffer hold the result. Any other operation waits for the whole input before it starts
// and reports nothing final: the producer copies back whatever was not reported after `done`.
// Threading: thread-safe.
class StagedInput {
 public:
  explicit StagedInput(uint64_t bytes) : bytes_(bytes) {}
  StagedInput(const StagedInput&) = delete;
  StagedInput& operator=(const StagedInput&) = delete;

  // Bytes per buffer.
  uint64_t bytes() const { return bytes_; }
  // Bytes of every buffer, from the start, that hold the input.
  uint64_t ready() const { return ready_.load(std::memory_order_acquire); }
  bool complete() const { return ready() >= bytes_; }
  // Producer: bytes [0, ready) of every buffer hold the input (ready <= bytes(); never less than
  // before).
  void Advance(uint64_t ready);
  // Producer: where Final goes (set before the operation starts).
  void SetFinalSink(std::function<void(uint64_t offset, uint64_t bytes)> sink);
  // Algorithm: bytes [offset, offset + bytes) of every buffer hold the result (each byte at most
  // once per operation). Called without data-plane locks held.
  void Final(uint64_t offset, uint64_t bytes) const;

 private:
  const uint64_t bytes_;
  std::atomic<uint64_t> ready_{0};
  std::function<void(uint64_t, uint64_t)> sink_;  // set before sharing
};

// One collective as the local training processes submitted it: in place on their buffers.
struct Operation {
  std::string tensor_name;
  uint64_t iteration = 0;  // n-th submission of this name in the job, same on every node
  common::DataType dtype = common::DataType::kFloat32;
  // Elements per buffer, >= 1; for all-gather and reduce-scatter (IsBlockwise) the elements of
  // one process's block, and each buffer then holds world_size() * count elements.
  uint64_t count = 0;
  Reduction reduction = Reduction::kSum;
  uint32_t root_node = 0;   // broadcast: worker rank of the node holding the root process
  uint32_t root_local = 0;  // broadcast on the root node: index in `buffers` of the root
  // One buffer per local training process (procs_per_node of them for push/pull), count elements
  // each; the result is written into every one. Sum and average read all of them, broadcast the
  // root's.
  std::vector<std::byte*> buffers;
  int32_t priority = 0;  // lower goes first
  // Keeps `buffers` valid until `done` has run and, after a failure, until sends already handed
  // to the transport have completed.
  std::shared_ptr<void> keepalive;
  // Runs exactly once, without data-plane locks held, with the collective's result: on the
  // thread that started it (DataPlaneNode::Start, CollectiveAlgorithm::Post) or on the
  // transport's thread. Never runs when the start itself returned an error.
  std::function<void(absl::Status)> done;

  // Parameter-server operations (IsParameterServer(reduction)) only; `buffers` then holds the
  // one buffer of one process.
  uint32_t ps_worker = 0;  // the process's global rank: the worker whose clock it advances
  double ps_scale = 0;     // kPsDelta: the servers' scale for this delta; 0 = the job's
  // kPsInit / kPsPull: receives the parameters' version before `done` runs OK (may be null).
  std::shared_ptr<uint64_t> ps_version;

  // Input still being copied in (null: every buffer holds its input at Start). See StagedInput.
  std::shared_ptr<StagedInput> staged;

  // The agent's own coordination (tensor fusion's list and decisions, agent/tensor_fusion.h):
  // runs like any other operation but stays out of the operation metrics and the job's
  // observations (collectives, busy time, iterations), and, in a job of several worker nodes,
  // among them whatever the job's algorithm (never through a summation server): a broadcast
  // straight from the root to each (StarBroadcastSchedule), anything else on the ring.
  bool control = false;

  // Little else of the job runs while it does (tensor fusion's leader says so of a fused
  // collective it decided with under kLoneFusionBytes of the job in flight, and FusingRunner of
  // every all-reduce under kLoneFusionBytes it runs unfused; agent/tensor_fusion.h): the
  // collective's time is its pipeline's fill and drain, not its share of a busy link, so
  // push/pull cuts it into chunks of down to kMinLoneChunkBytes (kLoneBulkChunkBytes once that
  // gives every server kLoneBulkChunksPerServer of them) instead of kMinPipelineChunkBytes
  // (dataplane/schedule/chunk_map.h). Every node must pass the same value
  // for the same collective (workers that do not fail it with INVALID_ARGUMENT).
  bool lone = false;
};

}  // namespace tributary::dataplane
