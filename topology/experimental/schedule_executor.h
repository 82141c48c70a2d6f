// Runs a compiled tree all-reduce Schedule on CPU float32 buffers, one per GPU position, over the
// in-process transport: one endpoint per position, every chunk reduced up its tree and broadcast
// down, all chunks in flight at once (pipelined). For tests and demonstrations of schedules.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dataplane/reduce/cpu/cpu_reducer.h"
#include "dataplane/transport/inprocess/inprocess_transport.h"
#include "topology/experimental/schedule.h"

namespace tributary::topology {

struct ExecutorOptions {
  // Endpoint addresses are address_prefix + position; must be unused in `network`.
  std::string address_prefix = "topology-pos-";
  // The run fails with DEADLINE_EXCEEDED if not done within this time.
  std::chrono::milliseconds timeout{10000};
};

// Sums `buffers` (buffers[p] holds position p's schedule.num_elements floats) in place: on OK,
// every buffer holds the element-wise sum of all inputs. `reducer` adds the incoming chunks
// (may be called from several endpoint threads at once). Blocks until done; creates and shuts
// down its endpoints in `network`. Messages are a 16-byte header (magic, kind, chunk, sender)
// plus the chunk's floats; a malformed or unexpected message fails the run with INTERNAL.
absl::Status ExecuteAllReduce(const Schedule& schedule, dataplane::InProcessNetwork& network,
                              dataplane::CpuReducer& reducer,
                              std::vector<std::vector<float>>& buffers,
                              const ExecutorOptions& options = {});

}  // namespace tributary::topology
