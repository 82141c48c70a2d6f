// `tributary jobs`, `plan`, `create-job`, `delete-job` and `job-stats`.
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/commands.h"
#include "client/cli/job_stats_view.h"
#include "client/cli/plan_view.h"
#include "client/cli/sizes.h"
#include "client/cli/table.h"
#include "common/status_macros.h"

namespace tributary::client::cli {
namespace {

std::string StateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_RUNNING:
      return "running";
    case v1::JOB_STATE_DEGRADED:
      return "degraded";
    default:
      return "unknown";
  }
}

// The job algorithms by their command-line names.
const std::map<std::string, v1::Algorithm>& AlgorithmNames() {
  static const auto* names = new std::map<std::string, v1::Algorithm>{
      {"auto", v1::ALGORITHM_AUTO},
      {"push-pull", v1::ALGORITHM_PUSH_PULL},
      {"ring", v1::ALGORITHM_RING},
      {"halving-doubling", v1::ALGORITHM_HALVING_DOUBLING},
      {"recursive-doubling", v1::ALGORITHM_RECURSIVE_DOUBLING},
  };
  return *names;
}

// A size option ("64M", checked and converted by CLI11 at parse time); nullopt: not given.
void AddSizeOption(CLI::App* command, const std::string& name, std::optional<uint64_t>& value,
                   const std::string& help) {
  command
      ->add_option_function<uint64_t>(
          name, [&value](const uint64_t& bytes) { value = bytes; }, help)
      ->transform(ByteSize());
}

// Options of the commands that describe a job spec (create-job, plan --workers).
struct SpecFlags {
  std::vector<std::string> workers;
  uint32_t procs_per_node = 1;
  int spares = -1;  // -1: as many as help.
  v1::Algorithm algorithm = v1::ALGORITHM_AUTO;
  std::optional<uint64_t> partition_bytes;
  std::optional<uint64_t> credit_bytes;
  bool fixed_partition = false;
  uint32_t timeout_ms = 0;
  std::optional<uint64_t> model_bytes;
  std::string mode = "sync";
  int32_t staleness = -1;
  std::optional<double> delta_scale;
  bool elastic = false;
  std::optional<uint64_t> fusion_bytes;
  uint32_t fusion_cycle_us = 0;

  void Add(CLI::App* command, bool with_run_options) {
    command->add_option("--workers", workers, "worker nodes in rank order, comma-separated")
        ->delimiter(',');
    command->add_option("--procs-per-node", procs_per_node, "training processes per worker node")
        ->check(CLI::PositiveNumber);
    command->add_option("--spares", spares, "most spare nodes to use as summation servers")
        ->check(CLI::NonNegativeNumber);
    command
        ->add_option("--algorithm", algorithm,
                     "auto (by size from a cost model; the default), push-pull, ring, "
                     "halving-doubling or recursive-doubling (all-reduce only: other "
                     "collectives of the job run ring)")
        ->transform(CLI::CheckedTransformer(AlgorithmNames()).description(""))
        ->type_name("NAME");
    AddSizeOption(command, "--partition-bytes", partition_bytes,
                  "largest chunk pushed to one server, e.g. 4M (default: the planner's choice, "
                  "64 chunks of --model-bytes per server within [64 KiB, 4 MiB])");
    AddSizeOption(command, "--model-bytes", model_bytes,
                  "gradient size the predicted times are for, e.g. 64M (default 64 MiB)");
    if (with_run_options) {
      AddSizeOption(command, "--credit-bytes", credit_bytes,
                    "bytes a worker node may have in flight (default: 4 partitions and at least "
                    "2 MiB per server)");
      AddSizeOption(command, "--fusion-bytes", fusion_bytes,
                    "tensor fusion: all-reduces smaller than this run fused, up to this much "
                    "per fused collective; 0 turns fusion off (default: one partition, at "
                    "least 4 MiB)");
      command
          ->add_option("--fusion-cycle-us", fusion_cycle_us,
                       "tensor fusion: the longest a fused group's first tensor may wait for "
                       "its last, us (default 0: measured)")
          ->check(CLI::Range(0, 1000000));
      command->add_flag("--fixed-partition", fixed_partition,
                        "keep every tensor's chunk size at --partition-bytes (no online tuning)");
      command->add_option("--timeout-ms", timeout_ms,
                          "deadline of one collective, ms (default 30000)");
      command
          ->add_option("--mode", mode,
                       "sync (collectives; the default) or async (parameter server: "
                       "init_params / push_delta / pull_params)")
          ->check(CLI::IsMember({"sync", "async"}));
      command
          ->add_option("--staleness", staleness,
                       "async: SSP bound, deltas a worker may be ahead of the slowest "
                       "(-1 unbounded, the default; 0 synchronous)")
          ->check(CLI::Range(-1, 1 << 30));
      command->add_option_function<double>(
          "--delta-scale", [this](const double& s) { delta_scale = s; },
          "async: the servers apply params += scale * delta (default 1)");
      command->add_flag("--elastic", elastic,
                        "go on with the surviving worker nodes when one dies (new ranks and "
                        "size; the processes catch the membership change and resync) instead "
                        "of failing until it is back");
    }
  }

