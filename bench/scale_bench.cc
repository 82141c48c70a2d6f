// The controller at cluster scale: a real tributary-controller (a child process, so its CPU and
// memory are its own) and N simulated agents in this process, each a lightweight gRPC client on
// its own connection (callback API: no thread per agent) that registers with a GPU or CPU
// inventory, heartbeats at 1 Hz with a small load and holds a WatchAssignments stream.
//
// Phases, in order, each printed as a row of the table (and in --json):
//   steady    N agents heartbeating: controller CPU (cores = CPU seconds / wall seconds, from
//             /proc/PID/stat), RSS, heartbeat latency p50/p99, the simulator's own CPU apart;
//   plan-W    CreateJob of W = 64, 256, 1024 (and 4096 with enough agents) DGX-1 worker nodes,
//             8 processes each, at most 256 spares: the RPC's time (plan + commit) and the time
//             until every node of the plan holds it (pushed by the watch);
//   death     a spare server of the 256-worker job stops heartbeating: the time until every node
//             of the new plan holds it, from the death and from the first agent's receipt (the
//             liveness timeout is printed apart);
//   flapping  --flappers nodes (spares, some of them servers) die and come back every few
//             seconds while the 1024-worker job is deleted and created again: heartbeat p99 and
//             the most healthy nodes ever seen dead (ListNodes, paged, every 2 s).
//
// Usage: tributary-scale-bench --agents 3000 [--steady-s 10] [--flappers 50] [--flap-s 20]
//        [--connections N] [--controller PATH] [--json FILE]
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/rpc/grpc_status.h"
#include "controller/planner/job_planner.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "nlohmann/json.hpp"
#include "topology/topology_file.h"
#include "tributary/v1/assigned_plan.h"
#include "tributary/v1/controller.grpc.pb.h"
#include "tributary/v1/plan_pages.h"

namespace tributary {
namespace {

using SteadyClock = std::chrono::steady_clock;
namespace v1 = tributary::v1;

double Seconds(SteadyClock::duration d) { return std::chrono::duration<double>(d).count(); }

struct ProcSample {
  double cpu_s = 0;  // user + system
  double rss_mb = 0;
};

ProcSample ReadProc(const std::string& pid) {
  ProcSample out;
  std::ifstream stat("/proc/" + pid + "/stat");
  std::string line;
  std::getline(stat, line);
  // Fields after the command (which may hold spaces) start after the last ')'.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  out.cpu_s = (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  std::ifstream status("/proc/" + pid + "/status");
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) out.rss_mb = std::stod(line.substr(6)) / 1024.0;
  }
  return out;
}

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1)))];
}

std::string Name(int i) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "a%05d", i);
  return buf;
}

class Sim;

// One simulated agent: its identity, heartbeats on/off, and what its watch delivered.
struct Agent {
  int index = 0;
  std::string id;
  std::atomic<uint64_t> incarnation{0};
  std::atomic<bool> beating{true};
  std::atomic<int64_t> last_beat_ns{0};  // steady clock: when the last heartbeat was sent
  v1::Controller::Stub* stub = nullptr;
  grpc::Channel* channel = nullptr;
  std::mutex mu;
  std::map<std::string, std::pair<uint64_t, SteadyClock::time_point>> held;  // job: version, since
};

// The agent's watch stream, read raw: an agent of the simulator looks only at each plan's job id
// and version (the first agent to get a version parses it whole, for its member list), so that
// the simulator's CPU goes to the connections, not to parsing N copies of big plans.
class Watch : public grpc::ClientReadReactor<grpc::ByteBuffer> {
 public:
  Watch(Sim* sim, Agent* agent) : sim_(sim), agent_(agent) {}
  void Start() {
    v1::WatchAssignmentsRequest req;
    req.set_node_id(agent_->id);
    req.set_incarnation(agent_->incarnation);
    bool own = false;
    (void)grpc::SerializationTraits<v1::WatchAssignmentsRequest>::Serialize(req, &req_, &own);
    grpc::internal::ClientCallbackReaderFactory<grpc::ByteBuffer>::Create<grpc::ByteBuffer>(
        agent_->channel,
        grpc::internal::RpcMethod("/tributary.v1.Controller/WatchAssignments",
                                  grpc::internal::RpcMethod::SERVER_STREAMING),
        &ctx_, &req_, this);
    StartRead(&msg_);
    StartCall();
  }
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& s) override {
    std::lock_guard lock(mu_);
    done_ = true;
    status_ = s;
    cv_.notify_all();
  }
  void Cancel() { ctx_.TryCancel(); }
  void WaitDone() {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return done_; });
  }

 private:
  Sim* sim_;
  Agent* agent_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer req_;
  grpc::ByteBuffer msg_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  grpc::Status status_;
};

