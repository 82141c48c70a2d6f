#include "dataplane/collectives/collective_engine.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/hash.h"
#include "common/logging.h"
#include "dataplane/collectives/allgather_reduce_scatter_halving_doubling.h"
#include "dataplane/collectives/allgather_reduce_scatter_ring.h"
#include "dataplane/collectives/allreduce_halving_doubling.h"
#include "dataplane/collectives/allreduce_recursive_doubling.h"
#include "dataplane/collectives/allreduce_ring.h"

namespace tributary::dataplane {
namespace {

using common::DataType;
using common::DataTypeSize;

constexpr auto Log = common::ComponentLog<"collectives">;

uint64_t NumChunks(uint64_t count, uint64_t chunk_elems) {
  return count == 0 ? 1 : (count + chunk_elems - 1) / chunk_elems;
}

// "42 x float32 average by ring over 4 ranks (plan v7)".
std::string DescribeShape(const WireHeader& h) {
  return absl::StrCat(
      h.tensor_count, " x ", std::string(common::DataTypeName(static_cast<DataType>(h.dtype))), " ",
      std::string(ReductionName(static_cast<Reduction>(h.reduce))),
      h.reduce == static_cast<uint8_t>(Reduction::kBroadcast) ? absl::StrCat(" from rank ", h.root)
                                                              : "",
      " by ", std::string(AlgorithmName(static_cast<Algorithm>(h.algorithm))), " over ",
      h.world_size, " ranks (plan v", h.plan_version, ")");
}

bool SameDescriptor(const WireHeader& a, const WireHeader& b) {
  return a.dtype == b.dtype && a.algorithm == b.algorithm && a.reduce == b.reduce &&
         a.plan_version == b.plan_version && a.tensor_count == b.tensor_count &&
         a.world_size == b.world_size && a.root == b.root;
}

}  // namespace

BlockRange GetBlock(uint64_t count, uint64_t num_blocks, uint64_t index) {
  const uint64_t q = count / num_blocks;
  const uint64_t rem = count % num_blocks;
  return {index * q + std::min(index, rem), q + (index < rem ? 1 : 0)};
}

// ---------------------------------------------------------------------------------------------
// Engine state

struct CollectiveEngine::Outgoing {
  std::string address;
  WireHeader header;
  std::span<const std::byte> payload;
  std::shared_ptr<OpState> op;  // data: completion goes to it
  int peer = -1;
  std::shared_ptr<const std::string> message;  // error: the payload's owner
};

struct CollectiveEngine::OpState {
  CollectiveKey key;
  std::shared_ptr<const JobView> view;
  Operation op;
  std::byte* buffer = nullptr;  // the one of op.buffers that takes part among the nodes
  Algorithm algorithm = Algorithm::kRing;
  WireHeader descriptor;  // data header of this rank, without step/chunk fields
  std::vector<ScheduleStep> steps;
  size_t elem_size = 0;
  uint64_t chunk_elems = 1;
  std::vector<std::vector<bool>> arrived;   // [step][chunk]: applied or deferred
  std::vector<std::vector<bool>> received;  // [step][chunk]: applied
  std::vector<uint64_t> recv_left;          // [step]: receives not applied yet
  std::vector<std::vector<bool>> sent;      // [step][chunk]: send completed (OK)
  std::vector<uint64_t> send_left;          // [step]: sends not completed yet
  size_t recv_step = 0;                     // first step whose receives are incomplete
  size_t send_step = 0;                     // first step whose sends are not all posted
  uint64_t send_cursor = 0;                 // next sub-chunk of send_step to post (posted in order)
  uint64_t sends_outstanding = 0;
  // Received before they may be applied (copies), by element offset: what an applied receive or
  // a completed send of a range can let go is found by overlap, not by scanning everything.
  std::multimap<uint64_t, Early> deferred;
  // Element ranges applied or whose send completed since deferred receives were last looked at,
  // and whether recv_step moved (which may let any kAllPreviousSteps receive go).
  std::vector<std::pair<uint64_t, uint64_t>> woken;
  bool recv_step_moved = false;
  common::Clock::TimePoint started;
  bool finished = false;
  // A failed operation whose sends the transport still holds: its completion waits for them
  // (until kFailedSendGrace), because the caller may free the buffer they read once told.
  Completion failure;
  bool failure_pending = false;
  common::Clock::TimePoint failed_at;

  std::string Name() const {
    return absl::StrCat(std::string(AlgorithmName(algorithm)), " ",
                        std::string(ReductionName(op.reduction)), " of tensor '", op.tensor_name,
                        "' iteration ", op.iteration, " (job ", view->job_id, ")");
  }
  uint64_t SendChunks(size_t s) const { return NumChunks(steps[s].send_count, chunk_elems); }
  uint64_t RecvChunks(size_t s) const { return NumChunks(steps[s].recv_count, chunk_elems); }

