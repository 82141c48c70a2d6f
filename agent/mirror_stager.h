// The staging of mirrored buffers (agent/shm_mapping.h MirroredMemory, e.g. a training
// process's CUDA buffer): an operation's regions are copied into their host mirrors before the
// data plane starts it and back after it succeeded, before its handles complete.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "agent/shm_mapping.h"
#include "dataplane/collectives/operation.h"

namespace tributary::agent {

// One thread that runs the mirrors' blocking copies in order, so that they never run under a
// lock of the agent, on a gRPC thread or on a data-plane thread. Started on the first Post.
// Threading: Post from any thread. Stop drains the queue (tasks posted by queued tasks
// included) and joins; after it, Post runs the task on the caller's thread.
class MirrorStager {
 public:
  MirrorStager() = default;
  MirrorStager(const MirrorStager&) = delete;
  MirrorStager& operator=(const MirrorStager&) = delete;
  ~MirrorStager();

  void Post(std::function<void()> task);
  void Stop();
  // Tasks run so far (for tests).
  uint64_t tasks_run() const;

 private:
  void Run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // Guarded by mu_.
  bool started_ = false;                     // Guarded by mu_.
  bool stopping_ = false;                    // Guarded by mu_.
  bool exited_ = false;                      // Guarded by mu_: the thread takes no more tasks.
  uint64_t tasks_run_ = 0;                   // Guarded by mu_.
  std::thread thread_;
};

// An operation's region that lives in mirrored memory.
struct MirroredRegion {
  std::shared_ptr<SharedMemoryMapping> mapping;  // mapping->mirror() != nullptr
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// Starts `op` with `start`. Without `regions`, at once on the calling thread. Otherwise on
// `stager`'s thread once every region is copied in (MirroredMemory::CopyIn); and `op.done` then
// copies them back (CopyOut, on the stager's thread) when the operation succeeded, before the
// original `done` runs -- with the copy's error instead when one fails. When a copy-in fails,
// `start` is not called and `failed` gets the error. Each copy waits at most `timeout` (the
// job's op deadline): a process whose GPU work never finishes fails its operation, and holds the
// staging thread for no longer than that.
//
// With `gpu` (a job's GpuAggregationSlot, agent/gpu_aggregation.h: given only for a sum or
// average whose every buffer is GPU memory, so that `regions` holds one region per local rank,
// in rank order), the node's sum is formed on the GPUs as the job's intra-node plan says:
// GpuAggregation::Before instead of the copies in, ::After instead of the copies back. When the
// plan has nothing to run on GPUs, the copies as above.
//
// With `streaming`, a sum or average whose regions are larger than one staging chunk
// (MirrorStagingChunkBytes) is not copied whole: it starts at once with a StagedInput
// (dataplane/collectives/operation.h), the regions are copied in a chunk at a time, in order, each
// chunk's arrival told to the data plane (`advanced`), and every range the data plane reports
// final is copied back at once -- so the copies overlap the network (push/pull sends a chunk as
// soon as its input is there; other algorithms wait for the whole input, and their result is
// copied back after they end, as above). When a chunk's copy in fails, `abort` fails the running
// operation everywhere (its `done` then reports it); copies back stop after any failure. The
// original `done` runs after every copy back, on the stager's thread.
class GpuAggregationSlot;
struct MirrorStreaming {
  // Starts the operation instead of `start` (CollectiveRunner::Start); on its error `failed` runs
  // and nothing is copied.
  std::function<absl::Status(dataplane::Operation)> start;
  std::function<void()> advanced;                  // CollectiveRunner::StagedInputAdvanced
  std::function<void(const absl::Status&)> abort;  // CollectiveRunner::Abort
};
void StartMirrored(const std::shared_ptr<MirrorStager>& stager, std::vector<MirroredRegion> regions,
                   dataplane::Operation op, std::chrono::milliseconds timeout,
                   std::function<void(dataplane::Operation)> start,
                   std::function<void(const absl::Status&)> failed,
                   std::shared_ptr<GpuAggregationSlot> gpu = nullptr,
                   std::optional<MirrorStreaming> streaming = std::nullopt);

// The staging chunk of StartMirrored's streaming, bytes (default kDefaultMirrorStagingChunk;
// 0: never stream, copy whole regions). Process-wide: the agent's --staging-chunk-kib.
inline constexpr uint64_t kDefaultMirrorStagingChunk = 4 << 20;
void SetMirrorStagingChunkBytes(uint64_t bytes);
uint64_t MirrorStagingChunkBytes();

}  // namespace tributary::agent
