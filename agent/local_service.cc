#include "agent/local_service.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"

namespace tributary::agent {
namespace {

using common::DataType;

constexpr size_t kMaxTensorName = 1024;
constexpr size_t kMaxHandlesPerSession = 1 << 16;
constexpr uint64_t kMaxTensorBytes = uint64_t{1} << 40;

std::shared_ptr<spdlog::logger> Log() {
  static auto logger = common::Logger("agent");
  return logger;
}

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(common::ToGrpcStatus(s));
  return reactor;
}

std::string NewSessionId() {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard lock(mu);
  return absl::StrFormat("%016x", rng());
}

const char* OpName(tributary::v1::CollectiveOp op) {
  switch (op) {
    case tributary::v1::COLLECTIVE_OP_SUM:
      return "sum";
    case tributary::v1::COLLECTIVE_OP_AVERAGE:
      return "average";
    case tributary::v1::COLLECTIVE_OP_BROADCAST:
      return "broadcast";
    default:
      return "unknown";
  }
}

}  // namespace

// A client's POSIX shared-memory object mapped into the agent. Unmapped when the last
// operation using it and the session have let go.
struct LocalService::Mapping {
  std::string name;
  std::byte* data = nullptr;
  uint64_t size = 0;
  ~Mapping() {
    if (data != nullptr) munmap(data, size);
  }
};

// The result of one submission, and the Wait calls parked on it.
struct LocalService::OpHandle {
  struct Waiter {
    grpc::ServerUnaryReactor* reactor;
    std::function<void(bool)> set_done;  // writes `done` into the parked call's response
    common::Clock::TimePoint deadline;
  };
  std::mutex mu;
  bool done = false;
  bool delivered = false;  // a Wait call has reported the result
  absl::Status status;
  std::vector<Waiter> waiters;

