#include "agent/local_service.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/cuda_buffer.h"
#include "agent/tensor_fusion.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace tributary::agent {
namespace {

using common::DataType;

constexpr size_t kMaxTensorName = 1024;
// Buffers one session may have registered at once.
constexpr size_t kMaxBuffersPerSession = 4096;
constexpr size_t kMaxHandlesPerSession = 1 << 16;
constexpr uint32_t kMaxWaitMs = 3600000;

constexpr auto Log = common::ComponentLog<"agent">;

}  // namespace

LocalService::LocalService(CollectiveRunner* runner, const common::Clock* clock)
    : runner_(runner),
      clock_(clock),
      stager_(std::make_shared<MirrorStager>()),
      cuda_importer_(ImportCudaBuffer),
      gather_(runner, clock, stager_),
      link_(std::make_shared<Link>()) {
  link_->service = this;
  // Operations may complete on a data-plane thread after this service is gone: the link says.
  gather_.SetRetriableFailureCallback([link = link_](const GatherKey& key,
                                                     const std::vector<std::string>& session_ids,
                                                     uint64_t epoch) {
    std::lock_guard link_lock(link->mu);
    if (link->service == nullptr) return;
    std::lock_guard lock(link->service->mu_);
    for (const std::string& id : session_ids) {
      absl::StatusOr<std::shared_ptr<Session>> session = link->service->sessions_.Find(id);
      // A failure from before the session's last Resync belongs to the iterations it forgot.
      if (session.ok() && epoch >= (*session)->synced_plan_version) {
        (*session)->failed[key.tensor][key.iteration] = epoch;
      }
    }
  });
}

LocalService::~LocalService() {
  Shutdown();
  // Copies still queued run now (the runner outlives the service); later ones run inline.
  stager_->Stop();
  std::lock_guard lock(link_->mu);
  link_->service = nullptr;
}

void LocalService::SetCudaImporterForTest(CudaImporter importer) {
  cuda_importer_ = std::move(importer);
}

void LocalService::SetGpuOpsFactoryForTest(GpuOpsFactory factory) {
  std::lock_guard lock(mu_);
  gather_.SetGpuOpsFactory(std::move(factory));
}

absl::StatusOr<uint64_t> LocalService::RegisterCudaBuffer(
    const tributary::v1::RegisterCudaBufferRequest& req) {
  {
    std::lock_guard lock(mu_);
    RETURN_IF_ERROR(sessions_.Find(req.session_id()).status());
  }
  // Opening the IPC handle and allocating the mirror are CUDA calls: outside the lock.
  ASSIGN_OR_RETURN(std::shared_ptr<SharedMemoryMapping> mapping,
                   cuda_importer_(req.record(),
                                  absl::StrCat("CUDA buffer of session '", req.session_id(), "'")));
  std::lock_guard lock(mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, sessions_.Find(req.session_id()));
  const uint64_t size = mapping->size();
  ASSIGN_OR_RETURN(const uint64_t id, AddBufferLocked(*session, std::move(mapping)));
  Log()->info("session {}: CUDA buffer {} of {} bytes registered (host mirror)", req.session_id(),
              id, size);
  return id;
}

absl::StatusOr<uint64_t> LocalService::AddBufferLocked(
    Session& session, std::shared_ptr<SharedMemoryMapping> mapping) {
  if (session.buffers.size() >= kMaxBuffersPerSession) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session '", session.id, "' already has ", session.buffers.size(),
                     " buffers (the limit); unregister some first"));
  }
  const uint64_t id = session.next_buffer++;
  session.buffers[id] = std::move(mapping);
  return id;
}

