#include "controller/controller_service.h"

#include <deque>
#include <mutex>

#include "common/metrics/metrics.h"
#include "common/rpc/grpc_status.h"
#include "common/thread_name.h"

namespace tributary::controller {
namespace {

constexpr const char* kMethodNames[] = {
    "RegisterNode", "Heartbeat", "GetAssignments", "ListNodes",        "CreateJob",
    "GetJob",       "ListJobs",  "DeleteJob",      "WatchAssignments", "GetJobStats"};

const Authorizer kAllowAll{AuthzOptions{}};

}  // namespace

// Starts the watch streams' writes on its own thread: ClusterState pushes with its mutex held, and
// a write started there would run gRPC's write path (serialization, sendmsg) under that mutex,
// for every agent of a plan, while heartbeats wait.
class WatchHub {
 public:
  WatchHub() : thread_([this] { Loop(); }) {}
  ~WatchHub() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // `reactor` has a reference for the hub (taken by the caller).
  void Ready(WatchReactor* reactor) {
    {
      std::lock_guard lock(mu_);
      ready_.push_back(reactor);
    }
    cv_.notify_one();
  }

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<WatchReactor*> ready_;
  bool stop_ = false;
  std::thread thread_;
};

// One node's watch stream. Owned by gRPC until OnDone and by the hub while queued there: deleted
// when both let go, after it has left ClusterState (so no Push can reach it). Push comes with
// ClusterState's mutex held and only queues; writes start on the hub's thread and continue from
// OnWriteDone; mu_ orders them.
class WatchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                           public ClusterState::AssignmentsWatcher {
 public:
  static constexpr size_t kMaxQueued = 16;

  WatchReactor(ClusterState* state, WatchHub* hub, std::string node_id)
      : state_(state), hub_(hub), node_id_(std::move(node_id)) {}

  // Subscribes; finishes the stream when the state refuses.
  absl::Status Begin(const tributary::v1::WatchAssignmentsRequest& req) {
    // At once, before any message: the agent knows its watch is up even when nothing is due.
    StartSendInitialMetadata();
    absl::Status s = state_->Watch(req, this);
    if (s.ok()) {
      subscribed_ = true;
    } else {
      FinishOnce(common::ToGrpcStatus(s));
    }
    return s;
  }

  void Push(uint64_t, const grpc::ByteBuffer& message) override {
    std::lock_guard lock(mu_);
    if (finishing_) return;
    if (queue_.size() >= kMaxQueued) {
      // A slow reader: the one in flight stays, the newest state replaces the rest.
      queue_.erase(std::next(queue_.begin()), queue_.end());
    }
    queue_.push_back(message);
    if (!writing_ && !kicked_) {
      kicked_ = true;
      refs_++;
      hub_->Ready(this);
    }
  }

  // On the hub's thread: starts writing the queue, or finishes the stream after End.
  void Kick() {
    bool finish = false;
    grpc::Status status;
    {
      std::lock_guard lock(mu_);
      kicked_ = false;
      if (finishing_) {
        finish = !writing_;  // else OnWriteDone finishes
        status = end_;
      } else if (!writing_ && !queue_.empty()) {
        writing_ = true;
        StartWrite(&queue_.front());
      }
    }
    if (finish) FinishOnce(status);
    Unref();
  }

  void OnWriteDone(bool ok) override {
    bool finish = false;
    grpc::Status status;
    {
      std::lock_guard lock(mu_);
      status = end_;
      queue_.pop_front();
      if (!ok || finishing_) {
        writing_ = false;
        finish = true;
      } else if (!queue_.empty()) {
        StartWrite(&queue_.front());
      } else {
        writing_ = false;
      }
    }
    if (finish) FinishOnce(status);
  }

  // With ClusterState's mutex held, like Push: the stream is finished on the hub's thread (or by
  // the write in flight), never here.
  void End(const absl::Status& why) override {
    std::lock_guard lock(mu_);
    end_ = common::ToGrpcStatus(why);
    finishing_ = true;
    if (writing_ || kicked_) return;  // OnWriteDone or the queued Kick finishes, with end_
    kicked_ = true;
    refs_++;
    hub_->Ready(this);
  }

