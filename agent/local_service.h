// The agent's local service, without its transport: training processes on this node join
// jobs, register shared-memory buffers and submit collectives; the local processes'
// submissions of one (tensor, iteration) are gathered into one node-level operation for the
// data plane. `LocalGrpcService` (local_grpc_service.h) serves it over gRPC; tests call it
// directly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "agent/collective_runner.h"
#include "agent/local_gather.h"
#include "agent/mirror_stager.h"
#include "agent/op_handle.h"
#include "agent/session_registry.h"
#include "common/clock.h"
#include "common/unix_fd.h"
#include "tributary/v1/agent.pb.h"

namespace tributary::agent {

// A job whose process on this node was replaced and whose new membership generation the
// controller has not confirmed yet (reported with every heartbeat until it has).
struct PendingMembershipChange {
  std::string job_id;
  uint64_t generation = 0;  // the job's generation when it happened
  uint32_t local_rank = 0;  // the rank that was taken again
};

// Membership. Each job has a generation (JobPlan.generation); a session is bound to the one it
// joined or last resynced at, and counts its per-name iterations in it. A JoinJob for a local
// rank that already had a session at the current generation is a replacement (the process
// died or left, and a new one takes its place): its iterations would start at 0 while the
// others' go on, so the agent refuses it (UNAVAILABLE, retriable: Client::Connect retries),
// and every collective of the job on this node (ABORTED, kMembershipChangedMarker), until the
// controller moves the generation (PendingMembershipChanges goes into the heartbeats). When a
// plan with a newer generation arrives, the job's open gathers fail and every session bound to
// an older generation is refused until it calls Resync, which starts its iterations at 0 again
// -- as every other process of the job does -- so all agree on the iteration again.
// Asynchronous parameter-server operations are per process and ignore membership.
//
// Threading: every method may be called from any thread and none blocks on the data plane
// (waits are parked `Reply`s, answered later by the operation's completion or by Tick). One
// mutex guards the session registry and the gather; the runner is called, handles completed
// and session-end callbacks run outside it.
class LocalService {
 public:
  using Reply = OpHandle::Reply;

  // `runner` and `clock` must outlive the service.
  LocalService(CollectiveRunner* runner, const common::Clock* clock);
  ~LocalService();

  // Replaces the set of jobs this node works for.
  void SetJobs(const std::vector<LocalJob>& jobs);
  // Fails local gathers older than their job's timeout and ends waits whose timeout passed.
  void Tick();
  // Ends every session and parked wait; later joins fail with UNAVAILABLE.
  void Shutdown();

  size_t num_sessions() const;
  // Membership generations this node saw move, and sessions resynced.
  uint64_t generation_changes() const;
  uint64_t resyncs() const;
  // The process replacements waiting for the controller's new generation.
  std::vector<PendingMembershipChange> PendingMembershipChanges() const;
  // Runs (with no lock of the service held) when a replacement becomes pending: the agent
  // heartbeats at once instead of at its next interval. Set before serving.
  void SetMembershipChangeCallback(std::function<void()> callback);
  // Binds the session to its job's current generation; when that is newer than the session's,
  // its per-name iterations start at 0 again (and its pending retries are forgotten). Fills the
  // rank, world size, generation and plan version. Idempotent within a generation. UNAVAILABLE
  // while a replacement on this node waits for the new generation (call again), NOT_FOUND for
  // an unknown session, FAILED_PRECONDITION when the job no longer has this node as a worker.
  absl::Status Resync(const tributary::v1::ResyncRequest& req, tributary::v1::ResyncResponse* resp);
  // Submissions that ran an iteration again after it failed as retriable (see Submit).
  uint64_t resubmissions() const;

