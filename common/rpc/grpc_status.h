// absl::Status <-> grpc::Status, and server plumbing every Tributary gRPC server shares.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"

namespace tributary::common {

// Same code, same message.
grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

// Trailing metadata key the agent sets (to "1") on every Submit and Wait answer it gives,
// errors included: a client tells the operation's result apart from a failure of the RPC itself
// (no answer from the agent: transport, deadline), which it may retry.
inline constexpr char kAgentAnswerTrailer[] = "tributary-agent-answer";

// Turns on grpc.health.v1 and server reflection for every server built afterwards.
void EnableHealthAndReflection();

// Turns off Abseil's mutex deadlock detection for this process. Debian builds Abseil without
// NDEBUG, so every absl::Mutex that gRPC locks records its lock order in a global graph: about a
// seventh of a busy controller's CPU (bench/README.md, "Controller scale"). Call it first thing
// in main, before any gRPC object exists.
void DisableMutexDeadlockDetection();

// Marks the default health service SERVING (overall and for `service_name`).
void SetServing(grpc::Server* server, const std::string& service_name);

}  // namespace tributary::common
