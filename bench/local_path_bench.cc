// The local path, hop by hop: what one small collective costs between a training process and its
// agent, through the Submit RPC and through the control ring (the shared-memory fast path).
//
// A real agent local service (LocalService, ControlRings, LocalGrpcService on a unix socket) runs
// in this process with the fake data plane completing every operation at once
// (FakeCollectiveRunner::CompleteOnStart), so the figures are the local path alone: no network,
// no reduction across nodes. Real Clients (one job of one process each, so that one submission
// is a whole operation) time every operation from the call to the result seen, and the table
// gives median, p99 and mean per path, plus the doorbell alone (a futex wake + wait ping-pong
// between two threads on a shared mapping, as the ring's two sides use it).
//
// Usage: local_path_bench [--ops N] [--bytes B] [--warmup N]
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "agent/buffer_socket.h"
#include "agent/control_ring_host.h"
#include "agent/fake_collective_runner.h"
#include "agent/local_grpc_service.h"
#include "client/client.h"
#include "common/buffer_socket_protocol.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/rpc/grpc_status.h"
#include "common/shm_ring.h"
#include "grpcpp/grpcpp.h"

namespace tributary {
namespace {

using SteadyClock = std::chrono::steady_clock;
namespace ring = common::shm_ring;

struct Row {
  std::string path;
  std::vector<double> us;  // one per operation
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

// Times `op` `ops` times after `warmup` untimed runs; stops at the first error. With `gap`, the
// thread computes (spins, untimed) that long before each operation, as a training step would.
Row Time(const std::string& path, int warmup, int ops, const std::function<absl::Status()>& op,
         std::chrono::microseconds gap = std::chrono::microseconds(0)) {
  Row row{path, {}};
  row.us.reserve(ops);
  for (int i = 0; i < warmup + ops; ++i) {
    if (gap.count() > 0) {
      const auto until = SteadyClock::now() + gap;
      while (SteadyClock::now() < until) {
      }
    }
    const auto t0 = SteadyClock::now();
    const absl::Status s = op();
    const auto t1 = SteadyClock::now();
    if (!s.ok()) {
      std::fprintf(stderr, "%s: operation %d failed: %s\n", path.c_str(), i, s.ToString().c_str());
      std::exit(1);
    }
    if (i >= warmup) row.us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return row;
}

// Two threads hand a token back and forth through two futex words of a shared mapping, each
// sleeping on its word with the ring's own Sleep/Notify; one row entry per round trip.
Row DoorbellPingPong(int warmup, int ops) {
  const size_t bytes = ring::TotalBytes(2, 2);
  void* mem = mmap(nullptr, 2 * bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  auto* a = static_cast<std::byte*>(mem);
  auto* b = a + bytes;
  (void)ring::InitializeHeader(a, bytes, {2, 2});
  (void)ring::InitializeHeader(b, bytes, {2, 2});
  const ring::RingView ping = ring::ViewOf(a, {2, 2}), pong = ring::ViewOf(b, {2, 2});
  const int total = warmup + ops;
  std::thread echo([&] {
    ring::RingConsumer<ring::SubmissionEntry> in(&ping.header->sq, ping.sq, 2);
    ring::RingProducer<ring::SubmissionEntry> out(&pong.header->sq, pong.sq, 2);
    ring::SubmissionEntry e;
    for (int i = 0; i < total;) {
      if (in.Pop(&e) != ring::RingResult::kOk) {
        in.Sleep(std::chrono::seconds(1), [] { return false; });
        continue;
      }
      (void)out.Push(e);
      out.Notify();
      ++i;
    }
  });
  ring::RingProducer<ring::SubmissionEntry> out(&ping.header->sq, ping.sq, 2);
  ring::RingConsumer<ring::SubmissionEntry> in(&pong.header->sq, pong.sq, 2);
  ring::SubmissionEntry e{};
  Row row = Time("doorbell ping-pong (futex wake+wait, both ways)", warmup, ops, [&] {
    (void)out.Push(e);
    out.Notify();
    while (in.Pop(&e) != ring::RingResult::kOk) {
      in.Sleep(std::chrono::seconds(1), [] { return false; });
    }
    return absl::OkStatus();
  });
  echo.join();
  munmap(mem, 2 * bytes);
  return row;
}

// A real agent local service in this process: LocalService over the fake data plane, its
// control rings polling for `spin` before they sleep, the gRPC service on a unix socket and the
// buffer socket beside it.
class LocalAgent {
 public:
  explicit LocalAgent(std::chrono::microseconds spin)
      : service_(&runner_, common::SystemClock::Get()),
        rings_(&service_, agent::ControlRings::Options{.spin = spin}),
        grpc_service_(&service_, &rings_),
        socket_(absl::StrCat("/tmp/tributary-local-path-bench-", getpid(), ".sock")) {
    runner_.CompleteOnStart(true);
    service_.SetJobs({agent::LocalJob{.job_id = "grpc", .num_nodes = 1, .procs_per_node = 1},
                      agent::LocalJob{.job_id = "ring", .num_nodes = 1, .procs_per_node = 1}});
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
    builder.RegisterService(&grpc_service_);
    server_ = builder.BuildAndStart();
    if (!server_) {
      std::fprintf(stderr, "cannot serve on unix:%s\n", socket_.c_str());
      return;
    }
    // Processes hand their buffers (sealed memfds) to the agent over the buffer socket.
    auto buffer_socket = agent::BufferSocketServer::Start(
        common::buffer_socket::PathFor(socket_), {},
        [this](const common::PeerCredentials& peer, const std::string& session, uint64_t size,
               common::UniqueFd fd) {
          return service_.RegisterBuffer(peer, session, size, std::move(fd));
        });
    if (!buffer_socket.ok()) {
      std::fprintf(stderr, "buffer socket: %s\n", buffer_socket.status().ToString().c_str());
      return;
    }
    buffer_socket_ = std::move(*buffer_socket);
  }
  ~LocalAgent() {
    buffer_socket_.reset();
    rings_.Shutdown();
    service_.Shutdown();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    unlink(socket_.c_str());
  }
  bool ok() const { return server_ != nullptr && buffer_socket_ != nullptr; }
  std::string address() const { return "unix:" + socket_; }

 private:
  agent::FakeCollectiveRunner runner_;
  agent::LocalService service_;
  agent::ControlRings rings_;
  agent::LocalGrpcService grpc_service_;
  const std::string socket_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<agent::BufferSocketServer> buffer_socket_;
};

int Main(int argc, char** argv) {
  CLI::App app{"Round trip of one small collective between a process and its agent"};
  int ops = 20000, warmup = 1000;
  size_t bytes = 4096;
  app.add_option("--ops", ops, "timed operations per path")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed operations first")->check(CLI::NonNegativeNumber);
  app.add_option("--bytes", bytes, "all-reduce size (float32 elements x 4)")
      ->check(CLI::Range(size_t{4}, size_t{1} << 30));
  int64_t spin_us = common::shm_ring::kDefaultSpin.count();
  app.add_option("--spin-us", spin_us,
                 "both sides' spin budget for the polling rows (the default client and agent's)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{10000}));
  CLI11_PARSE(app, argc, argv);
  common::InitLogging("warn");

  const std::chrono::seconds wait(10);
  const auto f32 = common::DataType::kFloat32;
  const auto sum = client::ReduceOp::kSum;
  const size_t count = bytes / sizeof(float);
  std::vector<Row> rows;
  // The ring paths with both sides polling before they sleep (the default) and without.
  for (const std::chrono::microseconds spin :
       {std::chrono::microseconds(spin_us), std::chrono::microseconds(0)}) {
    LocalAgent agent(spin);
    if (!agent.ok()) return 1;
    client::ClientOptions options;
    options.agent_address = agent.address();
    options.control_ring_spin = spin;
    options.control_ring = false;
    auto grpc_client = client::Client::Connect(options, "grpc", 0, 1);
    options.control_ring = true;
    auto ring_client = client::Client::Connect(options, "ring", 0, 1);
    if (!grpc_client.ok() || !ring_client.ok() || !(*ring_client)->has_control_ring()) {
      std::fprintf(stderr, "connect failed: %s / %s\n", grpc_client.status().ToString().c_str(),
                   ring_client.status().ToString().c_str());
      return 1;
    }
    auto grpc_buffer = (*grpc_client)->AllocateBuffer(bytes);
    auto ring_buffer = (*ring_client)->AllocateBuffer(bytes);
    if (!grpc_buffer.ok() || !ring_buffer.ok()) {
      std::fprintf(stderr, "buffers: %s / %s\n", grpc_buffer.status().ToString().c_str(),
                   ring_buffer.status().ToString().c_str());
      return 1;
    }
    const std::string how =
        spin.count() > 0 ? absl::StrCat(", polls ", spin.count(), " us") : ", sleeps at once";
    if (spin.count() > 0) {
      rows.push_back(Time("gRPC: AllReduce (Submit that waits, 1 RPC)", warmup, ops, [&] {
        return (*grpc_client)->AllReduce("t", **grpc_buffer, 0, count, f32, sum);
      }));
      rows.push_back(Time("gRPC: AllReduceAsync + Wait (2 RPCs)", warmup, ops, [&] {
        absl::StatusOr<client::Handle> h =
            (*grpc_client)->AllReduceAsync("t", **grpc_buffer, 0, count, f32, sum);
        return h.ok() ? h->Wait(wait) : h.status();
      }));
    }
    rows.push_back(Time("ring: AllReduce" + how, warmup, ops, [&] {
      return (*ring_client)->AllReduce("t", **ring_buffer, 0, count, f32, sum);
    }));
    auto async_wait = [&] {
      absl::StatusOr<client::Handle> h =
          (*ring_client)->AllReduceAsync("t", **ring_buffer, 0, count, f32, sum);
      if (!h.ok()) return h.status();
      if (!h->via_control_ring()) return absl::InternalError("went through gRPC");
      return h->Wait(wait);
    };
    rows.push_back(Time("ring: AllReduceAsync + Wait" + how, warmup, ops, async_wait));
    // The agent's ring thread idles longer than its budget between operations: it sleeps, and
    // only the waiting process polls.
    const std::chrono::microseconds gap(4 * spin_us);
    rows.push_back(Time(absl::StrCat("ring: ", gap.count(), " us of work between ops", how), warmup,
                        ops / 4, async_wait, gap));
    ring_client->reset();
    grpc_client->reset();
  }
  rows.push_back(DoorbellPingPong(warmup, ops));

  std::printf(
      "local path round trip, %zu-byte float32 sum, %d ops per path (after %d warm-up), "
      "fake data plane completing at once, %u hardware threads\n\n",
      bytes, ops, warmup, std::thread::hardware_concurrency());
  std::printf("| %-50s | %10s | %10s | %10s |\n", "path", "median us", "p99 us", "mean us");
  std::printf("|%s|%s|%s|%s|\n", std::string(52, '-').c_str(), std::string(12, '-').c_str(),
              std::string(12, '-').c_str(), std::string(12, '-').c_str());
  for (const Row& r : rows) {
    double mean = 0;
    for (double v : r.us) mean += v;
    mean /= r.us.size();
    std::printf("| %-50s | %10.1f | %10.1f | %10.1f |\n", r.path.c_str(), Percentile(r.us, 0.5),
                Percentile(r.us, 0.99), mean);
  }

  return 0;
}

}  // namespace
}  // namespace tributary

int main(int argc, char** argv) {
  tributary::common::DisableMutexDeadlockDetection();  // as the agent and the client library do
  return tributary::Main(argc, argv);
}
