#include "agent/grpc_controller_client.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>

#include "agent/load_delta.h"
#include "common/logging.h"
#include "common/rpc/tls.h"
#include "common/thread_name.h"
#include "grpcpp/grpcpp.h"
#include "tributary/v1/assigned_plan.h"

namespace tributary::agent {
namespace {

constexpr auto Log = common::ComponentLog<"agent">;

}  // namespace

ReconnectBackoff::ReconnectBackoff(Options options, std::function<double()> uniform01)
    : options_(options), uniform01_(std::move(uniform01)), base_(options.initial) {
  if (!uniform01_) {
    auto rng = std::make_shared<std::mt19937_64>(std::random_device{}());
    uniform01_ = [rng] { return std::uniform_real_distribution<double>(0, 1)(*rng); };
  }
}

std::chrono::milliseconds ReconnectBackoff::Next() {
  const double u = std::clamp(uniform01_(), 0.0, 1.0);
  const double factor = 1 + options_.jitter * (2 * u - 1);  // 1 ± jitter
  const auto delay = std::chrono::milliseconds(
      std::max<int64_t>(1, std::llround(static_cast<double>(base_.count()) * factor)));
  const auto grown = std::chrono::milliseconds(
      static_cast<int64_t>(static_cast<double>(base_.count()) * options_.multiplier));
  base_ = std::min(std::max(grown, base_), options_.max);
  return delay;
}

GrpcControllerClient::GrpcControllerClient(Options options) : options_(std::move(options)) {
  agent_instance_ = options_.agent_instance;
  std::random_device random;
  while (agent_instance_ == 0) agent_instance_ = (uint64_t{random()} << 32) | random();
  grpc::ChannelArguments args = options_.channel_args;
  // The channel's own reconnection stays short: the pace of attempts is ReconnectBackoff's.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  // No BDP pings: they arm a timer per connection (gRPC's timer table costs the controller CPU
  // per connection, controller/README.md "Scale"), and the plans it carries are small.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // A node's part of a plan is small, but a node in many jobs of thousands of workers could
  // pass gRPC's default 4 MiB.
  args.SetMaxReceiveMessageSize(common::kMaxReplyBytes);
  channel_ = grpc::CreateCustomChannel(
      options_.controller_address,
      options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials(), args);
  stub_ = tributary::v1::Controller::NewStub(channel_);
}

GrpcControllerClient::~GrpcControllerClient() { Stop(); }

void GrpcControllerClient::Start(PlansCallback on_plans, LoadFn load) {
  on_plans_ = std::move(on_plans);
  load_ = std::move(load);
  thread_ = std::thread([this] { Run(); });
  watch_thread_ = std::thread([this] { WatchLoop(); });
}

void GrpcControllerClient::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    if (watch_ctx_ != nullptr) watch_ctx_->TryCancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (watch_thread_.joinable()) watch_thread_.join();
}

void GrpcControllerClient::Deliver(uint64_t version, std::vector<tributary::v1::JobPlan> plans) {
  std::lock_guard lock(deliver_mu_);
  if (version <= held_version_) return;  // the watch and a fetch both brought it
  for (tributary::v1::JobPlan& plan : plans) {
    if (absl::Status s = tributary::v1::ExpandAssignedPlan(plan); !s.ok()) {
      // Not held: the next heartbeat sees the version ahead and fetches it again.
      Log()->error("assignments v{} from the controller: {}", version, s.message());
      return;
    }
  }
  held_version_ = version;
  on_plans_(plans);
}

void GrpcControllerClient::WatchLoop() {
  common::SetCurrentThreadName("trib-watch");
  ReconnectBackoff backoff(options_.backoff);
  uint64_t refused = 0;  // an incarnation the controller does not know: wait for the next one
  while (true) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
    tributary::v1::WatchAssignmentsRequest req;
    req.set_node_id(options_.node_id);
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || (incarnation_ != 0 && incarnation_ != refused); });
      if (stop_) return;
      req.set_incarnation(incarnation_);
      watch_ctx_ = ctx.get();
    }
    {
      std::lock_guard lock(deliver_mu_);
      req.set_since_version(held_version_);
    }
    std::unique_ptr<grpc::ClientReader<tributary::v1::WatchAssignmentsResponse>> reader =
        stub_->WatchAssignments(ctx.get(), req);
    reader->WaitForInitialMetadata();
    watching_ = true;
    tributary::v1::WatchAssignmentsResponse msg;
    while (reader->Read(&msg)) {
      backoff.Reset();
      Deliver(msg.assignments_version(), std::vector<tributary::v1::JobPlan>(
                                             std::make_move_iterator(msg.mutable_plans()->begin()),
                                             std::make_move_iterator(msg.mutable_plans()->end())));
    }
    watching_ = false;
    const grpc::Status s = reader->Finish();
    {
      std::lock_guard lock(mu_);
      watch_ctx_ = nullptr;
      if (stop_) return;
    }
    switch (s.error_code()) {
      case grpc::StatusCode::UNIMPLEMENTED:
        Log()->warn("controller {} has no assignments watch: polling with heartbeats",
                    options_.controller_address);
        watch_supported_ = false;
        return;
      case grpc::StatusCode::NOT_FOUND:
        refused = req.incarnation();  // reopened once the node has registered again
        continue;
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        continue;  // a long-lived stream renewed
      default:
        Log()->debug("assignments watch ended: {}; reopening", s.error_message());
        break;
    }
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, backoff.Next(), [this] { return stop_; });
    if (stop_) return;
  }
}