void LocalService::SetJobs(const std::vector<LocalJob>& jobs) {
  Deferred after;
  {
    std::lock_guard lock(mu_);
    std::set<std::string> planned;
    for (const LocalJob& job : jobs) {
      planned.insert(job.job_id);
      const LocalJob* old = sessions_.FindJob(job.job_id);
      if (old != nullptr && job.generation > old->generation) {
        generation_changes_++;
        Log()->info("job {}: membership generation {} -> {} (plan v{}); its processes resync",
                    job.job_id, old->generation, job.generation, job.plan_version);
        gather_.AbortJob(
            job.job_id,
            absl::AbortedError(absl::StrCat(kMembershipChangedMarker, ", generation ",
                                            job.generation, "] job '", job.job_id,
                                            "': the job's membership changed; call Resync and "
                                            "restart the iteration from a sync point")),
            after);
        // The ranks held now are the ones that joined this generation.
        std::set<uint32_t>& ranks = joined_ranks_[job.job_id];
        ranks.clear();
        for (const auto& [id, session] : sessions_.sessions()) {
          if (session->job_id == job.job_id) ranks.insert(session->local_rank);
        }
      }
      if (auto p = pending_.find(job.job_id);
          p != pending_.end() && job.generation > p->second.generation) {
        Log()->info("job {}: generation {} confirms the replacement of local rank {}", job.job_id,
                    job.generation, p->second.local_rank);
        pending_.erase(p);
      }
    }
    std::erase_if(pending_, [&](const auto& p) { return !planned.contains(p.first); });
    std::erase_if(joined_ranks_, [&](const auto& p) { return !planned.contains(p.first); });
    sessions_.SetJobs(jobs);
    gather_.JobsChanged(jobs, after);  // resubmissions waiting for a newer plan
  }
  after.Run();
}

uint64_t LocalService::resubmissions() const {
  std::lock_guard lock(mu_);
  return resubmissions_;
}

size_t LocalService::num_sessions() const {
  std::lock_guard lock(mu_);
  return sessions_.size();
}

uint64_t LocalService::generation_changes() const {
  std::lock_guard lock(mu_);
  return generation_changes_;
}

uint64_t LocalService::resyncs() const {
  std::lock_guard lock(mu_);
  return resyncs_;
}

std::vector<PendingMembershipChange> LocalService::PendingMembershipChanges() const {
  std::lock_guard lock(mu_);
  std::vector<PendingMembershipChange> out;
  for (const auto& [job_id, p] : pending_) out.push_back(p);
  return out;
}

void LocalService::SetMembershipChangeCallback(std::function<void()> callback) {
  std::lock_guard lock(mu_);
  on_membership_change_ = std::move(callback);
}

absl::Status LocalService::CheckMembershipLocked(const Session& session, const LocalJob& job,
                                                 absl::FunctionRef<std::string()> what) const {
  if (auto p = pending_.find(job.job_id); p != pending_.end()) {
    return absl::AbortedError(absl::StrCat(
        kMembershipChangedMarker, "] ", what(), ": local rank ", p->second.local_rank,
        " of this node was taken by a new process; the controller moves the job to a new "
        "membership generation, then call Resync and restart the iteration from a sync point"));
  }
  if (session.generation < job.generation) {
    return absl::AbortedError(
        absl::StrCat(kMembershipChangedMarker, ", generation ", job.generation, "] ", what(),
                     ": the job's membership changed (generation ", session.generation, " -> ",
                     job.generation, "); call Resync and restart the iteration from a sync point"));
  }
  return absl::OkStatus();
}

absl::Status LocalService::Resync(const tributary::v1::ResyncRequest& req,
                                  tributary::v1::ResyncResponse* resp) {
  std::lock_guard lock(mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, sessions_.Find(req.session_id()));
  const LocalJob* job = sessions_.FindJob(session->job_id);
  if (job == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", session->job_id, "' no longer has this node as a worker"));
  }
  if (auto p = pending_.find(job->job_id); p != pending_.end()) {
    return absl::UnavailableError(absl::StrCat(
        "job '", job->job_id, "': local rank ", p->second.local_rank,
        " of this node was taken by a new process and the controller has not confirmed the "
        "job's new membership generation yet; call Resync again"));
  }
  if (session->generation < job->generation) {
    Log()->info(
        "session {} (job {}, local rank {}) resynced: generation {} -> {}, {} tensor "
        "names start again at iteration 0",
        session->id, job->job_id, session->local_rank, session->generation, job->generation,
        session->iterations.size());
    session->generation = job->generation;
    session->synced_plan_version = job->plan_version;
    session->iterations.clear();
    session->failed.clear();
    resyncs_++;
  }
  resp->set_global_rank(job->GlobalRank(session->local_rank));
  resp->set_world_size(job->WorldSize());
  resp->set_generation(session->generation);
  resp->set_plan_version(job->plan_version);
  return absl::OkStatus();
}

