// The one interface behind which every collective algorithm of a node sits (UCC style): Post
// starts a non-blocking operation, incoming messages and ExpireStale progress it, and the
// operation's `done` reports its result exactly once. An algorithm may decline an input it
// cannot serve (CanServe); DataPlaneNode then falls back to another one.
//
// Implementations: PushPull (allreduce_push_pull.h: summation servers) and CollectiveEngine
// (collective_engine.h: ring and halving-doubling). DataPlaneNode owns one of each, the
// transport's receive handler, and the routing of messages to them by WireHeader::algorithm.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "dataplane/collectives/algorithm_selector.h"
#include "dataplane/collectives/job_view.h"
#include "dataplane/collectives/operation.h"
#include "dataplane/collectives/wire.h"

namespace tributary::dataplane {

// Thread-safe in every implementation. Borrows the transport, reducer and clock given at
// construction (they outlive it; shut the transport down before destroying it).
class CollectiveAlgorithm {
 public:
  virtual ~CollectiveAlgorithm() = default;

  // Adds or replaces a job's view. Running operations keep the view they started with.
  virtual void SetJob(const JobView& view) = 0;
  // Forgets the job; its running operations fail with CANCELLED.
  virtual void RemoveJob(uint64_t job_hash) = 0;

  // Whether this implementation can run `op` with `algorithm`: OK, or UNIMPLEMENTED /
  // FAILED_PRECONDITION saying why not (a decline: the caller may pick another algorithm).
  virtual absl::Status CanServe(Algorithm algorithm, const Operation& op) const = 0;

  // Starts `op` with `algorithm` (one this implementation serves). Returns an error, and never
  // calls op.done, when it cannot start: unknown job (NOT_FOUND), this node cannot take part
  // (FAILED_PRECONDITION), bad sizes, root or buffers (INVALID_ARGUMENT), the same tensor and
  // iteration already running (ALREADY_EXISTS), a decline (see CanServe). Otherwise op.done runs
  // exactly once: OK, or the error of this node or of any other participant.
  virtual absl::Status Post(const std::string& job_id, Algorithm algorithm, Operation op) = 0;

  // Progress by message: one incoming message of this algorithm, its header validated by
  // ParseHeader (payload valid only during the call). Runs on the transport's thread.
  virtual void HandleMessage(const WireHeader& h, std::span<const std::byte> payload) = 0;

  // Progress by time: fails operations past their deadline with DEADLINE_EXCEEDED (telling the
  // other participants) and forgets expired state. Call periodically.
  virtual void ExpireStale() = 0;

  // This node cannot take part in (tensor, iteration) of the job: fail it on every participant
  // now, with `reason` (not OK), whether or not they (or this node) have started it yet.
  virtual void Abort(const std::string& job_id, const std::string& tensor_name, uint64_t iteration,
                     const absl::Status& reason) = 0;
};

}  // namespace tributary::dataplane