  // Whether `done` holds for every sub-chunk of the range [offset, offset + count) of a step
  // (cut into sub-chunks from `offset`) that overlaps the elements [a, b).
  bool AllOverlapping(const std::vector<bool>& done, uint64_t offset, uint64_t count, uint64_t a,
                      uint64_t b) const {
    const uint64_t lo = std::max(offset, a);
    const uint64_t hi = std::min(offset + count, b);
    if (lo >= hi) return true;
    for (uint64_t c = (lo - offset) / chunk_elems; c <= (hi - 1 - offset) / chunk_elems; ++c) {
      if (!done[c]) return false;
    }
    return true;
  }
  // Every receive of steps before `s` is applied on elements [a, b).
  bool EarlierReceivesApplied(size_t s, uint64_t a, uint64_t b) const {
    for (size_t t = recv_step; t < s; ++t) {
      const ScheduleStep& step = steps[t];
      if (step.recv_peer < 0 || recv_left[t] == 0) continue;
      if (!AllOverlapping(received[t], step.recv_offset, step.recv_count, a, b)) return false;
    }
    return true;
  }
  // Every send of steps before `s` that read an element of [a, b) has completed (s = this step
  // + 1: this step's sends too).
  bool EarlierSendsCompleted(size_t s, uint64_t a, uint64_t b) const {
    for (size_t t = 0; t < s; ++t) {
      const ScheduleStep& step = steps[t];
      if (step.send_peer < 0 || send_left[t] == 0) continue;
      if (!AllOverlapping(sent[t], step.send_offset, step.send_count, a, b)) return false;
    }
    return true;
  }
  // Whether the received sub-chunk `h` may be applied now (see ScheduleStep::ApplyAfter).
  bool MayApply(const WireHeader& h) const {
    const ScheduleStep& step = steps[h.step];
    if (step.apply_early) return true;
    switch (step.apply_after) {
      case ScheduleStep::ApplyAfter::kAllPreviousSteps:
        return h.step <= recv_step;
      case ScheduleStep::ApplyAfter::kEarlierStepsCoveringRange:
        return EarlierReceivesApplied(h.step, h.chunk_offset, h.chunk_offset + h.chunk_count) &&
               EarlierSendsCompleted(h.step, h.chunk_offset, h.chunk_offset + h.chunk_count);
      case ScheduleStep::ApplyAfter::kThisAndEarlierStepsCoveringRange:
        return EarlierReceivesApplied(h.step, h.chunk_offset, h.chunk_offset + h.chunk_count) &&
               EarlierSendsCompleted(h.step + 1, h.chunk_offset, h.chunk_offset + h.chunk_count);
    }
    return false;
  }
};

CollectiveEngine::CollectiveEngine(Transport* transport, Reducer* reducer,
                                   const common::Clock* clock)
    : transport_(transport), reducer_(reducer), clock_(clock) {}

CollectiveEngine::~CollectiveEngine() = default;

void CollectiveEngine::SetJob(const JobView& view) {
  std::vector<Outgoing> out;
  std::vector<Completion> done;
  {
    std::lock_guard lock(mu_);
    auto [g, first] = generations_.try_emplace(view.job_hash(), view.generation, 0);
    const bool moved = !first && view.generation > g->second.first;
    if (moved) g->second = {view.generation, view.plan_version};
    jobs_[view.job_hash()] = std::make_shared<const JobView>(view);
    if (moved) {
      // The job's membership moved on: its collectives of an older generation can no longer
      // complete (the other nodes count their iterations from 0 again and will not send them),
      // so they fail now, retriable, instead of at their op timeout. A rank left waiting there
      // joined the new generation's sync an op timeout late, past its peers' deadline. The
      // peers are not told: the old plan's addresses may be gone, and each gets this plan too.
      std::vector<std::shared_ptr<OpState>> older;
      for (auto& [key, op] : ops_) {
        if (key.job == view.job_hash() && !op->finished && op->view->generation < view.generation) {
          older.push_back(op);
        }
      }
      for (auto& op : older) {
        FailLocked(
            op,
            PlanChangedError(view.job_id, op->descriptor.plan_version, view.plan_version,
                             absl::StrCat(op->Name(), " (membership generation ",
                                          op->view->generation, " -> ", view.generation, ")")),
            false, out, done);
      }
    }
  }
  Flush(std::move(out), std::move(done));
}

void CollectiveEngine::SetEarlyMessageLimit(uint64_t bytes) {
  std::lock_guard lock(mu_);
  max_early_bytes_ = bytes;
}

uint64_t CollectiveEngine::GenerationStartLocked(uint64_t job) const {
  auto g = generations_.find(job);
  return g == generations_.end() ? 0 : g->second.second;
}

std::chrono::nanoseconds CollectiveEngine::EarlyTtlLocked(uint64_t job) const {
  std::chrono::nanoseconds ttl = kTombstoneTtl;
  if (auto it = jobs_.find(job); it != jobs_.end()) {
    ttl = std::max(ttl, std::chrono::nanoseconds(it->second->op_timeout));
  }
  return ttl;
}

void CollectiveEngine::RemoveJob(uint64_t job) {
  std::vector<Outgoing> out;
  std::vector<Completion> done;
  {
    std::lock_guard lock(mu_);
    jobs_.erase(job);
    generations_.erase(job);
    std::vector<std::shared_ptr<OpState>> victims;
    for (auto& [key, op] : ops_) {
      if (key.job == job) victims.push_back(op);
    }
    for (auto& op : victims) {
      FailLocked(op, absl::CancelledError(absl::StrCat(op->Name(), ": job removed")), false, out,
                 done);
    }
    for (auto it = early_.begin(); it != early_.end();) {
      if (it->first.job == job) {
        for (const Early& e : it->second) early_bytes_ -= e.bytes();
        it = early_.erase(it);
      } else {
        ++it;
      }
    }
  }
  Flush(std::move(out), std::move(done));
}

size_t CollectiveEngine::active_operations() const {
  std::lock_guard lock(mu_);
  return ops_.size();
}

void CollectiveEngine::SetHalvingDoublingPipelined(bool pipelined) {
  std::lock_guard lock(mu_);
  hd_pipelined_ = pipelined;
}

absl::Status CollectiveEngine::CanServe(Algorithm algorithm, const Operation& op) const {
  switch (algorithm) {
    case Algorithm::kRing:
      return absl::OkStatus();
    case Algorithm::kHalvingDoubling:
      if (op.reduction == Reduction::kBroadcast) {
        return absl::UnimplementedError("halving-doubling does not implement broadcast");
      }
      return absl::OkStatus();
    case Algorithm::kRecursiveDoubling:
      if (op.reduction == Reduction::kBroadcast || IsBlockwise(op.reduction)) {
        return absl::UnimplementedError(
            absl::StrCat("recursive doubling implements all-reduce only, not ",
                         std::string(ReductionName(op.reduction))));
      }
      return absl::OkStatus();
    case Algorithm::kPushPull:
      return absl::FailedPreconditionError(
          "push/pull runs on summation servers (PushPull), not on the peer-to-peer engine");
    case Algorithm::kParameterServer:
      return absl::FailedPreconditionError(
          "parameter-server operations run on the summation servers (ParameterServer)");
    case Algorithm::kAuto:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("no such algorithm: ", std::string(AlgorithmName(algorithm))));
}

absl::Status CollectiveEngine::Post(const std::string& job_id, Algorithm algorithm, Operation op) {
  const std::string what = absl::StrCat("job '", job_id, "' tensor '", op.tensor_name, "'");
  if (op.buffers.empty() || op.count == 0 ||
      !common::IsValidDataType(static_cast<uint32_t>(op.dtype))) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": empty operation"));
  }
  if (std::find(op.buffers.begin(), op.buffers.end(), nullptr) != op.buffers.end()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null buffer"));
  }
  const bool broadcast = op.reduction == Reduction::kBroadcast;
  if (broadcast && op.root_local >= op.buffers.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": broadcast root out of range"));
  }
  if (!op.done) return absl::InvalidArgumentError(absl::StrCat(what, ": no done callback"));
  if (absl::Status s = CanServe(algorithm, op); !s.ok()) return s;
  const uint64_t job = common::StableHash64(job_id);
  std::shared_ptr<const JobView> view;
  {
    std::lock_guard lock(mu_);
    auto job_it = jobs_.find(job);
    if (job_it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("job ", job_id, " is not known here"));
    }
    view = job_it->second;
  }
  const int n = view->num_workers();
  if (view->my_worker_rank < 0 || view->my_worker_rank >= n) {
    return absl::FailedPreconditionError(absl::StrCat("this node has no rank in job ", job_id,
                                                      " (rank ", view->my_worker_rank, ")"));
  }
  if (broadcast && op.root_node >= static_cast<uint32_t>(n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", op.root_node, " of a world of ", n));
  }
  // All-gather and reduce-scatter: each buffer holds world_size() blocks of op.count; the node's
  // processes own the contiguous super-block of procs_per_node blocks at its rank.
  const bool blockwise = IsBlockwise(op.reduction);
  const uint32_t procs = view->procs_per_node;
  const uint64_t world = view->world_size();
  if (blockwise && op.buffers.size() != procs) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", op.buffers.size(), " local buffers for ", procs, " processes per node"));
  }
  if (blockwise && op.count > UINT64_MAX / DataTypeSize(op.dtype) / world) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", world, " blocks of ", op.count, " elements overflow"));
  }
  // Elements that travel among the nodes.
  const uint64_t tensor_count = blockwise ? op.count * world : op.count;
  const uint64_t super_block = op.count * procs;  // blockwise: one node's blocks
  const size_t esize = DataTypeSize(op.dtype);
  const int my_rank = view->my_worker_rank;
  // The buffer that takes part among the nodes: the root's for a broadcast, else the first one
  // with every local contribution added in (the result replaces the input anyway; all-gather:
  // every local block copied in). Done here, before the engine's lock: it is this caller's work,
  // not the transport thread's.
  const size_t lead = broadcast ? op.root_local : 0;
  if (op.reduction == Reduction::kAllGather) {
    for (size_t b = 1; b < op.buffers.size(); ++b) {
      const uint64_t at = (my_rank * super_block + b * op.count) * esize;
      std::memcpy(op.buffers[0] + at, op.buffers[b] + at, op.count * esize);
    }
  } else if (!broadcast) {
    for (size_t b = 1; b < op.buffers.size(); ++b) {
      reducer_->Sum(op.dtype, op.buffers[0], op.buffers[b], tensor_count);
    }
  }
  if (blockwise) {
    // Once the nodes are done: all-gather copies the whole region to the other local buffers;
    // reduce-scatter (averaged first) gives each local process its own block.
    // The keepalive goes with the copies: the engine drops its operation (and with it
    // op.keepalive) before running done, and a process may unregister its buffer meanwhile.
    op.done = [this, dtype = op.dtype, count = op.count, buffers = op.buffers, esize,
               keepalive = op.keepalive, gather = op.reduction == Reduction::kAllGather,
               average = op.reduction == Reduction::kReduceScatterAverage, world, tensor_count,
               first = my_rank * super_block, super_block,
               done = std::move(op.done)](absl::Status s) {
      if (s.ok()) {
        if (average) reducer_->Divide(dtype, buffers[0] + first * esize, super_block, world);
        for (size_t b = 1; b < buffers.size(); ++b) {
          if (gather) {
            std::memcpy(buffers[b], buffers[0], tensor_count * esize);
          } else {
            const uint64_t at = (first + b * count) * esize;
            std::memcpy(buffers[b] + at, buffers[0] + at, count * esize);
          }
        }
      }
      done(std::move(s));
    };
  } else if (op.reduction == Reduction::kAverage || op.buffers.size() > 1) {
    // Average and the copy to the other local buffers happen once the nodes agree on the sum,
    // outside the engine's lock.
    op.done = [this, dtype = op.dtype, count = op.count, buffers = op.buffers, lead,
               keepalive = op.keepalive, average = op.reduction == Reduction::kAverage,
               world = view->world_size(), done = std::move(op.done)](absl::Status s) {
      if (s.ok()) {
        if (average) reducer_->Divide(dtype, buffers[lead], count, world);
        const size_t bytes = count * DataTypeSize(dtype);
        for (size_t b = 0; b < buffers.size(); ++b) {
          if (b != lead) std::memcpy(buffers[b], buffers[lead], bytes);
        }
      }
      done(std::move(s));
    };
  }
  std::vector<Outgoing> out;
  std::vector<Completion> done;
  {
    std::lock_guard lock(mu_);
    const CollectiveKey key{job, common::StableHash64(op.tensor_name), op.iteration};
    if (ops_.contains(key)) {
      return absl::AlreadyExistsError(absl::StrCat("tensor '", op.tensor_name, "' iteration ",
                                                   op.iteration, " is already running"));
    }
    auto state = std::make_shared<OpState>();
    state->key = key;
    state->view = view;
    state->algorithm = algorithm;
    state->buffer = op.buffers[lead];
    state->elem_size = DataTypeSize(op.dtype);
    state->chunk_elems = std::max<uint64_t>(1, view->partition_bytes / state->elem_size);
    const int rank = view->my_worker_rank;
    if (blockwise && algorithm == Algorithm::kHalvingDoubling && !IsPowerOfTwo(n)) {
      // Recursive halving / doubling need 2^k ranks; every rank sees the same n and runs ring.
      algorithm = Algorithm::kRing;
      state->algorithm = algorithm;
    }
    const bool hd = algorithm == Algorithm::kHalvingDoubling;
    if (broadcast) {
      // The agent's own control broadcasts (tensor fusion's list and decisions) go straight from
      // the root to every rank: one hop, and none waits for another rank to post.
      state->steps = op.control
                         ? StarBroadcastSchedule(op.count, n, rank, static_cast<int>(op.root_node))
                         : RingBroadcastSchedule(op.count, n, rank, static_cast<int>(op.root_node));
    } else if (op.reduction == Reduction::kAllGather) {
      state->steps = hd ? HalvingDoublingAllGatherSchedule(super_block, n, rank)
                        : RingAllGatherSchedule(super_block, n, rank);
    } else if (blockwise) {
      state->steps = hd ? HalvingDoublingReduceScatterSchedule(super_block, n, rank)
                        : RingReduceScatterSchedule(super_block, n, rank);
    } else if (algorithm == Algorithm::kHalvingDoubling) {
      state->steps = HalvingDoublingSchedule(op.count, n, rank, hd_pipelined_);
    } else if (algorithm == Algorithm::kRecursiveDoubling) {
      state->steps = RecursiveDoublingSchedule(op.count, n, rank);
    } else {
      state->steps = RingAllReduceSchedule(op.count, n, rank);
    }
    WireHeader& d = state->descriptor;
    d.kind = static_cast<uint8_t>(MessageKind::kData);
    d.dtype = static_cast<uint8_t>(op.dtype);
    d.algorithm = static_cast<uint8_t>(algorithm);
    d.reduce = static_cast<uint8_t>(op.reduction);
    d.job = key.job;
    d.tensor = key.tensor;
    d.iteration = key.iteration;
    d.plan_version = view->plan_version;
    d.tensor_count = tensor_count;
    d.world_size = static_cast<uint32_t>(n);
    d.sender = static_cast<uint32_t>(rank);
    d.root = broadcast ? op.root_node : 0;
    for (size_t s = 0; s < state->steps.size(); ++s) {
      const uint64_t chunks = state->steps[s].recv_peer >= 0 ? state->RecvChunks(s) : 0;
      state->arrived.emplace_back(chunks, false);
      state->received.emplace_back(chunks, false);
      state->recv_left.push_back(chunks);
      const uint64_t sends = state->steps[s].send_peer >= 0 ? state->SendChunks(s) : 0;
      state->sent.emplace_back(sends, false);
      state->send_left.push_back(sends);
    }
    while (state->recv_step < state->steps.size() && state->recv_left[state->recv_step] == 0) {
      ++state->recv_step;
    }
    state->op = std::move(op);
    state->started = clock_->Now();
    stats_.ops_started++;

    // A tombstone or early messages of an older membership generation belong to another
    // collective that had the same numbers (iterations count from 0 again in a generation).
    const uint64_t generation_start = GenerationStartLocked(key.job);
    if (auto t = tombstones_.find(key);
        t != tombstones_.end() && t->second.epoch < generation_start) {
      tombstones_.erase(t);
    }
    if (auto e = early_.find(key); e != early_.end()) {
      std::erase_if(e->second, [&](const Early& m) {
        if (m.header.plan_version >= generation_start) return false;
        early_bytes_ -= m.bytes();
        stats_.fenced_messages++;
        return true;
      });
      if (e->second.empty()) early_.erase(e);
    }
    if (auto t = tombstones_.find(key); t != tombstones_.end() && !t->second.status.ok()) {
      // Another rank already failed or aborted this collective (or this one aborted it).
      state->finished = true;
      stats_.ops_failed++;
      if (t->second.tell_peers) {
        // A failure of this rank's the peers have not heard of (FailAtEarlyLimitLocked).
        t->second.tell_peers = false;
        TellPeersLocked(*view, d, t->second.status, out);
      }
      done.emplace_back(std::move(state->op.done), t->second.status);
    } else {
      ops_[key] = state;
      AdvanceLocked(state, out, done);
      if (auto e = early_.find(key); e != early_.end()) {
        std::deque<Early> early = std::move(e->second);
        early_.erase(e);
        for (const Early& m : early) early_bytes_ -= m.bytes();
        for (const Early& m : early) {
          if (state->finished) break;
          DeliverLocked(state, m.header, m.payload, out, done);
        }
      }
    }
  }
  Flush(std::move(out), std::move(done));
  return absl::OkStatus();
}

