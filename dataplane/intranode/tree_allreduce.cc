#include "dataplane/intranode/tree_allreduce.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/weighted_split.h"

namespace tributary::dataplane {

absl::StatusOr<GpuTree> RingRootedTree(std::span<const int> ring, int root) {
  const int n = static_cast<int>(ring.size());
  std::vector<int> position(n, -1);
  for (int i = 0; i < n; ++i) {
    if (ring[i] < 0 || ring[i] >= n || position[ring[i]] >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the ring is not a permutation of GPUs 0..", n - 1));
    }
    position[ring[i]] = i;
  }
  if (root < 0 || root >= n) {
    return absl::InvalidArgumentError(absl::StrCat("root GPU ", root, " is not in the ring"));
  }
  GpuTree tree;
  tree.parent.assign(n, -1);
  const int r = position[root];
  // Forward from the root for the first half, backward for the rest; each GPU's parent is its
  // ring neighbour one step nearer the root.
  const int forward = n / 2;
  for (int d = 1; d < n; ++d) {
    if (d <= forward) {
      tree.parent[ring[(r + d) % n]] = ring[(r + d - 1) % n];
    } else {
      const int back = n - d;  // Distance from the root going backward.
      tree.parent[ring[(r - back + n) % n]] = ring[(r - back + 1 + n) % n];
    }
  }
  return tree;
}

absl::StatusOr<std::unique_ptr<TreeAllReduce>> TreeAllReduce::Create(GpuOps& ops,
                                                                     Reducer& host_reducer,
                                                                     std::vector<GpuTree> trees,
                                                                     Options options) {
  const int n = ops.gpu_count();
  if (trees.empty()) return absl::InvalidArgumentError("no tree to run");
  if (options.chunk_bytes < 16) return absl::InvalidArgumentError("chunk_bytes must be >= 16");
  if (options.slots < 1 || options.window < 1) {
    return absl::InvalidArgumentError("slots and window must be >= 1");
  }
  if (options.tune_min_chunks < 1)
    return absl::InvalidArgumentError("tune_min_chunks must be >= 1");
  if (!options.now) return absl::InvalidArgumentError("no clock");
  std::unique_ptr<TreeAllReduce> ar(new TreeAllReduce(ops, host_reducer, options));
  for (size_t t = 0; t < trees.size(); ++t) {
    const GpuTree& in = trees[t];
    if (!(in.weight > 0) || !std::isfinite(in.weight)) {
      return absl::InvalidArgumentError(absl::StrCat("tree ", t, " has weight ", in.weight,
                                                     "; weights must be positive and finite"));
    }
    if (static_cast<int>(in.parent.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat("tree ", t, " names a parent for ",
                                                     in.parent.size(), " GPUs; the node has ", n));
    }
    Tree tree;
    tree.parent = in.parent;
    tree.weight = in.weight;
    tree.children.resize(n);
    tree.child_index.assign(n, -1);
    for (int g = 0; g < n; ++g) {
      const int p = in.parent[g];
      if (p == -1) {
        if (tree.root >= 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("tree ", t, " has two roots (GPUs ", tree.root, " and ", g, ")"));
        }
        tree.root = g;
      } else if (p < 0 || p >= n || p == g) {
        return absl::InvalidArgumentError(
            absl::StrCat("tree ", t, " gives GPU ", g, " the parent ", p));
      } else {
        tree.child_index[g] = static_cast<int>(tree.children[p].size());
        tree.children[p].push_back(g);
      }
    }
    if (tree.root < 0) return absl::InvalidArgumentError(absl::StrCat("tree ", t, " has no root"));
    // Breadth-first from the root: every GPU reached once, or a cycle keeps some out.
    std::vector<int> order{tree.root};
    for (size_t i = 0; i < order.size(); ++i) {
      for (int c : tree.children[order[i]]) order.push_back(c);
    }
    if (static_cast<int>(order.size()) != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("tree ", t, " does not reach every GPU from its root (a cycle)"));
    }
    tree.post_order.assign(order.rbegin(), order.rend());
    for (int g = 0; g < n; ++g) {
      absl::StatusOr<int> up = ops.AddQueue(g);
      if (!up.ok()) return up.status();
      absl::StatusOr<int> down = ops.AddQueue(g);
      if (!down.ok()) return down.status();
      tree.up.push_back(*up);
      tree.down.push_back(*down);
    }
    tree.scratch.assign(n, nullptr);
    ar->trees_.push_back(std::move(tree));
  }
  MiadTuner::Options tuner = options.tuner;
  tuner.initial_bytes = options.chunk_bytes;
  ar->tuner_ = std::make_unique<MiadTuner>(tuner);
  ar->trajectory_.push_back(ar->chunk_bytes());
  return ar;
}

