// HostGpuOps: GpuOps over host memory, for the executors' tests and GPU-less runs.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dataplane/intranode/gpu_ops.h"
#include "dataplane/reduce/reducer.h"

namespace tributary::dataplane {

// "GPUs" whose memory is host memory and whose work runs at once, on the calling thread
// (memcpy; sums by the given Reducer). Every allocation is tagged with its GPU (or the host), so
// that each copy is classified and logged as "d2h <gpu>", "h2d <gpu>", "peer <from>-><to>" (on
// queue <gpu>) or "local <gpu>", fences as "fence <gpu>" and waits as "wait <gpu>"; tensors the
// caller owns are tagged with RegisterBuffer. The log is what the executors' tests check (e.g. no
// peer copy between PCIe switch groups).
class HostGpuOps final : public GpuOps {
 public:
  HostGpuOps(int gpus, Reducer& reducer) : gpus_(gpus), reducer_(reducer) {}

  int gpu_count() const override { return gpus_; }
  absl::StatusOr<void*> AllocateDevice(int gpu, size_t bytes) override;
  absl::StatusOr<void*> AllocateHost(size_t bytes) override;
  absl::Status CopyAsync(int gpu, void* dst, const void* src, size_t bytes) override;
  absl::Status ReduceAsync(int gpu, common::DataType dtype, void* dst,
                           std::span<const void* const> srcs, size_t count) override;
  absl::StatusOr<uint64_t> Fence(int gpu) override;
  absl::Status WaitFence(int gpu, uint64_t fence) override;
  absl::Status Synchronize(int gpu) override;

  // Tags [data, data + bytes) as memory of GPU `gpu` (-1: host).
  void RegisterBuffer(int gpu, const void* data, size_t bytes);

  const std::vector<std::string>& log() const { return log_; }
  void ClearLog() { log_.clear(); }

 private:
  struct Range {
    const char* begin;
    const char* end;
    int gpu;  // -1: host.
  };
  // The GPU (or -1 for host) owning [p, p + bytes); INVALID_ARGUMENT when no one range holds it.
  absl::StatusOr<int> Owner(const void* p, size_t bytes) const;
  absl::Status CheckGpu(int gpu) const;

  int gpus_;
  Reducer& reducer_;
  std::vector<std::unique_ptr<char[]>> storage_;
  std::vector<Range> ranges_;
  std::vector<std::string> log_;
  uint64_t next_fence_ = 0;
};

}  // namespace tributary::dataplane