void CollectiveEngine::Abort(const std::string& job_id, const std::string& tensor_name,
                             uint64_t iteration, const absl::Status& reason) {
  const CollectiveKey key{common::StableHash64(job_id), common::StableHash64(tensor_name),
                          iteration};
  std::vector<Outgoing> out;
  std::vector<Completion> done;
  {
    std::lock_guard lock(mu_);
    auto job_it = jobs_.find(key.job);
    if (job_it == jobs_.end()) return;
    const JobView& view = *job_it->second;
    const int n = view.num_workers();
    const int rank = view.my_worker_rank;
    if (rank < 0 || rank >= n) return;
    const absl::Status status(
        reason.ok() ? absl::StatusCode::kAborted : reason.code(),
        absl::StrCat("rank ", rank, " aborted tensor '", tensor_name, "' iteration ", iteration,
                     " (job ", job_id, "): ", reason.message()));
    Log()->warn("{}", status.message());
    WireHeader h;
    h.kind = static_cast<uint8_t>(MessageKind::kAbort);
    h.algorithm = static_cast<uint8_t>(Algorithm::kRing);
    if (auto it = ops_.find(key); it != ops_.end()) {
      // A copy: failing the operation erases the map's reference.
      const std::shared_ptr<OpState> op = it->second;
      h = op->descriptor;
      h.kind = static_cast<uint8_t>(MessageKind::kAbort);
      FailLocked(op, status, /*tell_peers=*/false, out, done);
    } else {
      h.job = key.job;
      h.tensor = key.tensor;
      h.iteration = key.iteration;
      h.plan_version = view.plan_version;
      h.world_size = static_cast<uint32_t>(n);
      h.sender = static_cast<uint32_t>(rank);
      SetTombstoneLocked(key, status, view.plan_version);
    }
    TellPeersLocked(view, h, status, out);
  }
  Flush(std::move(out), std::move(done));
}

