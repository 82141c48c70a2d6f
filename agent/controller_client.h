// The agent's link to the controller as the agent sees it: a loop that registers the node,
// heartbeats with the node's load and hands over the plans involving this node whenever they
// change. `GrpcControllerClient` (grpc_controller_client.h) is the production implementation,
// `FakeControllerClient` (fake_controller_client.h) the one tests drive.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tributary/v1/controller.pb.h"

namespace tributary::agent {

// Implementations are thread-safe.
class ControllerClient {
 public:
  // Every plan involving this node, each time the set changes.
  using PlansCallback = std::function<void(const std::vector<tributary::v1::JobPlan>&)>;
  // The node's load for a heartbeat, over the `elapsed_seconds` since the previous one.
  using LoadFn = std::function<tributary::v1::NodeLoad(double elapsed_seconds)>;

  virtual ~ControllerClient() = default;

  // Starts the loop. `on_plans` and `load` run on the loop's thread; both must stay callable
  // until Stop returns.
  virtual void Start(PlansCallback on_plans, LoadFn load) = 0;
  // Ends the loop and waits for it. Idempotent.
  virtual void Stop() = 0;
  // Heartbeats (and so fetches changed plans) now instead of at the next interval.
  virtual void RequestRefresh() = 0;
  virtual bool registered() const = 0;
  virtual uint64_t heartbeats_sent() const = 0;
  virtual uint64_t heartbeats_failed() const = 0;
};

}  // namespace tributary::agent