absl::Status LocalService::Join(const tributary::v1::JoinJobRequest& req,
                                tributary::v1::JoinJobResponse* resp) {
  std::function<void()> notify;
  absl::Status status = JoinInternal(req, resp, notify);
  if (notify) notify();
  return status;
}

absl::Status LocalService::JoinInternal(const tributary::v1::JoinJobRequest& req,
                                        tributary::v1::JoinJobResponse* resp,
                                        std::function<void()>& notify) {
  std::lock_guard lock(mu_);
  if (shut_down_) return absl::UnavailableError("the agent is shutting down");
  if (const LocalJob* job = sessions_.FindJob(req.job_id()); job != nullptr) {
    auto p = pending_.find(req.job_id());
    const bool replacement = p == pending_.end() && req.local_rank() < job->procs_per_node &&
                             req.local_size() == job->procs_per_node &&
                             joined_ranks_[req.job_id()].contains(req.local_rank());
    const bool held = sessions_.Holder(req.job_id(), req.local_rank()) != nullptr;
    if (replacement && !held) {
      p = pending_
              .emplace(req.job_id(),
                       PendingMembershipChange{req.job_id(), job->generation, req.local_rank()})
              .first;
      Log()->warn(
          "job {}: local rank {} joins again (its process was replaced); waiting for "
          "the controller's new membership generation (now {})",
          req.job_id(), req.local_rank(), job->generation);
      notify = on_membership_change_;
    }
    if (p != pending_.end() && !held) {
      return absl::UnavailableError(absl::StrCat(
          "job '", req.job_id(), "': local rank ", p->second.local_rank,
          " of this node was held by a process that ended; the job moves to a new membership "
          "generation (the other processes resync) before it can be joined; retry"));
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   sessions_.Join(req.job_id(), req.local_rank(), req.local_size()));
  gather_.RankJoined(req.job_id(), req.local_rank());
  joined_ranks_[req.job_id()].insert(req.local_rank());
  const LocalJob& job = *sessions_.FindJob(req.job_id());
  resp->set_session_id(session->id);
  resp->set_global_rank(job.GlobalRank(req.local_rank()));
  resp->set_world_size(job.WorldSize());
  resp->set_plan_version(job.plan_version);
  resp->set_generation(session->generation);
  Log()->info("session {} joined job {} as local rank {}/{} (global rank {})", session->id,
              req.job_id(), req.local_rank(), req.local_size(), resp->global_rank());
  return absl::OkStatus();
}

absl::Status LocalService::WatchSession(const std::string& session_id,
                                        std::function<void()> on_end) {
  std::lock_guard lock(mu_);
  auto session = sessions_.Find(session_id);
  if (!session.ok() || shut_down_) {
    return absl::NotFoundError(absl::StrCat("session '", session_id, "' not found"));
  }
  (*session)->on_end.push_back(std::move(on_end));
  return absl::OkStatus();
}

void LocalService::EndSession(const std::string& session_id, const std::string& why) {
  Deferred after;
  {
    std::lock_guard lock(mu_);
    EndSessionLocked(session_id, why, after);
  }
  after.Run();
}

void LocalService::EndSessionLocked(const std::string& session_id, const std::string& why,
                                    Deferred& after) {
  std::shared_ptr<Session> session = sessions_.Remove(session_id);
  if (!session) return;
  Log()->info("session {} (job {}, local rank {}) ended: {}", session_id, session->job_id,
              session->local_rank, why);
  gather_.RankEnded(session->job_id, session->local_rank, why, after);
  for (auto& on_end : session->on_end) after.Add(std::move(on_end));
  for (auto& [id, handle] : session->handles) {
    after.Add([handle] { handle->ExpireWaiters({}, /*all=*/true); });
  }
  // The buffers go after the lock too: a CUDA mirror's teardown may wait for its stream.
  after.Add([buffers = std::move(session->buffers)] {});
}

absl::StatusOr<uint64_t> LocalService::RegisterBuffer(const common::PeerCredentials& peer,
                                                      const std::string& session_id,
                                                      uint64_t size_bytes, common::UniqueFd fd) {
  RETURN_IF_ERROR(CheckBufferSize(size_bytes));
  const auto check_owner = [&](Session& session) -> absl::Status {
    if (session.owner_uid && *session.owner_uid != peer.uid) {
      return absl::PermissionDeniedError(absl::StrCat("session '", session_id, "' belongs to uid ",
                                                      *session.owner_uid, "; uid ", peer.uid,
                                                      " may not add buffers to it"));
    }
    return absl::OkStatus();
  };
  {
    std::lock_guard lock(mu_);
    ASSIGN_OR_RETURN(std::shared_ptr<Session> session, sessions_.Find(session_id));
    RETURN_IF_ERROR(check_owner(*session));
  }
  // Map outside the lock: fcntl, fstat and mmap are system calls.
  ASSIGN_OR_RETURN(
      std::shared_ptr<SharedMemoryMapping> mapping,
      MapSealedMemory(fd.get(), size_bytes, absl::StrCat("buffer of session '", session_id, "'")));
  std::lock_guard lock(mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, sessions_.Find(session_id));
  RETURN_IF_ERROR(check_owner(*session));
  ASSIGN_OR_RETURN(const uint64_t id, AddBufferLocked(*session, std::move(mapping)));
  session->owner_uid = peer.uid;
  return id;
}

absl::StatusOr<std::shared_ptr<SharedMemoryMapping>> LocalService::FindBuffer(
    const std::string& session_id, uint64_t buffer_id) {
  std::lock_guard lock(mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, sessions_.Find(session_id));
  auto it = session->buffers.find(buffer_id);
  if (it == session->buffers.end()) {
    return absl::NotFoundError(
        absl::StrCat("session '", session_id, "' has no buffer ", buffer_id));
  }
  return it->second;
}

absl::Status LocalService::UnregisterBuffer(const tributary::v1::UnregisterBufferRequest& req) {
  // Dropped after the lock (declared before it): a CUDA mirror's teardown may wait for its
  // stream (agent/cuda_buffer.cc).
  std::shared_ptr<SharedMemoryMapping> released;
  std::lock_guard lock(mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, sessions_.Find(req.session_id()));
  // Operations still running keep their own reference to the mapping.
  if (auto it = session->buffers.find(req.buffer_id()); it != session->buffers.end()) {
    released = std::move(it->second);
    session->buffers.erase(it);
  }
  return absl::OkStatus();
}

absl::Status LocalService::Submit(const tributary::v1::SubmitRequest& req,
                                  tributary::v1::SubmitResponse* resp) {
  return SubmitInternal(req, resp, nullptr);
}

absl::Status LocalService::SubmitWithCallback(const tributary::v1::SubmitRequest& req,
                                              std::function<void(const absl::Status&)> on_done) {
  return SubmitInternal(req, nullptr, std::move(on_done));
}

absl::Status LocalService::SubmitInternal(const tributary::v1::SubmitRequest& req,
                                          tributary::v1::SubmitResponse* resp,
                                          std::function<void(const absl::Status&)> on_done) {
  Deferred after;
  absl::Status result = [&]() -> absl::Status {
    std::lock_guard lock(mu_);
    ASSIGN_OR_RETURN(std::shared_ptr<Session> session, sessions_.Find(req.session_id()));
    // Built only for an error or a log line: the per-operation path makes no string.
    const auto what = [&] {
      return absl::StrCat("job '", session->job_id, "' tensor '", req.tensor_name(), "'");
    };
    const LocalJob* job = sessions_.FindJob(session->job_id);
    if (job == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(what(), ": the job is no longer planned on this node"));
    }
    if (req.tensor_name().empty() || req.tensor_name().size() > kMaxTensorName) {
      return absl::InvalidArgumentError(
          absl::StrCat(what(), ": tensor names must have 1 to ", kMaxTensorName, " bytes"));
    }
    if (absl::StartsWith(req.tensor_name(), kReservedTensorPrefix)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what(), ": names starting with '", kReservedTensorPrefix,
                       "' are reserved for the agent's own collectives"));
    }
    if (!common::IsValidDataType(req.dtype())) {
      return absl::InvalidArgumentError(absl::StrCat(what(), ": unknown dtype ", req.dtype()));
    }
    absl::StatusOr<dataplane::Reduction> reduction = ToReduction(req.op());
    if (!reduction.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what(), ": ", reduction.status().message()));
    }
    if (!job->down_workers.empty() && !dataplane::IsParameterServer(*reduction)) {
      // Every collective needs every worker node: fail now, not at the deadline (an
      // asynchronous parameter-server job goes on without them).
      return absl::UnavailableError(absl::StrCat(
          what(), ": the job is degraded: worker node", job->down_workers.size() > 1 ? "s " : " ",
          absl::StrJoin(job->down_workers, ", "), job->down_workers.size() > 1 ? " are" : " is",
          " down; its collectives cannot complete until the controller sees them back"));
    }
    if (!dataplane::IsParameterServer(*reduction)) {
      RETURN_IF_ERROR(CheckMembershipLocked(*session, *job, what));
    }
    const DataType dtype = static_cast<DataType>(req.dtype());
    const uint64_t esize = common::DataTypeSize(dtype);
    const uint32_t world = job->WorldSize();
    // All-gather and reduce-scatter: `count` is one process's block; the region holds world
    // blocks.
    const bool blockwise = dataplane::IsBlockwise(*reduction);
    const uint64_t blocks = blockwise ? std::max<uint32_t>(world, 1) : 1;
    if (req.count() == 0 || req.count() > kMaxTensorBytes / esize / blocks) {
      return absl::InvalidArgumentError(
          blockwise ? absl::StrCat(what(), ": block count ", req.count(), " x world size ", world,
                                   " must be in [1, 2^40 bytes / element]")
                    : absl::StrCat(what(), ": count ", req.count(),
                                   " must be in [1, 2^40 bytes / element]"));
    }
    auto buf_it = session->buffers.find(req.buffer_id());
    if (buf_it == session->buffers.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what(), ": buffer ", req.buffer_id(), " is not registered in this session"));
    }
    const uint64_t bytes = req.count() * blocks * esize;
    const std::shared_ptr<SharedMemoryMapping>& mapping = buf_it->second;
    if (req.offset_bytes() > mapping->size() || bytes > mapping->size() - req.offset_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what(), ": bytes [", req.offset_bytes(), ", ", req.offset_bytes() + bytes, ")",
          blockwise
              ? absl::StrCat(" (world size ", world, " x block of ", req.count(), " elements)")
              : "",
          " do not fit buffer ", req.buffer_id(), " of ", mapping->size(), " bytes"));
    }
    if (*reduction == dataplane::Reduction::kBroadcast && req.root_rank() >= world) {
      return absl::InvalidArgumentError(absl::StrCat(what(), ": root rank ", req.root_rank(),
                                                     " is not below world size ", world));
    }
    if (resp != nullptr && session->handles.size() >= kMaxHandlesPerSession) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what(), ": ", kMaxHandlesPerSession, " operations not yet waited for; call Wait"));
    }

    Submission sub;
    sub.local_rank = session->local_rank;
    sub.mapping = mapping;
    sub.offset = req.offset_bytes();
    sub.count = req.count();
    sub.bytes = bytes;
    sub.dtype = dtype;
    sub.reduction = *reduction;
    sub.root = req.root_rank();
    sub.priority = req.priority();
    sub.handle = std::make_shared<OpHandle>();
    if (resp != nullptr) {
      const uint64_t handle_id = session->next_handle++;
      session->handles[handle_id] = sub.handle;
      resp->set_handle(handle_id);
    } else {
      // A ring submission: not in the session's handles (nobody Waits on it); its one waiter
      // never expires, so it is answered exactly once, by Complete.
      OpHandle::Waiter waiter{
          [on_done = std::move(on_done)](const absl::Status& status, bool done) {
            if (done) on_done(status);
          },
          common::Clock::TimePoint::max()};
      sub.handle->ResultOrPark(&waiter);
    }

    if (dataplane::IsParameterServer(*reduction)) {
      // Asynchronous parameter-server operations are per process: no gather, no iteration, no
      // retry of an iteration (after a plan change the parameters are gone and rank 0
      // initialises them again, see dataplane/collectives/parameter_server.h).
      dataplane::Operation op;
      op.tensor_name = req.tensor_name();
      op.dtype = dtype;
      op.count = req.count();
      op.reduction = *reduction;
      op.buffers = {mapping->data() + req.offset_bytes()};
      op.priority = req.priority();
      op.keepalive = mapping;
      op.ps_worker = job->GlobalRank(session->local_rank);
      op.ps_scale = req.delta_scale();
      op.ps_version = std::make_shared<uint64_t>(0);
      op.done = [handle = sub.handle, version = op.ps_version](absl::Status s) {
        handle->set_version(*version);
        handle->Complete(s);
      };
      std::vector<MirroredRegion> mirrored;
      if (mapping->mirror() != nullptr) mirrored.push_back({mapping, req.offset_bytes(), bytes});
      after.Add([runner = runner_, stager = stager_, job_id = session->job_id, op = std::move(op),
                 handle = sub.handle, mirrored = std::move(mirrored),
                 timeout = job->op_timeout]() mutable {
        StartMirrored(
            stager, std::move(mirrored), std::move(op), timeout,
            [runner, job_id, handle](dataplane::Operation op) {
              absl::Status started = runner->Start(job_id, std::move(op));
              if (!started.ok()) handle->Complete(started);
            },
            [handle](const absl::Status& status) { handle->Complete(status); });
      });
      return absl::OkStatus();
    }
    sub.session_id = session->id;
    uint64_t iteration = 0;
    auto failed = session->failed.find(req.tensor_name());
    if (failed != session->failed.end() && !failed->second.empty()) {
      // A retry of the lowest iteration of the name that failed as retriable.
      iteration = failed->second.begin()->first;
      sub.retry_of_epoch = failed->second.begin()->second;
      failed->second.erase(failed->second.begin());
      if (failed->second.empty()) session->failed.erase(failed);
      resubmissions_++;
      Log()->info("{} iteration {} submitted again by local rank {} (failed on plan v{})", what(),
                  iteration, session->local_rank, *sub.retry_of_epoch);
    } else {
      iteration = session->iterations[req.tensor_name()]++;
    }
    const GatherKey key{session->job_id, req.tensor_name(), iteration};
    gather_.Add(*job, key, std::move(sub), after);
    return absl::OkStatus();
  }();
  after.Run();
  return result;
}