size_t TreeAllReduce::chunk_bytes() const {
  return options_.tune ? static_cast<size_t>(tuner_->chunk_bytes()) : options_.chunk_bytes;
}

absl::Status TreeAllReduce::EnsureScratch(size_t chunk_bytes, bool host) {
  if (scratch_bytes_ < chunk_bytes) {
    // Grown to the largest chunk size used; GpuOps keeps what it allocated until it goes.
    for (Tree& tree : trees_) {
      for (int g = 0; g < ops_.gpu_count(); ++g) {
        if (tree.children[g].empty()) continue;
        absl::StatusOr<void*> p = ops_.AllocateDevice(
            g, static_cast<size_t>(options_.slots) * (tree.children[g].size() + 1) * chunk_bytes);
        if (!p.ok()) return p.status();
        tree.scratch[g] = *p;
      }
    }
    scratch_bytes_ = chunk_bytes;
  }
  if (host && host_bytes_ < chunk_bytes) {
    for (Tree& tree : trees_) {
      tree.host.clear();
      for (int w = 0; w < options_.window; ++w) {
        absl::StatusOr<void*> p = ops_.AllocateHost(chunk_bytes);
        if (!p.ok()) return p.status();
        tree.host.push_back(*p);
      }
    }
    host_bytes_ = chunk_bytes;
  }
  return absl::OkStatus();
}

TreeAllReduce::~TreeAllReduce() {
  for (const Recorded& r : recorded_) ops_.DropRecording(r.recording).IgnoreError();
}

absl::Status TreeAllReduce::AllReduce(common::DataType dtype, std::span<void* const> buffers,
                                      size_t count, bool average) {
  return Call(dtype, buffers, count, average, static_cast<uint64_t>(ops_.gpu_count()), nullptr);
}

absl::Status TreeAllReduce::AllReduce(common::DataType dtype, std::span<void* const> buffers,
                                      size_t count, bool average, uint64_t divisor,
                                      InterNode inter_node) {
  return Call(dtype, buffers, count, average, divisor, &inter_node);
}

absl::Status TreeAllReduce::SynchronizeAll() {
  absl::Status status;
  for (const Tree& tree : trees_) {
    for (int g = 0; g < ops_.gpu_count(); ++g) {
      for (int q : {tree.up[g], tree.down[g]}) {
        absl::Status s = ops_.Synchronize(q);
        if (status.ok()) status = s;
      }
    }
  }
  if (origin_ >= 0) {
    absl::Status s = ops_.Synchronize(origin_);
    if (status.ok()) status = s;
  }
  return status;
}

