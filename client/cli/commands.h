// The subcommands of the `tributary` CLI. Each Add*Command registers one subcommand (its
// options and its action) on the app; main.cc calls them all. A new subcommand goes in its own
// commands_<name>.cc with its Add function declared here.
#pragma once

#include "CLI/CLI.hpp"
#include "client/cli/cli_common.h"

namespace tributary::client::cli {

// `tributary nodes [--json]`: the controller's node registry.
void AddNodesCommand(CLI::App& app, GlobalOptions& global);
// `tributary jobs [--json]`: every job with its plan summary.
void AddJobsCommand(CLI::App& app, GlobalOptions& global);
// `tributary plan JOB | --workers a,b,...`: a plan's split and predicted time.
void AddPlanCommand(CLI::App& app, GlobalOptions& global);
// `tributary create-job JOB --workers a,b --procs-per-node R ...`.
void AddCreateJobCommand(CLI::App& app, GlobalOptions& global);
// `tributary delete-job JOB`.
void AddDeleteJobCommand(CLI::App& app, GlobalOptions& global);
// `tributary job-stats JOB [--what-if 8:2,16:0] [--json]`: observed communication vs the plan's
// prediction, per node, and the planner's what-if rows (GetJobStats).
void AddJobStatsCommand(CLI::App& app, GlobalOptions& global);
// `tributary bench-rank --agent ... --job J ...`: one process of a collective sweep.
void AddBenchRankCommand(CLI::App& app, GlobalOptions& global);

// `tributary chaos --trials N [--faults ...] [--json]`: fault injection against a local
// cluster; and `tributary chaos-rank`, one process of its workload.
void AddChaosCommands(CLI::App& app, GlobalOptions& global);

// `tributary topo [--topology F] [--gpus 0,1,2,5] [--links nvlink|all] [--json]`: a node's
// topology (a file or this machine), its intra-node strategy, tree packings and ring.
void AddTopoCommand(CLI::App& app, GlobalOptions& global);

// `tributary local-cluster`: a controller and agents on loopback until Ctrl-C.
void AddLocalClusterCommand(CLI::App& app, GlobalOptions& global);
// `tributary bench`: a local cluster and an all-reduce sweep for several numbers of spares.
void AddBenchCommand(CLI::App& app, GlobalOptions& global);

}  // namespace tributary::client::cli