void CollectiveEngine::TellPeersLocked(const JobView& view, WireHeader h,
                                       const absl::Status& status, std::vector<Outgoing>& out) {
  h.kind = static_cast<uint8_t>(MessageKind::kAbort);
  h.error_code = static_cast<uint32_t>(status.code());
  auto message = std::make_shared<const std::string>(std::string(status.message()));
  for (int r = 0; r < view.num_workers(); ++r) {
    if (r == view.my_worker_rank) continue;
    Outgoing o;
    o.address = view.worker_addresses[r];
    o.header = h;
    o.payload = {reinterpret_cast<const std::byte*>(message->data()), message->size()};
    o.message = message;
    out.push_back(std::move(o));
  }
}

void CollectiveEngine::FailAtEarlyLimitLocked(const CollectiveKey& key, const WireHeader& h,
                                              size_t bytes, std::vector<Outgoing>& out) {
  stats_.early_dropped++;
  if (h.plan_version < GenerationStartLocked(key.job)) {
    // A straggler of an older membership generation, whose iterations counted from 0 too: its
    // collective is over, and the same numbers may be running now. Dropped, as Post would.
    stats_.fenced_messages++;
    return;
  }
  auto job = jobs_.find(key.job);
  const bool known = job != jobs_.end() && job->second->my_worker_rank >= 0 &&
                     job->second->my_worker_rank < job->second->num_workers();
  const absl::Status status = absl::ResourceExhaustedError(absl::StrCat(
      known ? absl::StrCat("rank ", job->second->my_worker_rank) : std::string("a rank"),
      " dropped a message (", bytes, " bytes) of tensor ", absl::Hex(h.tensor, absl::kZeroPad16),
      " iteration ", h.iteration, " from rank ", h.sender, ": it already held ", early_bytes_,
      " bytes of messages of collectives it has not started yet, and the limit is ",
      max_early_bytes_,
      " (the agent's --early-message-mib; a rank far behind its peers?); the collective fails "
      "for every rank"));
  // The first until the next ExpireStale is logged, the rest summed up there.
  if (early_capped_since_sweep_++ == 0) Log()->warn("{}", status.message());
  // Fails it here when it starts, frees its early messages, and drops its later ones as late.
  SetTombstoneLocked(key, status, h.plan_version);
  if (!known) {
    // No plan for the job here yet (its messages can arrive first): the peers are told when this
    // rank posts the collective (Post), which needs the plan.
    tombstones_[key].tell_peers = true;
    return;
  }
  WireHeader abort = h;
  abort.sender = static_cast<uint32_t>(job->second->my_worker_rank);
  abort.world_size = static_cast<uint32_t>(job->second->num_workers());
  TellPeersLocked(*job->second, abort, status, out);
}

