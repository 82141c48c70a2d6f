#include "dataplane/intranode/cpu_assisted_allreduce.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tributary::dataplane {

absl::StatusOr<std::unique_ptr<CpuAssistedAllReduce>> CpuAssistedAllReduce::Create(
    GpuOps& ops, Reducer& host_reducer, std::vector<std::vector<int>> groups, Options options) {
  const int n = ops.gpu_count();
  if (options.chunk_bytes < 16) {
    return absl::InvalidArgumentError("chunk_bytes must be at least 16");
  }
  std::vector<int> seen(n, 0);
  for (const std::vector<int>& g : groups) {
    if (g.empty()) return absl::InvalidArgumentError("an empty GPU group");
    for (int gpu : g) {
      if (gpu < 0 || gpu >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat("GPU group names GPU ", gpu, "; the node has GPUs 0..", n - 1));
      }
      if (seen[gpu]++) {
        return absl::InvalidArgumentError(absl::StrCat("GPU ", gpu, " is in two groups"));
      }
    }
  }
  for (int gpu = 0; gpu < n; ++gpu) {
    if (!seen[gpu]) {
      return absl::InvalidArgumentError(absl::StrCat("GPU ", gpu, " is in no group"));
    }
  }
  return std::unique_ptr<CpuAssistedAllReduce>(
      new CpuAssistedAllReduce(ops, host_reducer, std::move(groups), options));
}

absl::Status CpuAssistedAllReduce::EnsureSets(size_t chunk_bytes) {
  if (set_bytes_ >= chunk_bytes) return absl::OkStatus();
  // Grown once to the chunk size; GpuOps keeps what it allocated until it goes.
  for (Set& s : sets_) {
    s.scratch.assign(groups_.size(), nullptr);
    s.partial.assign(groups_.size(), nullptr);
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (groups_[g].size() > 1) {
        absl::StatusOr<void*> p =
            ops_.AllocateDevice(groups_[g][0], (groups_[g].size() - 1) * chunk_bytes);
        if (!p.ok()) return p.status();
        s.scratch[g] = *p;
      }
      absl::StatusOr<void*> h = ops_.AllocateHost(chunk_bytes);
      if (!h.ok()) return h.status();
      s.partial[g] = *h;
    }
    absl::StatusOr<void*> sum = ops_.AllocateHost(chunk_bytes);
    if (!sum.ok()) return sum.status();
    s.sum = *sum;
  }
  set_bytes_ = chunk_bytes;
  return absl::OkStatus();
}

