#include "controller/controller_service.h"

#include "common/rpc/grpc_status.h"

namespace tributary::controller {
namespace {

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(common::ToGrpcStatus(s));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* ControllerService::RegisterNode(
    grpc::CallbackServerContext* ctx, const tributary::v1::RegisterNodeRequest* req,
    tributary::v1::RegisterNodeResponse* resp) {
  return Finish(ctx, state_->RegisterNode(*req, resp));
}

grpc::ServerUnaryReactor* ControllerService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                       const tributary::v1::HeartbeatRequest* req,
                                                       tributary::v1::HeartbeatResponse* resp) {
  return Finish(ctx, state_->Heartbeat(*req, resp));
}

grpc::ServerUnaryReactor* ControllerService::GetAssignments(
    grpc::CallbackServerContext* ctx, const tributary::v1::GetAssignmentsRequest* req,
    tributary::v1::GetAssignmentsResponse* resp) {
  return Finish(ctx, state_->GetAssignments(*req, resp));
}

grpc::ServerUnaryReactor* ControllerService::ListNodes(grpc::CallbackServerContext* ctx,
                                                       const tributary::v1::ListNodesRequest*,
                                                       tributary::v1::ListNodesResponse* resp) {
  state_->ListNodes(resp);
  return Finish(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* ControllerService::CreateJob(grpc::CallbackServerContext* ctx,
                                                       const tributary::v1::CreateJobRequest* req,
                                                       tributary::v1::Job* resp) {
  return Finish(ctx, state_->CreateJob(*req, resp));
}

grpc::ServerUnaryReactor* ControllerService::GetJob(grpc::CallbackServerContext* ctx,
                                                    const tributary::v1::GetJobRequest* req,
                                                    tributary::v1::Job* resp) {
  return Finish(ctx, state_->GetJob(req->job_id(), resp));
}

grpc::ServerUnaryReactor* ControllerService::ListJobs(grpc::CallbackServerContext* ctx,
                                                      const tributary::v1::ListJobsRequest*,
                                                      tributary::v1::ListJobsResponse* resp) {
  state_->ListJobs(resp);
  return Finish(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* ControllerService::DeleteJob(grpc::CallbackServerContext* ctx,
                                                       const tributary::v1::DeleteJobRequest* req,
                                                       tributary::v1::DeleteJobResponse*) {
  return Finish(ctx, state_->DeleteJob(req->job_id()));
}

}  // namespace tributary::controller