void CollectiveEngine::HandleMessage(const WireHeader& h, std::span<const std::byte> payload) {
  stats_.messages_received++;
  stats_.bytes_received += payload.size();
  if (Log()->should_log(spdlog::level::debug)) {
    Log()->debug(
        "received kind {} job {:016x} tensor {:016x} iteration {} step {} chunk {}/{} ({} bytes) "
        "from rank {}",
        h.kind, h.job, h.tensor, h.iteration, h.step, h.chunk, h.num_chunks, payload.size(),
        h.sender);
  }
  const CollectiveKey key = {h.job, h.tensor, h.iteration};
  std::vector<Outgoing> out;
  std::vector<Completion> done;
  {
    std::lock_guard lock(mu_);
    auto op_it = ops_.find(key);
    // A copy: completing or failing the operation erases the map's reference.
    const std::shared_ptr<OpState> op = op_it == ops_.end() ? nullptr : op_it->second;
    if (h.kind == static_cast<uint8_t>(MessageKind::kError) ||
        h.kind == static_cast<uint8_t>(MessageKind::kAbort)) {
      const std::string reason(reinterpret_cast<const char*>(payload.data()), payload.size());
      // An abort names its rank already; an error is this rank's own failure, reported.
      absl::Status status(static_cast<absl::StatusCode>(h.error_code),
                          h.kind == static_cast<uint8_t>(MessageKind::kAbort)
                              ? reason
                              : absl::StrCat("rank ", h.sender, " reported: ", reason));
      if (op) {
        FailLocked(op, status, false, out, done);
      } else if (auto t = tombstones_.find(key);
                 t == tombstones_.end() || t->second.epoch < h.plan_version) {
        SetTombstoneLocked(key, status, h.plan_version);
      }
    } else if (h.kind != static_cast<uint8_t>(MessageKind::kData)) {
      stats_.malformed_messages++;
      Log()->warn("message of kind {} for tensor {:016x} iteration {} dropped: not a {} message",
                  h.kind, h.tensor, h.iteration,
                  AlgorithmName(static_cast<Algorithm>(h.algorithm)));
    } else if (op) {
      DeliverLocked(op, h, payload, out, done);
    } else if (auto t = tombstones_.find(key);
               t != tombstones_.end() && t->second.epoch >= h.plan_version) {
      // Late: its collective is over (a tombstone of a newer epoch: the message is stale).
      stats_.late_messages++;
    } else if (early_bytes_ + payload.size() + sizeof(WireHeader) > max_early_bytes_) {
      FailAtEarlyLimitLocked(key, h, payload.size(), out);
    } else {
      stats_.early_messages++;
      early_bytes_ += payload.size() + sizeof(WireHeader);
      early_[key].push_back(Early{h, {payload.begin(), payload.end()}, clock_->Now()});
    }
  }
  Flush(std::move(out), std::move(done));
}

