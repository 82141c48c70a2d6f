// tributary-run: runs a training command as the processes of a Tributary job, in the spirit of
// horovodrun / bpslaunch / torchrun.
//
//   tributary-run --np 4 --procs-per-node 2 --spares 2 -- /usr/bin/python3 train.py args
#include <filesystem>
#include <iostream>
#include <map>

#include "CLI/CLI.hpp"
#include "client/launcher/launcher.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/tls_flags.h"

namespace {

// The folder of the running executable: the controller and agent binaries sit next to it.
std::string BinDir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

}  // namespace

int main(int argc, char** argv) {
  tributary::common::DisableMutexDeadlockDetection();
  namespace launcher = tributary::client::launcher;
  namespace v1 = tributary::v1;
  launcher::LaunchOptions o;
  o.bin_dir = BinDir();
  CLI::App app{
      "tributary-run: start a local Tributary cluster (or use --controller), create a job and "
      "run COMMAND as each of its processes, output prefixed with \"[rank] \"; exits non-zero "
      "when any process fails (after stopping the others).\nUsage: tributary-run [OPTIONS] -- "
      "COMMAND [ARGS...]"};
  app.add_option("--np", o.np, "training processes in all")->required()->check(CLI::PositiveNumber);
  app.add_option("--procs-per-node", o.procs_per_node,
                 "processes per worker node (agent); np must be a multiple of it")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--spares", o.spares, "spare nodes (summation servers only)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--controller", o.controller,
                 "use this controller (HOST:PORT) instead of starting a local cluster; then "
                 "--workers and --agents are required");
  app.add_option("--workers", o.workers, "with --controller: worker node ids in rank order")
      ->delimiter(',');
  app.add_option("--agents", o.agents,
                 "with --controller: each worker's agent address (unix:PATH), same order")
      ->delimiter(',');
  app.add_option("--job", o.job, "job id (default tributary-run-<pid>)");
  const std::map<std::string, v1::Algorithm> algorithms = {
      {"auto", v1::ALGORITHM_AUTO},
      {"push-pull", v1::ALGORITHM_PUSH_PULL},
      {"ring", v1::ALGORITHM_RING},
      {"halving-doubling", v1::ALGORITHM_HALVING_DOUBLING},
      {"recursive-doubling", v1::ALGORITHM_RECURSIVE_DOUBLING}};
  app.add_option("--algorithm", o.algorithm,
                 "auto, push-pull, ring, halving-doubling or recursive-doubling")
      ->transform(CLI::CheckedTransformer(algorithms).description(""))
      ->type_name("NAME");
  app.add_option("--timeout-ms", o.timeout_ms,
                 "deadline of one collective, ms (default: the controller's, 30000)");
  uint64_t partition_bytes = 0;
  app.add_option("--partition-bytes", partition_bytes, "largest chunk pushed to one server");
  std::string mode = "sync";
  app.add_option("--mode", mode,
                 "sync (collectives) or async (parameter server: init_params / push_delta / "
                 "pull_params)")
      ->check(CLI::IsMember({"sync", "async"}))
      ->capture_default_str();
  app.add_option("--staleness", o.staleness,
                 "async: SSP bound, deltas a rank may be ahead of the slowest (-1 unbounded, 0 "
                 "synchronous)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1 << 30));
  app.add_option("--delta-scale", o.delta_scale,
                 "async: the servers apply params += scale * delta (0: the default, 1)");
  int grace_ms = 5000;
  app.add_option("--stop-grace-ms", grace_ms,
                 "after a failure: SIGTERM to the others, SIGKILL after this many ms")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--run-dir", o.run_dir,
                 "local cluster: folder for sockets and logs, kept (default: a temporary one, "
                 "removed)");
  app.add_option("--nic-gbps", o.nic_gbps, "local cluster: NIC speed declared per node, Gbit/s")
      ->capture_default_str();
  app.add_option("--log-level", o.log_level, "local cluster: log level of controller and agents")
      ->capture_default_str();
  app.add_option("--bin-dir", o.bin_dir, "folder of tributary-controller and tributary-agent")
      ->capture_default_str();
  tributary::common::AddTlsFlags(app, o.tls, /*client=*/true);
  app.add_option("--tls-dir", o.tls_dir,
                 "local cluster: run it with mTLS, certificates from this folder (ca.crt, "
                 "controller.crt/.key, worker-I.crt/.key, spare-I.crt/.key, admin.crt/.key)")
      ->group("TLS");
  app.add_option("command", o.command, "the training command and its arguments (after --)")
      ->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (partition_bytes > 0) o.partition_bytes = partition_bytes;
  o.async_mode = mode == "async";
  o.stop_grace = std::chrono::milliseconds(grace_ms);
  absl::StatusOr<int> status = launcher::Launch(o);
  if (!status.ok()) {
    std::cerr << "tributary-run: error: " << status.status().message() << std::endl;
    return 1;
  }
  return *status;
}
