// HostGpuOps: GpuOps over host memory, for the executors' tests and GPU-less runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "dataplane/intranode/gpu_ops.h"
#include "dataplane/reduce/reducer.h"

namespace tributary::dataplane {

// "GPUs" whose memory is host memory (memcpy; sums by the given Reducer). Every allocation is
// tagged with its GPU (or the host), so that each copy is classified and logged as
// "d2h <gpu>", "h2d <gpu>", "peer <from>-><to>" (on <queue's gpu>) or "local <gpu>", fences as
// "fence <gpu>", host waits as "wait <gpu>" and queue waits as "qwait <gpu>"; tensors the
// caller owns are tagged with RegisterBuffer. The log is what the executors' tests check (e.g.
// no peer copy between PCIe switch groups).
//
// Work runs at once when enqueued, on the calling thread, unless `deferred`: then it is held in
// its queue and run only when the caller waits (WaitFence, Synchronize), choosing at each step a
// random queue (seeded) among those whose next item can run -- any order the queue semantics
// allow, so an executor that forgets a dependency computes wrong results under some seed. (A
// queue wait names a fence already enqueued, so the enqueue order is always legal: no cycle.)
// The log is in the order work ran.
class HostGpuOps final : public GpuOps {
 public:
  struct Options {
    bool deferred = false;
    uint64_t seed = 1;
  };
  HostGpuOps(int gpus, Reducer& reducer) : HostGpuOps(gpus, reducer, Options{}) {}
  HostGpuOps(int gpus, Reducer& reducer, Options options);

  int gpu_count() const override { return gpus_; }
  absl::StatusOr<int> AddQueue(int gpu) override;
  int QueueGpu(int queue) const override;
  absl::StatusOr<void*> AllocateDevice(int gpu, size_t bytes) override;
  absl::StatusOr<void*> AllocateHost(size_t bytes) override;
  absl::Status CopyAsync(int queue, void* dst, const void* src, size_t bytes) override;
  absl::Status ReduceAsync(int queue, common::DataType dtype, void* dst,
                           std::span<const void* const> srcs, size_t count) override;
  absl::Status DivideAsync(int queue, common::DataType dtype, void* dst, size_t count,
                           uint64_t divisor) override;
  absl::StatusOr<uint64_t> Fence(int queue) override;
  absl::Status WaitFence(int queue, uint64_t fence) override;
  absl::Status QueueWaitFence(int queue, uint64_t fence) override;
  absl::Status ReleaseFence(uint64_t fence) override;
  absl::Status Synchronize(int queue) override;
  absl::Status BeginRecording() override;
  absl::StatusOr<uint64_t> EndRecording() override;
  absl::Status Replay(uint64_t recording, int queue) override;
  absl::Status DropRecording(uint64_t recording) override;
  int replays() const { return replays_; }

  // Tags [data, data + bytes) as memory of GPU `gpu` (-1: host).
  void RegisterBuffer(int gpu, const void* data, size_t bytes);

  const std::vector<std::string>& log() const { return log_; }
  void ClearLog() { log_.clear(); }
  // Queues (default ones included) and the most items ever held in all queues at once.
  int queue_count() const { return static_cast<int>(queues_.size()); }
  // Fences neither waited for on the host nor released (an executor that returns leaves none).
  size_t fence_count() const { return fences_.size(); }
  size_t max_pending() const { return max_pending_; }

 private:
  struct Range {
    const char* begin;
    const char* end;
    int gpu;  // -1: host.
  };
  struct Item {
    std::function<void()> run;  // Work; empty for a fence or a queue wait.
    std::string log;
    uint64_t fence = 0;
    enum Kind { kWork, kFence, kWait } kind = kWork;
  };
  // The GPU (or -1 for host) owning [p, p + bytes); INVALID_ARGUMENT when no one range holds it.
  absl::StatusOr<int> Owner(const void* p, size_t bytes) const;
  absl::Status CheckGpu(int gpu) const;
  absl::Status CheckQueue(int queue) const;
  void Enqueue(int queue, Item item);
  // Runs items until `done()` (INTERNAL if nothing can run before: impossible, see above).
  absl::Status RunUntil(const std::function<bool()>& done);
  bool Runnable(const Item& item) const;
  void RunHead(int queue);

  int gpus_;
  Reducer& reducer_;
  Options options_;
  std::mt19937_64 random_;
  std::vector<std::unique_ptr<char[]>> storage_;
  std::vector<Range> ranges_;
  std::vector<std::string> log_;
  std::vector<int> queue_gpu_;
  std::vector<std::deque<Item>> queues_;
  std::map<uint64_t, int> fences_;  // Fence -> queue, until waited for on the host or released.
  std::set<uint64_t> reached_;
  uint64_t next_fence_ = 0;
  size_t pending_ = 0;
  size_t max_pending_ = 0;
  // Recordings: items in the order they were enqueued (a legal order), with their queues.
  bool recording_ = false;
  std::vector<std::pair<int, Item>> recorded_;
  std::set<uint64_t> recorded_fences_;  // Fences made while recording (renamed at each replay).
  struct Recording {
    std::vector<std::pair<int, Item>> items;
    std::set<uint64_t> fences;
  };
  std::map<uint64_t, Recording> recordings_;
  uint64_t next_recording_ = 0;
  int replays_ = 0;
};

}  // namespace tributary::dataplane
