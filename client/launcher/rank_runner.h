// Runs the training processes of a job on this machine: one per rank, each in its own process
// group, with its output forwarded line by line under a "[rank] " prefix.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tributary::client::launcher {

// One training process: its global rank (the output prefix) and the environment variables it
// gets on top of (or instead of) the launcher's own.
struct RankLaunch {
  int rank = 0;
  std::map<std::string, std::string> env;
};

struct RunRanksOptions {
  // The command every rank runs (argv[0] is looked up on PATH).
  std::vector<std::string> command;
  // After a rank fails (or the launcher gets SIGINT/SIGTERM) the others get SIGTERM; those
  // still running after `stop_grace` get SIGKILL.
  std::chrono::milliseconds stop_grace{5000};
  // Where the ranks' stdout and stderr lines go (file descriptors).
  int stdout_fd = 1;
  int stderr_fd = 2;
};

// Starts every rank and supervises them until all have exited. Returns the launcher's exit
// status: 0 when every rank exited 0; otherwise the status of the first rank that failed (its
// exit code, or 128 + signal), after the others were stopped; 128 + signal when the launcher
// itself was interrupted by SIGINT/SIGTERM (forwarded to the ranks as SIGTERM). Each process
// group gets the signals, so a rank's own children stop with it. A rank whose command cannot
// be executed exits 127 with a message saying why. Errors: INTERNAL when pipes or processes
// cannot be created (the ranks already started are killed).
//
// Threading: call from one thread; installs handlers for SIGCHLD, SIGINT and SIGTERM for the
// duration of the call and restores the previous ones.
absl::StatusOr<int> RunRanks(const std::vector<RankLaunch>& ranks, const RunRanksOptions& options);

}  // namespace tributary::client::launcher
