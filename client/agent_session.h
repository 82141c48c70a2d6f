// The connection to the local agent that a Client, its SharedBuffers and its Handles share.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "client/control_ring.h"
#include "grpcpp/grpcpp.h"
#include "tributary/v1/agent.grpc.pb.h"

namespace tributary::client::internal {

class BufferChannel;

// One joined session with the local agent: the channel, the stub, the session id and, when the
// agent serves one, the session's control ring (the fast path).
//
// Ownership: shared (std::shared_ptr) by the Client and by every SharedBuffer and Handle it
// hands out, so that those may outlive the Client; after the Client leaves, they see
// active() == false and skip or fail their RPCs instead of using a dead session.
// Threading: every method is thread-safe (the stub is, the rest is immutable or atomic).
class AgentSession {
 public:
  // `rpc_timeout` is the deadline of every unary RPC that is not a Wait. `ring` is the attached
  // control ring, or null (the agent has none: Submit/Wait only).
  AgentSession(std::shared_ptr<grpc::Channel> channel, std::unique_ptr<v1::Agent::Stub> stub,
               std::string agent_address, std::string session_id,
               std::chrono::milliseconds rpc_timeout, std::shared_ptr<ControlRing> ring = nullptr,
               std::unique_ptr<BufferChannel> buffers = nullptr);
  ~AgentSession();

  v1::Agent::Stub& stub() const { return *stub_; }
  const std::string& agent_address() const { return agent_address_; }
  const std::string& session_id() const { return session_id_; }
  std::chrono::milliseconds rpc_timeout() const { return rpc_timeout_; }
  // ClientOptions::max_unanswered_wait; set once, before the session is shared.
  std::chrono::milliseconds max_unanswered_wait() const { return max_unanswered_wait_; }
  // Capped at 100 years: milliseconds::max() ("never") overflowed in the clock's nanoseconds.
  void set_max_unanswered_wait(std::chrono::milliseconds limit) {
    max_unanswered_wait_ = std::min(limit, std::chrono::milliseconds(std::chrono::hours(876000)));
  }
  // Null when the session has no control ring.
  ControlRing* ring() const { return ring_.get(); }
  // The agent's buffer socket; null when it could not be reached at join (then
  // Client::AllocateBuffer says why).
  BufferChannel* buffers() const { return buffers_.get(); }

  // A fresh context whose deadline is `timeout` from now.
  std::unique_ptr<grpc::ClientContext> NewContext(std::chrono::milliseconds timeout) const;
  // A fresh context with the default deadline (rpc_timeout).
  std::unique_ptr<grpc::ClientContext> NewContext() const { return NewContext(rpc_timeout_); }

  // Asks the agent whether it still answers: a Wait RPC for handle 0, which is never a handle
  // (the agent answers NOT_FOUND), with the default deadline. OK when the agent answered (its
  // answer trailer came back, whatever the status), else the RPC's own failure. For waits on
  // the control ring, where a frozen agent (its connection and the KeepAlive stream still open)
  // otherwise shows only as results that do not come.
  absl::Status ProbeAgent() const;

  // False once the Client has left the job (or is leaving it).
  bool active() const { return active_.load(std::memory_order_acquire); }
  void MarkInactive() { active_.store(false, std::memory_order_release); }

  // The KeepAlive stream ended (the agent ended the session, shut down or died): no result can
  // come any more. `why` says so; ended() returns it from then on (nullopt before).
  void MarkEnded(absl::Status why);
  std::optional<absl::Status> ended() const;

 private:
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::Agent::Stub> stub_;
  const std::string agent_address_;
  const std::string session_id_;
  const std::chrono::milliseconds rpc_timeout_;
  std::chrono::milliseconds max_unanswered_wait_{30000};
  const std::shared_ptr<ControlRing> ring_;
  const std::unique_ptr<BufferChannel> buffers_;
  std::atomic<bool> active_{true};
  std::atomic<bool> ended_flag_{false};
  mutable std::mutex ended_mu_;
  absl::Status ended_;  // Guarded by ended_mu_; set once, with ended_flag_.
};

}  // namespace tributary::client::internal