void GrpcControllerClient::RequestRefresh() {
  {
    std::lock_guard lock(mu_);
    refresh_ = true;
  }
  cv_.notify_all();
}

bool GrpcControllerClient::WaitFor(std::chrono::milliseconds d) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, d, [this] { return stop_ || refresh_; });
  refreshed_ = refresh_;
  refresh_ = false;
  return !stop_;
}

std::unique_ptr<grpc::ClientContext> GrpcControllerClient::Context() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
  return ctx;
}

void GrpcControllerClient::Run() {
  common::SetCurrentThreadName("trib-heartbeat");
  uint64_t incarnation = 0;
  int behind = 0;  // heartbeats in a row whose version the watch had not delivered
  auto interval = std::chrono::milliseconds(500);
  ReconnectBackoff backoff(options_.backoff);
  auto last_sample = std::chrono::steady_clock::now();
  LoadDeltas load_deltas;
  bool warned = false;
  // Since when the controller has been unreachable (reported once it answers again).
  std::optional<std::chrono::steady_clock::time_point> lost_at;
  while (true) {
    if (!registered_) {
      tributary::v1::RegisterNodeRequest req;
      req.set_node_id(options_.node_id);
      *req.mutable_inventory() = options_.inventory;
      req.set_agent_instance(agent_instance_);
      req.set_expands_packed_plans(true);
      tributary::v1::RegisterNodeResponse resp;
      grpc::Status s = stub_->RegisterNode(Context().get(), req, &resp);
      if (!s.ok()) {
        if (!lost_at) lost_at = std::chrono::steady_clock::now();
        if (!warned) {
          Log()->warn(
              "registering node {} with controller {} failed: {}; retrying with backoff, "
              "keeping the current plans",
              options_.node_id, options_.controller_address, s.error_message());
          warned = true;
        }
        if (!WaitFor(backoff.Next())) return;
        continue;
      }
      warned = false;
      backoff.Reset();
      if (lost_at) {
        Log()->info(
            "controller {} reachable again after {:.1f} s", options_.controller_address,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - *lost_at).count());
        lost_at.reset();
      }
      incarnation = resp.incarnation();
      // The controller holds no load of this incarnation; one from before load deltas gets the
      // whole load every time.
      load_deltas.Reset(resp.takes_load_deltas());
      interval = std::chrono::milliseconds(std::max<uint32_t>(50, resp.heartbeat_interval_ms()));
      {
        // Versions are the controller's: after a restart they start again.
        std::lock_guard lock(deliver_mu_);
        held_version_ = 0;
      }
      {
        std::lock_guard lock(mu_);
        incarnation_ = incarnation;
      }
      cv_.notify_all();
      registered_ = true;
      Log()->info("node {} registered with controller {} (incarnation {})", options_.node_id,
                  options_.controller_address, incarnation);
    }

    tributary::v1::HeartbeatRequest hb;
    hb.set_node_id(options_.node_id);
    hb.set_incarnation(incarnation);
    const auto now = std::chrono::steady_clock::now();
    load_deltas.Fill(load_(std::chrono::duration<double>(now - last_sample).count()), &hb);
    last_sample = now;
    tributary::v1::HeartbeatResponse hb_resp;
    grpc::Status s = stub_->Heartbeat(Context().get(), hb, &hb_resp);
    load_deltas.Answered(s.ok());
    heartbeats_sent_++;
    if (!s.ok()) {
      heartbeats_failed_++;
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
        Log()->warn("controller does not know node {}: registering again", options_.node_id);
        registered_ = false;
        continue;
      }
      Log()->warn("heartbeat to controller failed: {}", s.error_message());
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
        // The controller may be restarting: register again once it answers, with backoff.
        registered_ = false;
        lost_at = std::chrono::steady_clock::now();
        if (!WaitFor(backoff.Next())) return;
        continue;
      }
      if (!WaitFor(interval)) return;
      continue;
    }
    if (hb_resp.heartbeat_interval_ms() != 0) {
      interval = std::chrono::milliseconds(std::max<uint32_t>(50, hb_resp.heartbeat_interval_ms()));
    }
    uint64_t held;
    {
      std::lock_guard lock(deliver_mu_);
      held = held_version_;
    }
    behind = hb_resp.assignments_version() == held ? 0 : behind + 1;
    // The watch delivers changes; a fetch is the fallback when there is none, when it lags a
    // whole heartbeat, or when the data plane asked for the plans (RequestRefresh).
    const bool fetch = behind > 0 && (!watching_ || !watch_supported_ || behind >= 2 || refreshed_);
    refreshed_ = false;
    if (fetch) {
      tributary::v1::GetAssignmentsRequest req;
      req.set_node_id(options_.node_id);
      tributary::v1::GetAssignmentsResponse resp;
      grpc::Status as = stub_->GetAssignments(Context().get(), req, &resp);
      if (as.ok()) {
        behind = 0;
        Deliver(resp.assignments_version(),
                std::vector<tributary::v1::JobPlan>(resp.plans().begin(), resp.plans().end()));
        continue;  // heartbeat again at once: another change may have raced this fetch
      }
      Log()->warn("fetching assignments failed: {}", as.error_message());
    }
    if (!WaitFor(interval)) return;
  }
}

}  // namespace tributary::agent