  void Complete(const absl::Status& s) {
    std::vector<Waiter> w;
    {
      std::lock_guard lock(mu);
      if (done) return;
      done = true;
      status = s;
      delivered = !waiters.empty();
      w.swap(waiters);
    }
    for (Waiter& x : w) {
      x.set_done(true);
      x.reactor->Finish(common::ToGrpcStatus(s));
    }
  }
  // Ends parked Wait calls whose timeout passed (with done = false); `all` ends every one.
  void ExpireWaiters(common::Clock::TimePoint now, bool all) {
    std::vector<Waiter> expired;
    {
      std::lock_guard lock(mu);
      for (auto it = waiters.begin(); it != waiters.end();) {
        if (all || it->deadline <= now) {
          expired.push_back(*it);
          it = waiters.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (Waiter& x : expired) {
      x.set_done(false);
      x.reactor->Finish(grpc::Status::OK);
    }
  }
};

// Lets a KeepAlive stream be finished exactly once, by whichever side gets there first. The
// mutex is recursive because Finish may run the reactor's OnDone inline.
struct KeepAliveLink {
  std::recursive_mutex mu;
  grpc::ServerWriteReactor<tributary::v1::KeepAliveEvent>* reactor = nullptr;
  bool finished = false;
  void End(const grpc::Status& s) {
    std::lock_guard lock(mu);
    if (reactor == nullptr || finished) return;
    finished = true;
    reactor->Finish(s);
  }
};

class LocalService::KeepAliveReactor final
    : public grpc::ServerWriteReactor<tributary::v1::KeepAliveEvent> {
 public:
  KeepAliveReactor(LocalService* service, std::string session_id,
                   std::shared_ptr<KeepAliveLink> link)
      : service_(service), session_id_(std::move(session_id)), link_(std::move(link)) {
    std::lock_guard lock(link_->mu);
    link_->reactor = this;
  }
  void OnCancel() override {
    std::vector<std::function<void()>> after;
    {
      std::lock_guard lock(service_->mu_);
      service_->EndSessionLocked(session_id_, "its process disconnected", after);
    }
    for (auto& f : after) f();
    link_->End(grpc::Status::CANCELLED);
  }
  void OnDone() override {
    {
      std::lock_guard lock(link_->mu);
      link_->reactor = nullptr;
    }
    delete this;
  }

 private:
  LocalService* service_;
  std::string session_id_;
  std::shared_ptr<KeepAliveLink> link_;
};

struct LocalService::Session {
  std::string id;
  std::string job_id;
  uint32_t local_rank = 0;
  uint32_t local_size = 0;
  std::map<uint64_t, std::shared_ptr<Mapping>> buffers;
  uint64_t next_buffer = 1;
  std::map<std::string, uint64_t> iterations;  // per tensor name: the next iteration
  std::map<uint64_t, std::shared_ptr<OpHandle>> handles;
  uint64_t next_handle = 1;
  std::shared_ptr<KeepAliveLink> keepalive = std::make_shared<KeepAliveLink>();
};

struct LocalService::Submission {
  uint32_t local_rank = 0;
  std::shared_ptr<Mapping> mapping;
  uint64_t offset = 0;
  uint64_t count = 0;
  DataType dtype = DataType::kFloat32;
  tributary::v1::CollectiveOp op = tributary::v1::COLLECTIVE_OP_SUM;
  uint32_t root = 0;
  int32_t priority = 0;
  std::shared_ptr<OpHandle> handle;

  std::string Describe() const {
    std::string s =
        absl::StrCat(count, " x ", std::string(common::DataTypeName(dtype)), " ", OpName(op));
    if (op == tributary::v1::COLLECTIVE_OP_BROADCAST) absl::StrAppend(&s, " from rank ", root);
    return s;
  }
  bool Agrees(const Submission& o) const {
    return count == o.count && dtype == o.dtype && op == o.op &&
           (op != tributary::v1::COLLECTIVE_OP_BROADCAST || root == o.root);
  }
};

struct LocalService::Gather {
  LocalJob job;
  std::vector<std::optional<Submission>> slots;
  uint32_t filled = 0;
  common::Clock::TimePoint created;
};

LocalService::LocalService(dataplane::DataPlaneNode* collectives, const common::Clock* clock)
    : collectives_(collectives), clock_(clock) {}

LocalService::~LocalService() { Shutdown(); }

void LocalService::SetJobs(const std::vector<LocalJob>& jobs) {
  std::lock_guard lock(mu_);
  jobs_.clear();
  for (const LocalJob& j : jobs) jobs_[j.job_id] = j;
}

size_t LocalService::num_sessions() const {
  std::lock_guard lock(mu_);
  return sessions_.size();
}

absl::StatusOr<std::shared_ptr<LocalService::Session>> LocalService::FindSessionLocked(
    const std::string& id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("session '", id,
                     "' not found: call JoinJob first (sessions end when the process "
                     "disconnects or leaves)"));
  }
  return it->second;
}

absl::Status LocalService::DoJoin(const tributary::v1::JoinJobRequest& req,
                                  tributary::v1::JoinJobResponse* resp) {
  std::lock_guard lock(mu_);
  if (shut_down_) return absl::UnavailableError("the agent is shutting down");
  auto job_it = jobs_.find(req.job_id());
  if (job_it == jobs_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", req.job_id(),
        "' has no plan on this node yet: create it with this node as a worker, then retry"));
  }
  const LocalJob& job = job_it->second;
  if (req.local_size() != job.procs_per_node) {
    return absl::InvalidArgumentError(
        absl::StrCat("job '", req.job_id(), "' runs ", job.procs_per_node,
                     " processes per node; local_size is ", req.local_size()));
  }
  if (req.local_rank() >= req.local_size()) {
    return absl::InvalidArgumentError(absl::StrCat("local_rank ", req.local_rank(),
                                                   " is not below local_size ", req.local_size()));
  }
  for (const auto& [id, s] : sessions_) {
    if (s->job_id == req.job_id() && s->local_rank == req.local_rank()) {
      return absl::AlreadyExistsError(absl::StrCat("local rank ", req.local_rank(), " of job '",
                                                   req.job_id(), "' is taken by session ", id));
    }
  }
  auto session = std::make_shared<Session>();
  session->id = NewSessionId();
  session->job_id = req.job_id();
  session->local_rank = req.local_rank();
  session->local_size = req.local_size();
  sessions_[session->id] = session;
  departed_[req.job_id()].erase(req.local_rank());
  resp->set_session_id(session->id);
  resp->set_global_rank(job.node_rank * job.procs_per_node + req.local_rank());
  resp->set_world_size(job.num_nodes * job.procs_per_node);
  resp->set_plan_version(job.plan_version);
  Log()->info("session {} joined job {} as local rank {}/{} (global rank {})", session->id,
              req.job_id(), req.local_rank(), req.local_size(), resp->global_rank());
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* LocalService::JoinJob(grpc::CallbackServerContext* ctx,
                                                const tributary::v1::JoinJobRequest* req,
                                                tributary::v1::JoinJobResponse* resp) {
  return Finish(ctx, DoJoin(*req, resp));
}

