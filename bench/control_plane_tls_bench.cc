// The cost of mTLS on the control plane: a real ControllerService (ClusterState, Authorizer)
// served over loopback TCP in this process, plaintext and with mTLS (certificates made with
// openssl into a temporary folder), and a client timing, per round trip:
//   heartbeat     Heartbeat on an established channel (what every agent does every interval)
//   register+get  RegisterNode then GetAssignments on an established channel
//   connect+beat  a new channel (TCP connect, and the TLS handshake) and its first Heartbeat
// Prints median, p99 and mean in microseconds and the TLS / plaintext ratio of the medians.
// Usage: control_plane_tls_bench [--rounds N] (default 4000; connect+beat runs N/20).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/clock.h"
#include "common/logging.h"
#include "common/rpc/tls.h"
#include "controller/authz.h"
#include "controller/cluster_state.h"
#include "controller/controller_service.h"
#include "grpcpp/grpcpp.h"
#include "tests/util/test_certs.h"

namespace {

using namespace tributary;  // NOLINT: a benchmark's main

struct Stats {
  double median_us, p99_us, mean_us;
};

Stats Summarize(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  double sum = 0;
  for (double u : us) sum += u;
  return {us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)],
          sum / static_cast<double>(us.size())};
}

template <typename F>
std::vector<double> Time(int rounds, F&& f) {
  std::vector<double> us;
  us.reserve(rounds);
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f(i);
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return us;
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return ctx;
}

void Check(const grpc::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s failed: %s\n", what, s.error_message().c_str());
    std::exit(1);
  }
}

// One server (plaintext when `tls` is empty) and the three measurements against it.
std::vector<Stats> Run(const common::TlsConfig& server_tls, const common::TlsConfig& client_tls,
                       int rounds) {
  controller::ClusterState::Options options;
  options.heartbeat_timeout = std::chrono::hours(1);
  controller::ClusterState state(common::SystemClock::Get(), options, 1 << 20);
  const controller::Authorizer authz(
      controller::AuthzOptions{.tls = server_tls.enabled(), .admins = {"admin"}});
  controller::ControllerService service(&state, nullptr, &authz);
  auto credentials = common::MakeServerCredentials(server_tls, "bench", "127.0.0.1:0");
  if (!credentials.ok()) {
    std::fprintf(stderr, "%s\n", std::string(credentials.status().message()).c_str());
    std::exit(1);
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", *credentials, &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  const std::string target = "127.0.0.1:" + std::to_string(port);

  auto new_stub = [&] {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a fresh connection per channel
    auto channel = common::MakeChannel(target, client_tls, args);
    return v1::Controller::NewStub(*channel);
  };
  v1::RegisterNodeRequest reg;
  reg.set_node_id("node-0");
  reg.mutable_inventory()->set_hostname("node-0");
  reg.mutable_inventory()->set_data_plane_address("127.0.0.1:1");
  reg.mutable_inventory()->set_nic_bytes_per_s(1.25e9);
  reg.mutable_inventory()->set_sum_bytes_per_s(4e9);
  reg.mutable_inventory()->set_offers_summation(true);
  v1::RegisterNodeResponse registered;
  auto stub = new_stub();
  Check(stub->RegisterNode(Context().get(), reg, &registered), "RegisterNode");
  v1::HeartbeatRequest beat;
  beat.set_node_id("node-0");
  beat.set_incarnation(registered.incarnation());

  std::vector<Stats> out;
  for (int i = 0; i < rounds / 10; ++i) {  // warm-up
    v1::HeartbeatResponse r;
    Check(stub->Heartbeat(Context().get(), beat, &r), "Heartbeat");
  }
  out.push_back(Summarize(Time(rounds, [&](int) {
    v1::HeartbeatResponse r;
    Check(stub->Heartbeat(Context().get(), beat, &r), "Heartbeat");
  })));
  out.push_back(Summarize(Time(rounds, [&](int) {
    v1::RegisterNodeResponse r;
    Check(stub->RegisterNode(Context().get(), reg, &r), "RegisterNode");
    v1::GetAssignmentsRequest get;
    get.set_node_id("node-0");
    v1::GetAssignmentsResponse a;
    Check(stub->GetAssignments(Context().get(), get, &a), "GetAssignments");
    beat.set_incarnation(r.incarnation());
  })));
  out.push_back(Summarize(Time(std::max(10, rounds / 20), [&](int) {
    auto fresh = new_stub();
    v1::HeartbeatResponse r;
    Check(fresh->Heartbeat(Context().get(), beat, &r), "Heartbeat");
  })));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"control_plane_tls_bench: controller round trips, plaintext vs mTLS"};
  int rounds = 4000;
  app.add_option("--rounds", rounds, "round trips per measurement")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  common::InitLogging("error");

  char tmpl[] = "/tmp/tributary-tls-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  testing::TestCerts certs(tmpl);
  for (absl::Status s :
       {certs.MakeCa("ca"), certs.MakeCert("ca", "controller", "controller", {"IP:127.0.0.1"}),
        certs.MakeCert("ca", "node-0", "node-0", {"DNS:node-0"})}) {
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  auto tls_of = [&](const std::string& name) {
    common::TlsConfig tls;
    tls.cert = certs.crt(name);
    tls.key = certs.key(name);
    tls.ca = certs.crt("ca");
    return tls;
  };
  const std::vector<Stats> plain = Run({}, {}, rounds);
  const std::vector<Stats> tls = Run(tls_of("controller"), tls_of("node-0"), rounds);
  std::filesystem::remove_all(tmpl);

  const char* names[] = {"heartbeat", "register+get", "connect+beat"};
  std::printf("controller round trips over loopback TCP, %d rounds (connect+beat: %d), us\n",
              rounds, std::max(10, rounds / 20));
  std::printf("%-14s %12s %12s %12s %12s %12s %12s %9s\n", "operation", "plain p50", "plain p99",
              "plain mean", "mTLS p50", "mTLS p99", "mTLS mean", "p50 ratio");
  for (int i = 0; i < 3; ++i) {
    std::printf("%-14s %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f %8.2fx\n", names[i],
                plain[i].median_us, plain[i].p99_us, plain[i].mean_us, tls[i].median_us,
                tls[i].p99_us, tls[i].mean_us, tls[i].median_us / plain[i].median_us);
  }
  return 0;
}
