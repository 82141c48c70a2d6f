#include "agent/local_grpc_service.h"

#include <memory>
#include <mutex>
#include <string>

#include "common/rpc/grpc_status.h"
#include "common/tsan_annotations.h"

namespace tributary::agent {
namespace {

// Every answer of this service carries the answer trailer: the client tells an error the agent
// gave (an operation's result) from one of the RPC itself (common/rpc/grpc_status.h).
grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  ctx->AddTrailingMetadata(common::kAgentAnswerTrailer, "1");
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(common::ToGrpcStatus(s));
  return reactor;
}

// Finishes a parked call when LocalService replies, with `done` in the response.
template <typename Response>
LocalService::Reply ParkedReply(grpc::CallbackServerContext* ctx, grpc::ServerUnaryReactor* reactor,
                                Response* resp) {
  return [ctx, reactor, resp](const absl::Status& status, bool done) {
    resp->set_done(done);
    ctx->AddTrailingMetadata(common::kAgentAnswerTrailer, "1");
    reactor->Finish(common::ToGrpcStatus(status));
  };
}

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
  // Sends the response headers: the client sees the session is watched from now on.
  void SendHeaders() {
    std::lock_guard lock(mu);
    if (reactor == nullptr || finished) return;
    reactor->StartSendInitialMetadata();
  }
};

}  // namespace

class LocalGrpcService::KeepAliveReactor final
    : public grpc::ServerWriteReactor<tributary::v1::KeepAliveEvent> {
 public:
  KeepAliveReactor(LocalService* service, std::string session_id,
                   std::shared_ptr<KeepAliveLink> link)
      : service_(service), session_id_(std::move(session_id)), link_(std::move(link)) {
    std::lock_guard lock(link_->mu);
    link_->reactor = this;
  }
  // gRPC runs the reactions one after another, after KeepAlive returned the reactor, and OnDone
  // last; it synchronises them where TSan cannot see (common/tsan_annotations.h).
  void OnCancel() override {
    TRIBUTARY_TSAN_ACQUIRE(this);
    service_->EndSession(session_id_, "its process disconnected");
    link_->End(grpc::Status::CANCELLED);
    TRIBUTARY_TSAN_RELEASE(this);
  }
  void OnDone() override {
    TRIBUTARY_TSAN_ACQUIRE(this);
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

grpc::ServerUnaryReactor* LocalGrpcService::JoinJob(grpc::CallbackServerContext* ctx,
                                                    const tributary::v1::JoinJobRequest* req,
                                                    tributary::v1::JoinJobResponse* resp) {
  return Finish(ctx, service_->Join(*req, resp));
}

grpc::ServerWriteReactor<tributary::v1::KeepAliveEvent>* LocalGrpcService::KeepAlive(
    grpc::CallbackServerContext*, const tributary::v1::KeepAliveRequest* req) {
  auto link = std::make_shared<KeepAliveLink>();
  auto* reactor = new KeepAliveReactor(service_, req->session_id(), link);
  // The stream ends (OK) when the session does; a session that is gone ends it at once.
  const absl::Status watched =
      service_->WatchSession(req->session_id(), [link] { link->End(grpc::Status::OK); });
  if (watched.ok()) {
    link->SendHeaders();
  } else {
    link->End(common::ToGrpcStatus(watched));
  }
  TRIBUTARY_TSAN_RELEASE(reactor);  // handed to gRPC: its reactions run on other threads
  return reactor;
}

grpc::ServerUnaryReactor* LocalGrpcService::LeaveJob(grpc::CallbackServerContext* ctx,
                                                     const tributary::v1::LeaveJobRequest* req,
                                                     tributary::v1::LeaveJobResponse*) {
  service_->EndSession(req->session_id(), "it left the job");
  return Finish(ctx, absl::OkStatus());  // idempotent
}

grpc::ServerUnaryReactor* LocalGrpcService::UnregisterBuffer(
    grpc::CallbackServerContext* ctx, const tributary::v1::UnregisterBufferRequest* req,
    tributary::v1::UnregisterBufferResponse*) {
  return Finish(ctx, service_->UnregisterBuffer(*req));
}

grpc::ServerUnaryReactor* LocalGrpcService::RegisterCudaBuffer(
    grpc::CallbackServerContext* ctx, const tributary::v1::RegisterCudaBufferRequest* req,
    tributary::v1::RegisterCudaBufferResponse* resp) {
  // Opens the IPC handle and allocates the mirror: short, like a buffer registration.
  absl::StatusOr<uint64_t> id = service_->RegisterCudaBuffer(*req);
  if (id.ok()) resp->set_buffer_id(*id);
  return Finish(ctx, id.status());
}

grpc::ServerUnaryReactor* LocalGrpcService::Submit(grpc::CallbackServerContext* ctx,
                                                   const tributary::v1::SubmitRequest* req,
                                                   tributary::v1::SubmitResponse* resp) {
  // What the session's control ring still holds was submitted before this (ControlRings).
  if (rings_ != nullptr) rings_->DrainSubmissions(req->session_id());
  const absl::Status submitted = service_->Submit(*req, resp);
  if (!submitted.ok() || req->wait_timeout_ms() == 0) return Finish(ctx, submitted);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  service_->Await(req->session_id(), resp->handle(), req->wait_timeout_ms(),
                  ParkedReply(ctx, reactor, resp), [resp](uint64_t v) { resp->set_version(v); });
  return reactor;
}

grpc::ServerUnaryReactor* LocalGrpcService::Wait(grpc::CallbackServerContext* ctx,
                                                 const tributary::v1::WaitRequest* req,
                                                 tributary::v1::WaitResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  service_->Await(req->session_id(), req->handle(), req->timeout_ms(),
                  ParkedReply(ctx, reactor, resp), [resp](uint64_t v) { resp->set_version(v); });
  return reactor;
}

grpc::ServerUnaryReactor* LocalGrpcService::Resync(grpc::CallbackServerContext* ctx,
                                                   const tributary::v1::ResyncRequest* req,
                                                   tributary::v1::ResyncResponse* resp) {
  return Finish(ctx, service_->Resync(*req, resp));
}

grpc::ServerUnaryReactor* LocalGrpcService::AttachControlRing(
    grpc::CallbackServerContext* ctx, const tributary::v1::AttachControlRingRequest* req,
    tributary::v1::AttachControlRingResponse* resp) {
  if (rings_ == nullptr) {
    return Finish(ctx, absl::UnimplementedError("this agent serves no control rings"));
  }
  // Maps the object and starts the ring's thread: short, like a buffer registration.
  return Finish(ctx, rings_->Attach(*req, resp));
}

}  // namespace tributary::agent