  void OnCancel() override {
    bool finish;
    {
      std::lock_guard lock(mu_);
      end_ = grpc::Status::CANCELLED;
      finishing_ = true;
      finish = !writing_;  // else OnWriteDone finishes
    }
    if (finish) FinishOnce(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    if (subscribed_) state_->Unwatch(node_id_, this);
    Unref();
  }

 private:
  void Unref() {
    bool last;
    {
      std::lock_guard lock(mu_);
      last = --refs_ == 0;
    }
    if (last) delete this;
  }

  void FinishOnce(const grpc::Status& status) {
    {
      std::lock_guard lock(mu_);
      finishing_ = true;
      if (finished_) return;
      finished_ = true;
    }
    Finish(status);
  }

  ClusterState* const state_;
  WatchHub* const hub_;
  const std::string node_id_;
  bool subscribed_ = false;
  std::mutex mu_;
  std::deque<grpc::ByteBuffer> queue_;  // front: being written while writing_
  bool writing_ = false;
  bool kicked_ = false;  // queued at the hub
  bool finishing_ = false;
  bool finished_ = false;
  // How a finish from OnWriteDone ends the stream (End's reason, or a cancel).
  grpc::Status end_{grpc::StatusCode::UNAVAILABLE, "watch stream broken"};
  int refs_ = 1;  // gRPC's, until OnDone
};

void WatchHub::Loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !ready_.empty(); });
    if (ready_.empty()) return;
    WatchReactor* reactor = ready_.front();
    ready_.pop_front();
    lock.unlock();
    reactor->Kick();
    lock.lock();
  }
}

ControllerService::ControllerService(ClusterState* state, prometheus::Registry* registry,
                                     const Authorizer* authz)
    : state_(state), authz_(authz != nullptr ? authz : &kAllowAll) {
  if (registry == nullptr) {
    own_registry_ = std::make_unique<prometheus::Registry>();
    registry = own_registry_.get();
  }
  rpcs_ = &common::metrics::CounterFamily(*registry, "tributary_controller_rpcs_total",
                                          "Controller RPCs handled, by method and status code.");
  auto& duration = common::metrics::HistogramFamily(
      *registry, "tributary_controller_rpc_duration_seconds", "Controller RPC handler time.");
  for (int m = 0; m < kNumMethods; ++m) {
    rpcs_->Add({{"method", kMethodNames[m]}, {"code", "OK"}});
    duration_[m] =
        &duration.Add({{"method", kMethodNames[m]}},
                      prometheus::Histogram::BucketBoundaries{
                          0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1});
  }
  planning_thread_ = std::thread([this] { PlanningLoop(); });
  hub_ = std::make_unique<WatchHub>();
}

ControllerService::~ControllerService() {
  {
    std::lock_guard lock(planning_mu_);
    planning_stop_ = true;
  }
  planning_cv_.notify_all();
  planning_thread_.join();
}

void ControllerService::PlanningLoop() {
  common::SetCurrentThreadName("trib-planner");
  std::unique_lock lock(planning_mu_);
  while (true) {
    planning_cv_.wait(lock, [this] { return planning_stop_ || !planning_queue_.empty(); });
    if (planning_queue_.empty()) return;  // stopping, nothing left
    std::function<void()> task = std::move(planning_queue_.front());
    planning_queue_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

void ControllerService::Record(Method method, std::chrono::steady_clock::time_point start,
                               const absl::Status& s) {
  duration_[method]->Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  rpcs_->Add({{"method", kMethodNames[method]}, {"code", absl::StatusCodeToString(s.code())}})
      .Increment();
}

grpc::ServerUnaryReactor* ControllerService::Finish(Method method,
                                                    std::chrono::steady_clock::time_point start,
                                                    grpc::CallbackServerContext* ctx,
                                                    const absl::Status& s) {
  Record(method, start, s);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(common::ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* ControllerService::RegisterNode(
    grpc::CallbackServerContext* ctx, const tributary::v1::RegisterNodeRequest* req,
    tributary::v1::RegisterNodeResponse* resp) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status denied = authz_->RegisterNode(*ctx, *req); !denied.ok())
    return Finish(kRegisterNode, start, ctx, denied);
  return Finish(kRegisterNode, start, ctx, state_->RegisterNode(*req, resp));
}

grpc::ServerUnaryReactor* ControllerService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                       const tributary::v1::HeartbeatRequest* req,
                                                       tributary::v1::HeartbeatResponse* resp) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status denied = authz_->ActForNode(*ctx, req->node_id(), "Heartbeat"); !denied.ok())
    return Finish(kHeartbeat, start, ctx, denied);
  return Finish(kHeartbeat, start, ctx, state_->Heartbeat(*req, resp));
}