grpc::ServerWriteReactor<tributary::v1::KeepAliveEvent>* LocalService::KeepAlive(
    grpc::CallbackServerContext* ctx, const tributary::v1::KeepAliveRequest* req) {
  std::shared_ptr<KeepAliveLink> link;
  {
    std::lock_guard lock(mu_);
    auto session = FindSessionLocked(req->session_id());
    if (session.ok() && !shut_down_) link = (*session)->keepalive;
  }
  if (!link) {
    // A reactor that finishes at once.
    auto finished = std::make_shared<KeepAliveLink>();
    auto* reactor = new KeepAliveReactor(this, req->session_id(), finished);
    finished->End(grpc::Status(grpc::StatusCode::NOT_FOUND,
                               absl::StrCat("session '", req->session_id(), "' not found")));
    return reactor;
  }
  return new KeepAliveReactor(this, req->session_id(), link);
}

void LocalService::EndSessionLocked(const std::string& session_id, const std::string& why,
                                    std::vector<std::function<void()>>& after) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  std::shared_ptr<Session> session = it->second;
  sessions_.erase(it);
  departed_[session->job_id][session->local_rank] = why;
  Log()->info("session {} (job {}, local rank {}) ended: {}", session_id, session->job_id,
              session->local_rank, why);
  // Gathers that still wait for this rank can never complete.
  for (auto g = gathers_.begin(); g != gathers_.end();) {
    if (g->first.job_id == session->job_id && !g->second->slots[session->local_rank]) {
      const GatherKey key = g->first;
      FailGatherLocked(
          key, *g->second,
          absl::AbortedError(absl::StrCat(
              "job '", key.job_id, "' tensor '", key.tensor, "' iteration ", key.iteration,
              ": local rank ", session->local_rank, " ended (", why, ") before submitting it")),
          after);
      g = gathers_.erase(g);
    } else {
      ++g;
    }
  }
  auto link = session->keepalive;
  after.push_back([link] { link->End(grpc::Status::OK); });
  for (auto& [id, handle] : session->handles) {
    after.push_back([handle] { handle->ExpireWaiters({}, /*all=*/true); });
  }
}

void LocalService::FailGatherLocked(const GatherKey& key, Gather& gather,
                                    const absl::Status& status,
                                    std::vector<std::function<void()>>& after) {
  Log()->warn("{}", status.message());
  for (auto& slot : gather.slots) {
    if (slot) after.push_back([h = slot->handle, status] { h->Complete(status); });
  }
  after.push_back(
      [this, key, status] { collectives_->Abort(key.job_id, key.tensor, key.iteration, status); });
}

grpc::ServerUnaryReactor* LocalService::LeaveJob(grpc::CallbackServerContext* ctx,
                                                 const tributary::v1::LeaveJobRequest* req,
                                                 tributary::v1::LeaveJobResponse*) {
  std::vector<std::function<void()>> after;
  {
    std::lock_guard lock(mu_);
    EndSessionLocked(req->session_id(), "it left the job", after);
  }
  for (auto& f : after) f();
  return Finish(ctx, absl::OkStatus());  // idempotent
}