class Sim {
 public:
  struct Options {
    int agents = 1000;
    int connections = 0;
    std::string target;
    std::string topology_file;
  };

  explicit Sim(Options o) : options_(std::move(o)) {
    auto topo = topology::LoadTopologyFile(options_.topology_file);
    if (topo.ok()) {
      dgx_ = *topo;
    } else {
      std::fprintf(stderr, "no topology (%s): workers report none\n",
                   std::string(topo.status().message()).c_str());
    }
    const int connections = options_.connections > 0 ? options_.connections : options_.agents;
    for (int c = 0; c < connections; ++c) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
      args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);            // as the agent's channel
      channels_.push_back(
          grpc::CreateCustomChannel(options_.target, grpc::InsecureChannelCredentials(), args));
      stubs_.push_back(v1::Controller::NewStub(channels_.back()));
    }
    grpc::ChannelArguments big;
    big.SetMaxReceiveMessageSize(256 << 20);
    control_ = v1::Controller::NewStub(
        grpc::CreateCustomChannel(options_.target, grpc::InsecureChannelCredentials(), big));
    for (int i = 0; i < options_.agents; ++i) {
      agents_.push_back(std::make_unique<Agent>());
      agents_.back()->index = i;
      agents_.back()->id = Name(i);
      agents_.back()->stub = stubs_[i % stubs_.size()].get();
      agents_.back()->channel = channels_[i % channels_.size()].get();
    }
  }

  ~Sim() {
    stop_ = true;
    if (beater_.joinable()) beater_.join();
    for (auto& w : watches_) w->Cancel();
    for (auto& w : watches_) w->WaitDone();
  }

  v1::Controller::Stub& control() { return *control_; }
  Agent& agent(int i) { return *agents_[i]; }
  int size() const { return static_cast<int>(agents_.size()); }

  // Workers (the first `gpu_nodes`) carry the DGX-1 topology; all offer summation.
  bool RegisterAll(int gpu_nodes) {
    std::mutex mu;
    std::condition_variable cv;
    int in_flight = 0, failed = 0, done = 0;
    for (auto& a : agents_) {
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return in_flight < 256; });
        ++in_flight;
      }
      struct Call {
        grpc::ClientContext ctx;
        v1::RegisterNodeRequest req;
        v1::RegisterNodeResponse resp;
      };
      auto* call = new Call;
      call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      call->req.set_node_id(a->id);
      call->req.set_expands_packed_plans(true);  // as agents do
      auto* inv = call->req.mutable_inventory();
      inv->set_hostname(a->id);
      inv->set_data_plane_address("10." + std::to_string(a->index / 65536) + "." +
                                  std::to_string(a->index / 256 % 256) + "." +
                                  std::to_string(a->index % 256) + ":4000");
      inv->set_cpu_cores(64);
      inv->set_memory_bytes(uint64_t{512} << 30);
      inv->set_nic_bytes_per_s(100e9 / 8);
      inv->set_sum_bytes_per_s(20e9);
      inv->set_offers_summation(true);
      if (a->index < gpu_nodes && dgx_.gpus_size() > 0) {
        *inv->mutable_topology() = dgx_;
        inv->mutable_topology()->set_hostname(a->id);
        inv->set_gpu_count(dgx_.gpus_size());
      }
      Agent* agent = a.get();
      agent->stub->async()->RegisterNode(&call->ctx, &call->req, &call->resp,
                                         [&, call, agent](grpc::Status s) {
                                           if (s.ok())
                                             agent->incarnation = call->resp.incarnation();
                                           delete call;
                                           std::lock_guard lock(mu);
                                           --in_flight;
                                           ++done;
                                           failed += s.ok() ? 0 : 1;
                                           cv.notify_all();
                                         });
    }
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done == size(); });
    if (failed > 0) std::fprintf(stderr, "%d registrations failed\n", failed);
    return failed == 0;
  }

  void StartWatches() {
    for (auto& a : agents_) {
      watches_.push_back(std::make_unique<Watch>(this, a.get()));
      watches_.back()->Start();
    }
  }

  // 1 Hz per agent, spread evenly over the second.
  void StartHeartbeats(std::chrono::milliseconds interval) {
    beater_ = std::thread([this, interval] {
      const auto start = SteadyClock::now();
      uint64_t sent = 0;
      while (!stop_) {
        const double elapsed = Seconds(SteadyClock::now() - start);
        const auto due = static_cast<uint64_t>(elapsed / (interval.count() / 1000.0) *
                                               static_cast<double>(agents_.size()));
        for (; sent < due; ++sent) Beat(*agents_[sent % agents_.size()]);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
  }

  // Heartbeat latencies (ms) since the last call, and failures.
  std::vector<double> TakeLatencies(uint64_t* failed = nullptr) {
    std::lock_guard lock(lat_mu_);
    if (failed != nullptr) *failed = failed_;
    failed_ = 0;
    return std::exchange(latencies_, {});
  }

  // What a watch delivered: the newest plan of each job as a member list (by the first agent
  // that got that version, which calls `parse` for the rest of the plan).
  void OnPlan(Agent& agent, const std::string& job_id, uint64_t version,
              const std::function<void(v1::JobPlan*)>& parse) {
    const auto now = SteadyClock::now();
    {
      std::lock_guard lock(agent.mu);
      auto& h = agent.held[job_id];
      if (version > h.first) h = {version, now};
    }
    std::lock_guard lock(plans_mu_);
    auto& latest = latest_[job_id];
    if (version > latest.version) {
      v1::JobPlan plan;
      parse(&plan);
      latest.version = version;
      latest.first = now;
      latest.members.clear();
      latest.workers.clear();
      for (const auto& w : plan.workers()) latest.members.insert(w.node_id());
      for (const auto& w : plan.workers()) latest.workers.insert(w.node_id());
      for (const auto& s : plan.servers()) latest.members.insert(s.node_id());
    }
  }

  struct Latest {
    uint64_t version = 0;
    SteadyClock::time_point first;
    std::set<std::string> members;
    std::set<std::string> workers;
  };
  // Waits until every member of the job's plan at `min_version` or newer holds that version;
  // returns the plan and the last receipt's time.
  // With `without`, only a plan that no longer names that node counts.
  bool WaitDelivered(const std::string& job, uint64_t min_version, Latest* out,
                     SteadyClock::time_point* last, std::chrono::seconds timeout,
                     const std::string& without = "") {
    const auto deadline = SteadyClock::now() + timeout;
    while (SteadyClock::now() < deadline) {
      Latest latest;
      {
        std::lock_guard lock(plans_mu_);
        latest = latest_[job];
      }
      if (latest.version >= min_version && !latest.members.contains(without)) {
        bool all = true;
        SteadyClock::time_point newest = latest.first;
        for (const std::string& m : latest.members) {
          Agent& a = *agents_[std::stoi(m.substr(1))];
          std::lock_guard lock(a.mu);
          auto it = a.held.find(job);
          if (it == a.held.end() || it->second.first < latest.version) {
            all = false;
            break;
          }
          newest = std::max(newest, it->second.second);
        }
        if (all) {
          *out = latest;
          *last = newest;
          return true;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

 private:
  void Beat(Agent& a) {
    if (!a.beating || a.incarnation == 0) return;
    struct Call {
      grpc::ClientContext ctx;
      v1::HeartbeatRequest req;
      v1::HeartbeatResponse resp;
      SteadyClock::time_point start;
    };
    auto* call = new Call;
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    call->req.set_node_id(a.id);
    call->req.set_incarnation(a.incarnation);
    call->req.mutable_load()->set_cpu_busy_fraction(0.1);
    call->req.mutable_load()->set_nic_tx_bytes_per_s(1e6);
    call->req.mutable_load()->set_nic_rx_bytes_per_s(1e6);
    call->req.mutable_load()->set_memory_used_bytes(uint64_t{64} << 30);
    call->start = SteadyClock::now();
    a.last_beat_ns = call->start.time_since_epoch().count();
    a.stub->async()->Heartbeat(&call->ctx, &call->req, &call->resp, [this, call](grpc::Status s) {
      const double ms = Seconds(SteadyClock::now() - call->start) * 1e3;
      delete call;
      std::lock_guard lock(lat_mu_);
      latencies_.push_back(ms);
      failed_ += s.ok() ? 0 : 1;
    });
  }

  Options options_;
  v1::Topology dgx_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::Controller::Stub>> stubs_;
  std::unique_ptr<v1::Controller::Stub> control_;
  std::vector<std::unique_ptr<Agent>> agents_;
  std::vector<std::unique_ptr<Watch>> watches_;
  std::atomic<bool> stop_{false};
  std::thread beater_;
  std::mutex lat_mu_;
  std::vector<double> latencies_;
  uint64_t failed_ = 0;
  std::mutex plans_mu_;
  std::map<std::string, Latest> latest_;
};

void Watch::OnReadDone(bool ok) {
  if (!ok) return;
  // Read in place (no copy of the message): most plans are skipped after their head.
  using google::protobuf::internal::WireFormatLite;
  grpc::ProtoBufferReader reader(&msg_);
  google::protobuf::io::CodedInputStream in(&reader);
  while (const uint32_t tag = in.ReadTag()) {
    if (WireFormatLite::GetTagFieldNumber(tag) != 2) {
      if (!WireFormatLite::SkipField(&in, tag)) break;
      continue;
    }
    uint32_t length = 0;
    if (!in.ReadVarint32(&length)) break;
    const auto limit = in.PushLimit(static_cast<int>(length));
    // A plan's job id (field 1) and version (field 2) come first.
    std::string job_id;
    uint64_t version = 0;
    for (int k = 0; k < 2; ++k) {
      const uint32_t t = in.ReadTag();
      if (WireFormatLite::GetTagFieldNumber(t) == 1) {
        uint32_t n = 0;
        if (!in.ReadVarint32(&n) || !in.ReadString(&job_id, static_cast<int>(n))) break;
      } else if (WireFormatLite::GetTagFieldNumber(t) == 2) {
        if (!in.ReadVarint64(&version)) break;
      }
    }
    sim_->OnPlan(*agent_, job_id, version, [&](v1::JobPlan* plan) {
      plan->ParseFromCodedStream(&in);  // the rest of this plan (up to the limit), packed
      (void)v1::ExpandAssignedPlan(*plan);
    });
    in.Skip(in.BytesUntilLimit());
    in.PopLimit(limit);
  }
  StartRead(&msg_);
}

// The controller child: started with its port written to a file, stopped with SIGTERM.
struct Controller {
  pid_t pid = -1;
  int port = 0;
  ~Controller() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
  }
};

bool StartController(const std::string& binary, int heartbeat_ms, int timeout_ms, int debounce_ms,
                     Controller* out) {
  const std::string port_file = (std::filesystem::temp_directory_path() /
                                 ("scale-bench-" + std::to_string(getpid()) + ".port"))
                                    .string();
  std::filesystem::remove(port_file);
  std::vector<std::string> args = {binary,
                                   "--listen=127.0.0.1:0",
                                   "--port-file=" + port_file,
                                   "--heartbeat-ms=" + std::to_string(heartbeat_ms),
                                   "--heartbeat-timeout-ms=" + std::to_string(timeout_ms),
                                   "--replan-debounce-ms=" + std::to_string(debounce_ms),
                                   "--max-heartbeats-per-s=100000",
                                   "--metrics-listen",
                                   "",
                                   "--log-level=warn"};
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    std::perror("execv");
    _exit(127);
  }
  out->pid = pid;
  const auto deadline = SteadyClock::now() + std::chrono::seconds(30);
  while (SteadyClock::now() < deadline) {
    std::ifstream f(port_file);
    if (f >> out->port && out->port > 0) {
      std::filesystem::remove(port_file);
      return true;
    }
    if (waitpid(pid, nullptr, WNOHANG) == pid) {
      out->pid = -1;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

struct Row {
  std::string phase;
  nlohmann::json values;
  std::string text;
};

}  // namespace
}  // namespace tributary

int main(int argc, char** argv) {
  using namespace tributary;
  common::DisableMutexDeadlockDetection();
  CLI::App app{"The controller at cluster scale: N simulated agents against a real controller"};
  int agents = 1000, connections = 0, steady_s = 10, flappers = -1, flap_s = 20;
  int heartbeat_ms = 1000, timeout_ms = 3000, max_workers = 4096, debounce_ms = 10;
  std::string controller_bin, json_file;
  std::string topology_file =
      std::string(TRIBUTARY_SOURCE_DIR) + "/tests/topology/fixtures/dgx1v_nccl_topo.xml";
  app.add_option("--agents", agents, "Simulated agents")->check(CLI::Range(10, 50000));
  app.add_option("--connections", connections, "gRPC connections they share (0: one each)");
  app.add_option("--steady-s", steady_s, "Seconds of steady state measured");
  app.add_option("--flappers", flappers, "Flapping nodes (-1: 50 from 3,000 agents, else 0)");
  app.add_option("--flap-s", flap_s, "Seconds of flapping");
  app.add_option("--max-workers", max_workers, "Largest job planned (64, 256, 1024, 4096)");
  app.add_option("--heartbeat-ms", heartbeat_ms, "Heartbeat interval of the agents");
  app.add_option("--timeout-ms", timeout_ms, "The controller's liveness timeout");
  app.add_option("--debounce-ms", debounce_ms, "The controller's --replan-debounce-ms")
      ->capture_default_str();
  app.add_option("--controller", controller_bin, "tributary-controller (default: next to this)");
  app.add_option("--topology-file", topology_file, "Worker nodes' topology");
  app.add_option("--json", json_file, "Also write the results as JSON here");
  CLI11_PARSE(app, argc, argv);
  if (controller_bin.empty()) {
    controller_bin =
        (std::filesystem::path(argv[0]).parent_path() / "tributary-controller").string();
  }
  if (flappers < 0) flappers = agents >= 3000 ? 50 : 0;
  const std::string load_before = LoadAverage();

  // The planner alone (what CreateJob spends planning): W DGX-1 workers x 8 GPUs + 256 spares.
  std::map<int, double> planner_s;
  {
    auto topo = topology::LoadTopologyFile(topology_file);
    for (int w : {64, 256, 1024, 4096}) {
      if (w > max_workers) break;
      std::vector<controller::NodeSnapshot> nodes;
      v1::JobSpec spec;
      spec.set_procs_per_node(8);
      spec.set_max_spare_nodes(256);
      for (int i = 0; i < w + 256; ++i) {
        auto inv = std::make_shared<v1::NodeInventory>();
        inv->set_data_plane_address("10.0." + std::to_string(i / 256) + "." +
                                    std::to_string(i % 256) + ":4000");
        inv->set_nic_bytes_per_s(100e9 / 8);
        inv->set_sum_bytes_per_s(20e9);
        inv->set_offers_summation(true);
        if (i < w && topo.ok()) {
          *inv->mutable_topology() = *topo;
          inv->mutable_topology()->set_hostname(Name(i));
        }
        nodes.push_back({.node_id = Name(i), .inventory = inv, .alive = true});
        if (i < w) spec.add_worker_nodes(Name(i));
      }
      auto normalized = controller::NormalizeJobSpec(spec);
      const auto t0 = SteadyClock::now();
      auto plan = controller::PlanJob("j", *normalized, nodes, 1);
      planner_s[w] = Seconds(SteadyClock::now() - t0);
      if (!plan.ok())
        std::fprintf(stderr, "planning %d workers: %s\n", w,
                     std::string(plan.status().message()).c_str());
    }
  }

  Controller controller;
  if (!StartController(controller_bin, heartbeat_ms, timeout_ms, debounce_ms, &controller)) {
    std::fprintf(stderr, "cannot start %s\n", controller_bin.c_str());
    return 1;
  }
  const std::string cpid = std::to_string(controller.pid);
  std::vector<Row> rows;
  nlohmann::json out = {{"agents", agents},
                        {"heartbeat_ms", heartbeat_ms},
                        {"liveness_timeout_ms", timeout_ms},
                        {"load_average_before", load_before}};

  // Job sizes that fit: W workers + 256 spares beside the jobs before it.
  const std::vector<int> sizes = {64, 256, 1024, 4096};
  std::vector<std::pair<int, int>> jobs;  // first worker, workers
  int next = 0;
  for (int w : sizes) {
    if (next + w + 256 > agents || w > max_workers) break;
    jobs.push_back({next, w});
    next += w;
  }
  const int gpu_nodes = next;

  Sim sim({.agents = agents,
           .connections = connections,
           .target = "127.0.0.1:" + std::to_string(controller.port),
           .topology_file = topology_file});
  const auto reg_start = SteadyClock::now();
  if (!sim.RegisterAll(gpu_nodes)) return 1;
  const double register_s = Seconds(SteadyClock::now() - reg_start);
  sim.StartWatches();
  sim.StartHeartbeats(std::chrono::milliseconds(heartbeat_ms));
  std::this_thread::sleep_for(std::chrono::seconds(2));  // every agent has beaten once
  sim.TakeLatencies();

  // Steady state.
  {
    const ProcSample c0 = ReadProc(cpid), s0 = ReadProc("self");
    const auto t0 = SteadyClock::now();
    std::this_thread::sleep_for(std::chrono::seconds(steady_s));
    const double wall = Seconds(SteadyClock::now() - t0);
    const ProcSample c1 = ReadProc(cpid), s1 = ReadProc("self");
    uint64_t failed = 0;
    const std::vector<double> lat = sim.TakeLatencies(&failed);
    Row r{"steady", {}, {}};
    r.values = {{"controller_cores", (c1.cpu_s - c0.cpu_s) / wall},
                {"controller_rss_mb", c1.rss_mb},
                {"simulator_cores", (s1.cpu_s - s0.cpu_s) / wall},
                {"heartbeats_per_s", static_cast<double>(lat.size()) / wall},
                {"heartbeat_p50_ms", Percentile(lat, 0.5)},
                {"heartbeat_p99_ms", Percentile(lat, 0.99)},
                {"heartbeats_failed", failed},
                {"register_all_s", register_s}};
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "controller %.2f cores, %.0f MB RSS; hb p50 %.2f ms p99 %.2f ms (%.0f/s, %lu "
                  "failed); simulator %.2f cores; registration %.1f s",
                  r.values["controller_cores"].get<double>(), c1.rss_mb, Percentile(lat, 0.5),
                  Percentile(lat, 0.99), static_cast<double>(lat.size()) / wall,
                  static_cast<unsigned long>(failed), r.values["simulator_cores"].get<double>(),
                  register_s);
    r.text = buf;
    rows.push_back(r);
  }

  // Plans.
  auto create = [&](const std::string& id, int first, int workers, double* rpc_s,
                    double* delivered_s, uint64_t* version) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    v1::CreateJobRequest req;
    req.set_job_id(id);
    for (int i = first; i < first + workers; ++i) req.mutable_spec()->add_worker_nodes(Name(i));
    req.mutable_spec()->set_procs_per_node(8);
    req.mutable_spec()->set_max_spare_nodes(256);
    v1::Job job;
    const auto t0 = SteadyClock::now();
    grpc::Status s = sim.control().CreateJob(&ctx, req, &job);
    *rpc_s = Seconds(SteadyClock::now() - t0);
    if (!s.ok()) {
      std::fprintf(stderr, "CreateJob %s: %s\n", id.c_str(), s.error_message().c_str());
      return false;
    }
    *version = job.plan().version();
    Sim::Latest latest;
    SteadyClock::time_point last;
    if (!sim.WaitDelivered(id, job.plan().version(), &latest, &last, std::chrono::seconds(60))) {
      std::fprintf(stderr, "job %s not delivered to all its nodes in 60 s\n", id.c_str());
      return false;
    }
    *delivered_s = Seconds(last - t0);
    return true;
  };
  std::map<int, uint64_t> versions;
  for (const auto& [first, workers] : jobs) {
    sim.TakeLatencies();
    const ProcSample c0 = ReadProc(cpid);
    double rpc_s = 0, delivered_s = 0;
    uint64_t version = 0;
    const std::string id = "job" + std::to_string(workers);
    const bool ok = create(id, first, workers, &rpc_s, &delivered_s, &version);
    versions[workers] = version;
    uint64_t failed = 0;
    const std::vector<double> lat = sim.TakeLatencies(&failed);
    Row r{"plan-" + std::to_string(workers), {}, {}};
    r.values = {{"ok", ok},
                {"planner_alone_s", planner_s[workers]},
                {"create_rpc_s", rpc_s},
                {"delivered_to_all_s", delivered_s},
                {"controller_rss_mb", ReadProc(cpid).rss_mb},
                {"controller_cpu_s", ReadProc(cpid).cpu_s - c0.cpu_s},
                {"heartbeat_p99_ms", Percentile(lat, 0.99)},
                {"heartbeats_failed", failed}};
    if (workers == 4096) {
      // Every job listed, and each whole (a cut plan read on with GetJob): how many bytes, and
      // the largest single reply.
      size_t total = 0, largest = 0;
      bool listed_whole = false;
      grpc::Status s;
      auto deadline = [] { return std::chrono::system_clock::now() + std::chrono::seconds(60); };
      v1::ListJobsRequest list;
      do {
        grpc::ClientContext ctx;
        ctx.set_deadline(deadline());
        v1::ListJobsResponse page;
        if (s = sim.control().ListJobs(&ctx, list, &page); !s.ok()) break;
        total += page.ByteSizeLong();
        largest = std::max(largest, page.ByteSizeLong());
        for (const v1::Job& job : page.jobs()) {
          absl::StatusOr<v1::Job> whole =
              v1::ReadRestOfPlan(job, [&](const std::string& token) -> absl::StatusOr<v1::Job> {
                grpc::ClientContext c;
                c.set_deadline(deadline());
                v1::GetJobRequest get;
                get.set_job_id(job.job_id());
                get.set_plan_page_token(token);
                v1::Job part;
                grpc::Status got = sim.control().GetJob(&c, get, &part);
                if (!got.ok()) return absl::UnknownError(got.error_message());
                total += part.ByteSizeLong();
                largest = std::max(largest, part.ByteSizeLong());
                return part;
              });
          if (whole.ok() && job.job_id() == id) {
            listed_whole = whole->plan().workers_size() == workers;
          }
        }
        list.set_page_token(page.next_page_token());
      } while (!list.page_token().empty());
      r.values["listed"] = s.ok() && listed_whole;
      r.values["list_bytes"] = total;
      r.values["largest_reply_bytes"] = largest;
    }
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "%s: planner %.3f s; CreateJob %.3f s, on every node of the plan after %.3f s; "
                  "hb p99 %.2f ms meanwhile",
                  ok ? "ok" : "FAILED", planner_s[workers], rpc_s, delivered_s,
                  Percentile(lat, 0.99));
    r.text = buf;
    if (r.values.contains("listed")) {
      std::snprintf(buf, sizeof buf, "; listed %s: %.1f MB, largest reply %.0f KB",
                    r.values["listed"].get<bool>() ? "whole" : "FAILED",
                    r.values["list_bytes"].get<double>() / 1e6,
                    r.values["largest_reply_bytes"].get<double>() / 1e3);
      r.text += buf;
    }
    rows.push_back(r);
  }

  // A spare server of the 256-worker job (or of the largest) dies.
  int victim = -1;  // a spare server of this job, preferably a node of no other job
  if (!jobs.empty()) {
    const int workers = jobs.size() > 1 ? 256 : jobs.back().second;
    const std::string id = "job" + std::to_string(workers);
    Sim::Latest before;
    SteadyClock::time_point ignored;
    sim.WaitDelivered(id, versions[workers], &before, &ignored, std::chrono::seconds(5));
    const auto [first, count] = jobs.size() > 1 ? jobs[1] : jobs.back();
    for (const std::string& m : before.members) {
      const int i = std::stoi(m.substr(1));
      if (i >= first && i < first + count) continue;
      if (victim < 0 || i >= gpu_nodes) victim = i;
    }
    Row r{"death", {}, {}};
    if (victim < 0) {
      r.text = "no spare server in the plan";
    } else {
      // Every job whose plan names the victim (spares serve several jobs) is affected.
      std::vector<std::pair<std::string, Sim::Latest>> affected;
      for (const auto& [f, w] : jobs) {
        const std::string job = "job" + std::to_string(w);
        Sim::Latest b;
        SteadyClock::time_point at;
        if (sim.WaitDelivered(job, versions[w], &b, &at, std::chrono::seconds(5)) &&
            b.members.contains(Name(victim))) {
          affected.emplace_back(job, b);
        }
      }
      sim.TakeLatencies();
      const auto t0 = SteadyClock::now();
      sim.agent(victim).beating = false;
      Sim::Latest after;
      SteadyClock::time_point last;
      bool ok = sim.WaitDelivered(id, before.version + 1, &after, &last, std::chrono::seconds(60),
                                  Name(victim));
      const bool gone = !after.members.contains(Name(victim));
      SteadyClock::time_point last_of_all = last;
      size_t agents_of_all = 0;
      for (const auto& [job, b] : affected) {
        Sim::Latest a;
        SteadyClock::time_point at;
        // A job it works for keeps it in its plan, marked down; the others drop it.
        const bool worker = b.workers.contains(Name(victim));
        ok &= sim.WaitDelivered(job, b.version + 1, &a, &at, std::chrono::seconds(60),
                                worker ? "" : Name(victim));
        last_of_all = std::max(last_of_all, at);
        agents_of_all += a.members.size();
      }
      // The controller hears nothing after the last heartbeat sent: it is dead a timeout later.
      const SteadyClock::time_point silent_since(
          SteadyClock::duration(sim.agent(victim).last_beat_ns.load()));
      const double total = Seconds(last - t0), spread = Seconds(last - after.first);
      const double after_timeout = Seconds(last - silent_since) - timeout_ms / 1000.0;
      const double all_after_timeout = Seconds(last_of_all - silent_since) - timeout_ms / 1000.0;
      uint64_t failed = 0;
      const std::vector<double> lat = sim.TakeLatencies(&failed);
      r.values = {{"ok", ok && gone},
                  {"stop_to_all_s", total},
                  {"liveness_timeout_s", timeout_ms / 1000.0},
                  {"after_timeout_s", after_timeout},
                  {"first_to_last_agent_s", spread},
                  {"agents_updated", after.members.size()},
                  {"affected_jobs", affected.size()},
                  {"affected_agents", agents_of_all},
                  {"all_affected_after_timeout_s", all_after_timeout},
                  {"heartbeat_p99_ms", Percentile(lat, 0.99)}};
      char buf[512];
      std::snprintf(buf, sizeof buf,
                    "%s: %zu agents hold the new plan %.3f s after its last heartbeat's timeout "
                    "(%.1f s; includes the %d ms debounce); first to last agent %.1f ms; all %zu "
                    "affected jobs (%zu agents) after %.3f s",
                    ok && gone ? "ok" : "FAILED", after.members.size(), after_timeout,
                    timeout_ms / 1000.0, debounce_ms, spread * 1e3, affected.size(), agents_of_all,
                    all_after_timeout);
      r.text = buf;
      sim.agent(victim).beating = true;
    }
    rows.push_back(r);
  }

  // Flapping spares while the largest job is deleted and created again.
  if (flappers > 0 && !jobs.empty()) {
    std::set<int> flapping;
    for (int i = agents - 1; i >= gpu_nodes && static_cast<int>(flapping.size()) < flappers;
         i -= 7) {
      flapping.insert(i);
    }
    std::atomic<bool> stop{false};
    std::thread flapper([&] {
      // Down for timeout + 0.7 s (declared dead), up for 1.5 s, in two staggered halves.
      const auto start = SteadyClock::now();
      while (!stop) {
        const double t = Seconds(SteadyClock::now() - start);
        const double period = timeout_ms / 1000.0 + 2.2;
        int k = 0;
        for (int i : flapping) {
          const double phase = std::fmod(t + (k++ % 2) * period / 2, period);
          sim.agent(i).beating = phase >= timeout_ms / 1000.0 + 0.7;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      for (int i : flapping) sim.agent(i).beating = true;
    });
    sim.TakeLatencies();
    const ProcSample c0 = ReadProc(cpid);
    const auto t0 = SteadyClock::now();
    int most_dead_healthy = 0;
    bool recreated = false;
    double recreate_s = 0;
    while (Seconds(SteadyClock::now() - t0) < flap_s) {
      if (!recreated && Seconds(SteadyClock::now() - t0) > flap_s / 3.0) {
        const auto [first, workers] = jobs.size() > 2 ? jobs[2] : jobs.back();
        const std::string id = "job" + std::to_string(workers);
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        v1::DeleteJobRequest del;
        del.set_job_id(id);
        v1::DeleteJobResponse ignored;
        sim.control().DeleteJob(&ctx, del, &ignored);
        double delivered = 0;
        uint64_t version = 0;
        create(id, first, workers, &recreate_s, &delivered, &version);
        recreated = true;
      }
      int dead_healthy = 0;
      v1::ListNodesRequest req;
      do {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        v1::ListNodesResponse page;
        if (!sim.control().ListNodes(&ctx, req, &page).ok()) break;
        for (const auto& n : page.nodes()) {
          // The death phase's node beats again, but is dead until its next heartbeat is due.
          const int i = std::stoi(n.node_id().substr(1));
          if (n.state() == v1::NODE_STATE_DEAD && !flapping.contains(i) && i != victim) {
            ++dead_healthy;
          }
        }
        req.set_page_token(page.next_page_token());
      } while (!req.page_token().empty());
      most_dead_healthy = std::max(most_dead_healthy, dead_healthy);
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
    stop = true;
    flapper.join();
    const double wall = Seconds(SteadyClock::now() - t0);
    uint64_t failed = 0;
    const std::vector<double> lat = sim.TakeLatencies(&failed);
    Row r{"flapping", {}, {}};
    r.values = {{"flappers", flappers},
                {"controller_cores", (ReadProc(cpid).cpu_s - c0.cpu_s) / wall},
                {"heartbeat_p50_ms", Percentile(lat, 0.5)},
                {"heartbeat_p99_ms", Percentile(lat, 0.99)},
                {"heartbeats_failed", failed},
                {"most_healthy_nodes_dead", most_dead_healthy},
                {"recreate_rpc_s", recreate_s}};
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "%d flapping: hb p50 %.2f ms p99 %.2f ms, controller %.2f cores, healthy nodes "
                  "seen dead: %d, job re-created in %.3f s",
                  flappers, Percentile(lat, 0.5), Percentile(lat, 0.99),
                  r.values["controller_cores"].get<double>(), most_dead_healthy, recreate_s);
    r.text = buf;
    rows.push_back(r);
  }

  out["load_average_after"] = LoadAverage();
  out["controller_rss_mb_end"] = ReadProc(cpid).rss_mb;
  std::printf(
      "tributary-scale-bench: %d agents, 1 connection %s, heartbeats every %d ms, "
      "liveness timeout %d ms; load average before %s, after %s\n",
      agents, connections > 0 ? "shared" : "each", heartbeat_ms, timeout_ms, load_before.c_str(),
      out["load_average_after"].get<std::string>().c_str());
  std::printf("%-10s | %s\n", "phase", "result");
  std::printf("-----------+---------------------------------------------------------------\n");
  for (const Row& r : rows) {
    std::printf("%-10s | %s\n", r.phase.c_str(), r.text.c_str());
    out["phases"][r.phase] = r.values;
  }
  if (!json_file.empty()) {
    std::ofstream f(json_file);
    f << out.dump(2) << "\n";
  }
  return 0;
}
