// CpuAssistedAllReduce: the all-reduce of a node's GPUs on PCIe-only machines (BytePS's
// CPU-assisted aggregation), as the topology planner's per-switch groups prescribe.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "dataplane/intranode/gpu_ops.h"
#include "dataplane/reduce/reducer.h"

namespace tributary::dataplane {

// For each chunk of the tensor:
//   1. inside each group (GPUs under one PCIe switch: topology's kCpuAssistedPerSwitch /
//      kHostStaging `switch_groups`), the members' chunks are copied to the group's leader (its
//      first GPU; peer copies that never cross a switch) and summed there by the GPU reducer;
//   2. each leader copies its group's partial to pinned host memory (one PCIe crossing per
//      group, not per GPU);
//   3. the CPU sums the groups' partials (the host Reducer), and `inter_node` runs on the sum
//      (the push/pull with the other nodes; nothing on a single node), then divides for an
//      average;
//   4. the sum goes back the same way: host -> each leader -> its members.
// Chunk c+1's steps 1-2 are enqueued before the CPU waits for chunk c, so the GPUs and PCIe work
// while the CPU sums (two sets of scratch and host buffers alternate between chunks). All of a
// group's work is on its leader's queue, whose order makes the reuse of a set safe.
//
// Not thread-safe: one AllReduce at a time. Buffers must be ready (their producers finished)
// when AllReduce is called.
class CpuAssistedAllReduce {
 public:
  struct Options {
    size_t chunk_bytes = size_t{4} << 20;  // Per chunk and buffer; rounded down to elements.
  };
  // The node's part of the cross-node all-reduce: called on the calling thread with the node's
  // sum of one chunk in host memory (`count` elements at `data`), to be replaced in place by the
  // sum over all nodes.
  using InterNode = absl::FunctionRef<absl::Status(common::DataType dtype, void* data, size_t count,
                                                   size_t element_offset)>;

  // `groups`: a partition of GPUs 0..ops.gpu_count()-1 (INVALID_ARGUMENT otherwise: a GPU
  // missing, repeated or out of range, an empty group). `host_reducer` sums on the CPU
  // (CpuReducer). Both must outlive the executor.
  static absl::StatusOr<std::unique_ptr<CpuAssistedAllReduce>> Create(
      GpuOps& ops, Reducer& host_reducer, std::vector<std::vector<int>> groups, Options options);

  // All-reduces `count` elements of `dtype` in place across `buffers` (buffers[g] on GPU g):
  // every buffer ends as the sum over all GPUs (and nodes, through `inter_node`), divided by
  // `divisor` when `average` (the number of contributors: GPUs times nodes).
  absl::Status AllReduce(common::DataType dtype, std::span<void* const> buffers, size_t count,
                         bool average, uint64_t divisor, InterNode inter_node);
  // The same on one node alone: divisor = the number of GPUs.
  absl::Status AllReduce(common::DataType dtype, std::span<void* const> buffers, size_t count,
                         bool average);

 private:
  struct Set {
    std::vector<void*> scratch;  // Per group: (members - 1) chunks on the leader.
    std::vector<void*> partial;  // Per group: one chunk in host memory.
    void* sum = nullptr;         // One chunk in host memory.
  };
  CpuAssistedAllReduce(GpuOps& ops, Reducer& host_reducer, std::vector<std::vector<int>> groups,
                       Options options)
      : ops_(ops), host_reducer_(host_reducer), groups_(std::move(groups)), options_(options) {}
  absl::Status EnsureSets(size_t chunk_bytes);
  absl::Status Run(common::DataType dtype, std::span<void* const> buffers, size_t count,
                   bool average, uint64_t divisor, InterNode inter_node);
  // Steps 1 and 2 for elements [begin, begin + n) into set `s`.
  absl::Status Gather(common::DataType dtype, std::span<void* const> buffers, size_t begin,
                      size_t n, Set& s);
  // Step 4 from set `s`.
  absl::Status Scatter(common::DataType dtype, std::span<void* const> buffers, size_t begin,
                       size_t n, Set& s);

  GpuOps& ops_;
  Reducer& host_reducer_;
  std::vector<std::vector<int>> groups_;
  Options options_;
  size_t set_bytes_ = 0;
  Set sets_[2];
};

}  // namespace tributary::dataplane