grpc::ServerUnaryReactor* ControllerService::GetAssignments(
    grpc::CallbackServerContext* ctx, const tributary::v1::GetAssignmentsRequest* req,
    tributary::v1::GetAssignmentsResponse* resp) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status denied = authz_->ActForNode(*ctx, req->node_id(), "GetAssignments");
      !denied.ok())
    return Finish(kGetAssignments, start, ctx, denied);
  return Finish(kGetAssignments, start, ctx, state_->GetAssignments(*req, resp));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ControllerService::WatchAssignments(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  const auto start = std::chrono::steady_clock::now();
  tributary::v1::WatchAssignmentsRequest req;
  absl::Status s;
  if (!grpc::SerializationTraits<tributary::v1::WatchAssignmentsRequest>::Deserialize(
           const_cast<grpc::ByteBuffer*>(request), &req)
           .ok()) {
    s = absl::InvalidArgumentError(
        "WatchAssignments: the request is not a WatchAssignmentsRequest");
  }
  // Only the node itself may follow its assignments (they carry its jobs' data-plane secrets).
  if (s.ok()) s = authz_->ActForNode(*ctx, req.node_id(), "WatchAssignments");
  auto* reactor = new WatchReactor(state_, hub_.get(), req.node_id());
  if (s.ok()) {
    s = reactor->Begin(req);
  } else {
    reactor->Finish(common::ToGrpcStatus(s));
  }
  Record(kWatchAssignments, start, s);
  return reactor;
}

grpc::ServerUnaryReactor* ControllerService::ListNodes(grpc::CallbackServerContext* ctx,
                                                       const tributary::v1::ListNodesRequest* req,
                                                       tributary::v1::ListNodesResponse* resp) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status denied = authz_->Read(*ctx, "ListNodes"); !denied.ok())
    return Finish(kListNodes, start, ctx, denied);
  return Finish(kListNodes, start, ctx, state_->ListNodes(*req, resp));
}

grpc::ServerUnaryReactor* ControllerService::CreateJob(grpc::CallbackServerContext* ctx,
                                                       const tributary::v1::CreateJobRequest* req,
                                                       tributary::v1::Job* resp) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status denied = authz_->Admin(*ctx, "CreateJob"); !denied.ok())
    return Finish(kCreateJob, start, ctx, denied);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  {
    std::lock_guard lock(planning_mu_);
    planning_queue_.push_back([this, start, reactor, req, resp] {
      const absl::Status s = state_->CreateJob(*req, resp);
      Record(kCreateJob, start, s);
      reactor->Finish(common::ToGrpcStatus(s));
    });
  }
  planning_cv_.notify_one();
  return reactor;
}

grpc::ServerUnaryReactor* ControllerService::GetJob(grpc::CallbackServerContext* ctx,
                                                    const tributary::v1::GetJobRequest* req,
                                                    tributary::v1::Job* resp) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status denied = authz_->Read(*ctx, "GetJob"); !denied.ok())
    return Finish(kGetJob, start, ctx, denied);
  return Finish(kGetJob, start, ctx, state_->GetJob(*req, resp));
}

grpc::ServerUnaryReactor* ControllerService::GetJobStats(
    grpc::CallbackServerContext* ctx, const tributary::v1::GetJobStatsRequest* req,
    tributary::v1::JobStats* resp) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status denied = authz_->Read(*ctx, "GetJobStats"); !denied.ok())
    return Finish(kGetJobStats, start, ctx, denied);
  return Finish(kGetJobStats, start, ctx, state_->GetJobStats(*req, resp));
}

grpc::ServerUnaryReactor* ControllerService::ListJobs(grpc::CallbackServerContext* ctx,
                                                      const tributary::v1::ListJobsRequest* req,
                                                      tributary::v1::ListJobsResponse* resp) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status denied = authz_->Read(*ctx, "ListJobs"); !denied.ok())
    return Finish(kListJobs, start, ctx, denied);
  return Finish(kListJobs, start, ctx, state_->ListJobs(*req, resp));
}

grpc::ServerUnaryReactor* ControllerService::DeleteJob(grpc::CallbackServerContext* ctx,
                                                       const tributary::v1::DeleteJobRequest* req,
                                                       tributary::v1::DeleteJobResponse*) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status denied = authz_->Admin(*ctx, "DeleteJob"); !denied.ok())
    return Finish(kDeleteJob, start, ctx, denied);
  return Finish(kDeleteJob, start, ctx, state_->DeleteJob(req->job_id()));
}

}  // namespace tributary::controller