void CollectiveEngine::DeliverLocked(const std::shared_ptr<OpState>& op, const WireHeader& h,
                                     std::span<const std::byte> payload, std::vector<Outgoing>& out,
                                     std::vector<Completion>& done) {
  if (op->finished) return;
  if (h.plan_version != op->descriptor.plan_version) {
    // Ranks that run one iteration under different epochs (plans): never a shape disagreement,
    // and never summed. The failure reaches every rank (retriable, UNAVAILABLE); it carries no
    // epoch (see EpochOf), so a retry is a new iteration: this iteration's tombstone stays.
    stats_.fenced_messages++;
    const uint64_t from = std::min<uint64_t>(h.plan_version, op->descriptor.plan_version);
    const uint64_t to = std::max<uint64_t>(h.plan_version, op->descriptor.plan_version);
    FailLocked(
        op,
        absl::UnavailableError(PlanChangedError(op->view->job_id, from, to,
                                                absl::StrCat(op->Name(), " (rank ", h.sender,
                                                             " runs plan v", h.plan_version, ")"))
                                   .message()),
        true, out, done);
    return;
  }
  if (!SameDescriptor(h, op->descriptor)) {
    FailLocked(op,
               absl::InvalidArgumentError(absl::StrCat(
                   op->Name(), ": ranks disagree: rank ", h.sender, " has ", DescribeShape(h),
                   ", rank ", op->descriptor.sender, " has ", DescribeShape(op->descriptor))),
               true, out, done);
    return;
  }
  const auto malformed = [&](std::string_view why) {
    stats_.malformed_messages++;
    Log()->warn("message of {} from rank {} (step {} chunk {}/{}) dropped: {}", op->Name(),
                h.sender, h.step, h.chunk, h.num_chunks, why);
  };
  if (h.step >= op->steps.size()) return malformed("no such step");
  const ScheduleStep& step = op->steps[h.step];
  if (step.recv_peer != static_cast<int>(h.sender)) return malformed("unexpected sender");
  const uint64_t chunks = op->RecvChunks(h.step);
  const uint64_t begin = std::min(step.recv_count, uint64_t{h.chunk} * op->chunk_elems);
  if (h.num_chunks != chunks || h.chunk_offset != step.recv_offset + begin ||
      h.chunk_count != std::min(op->chunk_elems, step.recv_count - begin)) {
    return malformed("sub-chunk does not match the schedule");
  }
  if (op->arrived[h.step][h.chunk]) return malformed("duplicate");
  op->arrived[h.step][h.chunk] = true;
  if (!op->MayApply(h)) {
    op->deferred.emplace(h.chunk_offset, Early{h, {payload.begin(), payload.end()}, clock_->Now()});
    return;
  }
  ApplyLocked(*op, h, payload);
  AdvanceLocked(op, out, done);
}

bool CollectiveEngine::ApplyDeferredLocked(OpState& op) {
  // Applying one receive may let others go (those of later steps over the same elements), and
  // so on: a work list of changed ranges, plus a full pass whenever recv_step moved. Within a
  // step sub-chunks do not overlap, and across steps MayApply keeps the step order per element,
  // so the order in which ready receives are applied does not change the bits.
  bool any = false;
  while (!op.deferred.empty()) {
    if (op.recv_step_moved) {
      op.recv_step_moved = false;
      op.woken.clear();  // the full pass below looks at everything
      for (auto it = op.deferred.begin(); it != op.deferred.end();) {
        if (!op.MayApply(it->second.header)) {
          ++it;
          continue;
        }
        Early e = std::move(it->second);
        it = op.deferred.erase(it);
        ApplyLocked(op, e.header, e.payload);
        any = true;
      }
      continue;
    }
    if (op.woken.empty()) break;
    const auto [a, b] = op.woken.back();
    op.woken.pop_back();
    // A deferred sub-chunk [o, o + k) with k <= chunk_elems overlaps [a, b) iff o < b and
    // o + k > a, so o > a - chunk_elems.
    for (auto it = op.deferred.lower_bound(a + 1 > op.chunk_elems ? a + 1 - op.chunk_elems : 0);
         it != op.deferred.end() && it->first < b;) {
      const WireHeader& h = it->second.header;
      if (h.chunk_offset + h.chunk_count <= a || !op.MayApply(h)) {
        ++it;
        continue;
      }
      Early e = std::move(it->second);
      it = op.deferred.erase(it);
      ApplyLocked(op, e.header, e.payload);
      any = true;
    }
  }
  op.woken.clear();
  return any;
}

void CollectiveEngine::ApplyLocked(OpState& op, const WireHeader& h,
                                   std::span<const std::byte> payload) {
  const ScheduleStep& step = op.steps[h.step];
  std::byte* dst = op.buffer + h.chunk_offset * op.elem_size;
  if (h.chunk_count > 0) {
    if (step.action == ScheduleStep::Action::kReduce) {
      reducer_->Sum(op.op.dtype, dst, payload.data(), h.chunk_count);
    } else {
      std::memcpy(dst, payload.data(), payload.size());
    }
  }
  op.received[h.step][h.chunk] = true;
  op.recv_left[h.step]--;
  const size_t recv_step = op.recv_step;
  while (op.recv_step < op.steps.size() && op.recv_left[op.recv_step] == 0) ++op.recv_step;
  if (op.deferred.empty()) return;
  op.recv_step_moved |= op.recv_step != recv_step;
  if (h.chunk_count > 0) op.woken.emplace_back(h.chunk_offset, h.chunk_offset + h.chunk_count);
}

void CollectiveEngine::AdvanceLocked(const std::shared_ptr<OpState>& op, std::vector<Outgoing>& out,
                                     std::vector<Completion>& done) {
  if (op->finished) return;
  // Posting a send never lets a receive go (only its completion does, in OnSendDone), so one
  // round suffices.
  ApplyDeferredLocked(*op);
  PostSendsLocked(op, out);
  if (op->send_step < op->steps.size() || op->recv_step < op->steps.size() ||
      op->sends_outstanding > 0) {
    return;
  }
  // Done: every receive applied, every send completed (average divides in op.done, see Post).
  op->finished = true;
  ops_.erase(op->key);
  SetTombstoneLocked(op->key, absl::OkStatus(), op->descriptor.plan_version);
  stats_.ops_completed++;
  done.emplace_back(std::move(op->op.done), absl::OkStatus());
}