  absl::StatusOr<v1::JobSpec> ToSpec() const {
    v1::JobSpec spec;
    if (workers.empty()) return absl::InvalidArgumentError("--workers must name at least one node");
    for (const auto& worker : workers) spec.add_worker_nodes(worker);
    spec.set_procs_per_node(procs_per_node);
    if (spares >= 0) spec.set_max_spare_nodes(static_cast<uint32_t>(spares));
    spec.set_algorithm(algorithm);
    if (partition_bytes) spec.set_partition_bytes(*partition_bytes);
    if (credit_bytes) spec.set_credit_bytes(*credit_bytes);
    spec.set_fixed_partition(fixed_partition);
    if (model_bytes) spec.set_model_bytes(*model_bytes);
    spec.set_op_timeout_ms(timeout_ms);
    spec.set_elastic(elastic);
    if (fusion_bytes) spec.set_fusion_bytes(*fusion_bytes);
    spec.set_fusion_cycle_us(fusion_cycle_us);
    if (mode == "async") {
      spec.set_mode(v1::JOB_MODE_ASYNC);
      spec.set_staleness(staleness);
      if (delta_scale) spec.set_delta_scale(*delta_scale);
    } else if (delta_scale) {
      return absl::InvalidArgumentError("--delta-scale needs --mode async");
    }
    return spec;
  }
};

absl::Status PrintPlan(const v1::Job& job, std::optional<uint64_t> model_bytes, bool json) {
  const uint64_t bytes = PlanModelBytes(job, model_bytes);
  if (json) {
    std::cout << PlanToJson(job, bytes).dump(2) << std::endl;
  } else {
    std::cout << RenderPlan(job, bytes);
  }
  return absl::OkStatus();
}

// --- jobs ------------------------------------------------------------------------------------

absl::Status RunJobs(GlobalOptions& global, bool json) {
  ControllerClient controller(global);
  ASSIGN_OR_RETURN(v1::ListJobsResponse response, controller.ListJobs());
  if (json) {
    ASSIGN_OR_RETURN(std::string text, MessageToJson(response));
    std::cout << text << std::endl;
    return absl::OkStatus();
  }
  Table table(
      {"JOB", "STATE", "WORKERS", "PROCS/NODE", "SERVERS", "PLAN", "PREDICTED", "RING", "MESSAGE"});
  for (size_t c : {3, 5, 6, 7}) table.SetAlign(c, Table::Align::kRight);
  for (const v1::Job& job : response.jobs()) {
    const v1::JobPlan& plan = job.plan();
    std::vector<std::string> workers(job.spec().worker_nodes().begin(),
                                     job.spec().worker_nodes().end());
    int spares = 0;
    for (const auto& server : plan.servers()) spares += server.is_worker() ? 0 : 1;
    const uint64_t model_bytes = PlanModelBytes(job, std::nullopt);
    table.AddRow({job.job_id(), StateName(job.state()), JoinOrDash(workers),
                  std::to_string(job.spec().procs_per_node()),
                  absl::StrCat(plan.servers_size(), " (", spares, " spare)"),
                  std::to_string(plan.version()),
                  FormatSeconds(PredictedSeconds(plan, model_bytes)),
                  FormatSeconds(RingSeconds(plan, model_bytes)), job.message()});
  }
  std::cout << table.Render();
  if (table.num_rows() == 0) std::cout << "(no jobs)" << std::endl;
  return absl::OkStatus();
}

// --- plan ------------------------------------------------------------------------------------

struct PlanFlags {
  std::string job_id;
  SpecFlags spec;
  bool json = false;
};

absl::Status RunPlan(GlobalOptions& global, const PlanFlags& flags) {
  if (flags.job_id.empty() == flags.spec.workers.empty()) {
    return absl::InvalidArgumentError(
        "give either an existing JOB or --workers a,b,... to preview a plan");
  }
  const std::optional<uint64_t> model_bytes = flags.spec.model_bytes;
  ControllerClient controller(global);
  v1::Job job;
  if (!flags.job_id.empty()) {
    ASSIGN_OR_RETURN(job, controller.GetJob(flags.job_id));
  } else {
    v1::CreateJobRequest request;
    request.set_job_id("preview");
    request.set_dry_run(true);
    ASSIGN_OR_RETURN(*request.mutable_spec(), flags.spec.ToSpec());
    ASSIGN_OR_RETURN(job, controller.CreateJob(request));
  }
  return PrintPlan(job, model_bytes, flags.json);
}

