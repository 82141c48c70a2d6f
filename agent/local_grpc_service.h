// The `tributary.v1.Agent` gRPC service for training processes: a thin adapter over
// LocalService that finishes unary calls with the service's absl::Status as a grpc::Status
// (same code and message), parks Submit/Wait reactors as LocalService replies, and holds each
// session's KeepAlive stream open until the session ends (its response headers, sent once the
// session is watched, tell the process so; its cancellation ends the session).
#pragma once

#include "agent/control_ring_host.h"
#include "agent/local_service.h"
#include "tributary/v1/agent.grpc.pb.h"

namespace tributary::agent {

// Threading: handlers run on gRPC threads and never block; parked calls are finished by the
// data plane's completion thread or the agent's tick thread. Holds no state of its own beyond
// the KeepAlive reactors gRPC owns.
class LocalGrpcService final : public tributary::v1::Agent::CallbackService {
 public:
  // `service` (and `rings`, unless null) must outlive the gRPC server this is registered
  // with. Without `rings` AttachControlRing answers UNIMPLEMENTED, as an agent without the fast
  // path does, and clients keep to Submit/Wait.
  explicit LocalGrpcService(LocalService* service, ControlRings* rings = nullptr)
      : service_(service), rings_(rings) {}

  grpc::ServerUnaryReactor* JoinJob(grpc::CallbackServerContext* ctx,
                                    const tributary::v1::JoinJobRequest* req,
                                    tributary::v1::JoinJobResponse* resp) override;
  grpc::ServerWriteReactor<tributary::v1::KeepAliveEvent>* KeepAlive(
      grpc::CallbackServerContext* ctx, const tributary::v1::KeepAliveRequest* req) override;
  grpc::ServerUnaryReactor* LeaveJob(grpc::CallbackServerContext* ctx,
                                     const tributary::v1::LeaveJobRequest* req,
                                     tributary::v1::LeaveJobResponse* resp) override;
  grpc::ServerUnaryReactor* UnregisterBuffer(
      grpc::CallbackServerContext* ctx, const tributary::v1::UnregisterBufferRequest* req,
      tributary::v1::UnregisterBufferResponse* resp) override;
  grpc::ServerUnaryReactor* RegisterCudaBuffer(
      grpc::CallbackServerContext* ctx, const tributary::v1::RegisterCudaBufferRequest* req,
      tributary::v1::RegisterCudaBufferResponse* resp) override;
  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* ctx,
                                   const tributary::v1::SubmitRequest* req,
                                   tributary::v1::SubmitResponse* resp) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx,
                                 const tributary::v1::WaitRequest* req,
                                 tributary::v1::WaitResponse* resp) override;
  grpc::ServerUnaryReactor* Resync(grpc::CallbackServerContext* ctx,
                                   const tributary::v1::ResyncRequest* req,
                                   tributary::v1::ResyncResponse* resp) override;
  grpc::ServerUnaryReactor* AttachControlRing(
      grpc::CallbackServerContext* ctx, const tributary::v1::AttachControlRingRequest* req,
      tributary::v1::AttachControlRingResponse* resp) override;

 private:
  class KeepAliveReactor;

  LocalService* service_;
  ControlRings* rings_;
};

}  // namespace tributary::agent