bool CollectiveEngine::PostSendsLocked(const std::shared_ptr<OpState>& op,
                                       std::vector<Outgoing>& out) {
  const JobView& view = *op->view;
  bool posted = false;
  while (op->send_step < op->steps.size()) {
    const size_t s = op->send_step;
    const ScheduleStep& step = op->steps[s];
    if (step.send_peer >= 0) {
      const uint64_t chunks = op->SendChunks(s);
      while (op->send_cursor < chunks) {
        const uint64_t c = op->send_cursor;
        const uint64_t begin = std::min(step.send_count, c * op->chunk_elems);
        const uint64_t count = std::min(op->chunk_elems, step.send_count - begin);
        bool ready = false;
        switch (step.send_after) {
          case ScheduleStep::SendAfter::kStart:
            ready = true;
            break;
          case ScheduleStep::SendAfter::kPrevStepSameChunk:
            ready = s == 0 || op->steps[s - 1].recv_peer < 0 ||
                    (c < op->received[s - 1].size() && op->received[s - 1][c]);
            break;
          case ScheduleStep::SendAfter::kAllPreviousSteps:
            ready = op->recv_step >= s;
            break;
          case ScheduleStep::SendAfter::kThisStepSameChunk:
            ready = step.recv_peer < 0 || (c < op->received[s].size() && op->received[s][c]);
            break;
          case ScheduleStep::SendAfter::kEarlierStepsCoveringRange:
            ready = op->EarlierReceivesApplied(s, step.send_offset + begin,
                                               step.send_offset + begin + count);
            break;
        }
        if (!ready) return posted;
        Outgoing o;
        o.address = view.worker_addresses[step.send_peer];
        o.header = op->descriptor;
        o.header.step = static_cast<uint32_t>(s);
        o.header.chunk = static_cast<uint32_t>(c);
        o.header.num_chunks = static_cast<uint32_t>(chunks);
        o.header.chunk_offset = step.send_offset + begin;
        o.header.chunk_count = count;
        o.payload = {op->buffer + o.header.chunk_offset * op->elem_size, count * op->elem_size};
        o.op = op;
        o.peer = step.send_peer;
        op->sends_outstanding++;
        out.push_back(std::move(o));
        op->send_cursor++;
        posted = true;
      }
    }
    op->send_step++;
    op->send_cursor = 0;
  }
  return posted;
}

void CollectiveEngine::FailLocked(const std::shared_ptr<OpState>& op, absl::Status status,
                                  bool tell_peers, std::vector<Outgoing>& out,
                                  std::vector<Completion>& done) {
  if (op->finished) return;
  op->finished = true;
  op->deferred.clear();
  ops_.erase(op->key);
  SetTombstoneLocked(op->key, status, op->descriptor.plan_version);
  stats_.ops_failed++;
  Log()->warn("{}", status.message());
  if (tell_peers) {
    auto message = std::make_shared<const std::string>(std::string(status.message()));
    for (int r = 0; r < op->view->num_workers(); ++r) {
      if (r == op->view->my_worker_rank) continue;
      Outgoing o;
      o.address = op->view->worker_addresses[r];
      o.header = op->descriptor;
      o.header.kind = static_cast<uint8_t>(MessageKind::kError);
      o.header.error_code = static_cast<uint32_t>(status.code());
      o.payload = {reinterpret_cast<const std::byte*>(message->data()), message->size()};
      o.message = message;
      out.push_back(std::move(o));
    }
  }
  if (op->sends_outstanding == 0) {
    done.emplace_back(std::move(op->op.done), std::move(status));
    return;
  }
  op->failure = {std::move(op->op.done), std::move(status)};
  op->failure_pending = true;
  op->failed_at = clock_->Now();
  draining_.push_back(op);
}

void CollectiveEngine::CompleteFailureLocked(const std::shared_ptr<OpState>& op,
                                             std::vector<Completion>& done) {
  if (!op->failure_pending) return;
  op->failure_pending = false;
  done.push_back(std::move(op->failure));
  std::erase(draining_, op);
}

void CollectiveEngine::OnSendDone(const std::shared_ptr<OpState>& op, int peer, uint32_t step,
                                  uint32_t chunk, absl::Status status) {
  std::vector<Outgoing> out;
  std::vector<Completion> done;
  {
    std::lock_guard lock(mu_);
    op->sends_outstanding--;
    if (!status.ok()) stats_.send_failures++;
    if (op->finished) {
      // Failed meanwhile: its completion may be waiting for this send.
      if (op->sends_outstanding == 0) CompleteFailureLocked(op, done);
    } else if (!status.ok()) {
      FailLocked(op,
                 absl::UnavailableError(absl::StrCat(op->Name(), ": send to rank ", peer, " (",
                                                     op->view->worker_addresses[peer],
                                                     ") failed: ", status.message())),
                 true, out, done);
    } else {
      op->sent[step][chunk] = true;
      op->send_left[step]--;
      const ScheduleStep& st = op->steps[step];
      const uint64_t begin = std::min(st.send_count, uint64_t{chunk} * op->chunk_elems);
      const uint64_t count = std::min(op->chunk_elems, st.send_count - begin);
      if (count > 0 && !op->deferred.empty()) {
        op->woken.emplace_back(st.send_offset + begin, st.send_offset + begin + count);
      }
      AdvanceLocked(op, out, done);
    }
  }
  Flush(std::move(out), std::move(done));
}

void CollectiveEngine::Flush(std::vector<Outgoing> out, std::vector<Completion> done) {
  for (Outgoing& o : out) {
    if (o.op) {
      stats_.messages_sent++;
      stats_.bytes_sent += o.payload.size();
      if (Log()->should_log(spdlog::level::debug)) {
        Log()->debug("{}: step {} chunk {}/{} ({} bytes) to rank {} ({})", o.op->Name(),
                     o.header.step, o.header.chunk, o.header.num_chunks, o.payload.size(), o.peer,
                     o.address);
      }
      transport_->Send(
          o.address, AsBytes(o.header), o.payload,
          [this, op = std::move(o.op), peer = o.peer, step = o.header.step, chunk = o.header.chunk](
              absl::Status s) { OnSendDone(op, peer, step, chunk, std::move(s)); });
    } else {
      transport_->Send(o.address, AsBytes(o.header), o.payload,
                       [message = std::move(o.message)](absl::Status) {});
    }
  }
  for (auto& [fn, status] : done) {
    if (fn) fn(std::move(status));
  }
}