absl::Status CpuAssistedAllReduce::Gather(common::DataType dtype, std::span<void* const> buffers,
                                          size_t begin, size_t n, Set& s) {
  const size_t size = common::DataTypeSize(dtype);
  const size_t bytes = n * size;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::vector<int>& group = groups_[g];
    const int leader = group[0];
    char* lead = static_cast<char*>(buffers[leader]) + begin * size;
    std::vector<const void*> srcs{lead};
    for (size_t m = 1; m < group.size(); ++m) {
      char* slot = static_cast<char*>(s.scratch[g]) + (m - 1) * bytes;
      const char* member = static_cast<const char*>(buffers[group[m]]) + begin * size;
      if (absl::Status st = ops_.CopyAsync(leader, slot, member, bytes); !st.ok()) return st;
      srcs.push_back(slot);
    }
    if (srcs.size() > 1) {
      if (absl::Status st = ops_.ReduceAsync(leader, dtype, lead, srcs, n); !st.ok()) return st;
    }
    if (absl::Status st = ops_.CopyAsync(leader, s.partial[g], lead, bytes); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status CpuAssistedAllReduce::Scatter(common::DataType dtype, std::span<void* const> buffers,
                                           size_t begin, size_t n, Set& s) {
  const size_t size = common::DataTypeSize(dtype);
  const size_t bytes = n * size;
  for (const std::vector<int>& group : groups_) {
    const int leader = group[0];
    char* lead = static_cast<char*>(buffers[leader]) + begin * size;
    if (absl::Status st = ops_.CopyAsync(leader, lead, s.sum, bytes); !st.ok()) return st;
    for (size_t m = 1; m < group.size(); ++m) {
      char* member = static_cast<char*>(buffers[group[m]]) + begin * size;
      if (absl::Status st = ops_.CopyAsync(leader, member, lead, bytes); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

absl::Status CpuAssistedAllReduce::AllReduce(common::DataType dtype, std::span<void* const> buffers,
                                             size_t count, bool average) {
  return AllReduce(dtype, buffers, count, average, static_cast<uint64_t>(ops_.gpu_count()),
                   [](common::DataType, void*, size_t, size_t) { return absl::OkStatus(); });
}

absl::Status CpuAssistedAllReduce::AllReduce(common::DataType dtype, std::span<void* const> buffers,
                                             size_t count, bool average, uint64_t divisor,
                                             InterNode inter_node) {
  if (absl::Status s = CheckExecutorArguments(ops_, dtype, buffers, average, divisor); !s.ok()) {
    return s;
  }
  if (count == 0) return absl::OkStatus();
  absl::Status status = Run(dtype, buffers, count, average, divisor, inter_node);
  // Nothing may still run on a buffer or a set when the call returns, error or not.
  for (const std::vector<int>& group : groups_) {
    absl::Status s = ops_.Synchronize(group[0]);
    if (status.ok()) status = s;
  }
  return status;
}

absl::Status CpuAssistedAllReduce::Run(common::DataType dtype, std::span<void* const> buffers,
                                       size_t count, bool average, uint64_t divisor,
                                       InterNode inter_node) {
  const size_t size = common::DataTypeSize(dtype);
  const size_t chunk = std::max<size_t>(1, options_.chunk_bytes / size);
  if (absl::Status s = EnsureSets(chunk * size); !s.ok()) return s;
  const size_t chunks = (count + chunk - 1) / chunk;
  auto range = [&](size_t c) { return std::min(chunk, count - c * chunk); };
  // Gathers chunk c into set c % 2 and fences every leader's queue after it.
  std::vector<uint64_t> fences[2];
  auto gather = [&](size_t c) -> absl::Status {
    if (absl::Status s = Gather(dtype, buffers, c * chunk, range(c), sets_[c % 2]); !s.ok()) {
      return s;
    }
    fences[c % 2].clear();
    for (const std::vector<int>& group : groups_) {
      absl::StatusOr<uint64_t> f = ops_.Fence(group[0]);
      if (!f.ok()) return f.status();
      fences[c % 2].push_back(*f);
    }
    return absl::OkStatus();
  };
  // Leader queues: gather 0, gather 1, scatter 0, gather 2, scatter 1, ... Set (c+1) % 2 was
  // last used by chunk c-1, whose gather and scatter precede gather c+1 on every leader's
  // queue, and whose partials the CPU has read; the CPU writes set.sum again only after
  // waiting for gather c+1's fence, i.e. after scatter c-1 read it.
  if (absl::Status s = gather(0); !s.ok()) return s;
  for (size_t c = 0; c < chunks; ++c) {
    Set& set = sets_[c % 2];
    const size_t begin = c * chunk, n = range(c);
    if (c + 1 < chunks) {
      if (absl::Status s = gather(c + 1); !s.ok()) return s;
    }
    // Chunk c's partials are in host memory; chunk c+1's gather keeps running.
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (absl::Status s = ops_.WaitFence(groups_[g][0], fences[c % 2][g]); !s.ok()) return s;
    }
    if (groups_.size() == 1) {
      std::memcpy(set.sum, set.partial[0], n * size);
    } else {
      host_reducer_.Sum2(dtype, set.sum, set.partial[0], set.partial[1], n);
      for (size_t g = 2; g < groups_.size(); ++g) {
        host_reducer_.Sum(dtype, set.sum, set.partial[g], n);
      }
    }
    if (absl::Status s = inter_node(dtype, set.sum, n, begin); !s.ok()) return s;
    if (average) host_reducer_.Divide(dtype, set.sum, n, divisor);
    if (absl::Status s = Scatter(dtype, buffers, begin, n, set); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace tributary::dataplane
