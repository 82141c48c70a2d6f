// suite_create_job: creates (or deletes) a job with a chosen algorithm for the emulated-cluster
// benchmark suite (bench/suite/run.py). `tributary create-job` has no --algorithm flag, so the
// suite uses this; it prints one line "PLAN,<servers>,<spares used>,<predicted s>,<ring s>".
//
//   suite_create_job --controller H:P --job ID --workers a,b,c [--spares K]
//       [--algorithm push-pull|ring|hd|auto] [--model-bytes N] [--partition-bytes N]
//       [--credit-bytes N] [--timeout-ms N]
//   suite_create_job --controller H:P --delete ID
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "client/cli/cli_common.h"

namespace {

using tributary::client::cli::ControllerClient;
using tributary::client::cli::GlobalOptions;

int Usage() {
  std::fprintf(stderr,
               "usage: suite_create_job --controller H:P (--delete ID | --job ID --workers a,b "
               "[--spares K] [--algorithm push-pull|ring|hd|auto] [--model-bytes N] "
               "[--partition-bytes N] [--credit-bytes N] [--timeout-ms N])\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  GlobalOptions global;
  global.rpc_timeout_ms = 30000;
  std::string job, del, workers, algorithm = "push-pull";
  long spares = -1, model = 0, partition = 0, credit = 0, timeout = 120000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--controller")
      global.controller = value;
    else if (flag == "--job")
      job = value;
    else if (flag == "--delete")
      del = value;
    else if (flag == "--workers")
      workers = value;
    else if (flag == "--algorithm")
      algorithm = value;
    else if (flag == "--spares")
      spares = std::atol(value);
    else if (flag == "--model-bytes")
      model = std::atol(value);
    else if (flag == "--partition-bytes")
      partition = std::atol(value);
    else if (flag == "--credit-bytes")
      credit = std::atol(value);
    else if (flag == "--timeout-ms")
      timeout = std::atol(value);
    else
      return Usage();
  }
  if (argc % 2 != 1) return Usage();
  ControllerClient controller(global);
  if (!del.empty()) {
    absl::Status status = controller.DeleteJob(del);
    if (!status.ok()) std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
    return status.ok() ? 0 : 1;
  }
  if (job.empty() || workers.empty()) return Usage();
  tributary::v1::CreateJobRequest req;
  req.set_job_id(job);
  auto* spec = req.mutable_spec();
  for (const auto& w : absl::StrSplit(workers, ',')) spec->add_worker_nodes(std::string(w));
  spec->set_procs_per_node(1);
  if (spares >= 0) spec->set_max_spare_nodes(static_cast<uint32_t>(spares));
  if (model > 0) spec->set_model_bytes(model);
  if (partition > 0) spec->set_partition_bytes(partition);
  if (credit > 0) spec->set_credit_bytes(credit);
  spec->set_op_timeout_ms(static_cast<uint32_t>(timeout));
  if (algorithm == "push-pull")
    spec->set_algorithm(tributary::v1::ALGORITHM_PUSH_PULL);
  else if (algorithm == "ring")
    spec->set_algorithm(tributary::v1::ALGORITHM_RING);
  else if (algorithm == "hd")
    spec->set_algorithm(tributary::v1::ALGORITHM_HALVING_DOUBLING);
  else if (algorithm == "auto")
    spec->set_algorithm(tributary::v1::ALGORITHM_AUTO);
  else
    return Usage();
  auto created = controller.CreateJob(req);
  if (!created.ok()) {
    std::fprintf(stderr, "error: %s\n", created.status().ToString().c_str());
    return 1;
  }
  int spares_used = 0;
  for (const auto& s : created->plan().servers()) spares_used += !s.is_worker();
  std::printf("PLAN,%d,%d,%.6f,%.6f\n", created->plan().servers_size(), spares_used,
              created->plan().predicted_seconds(), created->plan().ring_seconds());
  return 0;
}