void CollectiveEngine::SetTombstoneLocked(const CollectiveKey& key, absl::Status status,
                                          uint64_t epoch) {
  const common::Clock::TimePoint expires =
      clock_->Now() + (status.ok() ? kTombstoneTtl : EarlyTtlLocked(key.job));
  // The early messages a failure makes useless go now rather than at their (long) expiry: those
  // of this epoch and older (a newer plan's may belong to a run that is still to start).
  if (!status.ok()) {
    if (auto e = early_.find(key); e != early_.end()) {
      std::erase_if(e->second, [&](const Early& m) {
        if (m.header.plan_version > epoch) return false;
        early_bytes_ -= m.bytes();
        stats_.early_dropped++;
        return true;
      });
      if (e->second.empty()) early_.erase(e);
    }
  }
  if (status.ok()) {
    tombstone_expiry_.emplace_back(expires, key);
  } else {
    failure_expiry_.emplace(expires, key);
  }
  tombstones_[key] = Tombstone{std::move(status), expires, epoch};
}

void CollectiveEngine::ExpireStale() {
  std::vector<Outgoing> out;
  std::vector<Completion> done;
  {
    std::lock_guard lock(mu_);
    const common::Clock::TimePoint now = clock_->Now();
    std::vector<std::shared_ptr<OpState>> late;
    for (auto& [key, op] : ops_) {
      if (now - op->started > op->view->op_timeout) late.push_back(op);
    }
    for (auto& op : late) {
      std::string waiting;
      if (op->recv_step < op->steps.size()) {
        const ScheduleStep& step = op->steps[op->recv_step];
        uint64_t missing = 0;
        while (missing < op->arrived[op->recv_step].size() && op->arrived[op->recv_step][missing]) {
          ++missing;
        }
        if (missing < op->RecvChunks(op->recv_step)) {
          waiting = absl::StrCat("waiting for rank ", step.recv_peer, " (",
                                 op->view->worker_addresses[step.recv_peer], ") to send sub-chunk ",
                                 missing, "/", op->RecvChunks(op->recv_step));
        } else {
          // Everything arrived; what is held waits for sends of its range to complete.
          waiting = absl::StrCat(op->deferred.size(), " received sub-chunks waiting for ",
                                 op->sends_outstanding, " sends not completed by the transport");
        }
      } else {
        waiting = absl::StrCat(op->sends_outstanding, " sends not completed by the transport");
      }
      FailLocked(op,
                 absl::DeadlineExceededError(
                     absl::StrCat(op->Name(), " timed out after ", op->view->op_timeout.count(),
                                  " ms at step ", std::min(op->recv_step, op->steps.size() - 1) + 1,
                                  "/", op->steps.size(), ", ", waiting)),
                 true, out, done);
    }
    if (early_capped_since_sweep_ > 1) {
      Log()->warn("{} more collectives failed at the {}-byte limit of early messages",
                  early_capped_since_sweep_ - 1, max_early_bytes_);
    }
    early_capped_since_sweep_ = 0;
    // One line per sweep for the messages that expired: a peer that died can leave hundreds.
    uint64_t expired = 0, expired_collectives = 0;
    std::optional<std::pair<CollectiveKey, std::chrono::nanoseconds>> example;
    for (auto it = early_.begin(); it != early_.end();) {
      auto& q = it->second;
      const std::chrono::nanoseconds ttl = EarlyTtlLocked(it->first.job);
      const uint64_t before = expired;
      while (!q.empty() && now - q.front().arrived > ttl) {
        early_bytes_ -= q.front().bytes();
        stats_.early_dropped++;
        ++expired;
        q.pop_front();
      }
      if (expired > before) {
        ++expired_collectives;
        if (!example) example.emplace(it->first, ttl);
      }
      it = q.empty() ? early_.erase(it) : std::next(it);
    }
    if (example) {
      Log()->warn(
          "{} early message(s) of {} collective(s) dropped (the first: tensor {:016x} iteration "
          "{}, after {} s): they did not start on this rank within the longer of {} s and their "
          "job's op timeout",
          expired, expired_collectives, example->first.tensor, example->first.iteration,
          std::chrono::duration_cast<std::chrono::seconds>(example->second).count(),
          kTombstoneTtl.count());
    }
    // Oldest first, so this touches only what expires (walking the whole map cost 7% of the CPU
    // of a 4 KiB all-reduce loop, which leaves ~1,500 tombstones a second).
    const auto expire = [&](const CollectiveKey& key) {
      // The key may have been removed or set again since; only the entry that expired goes.
      if (auto t = tombstones_.find(key); t != tombstones_.end() && t->second.expires <= now) {
        tombstones_.erase(t);
      }
    };
    while (!tombstone_expiry_.empty() && tombstone_expiry_.front().first <= now) {
      expire(tombstone_expiry_.front().second);
      tombstone_expiry_.pop_front();
    }
    while (!failure_expiry_.empty() && failure_expiry_.top().first <= now) {
      expire(failure_expiry_.top().second);
      failure_expiry_.pop();
    }
    // Failed operations whose sends the transport has held for kFailedSendGrace are completed
    // anyway: every wait has a deadline (the transport is told nothing; it may still read).
    std::vector<std::shared_ptr<OpState>> overdue;
    for (const auto& op : draining_) {
      if (now - op->failed_at >= kFailedSendGrace) overdue.push_back(op);
    }
    for (const auto& op : overdue) {
      Log()->warn("{}: completing its failure with {} sends still held by the transport",
                  op->Name(), op->sends_outstanding);
      CompleteFailureLocked(op, done);
    }
  }
  Flush(std::move(out), std::move(done));
}

}  // namespace tributary::dataplane
