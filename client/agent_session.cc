#include "client/agent_session.h"

#include <utility>

#include "client/buffer_channel.h"
#include "common/rpc/grpc_status.h"

namespace tributary::client::internal {

AgentSession::AgentSession(std::shared_ptr<grpc::Channel> channel,
                           std::unique_ptr<v1::Agent::Stub> stub, std::string agent_address,
                           std::string session_id, std::chrono::milliseconds rpc_timeout,
                           std::shared_ptr<ControlRing> ring,
                           std::unique_ptr<BufferChannel> buffers)
    : channel_(std::move(channel)),
      stub_(std::move(stub)),
      agent_address_(std::move(agent_address)),
      session_id_(std::move(session_id)),
      rpc_timeout_(rpc_timeout),
      ring_(std::move(ring)),
      buffers_(std::move(buffers)) {}

AgentSession::~AgentSession() = default;

void AgentSession::MarkEnded(absl::Status why) {
  std::lock_guard lock(ended_mu_);
  if (ended_flag_.load(std::memory_order_relaxed)) return;
  ended_ = why.ok() ? absl::UnavailableError("the session with the agent ended") : std::move(why);
  ended_flag_.store(true, std::memory_order_release);
}

std::optional<absl::Status> AgentSession::ended() const {
  if (!ended_flag_.load(std::memory_order_acquire)) return std::nullopt;
  std::lock_guard lock(ended_mu_);
  return ended_;
}

absl::Status AgentSession::ProbeAgent() const {
  v1::WaitRequest request;
  request.set_session_id(session_id_);
  request.set_handle(0);
  request.set_timeout_ms(0);
  v1::WaitResponse response;
  std::unique_ptr<grpc::ClientContext> context = NewContext();
  const grpc::Status status = stub_->Wait(context.get(), request, &response);
  if (context->GetServerTrailingMetadata().contains(common::kAgentAnswerTrailer)) {
    return absl::OkStatus();
  }
  return status.ok() ? absl::OkStatus() : common::FromGrpcStatus(status);
}

std::unique_ptr<grpc::ClientContext> AgentSession::NewContext(
    std::chrono::milliseconds timeout) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + timeout);
  return context;
}

}  // namespace tributary::client::internal