void LocalService::Await(const std::string& session_id, uint64_t handle_id, uint32_t timeout_ms,
                         Reply reply, std::function<void(uint64_t)> version) {
  absl::Status status;
  bool done = false;
  {
    std::lock_guard lock(mu_);
    auto session = sessions_.Find(session_id);
    if (!session.ok()) {
      status = session.status();
    } else if (auto it = (*session)->handles.find(handle_id); it == (*session)->handles.end()) {
      status = absl::NotFoundError(absl::StrCat(
          "handle ", handle_id, " is unknown in this session (its result was already reported?)"));
    } else {
      if (version) {
        reply = [reply = std::move(reply), version = std::move(version), h = it->second](
                    const absl::Status& status, bool done) {
          if (done) version(h->version());
          reply(status, done);
        };
      }
      const bool park = timeout_ms != 0 && !shut_down_;
      const auto timeout = std::chrono::milliseconds(std::min(timeout_ms, kMaxWaitMs));
      OpHandle::Waiter waiter{std::move(reply), clock_->Now() + timeout};
      std::optional<absl::Status> result = it->second->ResultOrPark(park ? &waiter : nullptr);
      if (!result && park) return;  // Complete or Tick answers; Tick forgets the handle after.
      reply = std::move(waiter.reply);
      if (result) {
        (*session)->handles.erase(it);  // reported: forget it
        status = *result;
        done = true;
      }
    }
  }
  reply(status, done);
}

void LocalService::Tick() {
  Deferred after;
  std::vector<std::shared_ptr<OpHandle>> handles;
  const auto now = clock_->Now();
  {
    std::lock_guard lock(mu_);
    gather_.Expire(now, after);
    for (const auto& [id, session] : sessions_.sessions()) {
      for (auto h = session->handles.begin(); h != session->handles.end();) {
        if (h->second->done_and_delivered()) {
          h = session->handles.erase(h);
        } else {
          handles.push_back(h->second);
          ++h;
        }
      }
    }
  }
  after.Run();
  for (auto& h : handles) h->ExpireWaiters(now, /*all=*/false);
}

void LocalService::Shutdown() {
  Deferred after;
  {
    std::lock_guard lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    std::vector<std::string> ids;
    for (const auto& [id, s] : sessions_.sessions()) ids.push_back(id);
    for (const auto& id : ids) EndSessionLocked(id, "the agent is shutting down", after);
  }
  after.Run();
}

}  // namespace tributary::agent
