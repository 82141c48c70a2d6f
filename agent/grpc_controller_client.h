// The agent's link to the controller over gRPC: registration, heartbeats and plan fetches.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/controller_client.h"
#include "tributary/v1/controller.grpc.pb.h"

namespace tributary::agent {

// Runs one thread that (re-)registers the node, heartbeats at the interval the controller asks
// for, and fetches assignments whenever the controller's assignments version moves. It survives
// controller restarts: a NOT_FOUND heartbeat or a lost connection leads to registering again.
// Every RPC has a deadline.
class GrpcControllerClient final : public ControllerClient {
 public:
  struct Options {
    std::string controller_address;
    std::string node_id;
    tributary::v1::NodeInventory inventory;
    std::chrono::milliseconds rpc_timeout{2000};
  };
  explicit GrpcControllerClient(Options options);
  ~GrpcControllerClient() override;

  // `on_plans` gets every plan involving this node each time the set changes (on this class's
  // thread). `load` samples the node's load for heartbeats.
  void Start(PlansCallback on_plans, LoadFn load) override;
  void Stop() override;
  void RequestRefresh() override;
  bool registered() const override { return registered_.load(); }
  uint64_t heartbeats_sent() const override { return heartbeats_sent_.load(); }
  uint64_t heartbeats_failed() const override { return heartbeats_failed_.load(); }

 private:
  void Run();
  bool WaitFor(std::chrono::milliseconds d);  // false when stopping
  std::unique_ptr<grpc::ClientContext> Context() const;

  Options options_;
  PlansCallback on_plans_;
  LoadFn load_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tributary::v1::Controller::Stub> stub_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool refresh_ = false;
  std::atomic<bool> registered_{false};
  std::atomic<uint64_t> heartbeats_sent_{0}, heartbeats_failed_{0};
  std::thread thread_;
};

}  // namespace tributary::agent
