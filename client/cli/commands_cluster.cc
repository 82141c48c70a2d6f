// `tributary local-cluster` and `tributary bench`: a controller and agents as local processes,
// and an all-reduce sweep over them comparing plans with and without spare summation servers.
#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/commands.h"
#include "client/cli/sizes.h"
#include "client/cli/table.h"
#include "client/cluster/local_cluster.h"
#include "common/status_macros.h"

namespace tributary::client::cli {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;
void OnInterrupt(int) { g_interrupted = 1; }

struct ClusterFlags {
  int workers = 4;
  int spares = 2;
  // One speed for every node, or one per node (workers first, then spares), Gbit/s.
  std::vector<double> nic_gbps = {1};
  double sum_gbps = 0;
  bool emulate_nic = true;
  std::string transport = "auto";  // the agents' --transport
  std::string log_level = "warn";
  std::string run_dir;
  std::string topology_file;
};

void AddClusterFlags(CLI::App* cmd, ClusterFlags* f) {
  cmd->add_option("--workers", f->workers, "worker nodes (agents that serve training processes)")
      ->capture_default_str();
  cmd->add_option("--spares", f->spares, "spare CPU nodes (summation servers only)")
      ->capture_default_str();
  cmd->add_option("--nic-gbps", f->nic_gbps,
                  "declared NIC speed, Gbit/s: one value for every node, or one per node "
                  "(workers first, then spares), comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--sum-gbps", f->sum_gbps, "declared summation rate, GB/s (0 = measured)")
      ->capture_default_str();
  cmd->add_flag("--emulate-nic,!--no-emulate-nic", f->emulate_nic,
                "pace each agent's data-plane egress to its NIC speed (loopback is otherwise "
                "CPU-bound)")
      ->capture_default_str();
  cmd->add_option("--transport", f->transport,
                  "the agents' data-plane transport: tcp, ucx, or auto (tcp unless UCX_TLS allows "
                  "RDMA)")
      ->check(CLI::IsMember({"auto", "tcp", "ucx"}))
      ->capture_default_str();
  cmd->add_option("--agent-log-level", f->log_level, "log level of the controller and agents")
      ->capture_default_str();
  cmd->add_option("--run-dir", f->run_dir, "folder for sockets and logs (default: a temp dir)");
  cmd->add_option("--topology-file", f->topology_file,
                  "worker agents report this node topology (NCCL XML, nvidia-smi, JSON, YAML)");
}

absl::StatusOr<std::unique_ptr<LocalCluster>> StartCluster(const ClusterFlags& f) {
  LocalClusterOptions o;
  o.bin_dir = ExecutableDir();
  o.run_dir = f.run_dir;
  o.workers = f.workers;
  o.spares = f.spares;
  o.nic_gbps = f.nic_gbps;
  o.sum_gbps = f.sum_gbps;
  o.emulate_nic = f.emulate_nic;
  o.transport = f.transport;
  o.worker_topology_file = f.topology_file;
  o.log_level = f.log_level;
  return LocalCluster::Start(o);
}

absl::Status RunLocalCluster(const ClusterFlags& f, double run_for_s) {
  ASSIGN_OR_RETURN(auto cluster, StartCluster(f));
  std::printf("local cluster up: controller %s, logs in %s\n",
              cluster->controller_address().c_str(), cluster->run_dir().c_str());
  Table t({"node", "role", "NIC Gbit/s", "agent socket"});
  for (int i = 0; i < cluster->num_nodes(); ++i) {
    const double gbps = f.nic_gbps.size() == 1 ? f.nic_gbps[0] : f.nic_gbps[i];
    t.AddRow({cluster->node_id(i), i < f.workers ? "worker" : "spare", FormatFixed(gbps, 2),
              cluster->agent_address(i)});
  }
  std::printf("%s", t.Render().c_str());
  std::printf("try: tributary --controller %s nodes\nCtrl-C stops the cluster.\n",
              cluster->controller_address().c_str());
  std::fflush(stdout);
  std::signal(SIGINT, OnInterrupt);
  std::signal(SIGTERM, OnInterrupt);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(run_for_s);
  while (!g_interrupted && (run_for_s <= 0 || std::chrono::steady_clock::now() < end)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  cluster->Stop();
  std::printf("local cluster stopped\n");
  return absl::OkStatus();
}

struct BenchFlags {
  ClusterFlags cluster;
  std::string ks = "0,2";
  // Also run these algorithms among the workers alone (no summation servers): ring, hd, rd.
  std::string peers;
  int procs_per_node = 1;
  std::string sizes = "1M:16M";
  std::string dtype = "float32";
  int iters = 5;
  int warmup = 2;
  uint64_t partition_bytes = 0;  // 0: the planner's choice
  uint64_t credit_bytes = 0;
  std::string csv_path;
};

struct Row {
  uint64_t bytes = 0;
  uint64_t count = 0;
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  uint64_t wrong = 0;
};

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs one sweep over a job with at most `k` spare servers; returns rank 0's rows by size.
// One configuration of the sweep: push/pull with at most k spare servers, or another algorithm.
struct Config {
  std::string name;
  int k = 0;
  v1::Algorithm algorithm = v1::ALGORITHM_PUSH_PULL;
};

absl::StatusOr<std::map<uint64_t, Row>> RunSweep(LocalCluster& cluster, const BenchFlags& f,
                                                 const GlobalOptions& global, const Config& config,
                                                 uint64_t max_bytes, v1::JobPlan* plan_out) {
  const int k = config.k;
  GlobalOptions g = global;
  g.controller = cluster.controller_address();
  ControllerClient controller(g);
  std::string job = absl::StrCat("bench-", config.name);
  for (char& ch : job) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-') ch = '-';
  }
  v1::CreateJobRequest req;
  req.set_job_id(job);
  for (const auto& w : cluster.worker_node_ids()) req.mutable_spec()->add_worker_nodes(w);
  req.mutable_spec()->set_procs_per_node(f.procs_per_node);
  req.mutable_spec()->set_max_spare_nodes(k);
  req.mutable_spec()->set_partition_bytes(f.partition_bytes);
  req.mutable_spec()->set_credit_bytes(f.credit_bytes);
  req.mutable_spec()->set_model_bytes(max_bytes);
  req.mutable_spec()->set_op_timeout_ms(120000);
  req.mutable_spec()->set_algorithm(config.algorithm);
  ASSIGN_OR_RETURN(v1::Job created, controller.CreateJob(req));
  *plan_out = created.plan();
  int spares_used = 0;
  for (const auto& s : created.plan().servers()) spares_used += !s.is_worker();
  std::printf(
      "\n## %s: %d summation servers (%d spare), partition %s, credit %s, predicted %s vs ring "
      "%s for %s\n",
      config.name.c_str(), created.plan().servers_size(), spares_used,
      FormatBytes(created.plan().partition_bytes()).c_str(),
      FormatBytes(created.plan().credit_bytes()).c_str(),
      FormatFixed(created.plan().predicted_seconds(), 3).c_str(),
      FormatFixed(created.plan().ring_seconds(), 3).c_str(), FormatBytes(max_bytes).c_str());
  std::fflush(stdout);

  std::vector<std::pair<pid_t, std::string>> procs;
  for (int node = 0; node < static_cast<int>(cluster.worker_node_ids().size()); ++node) {
    for (int r = 0; r < f.procs_per_node; ++r) {
      const std::string log = absl::StrCat(cluster.run_dir(), "/", job, "-", node, "-", r, ".out");
      std::filesystem::remove(log);
      ASSIGN_OR_RETURN(pid_t pid, SpawnProcess({ExecutableDir() + "/tributary",
                                                "bench-rank",
                                                "--agent",
                                                cluster.agent_address(node),
                                                "--job",
                                                job,
                                                "--local-rank",
                                                std::to_string(r),
                                                "--local-size",
                                                std::to_string(f.procs_per_node),
                                                "--sizes",
                                                f.sizes,
                                                "--dtype",
                                                f.dtype,
                                                "--iters",
                                                std::to_string(f.iters),
                                                "--warmup",
                                                std::to_string(f.warmup),
                                                "--csv",
                                                "--log-level",
                                                "warn"},
                                               log));
      procs.emplace_back(pid, log);
    }
  }
  absl::Status status;
  for (size_t i = 0; i < procs.size(); ++i) {
    const int code = WaitProcess(procs[i].first, std::chrono::minutes(10));
    if (code != 0) {
      std::fprintf(stderr, "bench process %zu exited with %d:\n%s\n", i, code,
                   ReadFile(procs[i].second).c_str());
      status = absl::InternalError(
          absl::StrCat("bench process ", i, " of k = ", k, " failed with exit code ", code));
    }
  }
  (void)controller.DeleteJob(job);
  std::map<uint64_t, Row> rows;
  for (const auto& line : absl::StrSplit(ReadFile(procs[0].second), '\n')) {
    if (!absl::StartsWith(line, "CSV,")) {
      if (!line.empty()) std::printf("%s\n", std::string(line).c_str());
      continue;
    }
    std::vector<std::string> c = absl::StrSplit(line, ',');
    if (c.size() != 9 || c[1] == "size") continue;
    Row r;
    (void)absl::SimpleAtoi(c[1], &r.bytes);
    (void)absl::SimpleAtoi(c[2], &r.count);
    (void)absl::SimpleAtod(c[5], &r.time_us);
    (void)absl::SimpleAtod(c[6], &r.algbw);
    (void)absl::SimpleAtod(c[7], &r.busbw);
    (void)absl::SimpleAtoi(c[8], &r.wrong);
    rows[r.bytes] = r;
  }
  std::fflush(stdout);
  if (!status.ok()) return status;
  return rows;
}

absl::Status RunBench(const BenchFlags& f, const GlobalOptions& global) {
  // Ring and halving-doubling first: the first configuration is the baseline.
  std::vector<Config> configs;
  for (absl::string_view a : absl::StrSplit(f.peers, ',', absl::SkipEmpty())) {
    if (a == "ring") {
      configs.push_back({"ring", 0, v1::ALGORITHM_RING});
    } else if (a == "hd") {
      configs.push_back({"halving-doubling", 0, v1::ALGORITHM_HALVING_DOUBLING});
    } else if (a == "rd") {
      configs.push_back({"recursive-doubling", 0, v1::ALGORITHM_RECURSIVE_DOUBLING});
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--algorithms: '", std::string(a), "' is none of ring, hd, rd"));
    }
  }
  for (absl::string_view k : absl::StrSplit(f.ks, ',', absl::SkipEmpty())) {
    int v;
    if (!absl::SimpleAtoi(k, &v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--k: '", std::string(k), "' is not a count of spare nodes"));
    }
    configs.push_back({absl::StrCat("push-pull k=", v), v, v1::ALGORITHM_PUSH_PULL});
  }
  if (configs.empty())
    return absl::InvalidArgumentError("nothing to run: give --k or --algorithms");
  ASSIGN_OR_RETURN(std::vector<uint64_t> sizes, ParseSizeList(f.sizes));
  if (sizes.empty()) return absl::InvalidArgumentError("--sizes is empty");
  const uint64_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  ASSIGN_OR_RETURN(auto cluster, StartCluster(f.cluster));
  std::printf(
      "# tributary bench: %d worker nodes x %d processes, %d spare nodes, NIC %s Gbit/s"
      " (%s), partition %s, credit %s, %s, %d iterations after %d warm-ups\n",
      f.cluster.workers, f.procs_per_node, f.cluster.spares,
      absl::StrJoin(f.cluster.nic_gbps, ",").c_str(),
      f.cluster.emulate_nic ? "emulated by pacing" : "not enforced",
      f.partition_bytes ? FormatBytes(f.partition_bytes).c_str() : "auto",
      f.credit_bytes ? FormatBytes(f.credit_bytes).c_str() : "auto", f.dtype.c_str(), f.iters,
      f.warmup);

  std::vector<std::map<uint64_t, Row>> results(configs.size());
  std::vector<v1::JobPlan> plans(configs.size());
  absl::Status status;
  for (size_t c = 0; c < configs.size(); ++c) {
    auto rows = RunSweep(*cluster, f, global, configs[c], max_bytes, &plans[c]);
    if (!rows.ok()) {
      status = rows.status();
      continue;
    }
    results[c] = *std::move(rows);
  }
  cluster->Stop();

  // Side by side: measured against the bandwidth model and against the first configuration.
  // Push/pull's model is the plan's; ring and halving-doubling move 2(n-1)/n of the tensor
  // through every NIC, like push/pull without spares.
  const std::string& base = configs[0].name;
  Table t({"size", "config", "time(us)", "algbw(GB/s)", "predicted(us)", "measured/predicted",
           "speed-up vs " + base, "predicted speed-up", "#wrong"});
  std::ofstream csv;
  if (!f.csv_path.empty()) {
    csv.open(f.csv_path);
    csv << "size,config,time_us,algbw,predicted_us,speedup,predicted_speedup,wrong\n";
  }
  auto seconds_per_byte = [&](size_t c) {
    return configs[c].algorithm == v1::ALGORITHM_PUSH_PULL ? plans[c].predicted_seconds_per_byte()
                                                           : plans[c].ring_seconds_per_byte();
  };
  uint64_t wrong = 0;
  for (uint64_t size : sizes) {
    for (size_t c = 0; c < configs.size(); ++c) {
      auto it = results[c].find(size);
      if (it == results[c].end()) continue;
      const Row& r = it->second;
      const double predicted_us = seconds_per_byte(c) * size * 1e6;
      const double base_us = results[0].contains(size) ? results[0][size].time_us : std::nan("");
      const double predicted_speedup =
          seconds_per_byte(c) > 0 ? seconds_per_byte(0) / seconds_per_byte(c) : std::nan("");
      t.AddRow({FormatBytes(size), configs[c].name, FormatFixed(r.time_us, 1),
                FormatFixed(r.algbw, 3), FormatFixed(predicted_us, 1),
                FormatFixed(r.time_us / predicted_us, 2), FormatFixed(base_us / r.time_us, 2),
                FormatFixed(predicted_speedup, 2), std::to_string(r.wrong)});
      if (csv) {
        csv << size << "," << configs[c].name << "," << r.time_us << "," << r.algbw << ","
            << predicted_us << "," << base_us / r.time_us << "," << predicted_speedup << ","
            << r.wrong << "\n";
      }
      wrong += r.wrong;
    }
  }
  std::printf("\n# Summary (predicted = the bandwidth model of DESIGN.md 1.1; no latency term)\n%s",
              t.Render().c_str());
  std::printf("# #wrong total: %llu\n", static_cast<unsigned long long>(wrong));
  if (!status.ok()) return status;
  if (wrong > 0) return absl::DataLossError(absl::StrCat(wrong, " wrong elements"));
  return absl::OkStatus();
}

}  // namespace

void AddLocalClusterCommand(CLI::App& app, GlobalOptions& global) {
  auto* cmd = app.add_subcommand("local-cluster",
                                 "start a controller and agents on loopback; Ctrl-C stops them");
  auto flags = std::make_shared<ClusterFlags>();
  auto run_for = std::make_shared<double>(0);
  AddClusterFlags(cmd, flags.get());
  cmd->add_option("--run-for", *run_for, "stop after this many seconds (0 = until Ctrl-C)");
  SetAction(cmd, global, [flags, run_for] { return RunLocalCluster(*flags, *run_for); });
}

void AddBenchCommand(CLI::App& app, GlobalOptions& global) {
  auto* cmd = app.add_subcommand(
      "bench",
      "start a local cluster and run an all-reduce sweep for each number of spare servers");
  auto f = std::make_shared<BenchFlags>();
  AddClusterFlags(cmd, &f->cluster);
  cmd->add_option("--k", f->ks, "comma-separated numbers of spare summation nodes to try")
      ->capture_default_str();
  cmd->add_option("--algorithms", f->peers,
                  "also run these among the workers alone: ring, hd, rd (comma-separated)");
  cmd->add_option("--procs-per-node", f->procs_per_node, "training processes per worker node")
      ->capture_default_str();
  cmd->add_option("--sizes", f->sizes, "sizes, MIN:MAX (powers of 2) or a comma list")
      ->capture_default_str()
      ->check(ByteSizeList());
  cmd->add_option("--dtype", f->dtype, "element type")->capture_default_str();
  cmd->add_option("--iters", f->iters, "timed iterations per size")->capture_default_str();
  cmd->add_option("--warmup", f->warmup, "untimed iterations per size")->capture_default_str();
  cmd->add_option("--partition-bytes", f->partition_bytes,
                  "chunk size, e.g. 4M (0: the planner's choice)")
      ->capture_default_str()
      ->transform(ByteSize());
  cmd->add_option("--credit-bytes", f->credit_bytes,
                  "bytes a worker node may have in flight, e.g. 16M (0: the planner's choice)")
      ->capture_default_str()
      ->transform(ByteSize());
  cmd->add_option("--csv", f->csv_path, "also write the summary as CSV to this file");
  SetAction(cmd, global, [f, &global] { return RunBench(*f, global); });
}

}  // namespace tributary::client::cli
