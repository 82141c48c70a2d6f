// tributary: the command-line tool for operators and benchmarks.
#include <iostream>

#include "CLI/CLI.hpp"
#include "client/cli/cli_common.h"
#include "client/cli/commands.h"
#include "common/rpc/grpc_status.h"

int main(int argc, char** argv) {
  tributary::common::DisableMutexDeadlockDetection();
  namespace cli = tributary::client::cli;
  CLI::App app{"tributary: inspect and drive a Tributary cluster"};
  app.require_subcommand(1);
  app.fallthrough();  // Global options may also follow the subcommand.
  cli::GlobalOptions global;
  cli::AddGlobalOptions(app, global);
  cli::AddNodesCommand(app, global);
  cli::AddJobsCommand(app, global);
  cli::AddPlanCommand(app, global);
  cli::AddCreateJobCommand(app, global);
  cli::AddDeleteJobCommand(app, global);
  cli::AddJobStatsCommand(app, global);
  cli::AddBenchRankCommand(app, global);
  cli::AddLocalClusterCommand(app, global);
  cli::AddBenchCommand(app, global);
  cli::AddTopoCommand(app, global);
  cli::AddChaosCommands(app, global);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;
  }
  if (!global.status.ok()) {
    std::cerr << "error: " << global.status.message() << std::endl;
    return 1;
  }
  return 0;
}