absl::Status TreeAllReduce::Call(common::DataType dtype, std::span<void* const> buffers,
                                 size_t count, bool average, uint64_t divisor,
                                 const InterNode* inter_node, Phase phase) {
  if (absl::Status s = CheckExecutorArguments(ops_, dtype, buffers, average, divisor); !s.ok()) {
    return s;
  }
  if (count == 0) return absl::OkStatus();
  const size_t size = common::DataTypeSize(dtype);
  const size_t chunk = std::max<size_t>(1, chunk_bytes() / size);
  const absl::Time start = options_.now();
  absl::Status status;
  bool recorded_now = false;  // A first call records: its time is no measure of the chunk size.
  if (inter_node == nullptr && options_.record) {
    status = Replayed(dtype, buffers, count, average, divisor, chunk, phase);
    recorded_now = status.ok() && recorded_.back().fresh;
  } else {
    status = Enqueue(dtype, buffers, count, average, divisor, inter_node, chunk, phase);
    // Nothing may still run on a buffer or a slot when the call returns, error or not.
    absl::Status s = SynchronizeAll();
    if (status.ok()) status = s;
  }
  if (status.ok() && options_.tune && phase == Phase::kAll) {
    const double seconds = absl::ToDoubleSeconds(options_.now() - start);
    if (!recorded_now && seconds > 0 &&
        (count + chunk - 1) / chunk >= static_cast<size_t>(options_.tune_min_chunks)) {
      tuner_->Report(static_cast<double>(count * size) / seconds);
      if (chunk_bytes() != trajectory_.back()) trajectory_.push_back(chunk_bytes());
    }
  }
  return status;
}

absl::Status TreeAllReduce::Replayed(common::DataType dtype, std::span<void* const> buffers,
                                     size_t count, bool average, uint64_t divisor, size_t chunk,
                                     Phase phase) {
  if (origin_ < 0) {
    absl::StatusOr<int> origin = ops_.AddQueue(0);
    if (!origin.ok()) return origin.status();
    origin_ = *origin;
  }
  auto same = [&](const Recorded& r) {
    return r.phase == phase && r.dtype == dtype && r.count == count && r.chunk == chunk &&
           r.average == average && r.host_out == host_out_ && (!average || r.divisor == divisor) &&
           std::equal(r.buffers.begin(), r.buffers.end(), buffers.begin(), buffers.end());
  };
  auto it = std::find_if(recorded_.begin(), recorded_.end(), same);
  if (it != recorded_.end()) {
    std::rotate(it, it + 1, recorded_.end());  // Most recently used last.
    recorded_.back().fresh = false;
  } else {
    // Scratch first: allocation is no recordable work.
    if (absl::Status s = EnsureScratch(chunk * common::DataTypeSize(dtype), false); !s.ok()) {
      return s;
    }
    if (absl::Status s = ops_.BeginRecording(); !s.ok()) return s;
    absl::Status enqueued = Enqueue(dtype, buffers, count, average, divisor, nullptr, chunk, phase);
    absl::StatusOr<uint64_t> recording = ops_.EndRecording();
    if (!enqueued.ok()) {
      if (recording.ok()) ops_.DropRecording(*recording).IgnoreError();
      return enqueued;
    }
    if (!recording.ok()) return recording.status();
    if (static_cast<int>(recorded_.size()) >= std::max(1, options_.recordings)) {
      ops_.DropRecording(recorded_.front().recording).IgnoreError();
      recorded_.erase(recorded_.begin());
    }
    recorded_.push_back({phase, dtype, std::vector<void*>(buffers.begin(), buffers.end()), count,
                         chunk, average, divisor, *recording, true, host_out_});
  }
  ++replays_;
  absl::Status status = ops_.Replay(recorded_.back().recording, origin_);
  absl::Status s = ops_.Synchronize(origin_);
  return status.ok() ? s : status;
}

namespace {

// The fences of one AllReduce: each is released (or waited for) once no more work will wait for
// it, and whatever is left at the end is released, errors included.
class Fences {
 public:
  static constexpr uint64_t kNone = ~uint64_t{0};  // No fence (nothing to wait for).
  explicit Fences(GpuOps& ops) : ops_(ops) {}
  ~Fences() {
    for (uint64_t f : live_) ops_.ReleaseFence(f).IgnoreError();
  }
  absl::StatusOr<uint64_t> Make(int queue) {
    absl::StatusOr<uint64_t> f = ops_.Fence(queue);
    if (f.ok()) live_.insert(*f);
    return f;
  }
  absl::Status Release(uint64_t f) {
    if (f == kNone || !live_.erase(f)) return absl::OkStatus();
    return ops_.ReleaseFence(f);
  }
  absl::Status HostWait(int queue, uint64_t f) {
    live_.erase(f);
    return ops_.WaitFence(queue, f);
  }