absl::Status LocalService::DoRegisterBuffer(const tributary::v1::RegisterBufferRequest& req,
                                            tributary::v1::RegisterBufferResponse* resp) {
  const std::string& name = req.shm_name();
  if (name.size() < 2 || name.size() > 255 || name[0] != '/' ||
      name.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm_name '", name, "' must be '/' followed by up to 254 characters without '/'"));
  }
  if (req.size_bytes() == 0 || req.size_bytes() > kMaxTensorBytes) {
    return absl::InvalidArgumentError(absl::StrCat("buffer '", name, "': size_bytes ",
                                                   req.size_bytes(), " is not in [1, 1 TiB]"));
  }
  {
    std::lock_guard lock(mu_);
    RETURN_IF_ERROR(FindSessionLocked(req.session_id()).status());
  }
  // Map outside the lock: shm_open and mmap are system calls.
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("shm_open('", name, "') failed: ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < req.size_bytes()) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("shared memory '", name, "' has ", st.st_size,
                                                   " bytes, fewer than the ", req.size_bytes(),
                                                   " declared"));
  }
  void* data = mmap(nullptr, req.size_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (data == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of '", name, "' failed: ", std::strerror(errno)));
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->name = name;
  mapping->data = static_cast<std::byte*>(data);
  mapping->size = req.size_bytes();
  std::lock_guard lock(mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, FindSessionLocked(req.session_id()));
  const uint64_t id = session->next_buffer++;
  session->buffers[id] = std::move(mapping);
  resp->set_buffer_id(id);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* LocalService::RegisterBuffer(
    grpc::CallbackServerContext* ctx, const tributary::v1::RegisterBufferRequest* req,
    tributary::v1::RegisterBufferResponse* resp) {
  return Finish(ctx, DoRegisterBuffer(*req, resp));
}

grpc::ServerUnaryReactor* LocalService::UnregisterBuffer(
    grpc::CallbackServerContext* ctx, const tributary::v1::UnregisterBufferRequest* req,
    tributary::v1::UnregisterBufferResponse*) {
  std::lock_guard lock(mu_);
  auto session = FindSessionLocked(req->session_id());
  // Operations still running keep their own reference to the mapping.
  if (session.ok()) (*session)->buffers.erase(req->buffer_id());
  return Finish(ctx, session.status());
}

absl::Status LocalService::DoSubmit(const tributary::v1::SubmitRequest& req,
                                    tributary::v1::SubmitResponse* resp) {
  std::vector<std::function<void()>> after;
  absl::Status result = [&]() -> absl::Status {
    std::lock_guard lock(mu_);
    ASSIGN_OR_RETURN(std::shared_ptr<Session> session, FindSessionLocked(req.session_id()));
    const std::string what =
        absl::StrCat("job '", session->job_id, "' tensor '", req.tensor_name(), "'");
    auto job_it = jobs_.find(session->job_id);
    if (job_it == jobs_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": the job is no longer planned on this node"));
    }
    const LocalJob& job = job_it->second;
    if (req.tensor_name().empty() || req.tensor_name().size() > kMaxTensorName) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": tensor names must have 1 to ", kMaxTensorName, " bytes"));
    }
    if (!common::IsValidDataType(req.dtype())) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": unknown dtype ", req.dtype()));
    }
    if (req.op() < tributary::v1::COLLECTIVE_OP_SUM ||
        req.op() > tributary::v1::COLLECTIVE_OP_BROADCAST) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": unknown op ", req.op()));
    }
    const DataType dtype = static_cast<DataType>(req.dtype());
    const uint64_t esize = common::DataTypeSize(dtype);
    if (req.count() == 0 || req.count() > kMaxTensorBytes / esize) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": count ", req.count(), " must be in [1, 2^40 bytes / element]"));
    }
    auto buf_it = session->buffers.find(req.buffer_id());
    if (buf_it == session->buffers.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": buffer ", req.buffer_id(), " is not registered in this session"));
    }
    const uint64_t bytes = req.count() * esize;
    const std::shared_ptr<Mapping>& mapping = buf_it->second;
    if (req.offset_bytes() > mapping->size || bytes > mapping->size - req.offset_bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": bytes [", req.offset_bytes(), ", ", req.offset_bytes() + bytes,
                       ") do not fit buffer ", req.buffer_id(), " of ", mapping->size, " bytes"));
    }
    const uint32_t world = job.num_nodes * job.procs_per_node;
    if (req.op() == tributary::v1::COLLECTIVE_OP_BROADCAST && req.root_rank() >= world) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": root rank ", req.root_rank(), " is not below world size ", world));
    }
    if (session->handles.size() >= kMaxHandlesPerSession) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, ": ", kMaxHandlesPerSession, " operations not yet waited for; call Wait"));
    }

    Submission sub;
    sub.local_rank = session->local_rank;
    sub.mapping = mapping;
    sub.offset = req.offset_bytes();
    sub.count = req.count();
    sub.dtype = dtype;
    sub.op = req.op();
    sub.root = req.root_rank();
    sub.priority = req.priority();
    sub.handle = std::make_shared<OpHandle>();
    const uint64_t handle_id = session->next_handle++;
    session->handles[handle_id] = sub.handle;
    resp->set_handle(handle_id);

    const GatherKey key{session->job_id, req.tensor_name(),
                        session->iterations[req.tensor_name()]++};
    auto& gather = gathers_[key];
    if (!gather) {
      gather = std::make_unique<Gather>();
      gather->job = job;
      gather->slots.resize(job.procs_per_node);
      gather->created = clock_->Now();
    }
    gather->slots[sub.local_rank] = std::move(sub);
    if (++gather->filled < job.procs_per_node) {
      // A rank whose process already left will never submit: fail now, not at the deadline.
      for (const auto& [rank, why] : departed_[key.job_id]) {
        if (rank < gather->slots.size() && !gather->slots[rank]) {
          FailGatherLocked(
              key, *gather,
              absl::AbortedError(absl::StrCat(what, " iteration ", key.iteration, ": local rank ",
                                              rank, " ended (", why, ") and cannot submit it")),
              after);
          gathers_.erase(key);
          break;
        }
      }
      return absl::OkStatus();
    }

    // Every local process has submitted: check they agree, then start the node's operation.
    std::unique_ptr<Gather> full = std::move(gather);
    gathers_.erase(key);
    const Submission& first = *full->slots[0];
    for (const auto& slot : full->slots) {
      if (!slot->Agrees(first)) {
        FailGatherLocked(
            key, *full,
            absl::InvalidArgumentError(absl::StrCat(
                what, " iteration ", key.iteration, ": local rank 0 submitted ", first.Describe(),
                " but local rank ", slot->local_rank, " submitted ", slot->Describe())),
            after);
        return absl::OkStatus();  // the error travels through every handle
      }
    }
    dataplane::Operation op;
    op.tensor_name = key.tensor;
    op.iteration = key.iteration;
    op.dtype = first.dtype;
    op.count = first.count;
    op.reduction = first.op == tributary::v1::COLLECTIVE_OP_SUM ? dataplane::Reduction::kSum
                   : first.op == tributary::v1::COLLECTIVE_OP_AVERAGE
                       ? dataplane::Reduction::kAverage
                       : dataplane::Reduction::kBroadcast;
    op.root_node = first.root / job.procs_per_node;
    op.root_local = first.root % job.procs_per_node;
    op.priority = first.priority;
    auto mappings = std::make_shared<std::vector<std::shared_ptr<Mapping>>>();
    std::vector<std::shared_ptr<OpHandle>> handles;
    for (const auto& slot : full->slots) {
      op.buffers.push_back(slot->mapping->data + slot->offset);
      op.priority = std::min(op.priority, slot->priority);
      mappings->push_back(slot->mapping);
      handles.push_back(slot->handle);
    }
    op.keepalive = mappings;
    op.done = [handles](absl::Status s) {
      for (const auto& h : handles) h->Complete(s);
    };
    after.push_back([this, job_id = key.job_id, op = std::move(op), handles]() mutable {
      const std::string tensor = op.tensor_name;
      const uint64_t iteration = op.iteration;
      absl::Status started = collectives_->Start(job_id, std::move(op));
      if (!started.ok()) {
        for (const auto& h : handles) h->Complete(started);
        collectives_->Abort(job_id, tensor, iteration, started);
      }
    });
    return absl::OkStatus();
  }();
  for (auto& f : after) f();
  return result;
}

