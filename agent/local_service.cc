#include "agent/local_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
    : runner_(runner), clock_(clock), gather_(runner, clock), link_(std::make_shared<Link>()) {
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
      if (session.ok()) (*session)->failed[key.tensor][key.iteration] = epoch;
    }
  });
}

LocalService::~LocalService() {
  Shutdown();
  std::lock_guard lock(link_->mu);
  link_->service = nullptr;
}

void LocalService::SetJobs(const std::vector<LocalJob>& jobs) {
  Deferred after;
  {
    std::lock_guard lock(mu_);
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

absl::Status LocalService::Join(const tributary::v1::JoinJobRequest& req,
                                tributary::v1::JoinJobResponse* resp) {
  std::lock_guard lock(mu_);
  if (shut_down_) return absl::UnavailableError("the agent is shutting down");
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   sessions_.Join(req.job_id(), req.local_rank(), req.local_size()));
  gather_.RankJoined(req.job_id(), req.local_rank());
  const LocalJob& job = *sessions_.FindJob(req.job_id());
  resp->set_session_id(session->id);
  resp->set_global_rank(job.node_rank * job.procs_per_node + req.local_rank());
  resp->set_world_size(job.num_nodes * job.procs_per_node);
  resp->set_plan_version(job.plan_version);
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
  if (session->buffers.size() >= kMaxBuffersPerSession) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session '", session_id, "' already has ", session->buffers.size(),
                     " buffers (the limit); unregister some first"));
  }
  session->owner_uid = peer.uid;
  const uint64_t id = session->next_buffer++;
  session->buffers[id] = std::move(mapping);
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
  std::lock_guard lock(mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, sessions_.Find(req.session_id()));
  // Operations still running keep their own reference to the mapping.
  session->buffers.erase(req.buffer_id());
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
    const std::string what =
        absl::StrCat("job '", session->job_id, "' tensor '", req.tensor_name(), "'");
    const LocalJob* job = sessions_.FindJob(session->job_id);
    if (job == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": the job is no longer planned on this node"));
    }
    if (req.tensor_name().empty() || req.tensor_name().size() > kMaxTensorName) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": tensor names must have 1 to ", kMaxTensorName, " bytes"));
    }
    if (!common::IsValidDataType(req.dtype())) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": unknown dtype ", req.dtype()));
    }
    absl::StatusOr<dataplane::Reduction> reduction = ToReduction(req.op());
    if (!reduction.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", reduction.status().message()));
    }
    if (!job->down_workers.empty() && !dataplane::IsParameterServer(*reduction)) {
      // Every collective needs every worker node: fail now, not at the deadline (an
      // asynchronous parameter-server job goes on without them).
      return absl::UnavailableError(absl::StrCat(
          what, ": the job is degraded: worker node", job->down_workers.size() > 1 ? "s " : " ",
          absl::StrJoin(job->down_workers, ", "), job->down_workers.size() > 1 ? " are" : " is",
          " down; its collectives cannot complete until the controller sees them back"));
    }
    const DataType dtype = static_cast<DataType>(req.dtype());
    const uint64_t esize = common::DataTypeSize(dtype);
    const uint32_t world = job->num_nodes * job->procs_per_node;
    // All-gather and reduce-scatter: `count` is one process's block; the region holds world
    // blocks.
    const bool blockwise = dataplane::IsBlockwise(*reduction);
    const uint64_t blocks = blockwise ? std::max<uint32_t>(world, 1) : 1;
    if (req.count() == 0 || req.count() > kMaxTensorBytes / esize / blocks) {
      return absl::InvalidArgumentError(
          blockwise ? absl::StrCat(what, ": block count ", req.count(), " x world size ", world,
                                   " must be in [1, 2^40 bytes / element]")
                    : absl::StrCat(what, ": count ", req.count(),
                                   " must be in [1, 2^40 bytes / element]"));
    }
    auto buf_it = session->buffers.find(req.buffer_id());
    if (buf_it == session->buffers.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": buffer ", req.buffer_id(), " is not registered in this session"));
    }
    const uint64_t bytes = req.count() * blocks * esize;
    const std::shared_ptr<SharedMemoryMapping>& mapping = buf_it->second;
    if (req.offset_bytes() > mapping->size() || bytes > mapping->size() - req.offset_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": bytes [", req.offset_bytes(), ", ", req.offset_bytes() + bytes, ")",
          blockwise
              ? absl::StrCat(" (world size ", world, " x block of ", req.count(), " elements)")
              : "",
          " do not fit buffer ", req.buffer_id(), " of ", mapping->size(), " bytes"));
    }
    if (*reduction == dataplane::Reduction::kBroadcast && req.root_rank() >= world) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": root rank ", req.root_rank(), " is not below world size ", world));
    }
    if (resp != nullptr && session->handles.size() >= kMaxHandlesPerSession) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, ": ", kMaxHandlesPerSession, " operations not yet waited for; call Wait"));
    }

    Submission sub;
    sub.local_rank = session->local_rank;
    sub.mapping = mapping;
    sub.offset = req.offset_bytes();
    sub.count = req.count();
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
      op.ps_worker = job->node_rank * job->procs_per_node + session->local_rank;
      op.ps_scale = req.delta_scale();
      op.ps_version = std::make_shared<uint64_t>(0);
      op.done = [handle = sub.handle, version = op.ps_version](absl::Status s) {
        handle->set_version(*version);
        handle->Complete(s);
      };
      after.Add([runner = runner_, job_id = session->job_id, op = std::move(op),
                 handle = sub.handle]() mutable {
        absl::Status started = runner->Start(job_id, std::move(op));
        if (!started.ok()) handle->Complete(started);
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
      Log()->info("{} iteration {} submitted again by local rank {} (failed on plan v{})", what,
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
