// `tributary chaos`: the records a chaos workload rank writes, and what a trial's records say
// (hangs, wrong sums, errors, recovery). The orchestration is in commands_chaos.cc; this part is
// pure, so that the verdicts are unit-tested.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tributary::client::cli {

// The faults `tributary chaos` injects, by name.
inline constexpr const char* kChaosFaults[] = {
    "spare-kill",            // SIGKILL of a spare summation server's agent
    "spare-freeze",          // SIGSTOP of a spare past the op deadline, then SIGCONT
    "controller-restart",    // SIGKILL of the controller, restarted on its database
    "process-restart",       // SIGKILL of a training process, a replacement started at once
    "worker-agent-kill",     // SIGKILL of a worker node's agent (not restarted)
    "worker-agent-restart",  // SIGKILL of a worker node's agent, started again at once
};
// Faults after which the workload is expected to run again (the others only have to fail
// cleanly: a dead worker node degrades a non-elastic job until it returns; an elastic job goes
// on without it).
bool ChaosFaultRecovers(std::string_view fault, bool elastic = false);

// One iteration of one rank: a step agreement (an all-reduce in which every rank contributes
// its step) then the workload's tensors, every element checked. Times are steady-clock
// milliseconds (CLOCK_MONOTONIC: one clock for every process of the machine).
struct ChaosIteration {
  uint32_t rank = 0;   // the global rank it ran as
  uint32_t world = 0;  // the world size it ran with (an elastic job's changes; 0 = unknown)
  uint64_t step = 0;   // the agreed step (meaningful when ok)
  int64_t start_ms = 0;
  int64_t end_ms = 0;
  int64_t max_op_ms = 0;  // the slowest single collective of the iteration
  bool ok = false;
  std::string error;   // the first error, "CODE: message"
  uint64_t wrong = 0;  // elements that differ from the exact sum
};

std::string FormatChaosIteration(const ChaosIteration& it);  // one JSON line
// Parses FormatChaosIteration's line; INVALID_ARGUMENT for anything else.
absl::StatusOr<ChaosIteration> ParseChaosIteration(std::string_view line);

// Everything one trial produced.
struct ChaosTrial {
  std::string fault;
  bool elastic = false;
  uint32_t world_size = 0;
  int64_t op_deadline_ms = 0;
  int64_t fault_ms = 0;  // when the fault was injected
  int64_t stop_ms = 0;   // when the ranks were told to stop
  // Ranks whose process had not exited 2 x the op deadline after stop_ms.
  uint32_t stuck_processes = 0;
  std::vector<ChaosIteration> iterations;  // every rank's, any order
};

struct ChaosVerdict {
  // A collective that took over 2 x the op deadline, or a process stuck at the end.
  uint32_t hangs = 0;
  uint64_t wrong_elements = 0;
  uint64_t failed_iterations = 0;  // errors surfaced to the training processes
  // Failed iterations that ended after the ranks were told to stop (stop_ms): a rank that saw the
  // stop before starting its next step leaves the others' step to its deadline. The end of the
  // trial, not an effect of the fault: counted apart, never hidden.
  uint64_t failed_at_stop = 0;
  // From the fault to the end of the first step after it that succeeded on every rank (of the
  // world size it ran with).
  std::optional<int64_t> recovery_ms;
  // OK iterations of different ranks that claim the same step with different outcomes never
  // happen by construction; this counts steps some ranks completed and others failed.
  uint64_t split_steps = 0;
  // ChaosFaultRecovers(fault, elastic) of the trial.
  bool expected_to_recover = false;
};

ChaosVerdict JudgeChaosTrial(const ChaosTrial& trial);

// Per fault: trials, the sums of the verdicts, and the recovery distribution.
struct ChaosSummary {
  std::string fault;
  uint32_t trials = 0;
  uint32_t hangs = 0;
  uint32_t trials_with_wrong_sums = 0;
  uint64_t failed_iterations = 0;
  uint64_t failed_at_stop = 0;
  uint32_t recovered = 0;  // trials with a recovery_ms
  uint32_t expected_to_recover = 0;
  std::optional<int64_t> recovery_p50_ms, recovery_p99_ms, recovery_max_ms;
};

std::vector<ChaosSummary> SummarizeChaos(
    const std::vector<std::pair<std::string, ChaosVerdict>>& trials);

}  // namespace tributary::client::cli
