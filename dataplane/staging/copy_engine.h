// CopyEngine: where staged chunks are copied, and the memory they are staged in.
#pragma once

#include <cstddef>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tributary::dataplane {

// Host memory a CopyEngine allocated for staging (page-locked on a GPU engine), freed by its
// engine's deleter when the buffer goes.
class StagingMemory {
 public:
  StagingMemory() = default;
  StagingMemory(void* data, size_t bytes, void (*free)(void*))
      : data_(data), bytes_(bytes), free_(free) {}
  StagingMemory(StagingMemory&& o) noexcept { *this = std::move(o); }
  StagingMemory& operator=(StagingMemory&& o) noexcept {
    Reset();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    free_ = std::exchange(o.free_, nullptr);
    return *this;
  }
  ~StagingMemory() { Reset(); }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void Reset() {
    if (data_ != nullptr && free_ != nullptr) free_(data_);
    data_ = nullptr;
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
  void (*free_)(void*) = nullptr;
};

// An ordered queue of copies between (device) tensor memory and host staging memory, like one
// CUDA stream: work runs in the order it was enqueued, asynchronously to the caller.
// Implementations: HostCopyEngine (memcpy on a thread of its own; "device" memory is host
// memory: the pipeline's logic runs and is tested without a GPU) and CudaCopyEngine
// (cudaMemcpyAsync on a stream of its own, cudaHostAlloc'd staging).
//
// Thread-safety: one thread enqueues at a time (the pipeline's); callbacks run on an engine
// thread and must not call the engine.
class CopyEngine {
 public:
  virtual ~CopyEngine() = default;

  // "host" or "cuda", for logs.
  virtual const char* name() const = 0;

  // `bytes` (> 0) of host memory for staging: page-locked where the engine's copies need it.
  virtual absl::StatusOr<StagingMemory> AllocateStaging(size_t bytes) = 0;

  // Enqueues a copy of `bytes` from `src` to `dst`, one of them staging memory of this engine,
  // the other tensor memory (device memory on a GPU engine). Runs after everything enqueued
  // before it. An error here means nothing was enqueued.
  virtual absl::Status CopyAsync(void* dst, const void* src, size_t bytes) = 0;

  // Enqueues `done`, called once, on an engine thread, when everything enqueued before it has
  // finished, with OK or the error that work hit. `done` must not call the engine.
  virtual absl::Status NotifyAsync(absl::AnyInvocable<void(absl::Status)> done) = 0;

  // Blocks until everything enqueued so far has finished.
  virtual absl::Status Synchronize() = 0;
};

}  // namespace tributary::dataplane
