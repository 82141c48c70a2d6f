#include "controller/controller_service.h"

#include "common/metrics/metrics.h"
#include "common/rpc/grpc_status.h"

namespace tributary::controller {
namespace {

constexpr const char* kMethodNames[] = {"RegisterNode", "Heartbeat", "GetAssignments", "ListNodes",
                                        "CreateJob",    "GetJob",    "ListJobs",       "DeleteJob"};

const Authorizer kAllowAll{AuthzOptions{}};

}  // namespace

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
}

grpc::ServerUnaryReactor* ControllerService::Finish(Method method,
                                                    std::chrono::steady_clock::time_point start,
                                                    grpc::CallbackServerContext* ctx,
                                                    const absl::Status& s) {
  duration_[method]->Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  rpcs_->Add({{"method", kMethodNames[method]}, {"code", absl::StatusCodeToString(s.code())}})
      .Increment();
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

grpc::ServerUnaryReactor* ControllerService::ListNodes(grpc::CallbackServerContext* ctx,
                                                       const tributary::v1::ListNodesRequest*,
                                                       tributary::v1::ListNodesResponse* resp) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status denied = authz_->Read(*ctx, "ListNodes"); !denied.ok())
    return Finish(kListNodes, start, ctx, denied);
  state_->ListNodes(resp);
  return Finish(kListNodes, start, ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* ControllerService::CreateJob(grpc::CallbackServerContext* ctx,
                                                       const tributary::v1::CreateJobRequest* req,
                                                       tributary::v1::Job* resp) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status denied = authz_->Admin(*ctx, "CreateJob"); !denied.ok())
    return Finish(kCreateJob, start, ctx, denied);
  return Finish(kCreateJob, start, ctx, state_->CreateJob(*req, resp));
}

grpc::ServerUnaryReactor* ControllerService::GetJob(grpc::CallbackServerContext* ctx,
                                                    const tributary::v1::GetJobRequest* req,
                                                    tributary::v1::Job* resp) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status denied = authz_->Read(*ctx, "GetJob"); !denied.ok())
    return Finish(kGetJob, start, ctx, denied);
  return Finish(kGetJob, start, ctx, state_->GetJob(req->job_id(), resp));
}

grpc::ServerUnaryReactor* ControllerService::ListJobs(grpc::CallbackServerContext* ctx,
                                                      const tributary::v1::ListJobsRequest*,
                                                      tributary::v1::ListJobsResponse* resp) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status denied = authz_->Read(*ctx, "ListJobs"); !denied.ok())
    return Finish(kListJobs, start, ctx, denied);
  state_->ListJobs(resp);
  return Finish(kListJobs, start, ctx, absl::OkStatus());
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