  // A session for a local process; fills the session id, global rank, world size and plan
  // version. Errors as SessionRegistry::Join, UNAVAILABLE after Shutdown.
  absl::Status Join(const tributary::v1::JoinJobRequest& req, tributary::v1::JoinJobResponse* resp);
  // Runs `on_end` once when the session ends (the KeepAlive stream). NOT_FOUND when there is
  // no such session or the service has shut down.
  absl::Status WatchSession(const std::string& session_id, std::function<void()> on_end);
  // Ends the session (`why` goes into the log and into the errors of the gathers that still
  // miss its rank: ABORTED). Unknown ids are ignored, so it is idempotent.
  void EndSession(const std::string& session_id, const std::string& why);
  // Maps the process's sealed memfd (from the buffer socket, agent/buffer_socket.h) and gives it
  // a buffer id in its session. The first buffer binds the session to the sender's uid; a
  // buffer from another uid is PERMISSION_DENIED.
  absl::StatusOr<uint64_t> RegisterBuffer(const common::PeerCredentials& peer,
                                          const std::string& session_id, uint64_t size_bytes,
                                          common::UniqueFd fd);
  // Opens a CUDA device buffer of the process from its CUDA IPC record
  // (RegisterCudaBufferRequest) and gives its host mirror a buffer id in the session, as
  // RegisterBuffer does; collectives on it are staged (agent/mirror_stager.h). The import (a
  // few CUDA calls) runs on the calling thread, without the service's lock. Errors: NOT_FOUND
  // for an unknown session; ImportCudaBuffer's (agent/cuda_buffer.h): FAILED_PRECONDITION
  // without CUDA or a device, INVALID_ARGUMENT for a bad record; RESOURCE_EXHAUSTED over the
  // session's buffer limit.
  absl::StatusOr<uint64_t> RegisterCudaBuffer(const tributary::v1::RegisterCudaBufferRequest& req);
  // What RegisterCudaBuffer opens records with (tests: a fake mirror). Set before serving.
  using CudaImporter = std::function<absl::StatusOr<std::shared_ptr<SharedMemoryMapping>>(
      const std::string& record, const std::string& what)>;
  void SetCudaImporterForTest(CudaImporter importer);
  // The GPUs that jobs' intra-node plans run on (LocalGather::SetGpuOpsFactory).
  void SetGpuOpsFactoryForTest(GpuOpsFactory factory);
  // The session's registered buffer `buffer_id` (NOT_FOUND naming what is missing).
  absl::StatusOr<std::shared_ptr<SharedMemoryMapping>> FindBuffer(const std::string& session_id,
                                                                  uint64_t buffer_id);
  // Forgets the buffer (operations still running keep their own reference to the mapping).
  // NOT_FOUND only for an unknown session.
  absl::Status UnregisterBuffer(const tributary::v1::UnregisterBufferRequest& req);
  // Validates the request (INVALID_ARGUMENT naming job and tensor; FAILED_PRECONDITION when the
  // job is no longer planned here; RESOURCE_EXHAUSTED with too many unreported handles), adds
  // it to its gather and sets the handle in `resp`. Each submission of a name is its next
  // iteration, except after an iteration of the name failed as retriable (UNAVAILABLE carrying
  // the plan epoch it ran under, dataplane::EpochOf): then the next submission is a retry of
  // that iteration, which starts once this node has a newer plan of the job. Every process of
  // the job saw the same failure, so all agree on the iteration they retry.
  absl::Status Submit(const tributary::v1::SubmitRequest& req, tributary::v1::SubmitResponse* resp);
  // Submit for the control ring: validated and gathered exactly as Submit, but there is no
  // handle to Wait on (nor a limit on unreported handles: the ring bounds what is in flight);
  // `on_done` runs once with the operation's result, on the thread that completes it (possibly
  // this one, before SubmitWithCallback returns), with no lock of the service held. When the
  // submission itself is refused, its error is returned and `on_done` never runs.
  absl::Status SubmitWithCallback(const tributary::v1::SubmitRequest& req,
                                  std::function<void(const absl::Status&)> on_done);
  // Answers `reply` about handle `handle_id` of the session: at once when the operation is
  // done (then the handle is forgotten), when timeout_ms is 0 or after Shutdown; otherwise when
  // the operation completes or timeout_ms (at most an hour) passes, seen by Tick. NOT_FOUND for
  // an unknown session or handle. `reply` may run before Await returns.
  // `version`, unless null, receives the handle's parameter version (OpHandle::version) just
  // before `reply` runs with done = true.
  void Await(const std::string& session_id, uint64_t handle_id, uint32_t timeout_ms, Reply reply,
             std::function<void(uint64_t)> version = nullptr);

 private:
  // Submit (resp set) or SubmitWithCallback (resp null, on_done set).
  absl::Status SubmitInternal(const tributary::v1::SubmitRequest& req,
                              tributary::v1::SubmitResponse* resp,
                              std::function<void(const absl::Status&)> on_done);
  // Join; `notify` receives the membership-change callback to run once mu_ is released.
  absl::Status JoinInternal(const tributary::v1::JoinJobRequest& req,
                            tributary::v1::JoinJobResponse* resp, std::function<void()>& notify);
  // The job's membership refusal for `session`'s collectives, or OK. mu_ held.
  // `what` names the operation in the refusal (called only then).
  absl::Status CheckMembershipLocked(const Session& session, const LocalJob& job,
                                     absl::FunctionRef<std::string()> what) const;
  // Ends a session; gathers still missing its rank fail with ABORTED. mu_ held.
  void EndSessionLocked(const std::string& session_id, const std::string& why, Deferred& after);

  // What the gather's retriable-failure callback reaches this service through (mu, then mu_).
  struct Link {
    std::mutex mu;
    LocalService* service = nullptr;  // Guarded by mu; null once the service is gone.
  };

  // Gives `mapping` the session's next buffer id; RESOURCE_EXHAUSTED at kMaxBuffersPerSession.
  absl::StatusOr<uint64_t> AddBufferLocked(Session& session,
                                           std::shared_ptr<SharedMemoryMapping> mapping);

  CollectiveRunner* runner_;
  const common::Clock* clock_;
  // The copies of mirrored (CUDA) buffers; stopped (drained) by the destructor.
  std::shared_ptr<MirrorStager> stager_;
  CudaImporter cuda_importer_;
  mutable std::mutex mu_;
  SessionRegistry sessions_;    // Guarded by mu_.
  LocalGather gather_;          // Guarded by mu_.
  bool shut_down_ = false;      // Guarded by mu_.
  uint64_t resubmissions_ = 0;  // Guarded by mu_.
  // Per job: the local ranks that had a session at the job's current generation.
  std::map<std::string, std::set<uint32_t>> joined_ranks_;  // Guarded by mu_.
  // Per job: a replacement waiting for the controller's new generation.
  std::map<std::string, PendingMembershipChange> pending_;  // Guarded by mu_.
  std::function<void()> on_membership_change_;
  uint64_t generation_changes_ = 0;  // Guarded by mu_.
  uint64_t resyncs_ = 0;             // Guarded by mu_.
  std::shared_ptr<Link> link_;
};

}  // namespace tributary::agent
