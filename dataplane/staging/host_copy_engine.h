// HostCopyEngine: CopyEngine over host memory, memcpy on a thread of its own.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "dataplane/staging/copy_engine.h"

namespace tributary::dataplane {

// The CopyEngine of machines without a GPU, and of the pipeline's tests: "device" memory is
// host memory, copies are memcpy run in order by one worker thread (the engine's "stream"),
// so copies really overlap with what the enqueuing thread does next. Staging memory is plain
// 64-byte-aligned host memory.
//
// Owns its worker: started in the constructor, joined in the destructor after the queue drains.
class HostCopyEngine final : public CopyEngine {
 public:
  HostCopyEngine();
  ~HostCopyEngine() override;

  const char* name() const override { return "host"; }
  absl::StatusOr<StagingMemory> AllocateStaging(size_t bytes) override;
  absl::Status CopyAsync(void* dst, const void* src, size_t bytes) override;
  absl::Status NotifyAsync(absl::AnyInvocable<void(absl::Status)> done) override;
  absl::Status Synchronize() override;

 private:
  void Enqueue(absl::AnyInvocable<void()> task);
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<absl::AnyInvocable<void()>> queue_;  // Guarded by mu_.
  size_t busy_ = 0;                               // Tasks queued or running; guarded by mu_.
  bool stopping_ = false;                         // Guarded by mu_.
  std::thread worker_;
};

}  // namespace tributary::dataplane
