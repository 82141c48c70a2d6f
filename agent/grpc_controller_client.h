// The agent's link to the controller over gRPC: registration, heartbeats and plan fetches.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/controller_client.h"
#include "grpcpp/grpcpp.h"
#include "tributary/v1/controller.grpc.pb.h"

namespace tributary::agent {

// Delays between attempts to reach the controller: `initial`, multiplied by `multiplier` after
// every failure up to `max`, each delay spread uniformly over ±`jitter` of it so that the agents
// of a cluster do not all knock at once when a controller comes back. Reset after a success.
// Not thread-safe (the controller client's thread owns it).
class ReconnectBackoff {
 public:
  struct Options {
    std::chrono::milliseconds initial{100};
    std::chrono::milliseconds max{4000};  // with +20% jitter, at most 4.8 s between attempts
    double multiplier = 2;
    double jitter = 0.2;  // fraction of the delay, in [0, 1)
  };
  // `uniform01` returns values in [0, 1) (tests inject a fixed sequence); null: a PRNG seeded
  // from std::random_device.
  explicit ReconnectBackoff(Options options, std::function<double()> uniform01 = nullptr);

  // The delay before the next attempt; the base delay then grows.
  std::chrono::milliseconds Next();
  // After a success: the next failure waits `initial` again.
  void Reset() { base_ = options_.initial; }
  std::chrono::milliseconds base() const { return base_; }

 private:
  Options options_;
  std::function<double()> uniform01_;
  std::chrono::milliseconds base_;
};

// Runs one thread that (re-)registers the node and heartbeats at the interval the controller asks
// for (it grows with the cluster), and one that holds a WatchAssignments stream: the controller
// pushes the node's plans whenever they change, resumed from the version held after a broken
// stream (reopened with ReconnectBackoff). The heartbeat thread fetches (GetAssignments) only when
// there is no watch (an older controller answers UNIMPLEMENTED: polling from then on), when the
// heartbeat's version stays ahead of what the watch delivered for two heartbeats, or on
// RequestRefresh. It survives controller restarts: a NOT_FOUND heartbeat or a lost connection
// leads to registering again, retried with ReconnectBackoff. Plans are only ever replaced by plans
// the controller sent, each version delivered once and in order, so an unreachable controller
// never makes the agent drop a job. Every unary RPC has a deadline; the watch one of minutes.
class GrpcControllerClient final : public ControllerClient {
 public:
  struct Options {
    std::string controller_address;
    // How to dial it (common/rpc/tls.h: MakeChannelCredentials); null: plaintext.
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    // Channel arguments the credentials need (ApplyTlsChannelArgs: the TLS server name).
    grpc::ChannelArguments channel_args;
    std::string node_id;
    tributary::v1::NodeInventory inventory;
    // RegisterNodeRequest.agent_instance: random per agent process; 0 = drawn by the client.
    uint64_t agent_instance = 0;
    std::chrono::milliseconds rpc_timeout{2000};
    ReconnectBackoff::Options backoff;
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
  void WatchLoop();
  // Options::agent_instance, or a random non-zero value.
  uint64_t agent_instance_ = 0;
  // Hands `plans` at `version` to on_plans_ unless that version (or a newer one) was delivered.
  void Deliver(uint64_t version, std::vector<tributary::v1::JobPlan> plans);
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
  bool refreshed_ = false;    // the last WaitFor ended for RequestRefresh (Run's thread)
  uint64_t incarnation_ = 0;  // guarded by mu_: the watch opens streams for it
  grpc::ClientContext* watch_ctx_ = nullptr;  // guarded by mu_: cancelled by Stop
  std::mutex deliver_mu_;
  uint64_t held_version_ = 0;          // guarded by deliver_mu_: the assignments version delivered
  std::atomic<bool> watching_{false};  // a watch stream is open
  std::atomic<bool> watch_supported_{true};
  std::thread watch_thread_;
  std::atomic<bool> registered_{false};
  std::atomic<uint64_t> heartbeats_sent_{0}, heartbeats_failed_{0};
  std::thread thread_;
};

}  // namespace tributary::agent
