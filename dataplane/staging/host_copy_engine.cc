#include "dataplane/staging/host_copy_engine.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tributary::dataplane {

HostCopyEngine::HostCopyEngine() : worker_([this] { Run(); }) {}

HostCopyEngine::~HostCopyEngine() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

absl::StatusOr<StagingMemory> HostCopyEngine::AllocateStaging(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("staging memory of 0 bytes");
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of staging memory"));
  }
  return StagingMemory(p, bytes, [](void* q) { std::free(q); });
}

absl::Status HostCopyEngine::CopyAsync(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr)
    return absl::InvalidArgumentError("copy with a null pointer");
  Enqueue([dst, src, bytes] { std::memcpy(dst, src, bytes); });
  return absl::OkStatus();
}

absl::Status HostCopyEngine::NotifyAsync(absl::AnyInvocable<void(absl::Status)> done) {
  Enqueue([done = std::move(done)]() mutable { done(absl::OkStatus()); });
  return absl::OkStatus();
}

absl::Status HostCopyEngine::Synchronize() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [this] { return busy_ == 0; });
  return absl::OkStatus();
}

void HostCopyEngine::Enqueue(absl::AnyInvocable<void()> task) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(task));
    ++busy_;
  }
  cv_.notify_all();
}

void HostCopyEngine::Run() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // Stopping, and drained.
    absl::AnyInvocable<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    lock.lock();
    --busy_;
    cv_.notify_all();
  }
}

}  // namespace tributary::dataplane