grpc::ServerUnaryReactor* LocalService::Submit(grpc::CallbackServerContext* ctx,
                                               const tributary::v1::SubmitRequest* req,
                                               tributary::v1::SubmitResponse* resp) {
  const absl::Status submitted = DoSubmit(*req, resp);
  if (!submitted.ok() || req->wait_timeout_ms() == 0) return Finish(ctx, submitted);
  return Park(ctx, req->session_id(), resp->handle(), req->wait_timeout_ms(),
              [resp](bool done) { resp->set_done(done); });
}

grpc::ServerUnaryReactor* LocalService::Park(grpc::CallbackServerContext* ctx,
                                             const std::string& session_id, uint64_t handle_id,
                                             uint32_t timeout_ms,
                                             std::function<void(bool)> set_done) {
  std::lock_guard lock(mu_);
  auto session = FindSessionLocked(session_id);
  if (!session.ok()) return Finish(ctx, session.status());
  auto it = (*session)->handles.find(handle_id);
  if (it == (*session)->handles.end()) {
    return Finish(ctx, absl::NotFoundError(absl::StrCat(
                           "handle ", handle_id,
                           " is unknown in this session (its result was already reported?)")));
  }
  std::shared_ptr<OpHandle> handle = it->second;
  std::lock_guard hlock(handle->mu);
  if (handle->done || timeout_ms == 0 || shut_down_) {
    set_done(handle->done);
    if (handle->done) (*session)->handles.erase(it);  // reported: forget it
    return Finish(ctx, handle->done ? handle->status : absl::OkStatus());
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const auto timeout = std::chrono::milliseconds(std::min<uint32_t>(timeout_ms, 3600000));
  handle->waiters.push_back({reactor, std::move(set_done), clock_->Now() + timeout});
  // Once parked, the result is reported by Complete; the handle is forgotten by Tick.
  return reactor;
}

grpc::ServerUnaryReactor* LocalService::Wait(grpc::CallbackServerContext* ctx,
                                             const tributary::v1::WaitRequest* req,
                                             tributary::v1::WaitResponse* resp) {
  return Park(ctx, req->session_id(), req->handle(), req->timeout_ms(),
              [resp](bool done) { resp->set_done(done); });
}

void LocalService::Tick() {
  std::vector<std::function<void()>> after;
  std::vector<std::shared_ptr<OpHandle>> handles;
  const auto now = clock_->Now();
  {
    std::lock_guard lock(mu_);
    for (auto g = gathers_.begin(); g != gathers_.end();) {
      Gather& gather = *g->second;
      if (now - gather.created < gather.job.op_timeout) {
        ++g;
        continue;
      }
      std::vector<uint32_t> missing;
      for (uint32_t r = 0; r < gather.slots.size(); ++r) {
        if (!gather.slots[r]) missing.push_back(r);
      }
      FailGatherLocked(g->first, gather,
                       absl::DeadlineExceededError(absl::StrCat(
                           "job '", g->first.job_id, "' tensor '", g->first.tensor, "' iteration ",
                           g->first.iteration, ": local ranks [", absl::StrJoin(missing, ","),
                           "] did not submit it within ", gather.job.op_timeout.count(), " ms")),
                       after);
      g = gathers_.erase(g);
    }
    for (auto& [id, session] : sessions_) {
      for (auto h = session->handles.begin(); h != session->handles.end();) {
        bool forget;
        {
          std::lock_guard hlock(h->second->mu);
          forget = h->second->done && h->second->delivered;
        }
        if (forget) {
          h = session->handles.erase(h);
        } else {
          handles.push_back(h->second);
          ++h;
        }
      }
    }
  }
  for (auto& f : after) f();
  for (auto& h : handles) h->ExpireWaiters(now, /*all=*/false);
}

void LocalService::Shutdown() {
  std::vector<std::function<void()>> after;
  {
    std::lock_guard lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    std::vector<std::string> ids;
    for (const auto& [id, s] : sessions_) ids.push_back(id);
    for (const auto& id : ids) EndSessionLocked(id, "the agent is shutting down", after);
  }
  for (auto& f : after) f();
}

}  // namespace tributary::agent