 private:
  GpuOps& ops_;
  std::set<uint64_t> live_;
};

}  // namespace

void TreeAllReduce::Split(size_t count, std::vector<size_t>& first,
                          std::vector<size_t>& share) const {
  std::vector<double> weights;
  for (const Tree& t : trees_) weights.push_back(t.weight);
  share = common::SplitByWeight(count, weights);
  first.assign(share.size(), 0);
  for (size_t t = 1; t < share.size(); ++t) first[t] = first[t - 1] + share[t - 1];
}

std::vector<TreeAllReduce::Share> TreeAllReduce::Shares(size_t count) const {
  std::vector<size_t> first, share;
  Split(count, first, share);
  std::vector<Share> out;
  for (size_t t = 0; t < trees_.size(); ++t) {
    if (share[t] > 0) out.push_back({trees_[t].root, first[t], share[t]});
  }
  return out;
}

absl::Status TreeAllReduce::ReduceToRoots(common::DataType dtype, std::span<void* const> buffers,
                                          size_t count, std::span<void* const> host_out) {
  if (host_out.size() != static_cast<size_t>(ops_.gpu_count())) {
    return absl::InvalidArgumentError(absl::StrCat(host_out.size(), " host destinations for ",
                                                   ops_.gpu_count(), " GPUs: one per GPU"));
  }
  for (const Tree& tree : trees_) {
    if (host_out[tree.root] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("no host destination for GPU ", tree.root, ", a root"));
    }
  }
  host_out_.assign(host_out.begin(), host_out.end());
  absl::Status s = Call(dtype, buffers, count, false, 1, nullptr, Phase::kReduce);
  host_out_.clear();
  return s;
}

absl::Status TreeAllReduce::BroadcastFromRoots(common::DataType dtype,
                                               std::span<void* const> buffers, size_t count) {
  return Call(dtype, buffers, count, false, 1, nullptr, Phase::kBroadcast);
}

