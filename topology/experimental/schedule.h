// Compiles a tree Packing into a chunked all-reduce schedule: the tensor is split across the
// trees in proportion to their weights; each tree's share is cut into chunks, and every chunk is
// reduced up the tree (children send to their parent, the parent adds) and broadcast back down
// (parents send the sum to their children). Chunks are independent, so an executor pipelines
// them: a chunk's broadcast overlaps the next chunk's reduce on the opposite link directions.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "topology/tree_packing.h"

namespace tributary::topology {

struct ScheduleTree {
  int root = 0;
  std::vector<int> parent;                 // per position; -1 at the root
  std::vector<std::vector<int>> children;  // per position
  size_t offset = 0;                       // first element of this tree's share
  size_t count = 0;                        // elements in this tree's share
};

struct ScheduleChunk {
  int tree = 0;
  size_t offset = 0;  // first element (absolute, within the tensor)
  size_t count = 0;   // elements, > 0
};

struct Schedule {
  int num_positions = 0;  // GPU positions (indices into GpuGraph::gpus)
  size_t num_elements = 0;
  std::vector<ScheduleTree> trees;    // one per packing tree, same order
  std::vector<ScheduleChunk> chunks;  // issue order: the trees' chunks interleaved round-robin
};

// `packing`: trees over `num_positions` GPUs (as produced by PlanAllReduce); `num_elements`:
// tensor length; `chunk_elements` (> 0): most elements per chunk. Shares are proportional to
// the weights (largest remainder), so a tree with weight w of rate R carries ~w/R of the tensor.
// INVALID_ARGUMENT for a tree that is not a spanning arborescence or a packing without weight.
absl::StatusOr<Schedule> CompileAllReduceSchedule(const Packing& packing, int num_positions,
                                                  size_t num_elements, size_t chunk_elements);

}  // namespace tributary::topology
