// TreeAllReduce: the all-reduce of a node's GPUs over spanning trees (Blink's packed trees,
// topology's kPackedTrees) and over the NVLink ring rooted at the planner's root GPU
// (kNvLinkRootedOutsideNicSwitch), chunked and pipelined on per-tree queues.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "dataplane/intranode/gpu_ops.h"
#include "dataplane/reduce/reducer.h"
#include "dataplane/schedule/miad_tuner.h"

namespace tributary::dataplane {

// A spanning tree over the node's GPUs: parent[g] is GPU g's parent, -1 at the (one) root.
// `weight` (> 0): the tree's share of the tensor is weight / (sum of the weights) -- the
// packing's bytes/s per tree (topology::Tree::weight).
struct GpuTree {
  std::vector<int> parent;
  double weight = 1;
};

// The tree the NVLink-rooted strategy runs: `ring` (a permutation of the GPUs, e.g.
// topology::BestRing's order) cut at `root` into two chains that reduce toward the root from
// both of its ring neighbours, so every ring link carries the reduce one way and the broadcast
// the other (the link opposite the root is idle). INVALID_ARGUMENT when `ring` is not a
// permutation of 0..n-1 or `root` is not in it.
absl::StatusOr<GpuTree> RingRootedTree(std::span<const int> ring, int root);

// For each tree, its share of the tensor is cut into chunks; each chunk is
//   reduced up: every GPU waits for its children's partials (copied by the children into its
//     scratch slots, on the children's queues: a peer copy per tree edge), sums them into its
//     own buffer and copies the result into its parent's slot;
//   at the root: divided for an average, or -- with an `inter_node` step -- copied to pinned host
//     memory, handed to `inter_node` on the calling thread (the push/pull with other nodes),
//     divided there, and copied back;
//   broadcast down: every GPU copies the final chunk into its children's buffers.
// Each GPU has an "up" and a "down" queue per tree (CUDA streams), ordered by fences on the
// device only, so chunk c+1 climbs while chunk c descends and the trees run at once; the host
// blocks only for the `inter_node` step (a window of `window` chunks in flight per tree) and at
// the end. A parent's scratch has `slots` chunks per child: a child pushes chunk c once the parent
// has summed chunk c - slots.
//
// Without an inter-node step the whole all-reduce is device work, so it is recorded once per
// (dtype, buffers, count, chunk size, average) -- a CUDA graph on CudaGpuOps -- and replayed by
// later calls with the same arguments in one launch, instead of a host call per copy, sum and
// fence of every chunk (`record`; the last `recordings` argument sets are kept).
//
// The chunk size is tuned online (DESIGN.md §1.3): each AllReduce of at least `tune_min_chunks`
// chunks reports its throughput (bytes / wall time by `now`) to a MiadTuner, whose size the next
// AllReduce uses (a call that made a recording reports nothing: recording is no measure of the
// chunk size); with `tune` off, `chunk_bytes` stays.
//
// Not thread-safe: one AllReduce at a time. Buffers must be ready (their producers finished)
// when AllReduce is called; nothing of it runs on them when it returns (every queue is
// synchronized, on errors too).
class TreeAllReduce {
 public:
  struct Options {
    size_t chunk_bytes = size_t{1} << 20;  // The first size (and the tuner's initial one).
    bool tune = true;
    MiadTuner::Options tuner = {.min_bytes = uint64_t{64} << 10,
                                .max_bytes = uint64_t{32} << 20,
                                .initial_bytes = uint64_t{1} << 20,
                                .increase_factor = 2.0,
                                .decrease_step = uint64_t{256} << 10,
                                .samples_per_step = 2,
                                .threshold = 0.05};
    int tune_min_chunks = 4;
    int slots = 2;   // >= 1
    int window = 4;  // >= 1; chunks per tree between the root's copy to host and the host
    bool record = true;
    int recordings = 4;  // >= 1
    // The clock of the tuner's measurements.
    std::function<absl::Time()> now = [] { return absl::Now(); };
  };
  using InterNode = absl::FunctionRef<absl::Status(common::DataType dtype, void* data, size_t count,
                                                   size_t element_offset)>;

  // INVALID_ARGUMENT for no tree, a tree whose parent list is not a spanning tree of the
  // ops.gpu_count() GPUs (wrong size, no root or two, a cycle, a parent out of range), a weight
  // that is not positive and finite, or bad options.
  static absl::StatusOr<std::unique_ptr<TreeAllReduce>> Create(GpuOps& ops, Reducer& host_reducer,
                                                               std::vector<GpuTree> trees,
                                                               Options options);