// --- create-job / delete-job -----------------------------------------------------------------

struct CreateFlags {
  std::string job_id;
  SpecFlags spec;
  bool json = false;
};

absl::Status RunCreateJob(GlobalOptions& global, const CreateFlags& flags) {
  v1::CreateJobRequest request;
  request.set_job_id(flags.job_id);
  ASSIGN_OR_RETURN(*request.mutable_spec(), flags.spec.ToSpec());
  ControllerClient controller(global);
  ASSIGN_OR_RETURN(v1::Job job, controller.CreateJob(request));
  if (flags.json) {
    ASSIGN_OR_RETURN(std::string text, MessageToJson(job));
    std::cout << text << std::endl;
    return absl::OkStatus();
  }
  std::cout << "created job " << job.job_id() << " (" << StateName(job.state()) << ")\n";
  return PrintPlan(job, std::nullopt, /*json=*/false);
}

absl::Status RunDeleteJob(GlobalOptions& global, const std::string& job_id) {
  ControllerClient controller(global);
  RETURN_IF_ERROR(controller.DeleteJob(job_id));
  std::cout << "deleted job " << job_id << std::endl;
  return absl::OkStatus();
}

// --- job-stats -------------------------------------------------------------------------------

struct JobStatsFlags {
  std::string job_id;
  std::string what_if;
  bool json = false;
};

absl::Status RunJobStats(GlobalOptions& global, const JobStatsFlags& flags) {
  v1::GetJobStatsRequest request;
  request.set_job_id(flags.job_id);
  ASSIGN_OR_RETURN(const auto pairs, ParseWhatIf(flags.what_if));
  for (const auto& [n, k] : pairs) {
    v1::WhatIf* w = request.add_what_if();
    w->set_workers(n);
    w->set_spares(k);
  }
  ControllerClient controller(global);
  ASSIGN_OR_RETURN(v1::JobStats stats, controller.GetJobStats(request));
  if (flags.json) {
    ASSIGN_OR_RETURN(std::string text, MessageToJson(stats));
    std::cout << text << std::endl;
    return absl::OkStatus();
  }
  std::cout << RenderJobStats(stats);
  return absl::OkStatus();
}

}  // namespace

void AddJobStatsCommand(CLI::App& app, GlobalOptions& global) {
  CLI::App* command = app.add_subcommand(
      "job-stats",
      "a job's observed communication (bandwidth, iteration time, communication fraction) "
      "against the plan's prediction, and what-if predictions for other worker / spare counts");
  auto flags = std::make_shared<JobStatsFlags>();
  command->add_option("job", flags->job_id, "job id")->required();
  command->add_option("--what-if", flags->what_if,
                      "WORKERS:SPARES pairs to predict, comma-separated (default: the job's n "
                      "with 0.. the spares available, n/2 and 2n)");
  command->add_flag("--json", flags->json, "print the GetJobStats response as JSON");
  SetAction(command, global, [&global, flags] { return RunJobStats(global, *flags); });
}

void AddJobsCommand(CLI::App& app, GlobalOptions& global) {
  CLI::App* command = app.add_subcommand("jobs", "list jobs with their plans");
  auto json = std::make_shared<bool>(false);
  command->add_flag("--json", *json, "print the ListJobs response as JSON");
  SetAction(command, global, [&global, json] { return RunJobs(global, *json); });
}

void AddPlanCommand(CLI::App& app, GlobalOptions& global) {
  CLI::App* command = app.add_subcommand(
      "plan", "show a job's split over summation servers, or preview one with --workers");
  auto flags = std::make_shared<PlanFlags>();
  command->add_option("job", flags->job_id, "an existing job");
  flags->spec.Add(command, /*with_run_options=*/false);
  command->add_flag("--json", flags->json, "print JSON");
  SetAction(command, global, [&global, flags] { return RunPlan(global, *flags); });
}

void AddCreateJobCommand(CLI::App& app, GlobalOptions& global) {
  CLI::App* command = app.add_subcommand("create-job", "create (and plan) a job");
  auto flags = std::make_shared<CreateFlags>();
  command->add_option("job", flags->job_id, "job id")->required();
  flags->spec.Add(command, /*with_run_options=*/true);
  command->get_option("--workers")->required();
  command->get_option("--procs-per-node")->required();
  command->add_flag("--json", flags->json, "print the created job as JSON");
  SetAction(command, global, [&global, flags] { return RunCreateJob(global, *flags); });
}

void AddDeleteJobCommand(CLI::App& app, GlobalOptions& global) {
  CLI::App* command = app.add_subcommand("delete-job", "delete a job (succeeds if it is gone)");
  auto job_id = std::make_shared<std::string>();
  command->add_option("job", *job_id, "job id")->required();
  SetAction(command, global, [&global, job_id] { return RunDeleteJob(global, *job_id); });
}

}  // namespace tributary::client::cli