absl::Status TreeAllReduce::Enqueue(common::DataType dtype, std::span<void* const> buffers,
                                    size_t count, bool average, uint64_t divisor,
                                    const InterNode* inter_node, size_t chunk, Phase phase) {
  const size_t size = common::DataTypeSize(dtype);
  const size_t stride = chunk * size;  // Bytes per scratch or host slot.
  if (absl::Status s = EnsureScratch(stride, inter_node != nullptr); !s.ok()) return s;
  const int n = ops_.gpu_count();
  const size_t slots = static_cast<size_t>(options_.slots);
  const size_t window = static_cast<size_t>(options_.window);

  // Each tree's share of the elements, by weight (largest remainder).
  const size_t trees = trees_.size();
  std::vector<size_t> first, share;
  Split(count, first, share);
  std::vector<size_t> chunks(trees, 0);
  for (size_t t = 0; t < trees; ++t) chunks[t] = (share[t] + chunk - 1) / chunk;

  Fences fences(ops_);
  // Per tree and chunk: the fences later work waits for.
  struct ChunkFences {
    std::vector<uint64_t> pushed;        // GPU -> its partial is in its parent's slot.
    std::vector<uint64_t> freed;         // GPU -> it has summed its children's slots.
    std::vector<uint64_t> final;         // GPU -> its buffer holds the result.
    uint64_t to_host = Fences::kNone;    // The root's partial is in host memory.
    uint64_t from_host = Fences::kNone;  // The host slot has been copied back to the root.
  };
  std::vector<std::map<size_t, ChunkFences>> state(trees);
  auto at = [&](size_t t, size_t j) -> ChunkFences& {
    ChunkFences& f = state[t][j];
    if (f.pushed.empty()) {
      f.pushed.assign(n, Fences::kNone);
      f.freed.assign(n, Fences::kNone);
      f.final.assign(n, Fences::kNone);
    }
    return f;
  };
  auto element = [&](int g, size_t offset) {
    return static_cast<char*>(buffers[g]) + offset * size;
  };

  // Reduce of chunk j of tree t up to its root (and, with an inter-node step, to host memory).
  auto up = [&](size_t t, size_t j) -> absl::Status {
    const Tree& tree = trees_[t];
    const size_t begin = first[t] + j * chunk;
    const size_t count_j = std::min(chunk, share[t] - j * chunk);
    const size_t bytes = count_j * size;
    const size_t slot = j % slots;
    ChunkFences& f = at(t, j);
    for (int g : tree.post_order) {
      const int q = tree.up[g];
      const std::vector<int>& kids = tree.children[g];
      // Where g's partial sum goes: the callers' buffers stay as they were until the result
      // comes down (a failed all-reduce leaves its inputs), except the root's in a whole
      // all-reduce, which the result overwrites anyway.
      char* sum_at = element(g, begin);
      if (!kids.empty()) {
        const size_t per_slot = kids.size() + 1;  // The children's chunks, then g's partial.
        if (g != tree.root || phase == Phase::kReduce) {
          sum_at = static_cast<char*>(tree.scratch[g]) + (slot * per_slot + kids.size()) * stride;
        }
        std::vector<const void*> srcs{element(g, begin)};
        for (size_t k = 0; k < kids.size(); ++k) {
          if (absl::Status s = ops_.QueueWaitFence(q, f.pushed[kids[k]]); !s.ok()) return s;
          srcs.push_back(static_cast<char*>(tree.scratch[g]) + (slot * per_slot + k) * stride);
        }
        if (absl::Status s = ops_.ReduceAsync(q, dtype, sum_at, srcs, count_j); !s.ok()) {
          return s;
        }
        if (j + slots < chunks[t]) {
          absl::StatusOr<uint64_t> freed = fences.Make(q);
          if (!freed.ok()) return freed.status();
          f.freed[g] = *freed;
        }
      }
      if (g != tree.root) {
        const int p = tree.parent[g];
        if (j >= slots) {
          if (absl::Status s = ops_.QueueWaitFence(q, at(t, j - slots).freed[p]); !s.ok()) return s;
        }
        char* dst = static_cast<char*>(tree.scratch[p]) +
                    (slot * (tree.children[p].size() + 1) + tree.child_index[g]) * stride;
        if (absl::Status s = ops_.CopyAsync(q, dst, sum_at, bytes); !s.ok()) return s;
        absl::StatusOr<uint64_t> pushed = fences.Make(q);
        if (!pushed.ok()) return pushed.status();
        f.pushed[g] = *pushed;
      } else if (inter_node != nullptr) {
        if (j >= window) {
          if (absl::Status s = ops_.QueueWaitFence(q, at(t, j - window).from_host); !s.ok()) {
            return s;
          }
        }
        if (absl::Status s = ops_.CopyAsync(q, tree.host[j % window], element(g, begin), bytes);
            !s.ok()) {
          return s;
        }
        absl::StatusOr<uint64_t> to_host = fences.Make(q);
        if (!to_host.ok()) return to_host.status();
        f.to_host = *to_host;
      } else if (phase == Phase::kReduce) {
        // The node's sum of this share goes to the caller's host memory.
        if (absl::Status s =
                ops_.CopyAsync(q, static_cast<char*>(host_out_[g]) + begin * size, sum_at, bytes);
            !s.ok()) {
          return s;
        }
      } else if (phase == Phase::kAll) {
        if (average) {
          if (absl::Status s = ops_.DivideAsync(q, dtype, element(g, begin), count_j, divisor);
              !s.ok()) {
            return s;
          }
        }
        absl::StatusOr<uint64_t> done = fences.Make(q);
        if (!done.ok()) return done.status();
        f.final[g] = *done;
      }
    }
    // Every wait for these fences is enqueued: the parents' for `pushed` just now, the
    // children's for chunk j - slots's `freed` in this chunk, the root's for chunk j - window's
    // `from_host` too.
    for (int g = 0; g < n; ++g) {
      if (absl::Status s = fences.Release(f.pushed[g]); !s.ok()) return s;
    }
    if (j >= slots) {
      for (uint64_t freed : at(t, j - slots).freed) {
        if (absl::Status s = fences.Release(freed); !s.ok()) return s;
      }
    }
    if (j >= window && inter_node != nullptr) {
      if (absl::Status s = fences.Release(at(t, j - window).from_host); !s.ok()) return s;
    }
    return absl::OkStatus();
  };

  // Broadcast of chunk j of tree t from its root (after the host step, if any).
  auto down = [&](size_t t, size_t j) -> absl::Status {
    const Tree& tree = trees_[t];
    const size_t begin = first[t] + j * chunk;
    const size_t count_j = std::min(chunk, share[t] - j * chunk);
    const size_t bytes = count_j * size;
    ChunkFences& f = at(t, j);
    const int r = tree.root;
    if (inter_node != nullptr) {
      void* host = tree.host[j % window];
      if (absl::Status s = fences.HostWait(tree.up[r], f.to_host); !s.ok()) return s;
      if (absl::Status s = (*inter_node)(dtype, host, count_j, begin); !s.ok()) return s;
      if (average) host_reducer_.Divide(dtype, host, count_j, divisor);
      if (absl::Status s = ops_.CopyAsync(tree.down[r], element(r, begin), host, bytes); !s.ok()) {
        return s;
      }
      if (j + window < chunks[t]) {
        absl::StatusOr<uint64_t> back = fences.Make(tree.down[r]);
        if (!back.ok()) return back.status();
        f.from_host = *back;
      }
    } else if (phase == Phase::kAll) {
      if (absl::Status s = ops_.QueueWaitFence(tree.down[r], f.final[r]); !s.ok()) return s;
    }  // kBroadcast: the root's share is in place since the call began.
    for (auto g = tree.post_order.rbegin(); g != tree.post_order.rend(); ++g) {
      const int q = tree.down[*g];
      const std::vector<int>& kids = tree.children[*g];
      if (kids.empty()) continue;
      if (*g != r) {
        if (absl::Status s = ops_.QueueWaitFence(q, f.final[*g]); !s.ok()) return s;
      }
      for (int c : kids) {
        if (absl::Status s = ops_.CopyAsync(q, element(c, begin), element(*g, begin), bytes);
            !s.ok()) {
          return s;
        }
        if (!tree.children[c].empty()) {
          absl::StatusOr<uint64_t> done = fences.Make(q);
          if (!done.ok()) return done.status();
          f.final[c] = *done;
        }
      }
    }
    for (uint64_t done : f.final) {
      if (absl::Status s = fences.Release(done); !s.ok()) return s;
    }
    // Chunks whose fences are all released or waited for leave the map.
    if (j >= std::max(slots, window)) state[t].erase(j - std::max(slots, window));
    return absl::OkStatus();
  };

  auto run = [&]() -> absl::Status {
    const size_t most = *std::max_element(chunks.begin(), chunks.end());
    if (inter_node == nullptr) {
      // All on the device: enqueue everything, trees interleaved chunk by chunk.
      for (size_t j = 0; j < most; ++j) {
        for (size_t t = 0; t < trees; ++t) {
          if (j >= chunks[t]) continue;
          if (phase != Phase::kBroadcast) {
            if (absl::Status s = up(t, j); !s.ok()) return s;
          }
          if (phase != Phase::kReduce) {
            if (absl::Status s = down(t, j); !s.ok()) return s;
          }
        }
      }
      return absl::OkStatus();
    }
    // With the host step: `window` chunks per tree climb while the host handles the oldest.
    for (size_t j = 0; j < std::min(window, most); ++j) {
      for (size_t t = 0; t < trees; ++t) {
        if (j >= chunks[t]) continue;
        if (absl::Status s = up(t, j); !s.ok()) return s;
      }
    }
    for (size_t j = 0; j < most; ++j) {
      for (size_t t = 0; t < trees; ++t) {
        if (j >= chunks[t]) continue;
        if (absl::Status s = down(t, j); !s.ok()) return s;
        if (j + window < chunks[t]) {
          if (absl::Status s = up(t, j + window); !s.ok()) return s;
        }
      }
    }
    return absl::OkStatus();
  };
  return run();
}

}  // namespace tributary::dataplane