  // All-reduces `count` elements of `dtype` in place across `buffers` (buffers[g] on GPU g):
  // every buffer ends as the sum over all GPUs (and nodes, through `inter_node`), divided by
  // `divisor` when `average`.
  absl::Status AllReduce(common::DataType dtype, std::span<void* const> buffers, size_t count,
                         bool average, uint64_t divisor, InterNode inter_node);
  // The same on one node alone (no host step): divisor = the number of GPUs.
  absl::Status AllReduce(common::DataType dtype, std::span<void* const> buffers, size_t count,
                         bool average);

  // The two halves of an all-reduce, for a caller that runs the inter-node step on its own
  // (the agent: the data plane's whole-tensor operation between them). ReduceToRoots writes the
  // sum over all GPUs of each tree's share of the elements (Shares) to host_out[root] (host
  // memory the GPUs can reach, e.g. pinned, laid out like the tensor: element i at i x element
  // size), and leaves every buffer as it was. BroadcastFromRoots copies each root's share of its
  // buffer down its tree to every GPU. Recorded and replayed like AllReduce; never tuned.
  struct Share {
    int root;      // GPU
    size_t first;  // element
    size_t count;  // elements
  };
  std::vector<Share> Shares(size_t count) const;
  absl::Status ReduceToRoots(common::DataType dtype, std::span<void* const> buffers, size_t count,
                             std::span<void* const> host_out);
  absl::Status BroadcastFromRoots(common::DataType dtype, std::span<void* const> buffers,
                                  size_t count);

  ~TreeAllReduce();

  // Replays of a recording so far (calls that did not enqueue their work piece by piece).
  int replays() const { return replays_; }

  // The chunk size the next AllReduce uses, and each size the tuner has moved to (the first
  // included): the tuner's trajectory.
  size_t chunk_bytes() const;
  const std::vector<size_t>& chunk_trajectory() const { return trajectory_; }

 private:
  struct Tree {
    int root = -1;
    std::vector<int> parent;
    std::vector<std::vector<int>> children;
    std::vector<int> child_index;  // GPU -> its index among its parent's children.
    std::vector<int> post_order;   // Children before parents.
    std::vector<int> up, down;     // GPU -> queue.
    double weight = 1;
    // GPU -> slots x (children + 1) scratch chunks: slot s, child k at (s * (children + 1) + k)
    // chunks, and the GPU's own partial sum after its children's.
    std::vector<void*> scratch;
    std::vector<void*> host;  // window chunks of pinned host memory (with an inter-node step).
  };
  enum class Phase { kAll, kReduce, kBroadcast };
  struct Recorded {
    Phase phase;
    common::DataType dtype;
    std::vector<void*> buffers;
    size_t count;
    size_t chunk;
    bool average;
    uint64_t divisor;
    uint64_t recording;
    bool fresh;  // Made by the latest call.
    std::vector<void*> host_out;
  };
  TreeAllReduce(GpuOps& ops, Reducer& host_reducer, Options options)
      : ops_(ops), host_reducer_(host_reducer), options_(std::move(options)) {}
  absl::Status EnsureScratch(size_t chunk_bytes, bool host);
  // Validates, runs (Enqueue + synchronize, or a replay) and reports to the tuner.
  absl::Status Call(common::DataType dtype, std::span<void* const> buffers, size_t count,
                    bool average, uint64_t divisor, const InterNode* inter_node,
                    Phase phase = Phase::kAll);
  // Enqueues the all-reduce (running the host steps, if any, as their chunks arrive).
  absl::Status Enqueue(common::DataType dtype, std::span<void* const> buffers, size_t count,
                       bool average, uint64_t divisor, const InterNode* inter_node,
                       size_t chunk_elements, Phase phase);
  // Replays the recording of these arguments, recording it first if there is none.
  absl::Status Replayed(common::DataType dtype, std::span<void* const> buffers, size_t count,
                        bool average, uint64_t divisor, size_t chunk_elements, Phase phase);
  // Each tree's first element and share of `count` (by weight, largest remainder).
  void Split(size_t count, std::vector<size_t>& first, std::vector<size_t>& share) const;
  absl::Status SynchronizeAll();

  GpuOps& ops_;
  Reducer& host_reducer_;
  Options options_;
  std::vector<Tree> trees_;
  std::unique_ptr<MiadTuner> tuner_;
  std::vector<size_t> trajectory_;
  size_t scratch_bytes_ = 0;
  size_t host_bytes_ = 0;
  int replays_ = 0;
  std::vector<void*> host_out_;     // ReduceToRoots' destinations, during the call.
  int origin_ = -1;                 // The queue recordings are replayed on.
  std::vector<Recorded> recorded_;  // Most recently used last.
};

}  // namespace tributary::dataplane
