#include "dataplane/intranode/host_gpu_ops.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tributary::dataplane {

HostGpuOps::HostGpuOps(int gpus, Reducer& reducer, Options options)
    : gpus_(gpus), reducer_(reducer), options_(options), random_(options.seed) {
  for (int g = 0; g < gpus; ++g) queue_gpu_.push_back(g);
  queues_.resize(gpus);
}

absl::Status HostGpuOps::CheckGpu(int gpu) const {
  if (gpu < 0 || gpu >= gpus_) {
    return absl::InvalidArgumentError(absl::StrCat("no GPU ", gpu, " (", gpus_, " GPUs)"));
  }
  return absl::OkStatus();
}

absl::Status HostGpuOps::CheckQueue(int queue) const {
  if (queue < 0 || queue >= static_cast<int>(queues_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("no queue ", queue, " (", queues_.size(), " queues)"));
  }
  return absl::OkStatus();
}

int HostGpuOps::QueueGpu(int queue) const {
  return CheckQueue(queue).ok() ? queue_gpu_[queue] : -1;
}

absl::StatusOr<int> HostGpuOps::AddQueue(int gpu) {
  if (absl::Status s = CheckGpu(gpu); !s.ok()) return s;
  queue_gpu_.push_back(gpu);
  queues_.emplace_back();
  return static_cast<int>(queues_.size()) - 1;
}

void HostGpuOps::RegisterBuffer(int gpu, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  ranges_.push_back({p, p + bytes, gpu});
}

absl::StatusOr<void*> HostGpuOps::AllocateDevice(int gpu, size_t bytes) {
  if (absl::Status s = CheckGpu(gpu); !s.ok()) return s;
  storage_.push_back(std::make_unique<char[]>(bytes));
  RegisterBuffer(gpu, storage_.back().get(), bytes);
  return static_cast<void*>(storage_.back().get());
}

absl::StatusOr<void*> HostGpuOps::AllocateHost(size_t bytes) {
  storage_.push_back(std::make_unique<char[]>(bytes));
  RegisterBuffer(-1, storage_.back().get(), bytes);
  return static_cast<void*>(storage_.back().get());
}

absl::StatusOr<int> HostGpuOps::Owner(const void* p, size_t bytes) const {
  const char* c = static_cast<const char*>(p);
  for (const Range& r : ranges_) {
    if (c >= r.begin && c + bytes <= r.end) return r.gpu;
  }
  return absl::InvalidArgumentError("memory outside every registered buffer");
}

bool HostGpuOps::Runnable(const Item& item) const {
  return item.kind != Item::kWait || reached_.count(item.fence) > 0;
}

void HostGpuOps::RunHead(int queue) {
  Item item = std::move(queues_[queue].front());
  queues_[queue].pop_front();
  --pending_;
  if (item.kind == Item::kFence) reached_.insert(item.fence);
  if (item.run) item.run();
  if (!item.log.empty()) log_.push_back(std::move(item.log));
}

void HostGpuOps::Enqueue(int queue, Item item) {
  if (recording_) {
    if (item.kind == Item::kFence) recorded_fences_.insert(item.fence);
    recorded_.emplace_back(queue, std::move(item));
    return;
  }
  queues_[queue].push_back(std::move(item));
  max_pending_ = std::max(max_pending_, ++pending_);
  if (!options_.deferred) {
    // Everything enqueued before ran already (every fence is reached when enqueued), so the
    // item can run now.
    RunHead(queue);
  }
}

absl::Status HostGpuOps::RunUntil(const std::function<bool()>& done) {
  std::vector<int> ready;
  while (!done()) {
    ready.clear();
    for (int q = 0; q < static_cast<int>(queues_.size()); ++q) {
      if (!queues_[q].empty() && Runnable(queues_[q].front())) ready.push_back(q);
    }
    if (ready.empty()) {
      return absl::InternalError("no queue can run, yet the wait is not over");
    }
    RunHead(ready[std::uniform_int_distribution<size_t>(0, ready.size() - 1)(random_)]);
  }
  return absl::OkStatus();
}

absl::Status HostGpuOps::CopyAsync(int queue, void* dst, const void* src, size_t bytes) {
  if (absl::Status s = CheckQueue(queue); !s.ok()) return s;
  const int gpu = queue_gpu_[queue];
  absl::StatusOr<int> from = Owner(src, bytes);
  if (!from.ok()) return from.status();
  absl::StatusOr<int> to = Owner(dst, bytes);
  if (!to.ok()) return to.status();
  std::string what;
  if (*from >= 0 && *to < 0) {
    what = absl::StrCat("d2h ", *from);
  } else if (*from < 0 && *to >= 0) {
    what = absl::StrCat("h2d ", *to);
  } else if (*from >= 0 && *to >= 0 && *from != *to) {
    what = absl::StrCat("peer ", *from, "->", *to);
  } else if (*from >= 0) {
    what = absl::StrCat("local ", *from);
  } else {
    what = "h2h";
  }
  // A queue copies only to or from its own GPU's memory (or between host buffers).
  if (*from != gpu && *to != gpu && !(*from < 0 && *to < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " enqueued on GPU ", gpu));
  }
  Enqueue(queue, {.run = [dst, src, bytes] { std::memmove(dst, src, bytes); },
                  .log = absl::StrCat(what, " on ", gpu)});
  return absl::OkStatus();
}

absl::Status HostGpuOps::ReduceAsync(int queue, common::DataType dtype, void* dst,
                                     std::span<const void* const> srcs, size_t count) {
  if (absl::Status s = CheckQueue(queue); !s.ok()) return s;
  const int gpu = queue_gpu_[queue];
  if (srcs.empty()) return absl::InvalidArgumentError("a reduction needs a source");
  const size_t bytes = count * common::DataTypeSize(dtype);
  for (const void* p : srcs) {
    absl::StatusOr<int> owner = Owner(p, bytes);
    if (!owner.ok()) return owner.status();
    if (*owner != gpu) {
      return absl::InvalidArgumentError(absl::StrCat("GPU ", gpu, " reduces memory of ",
                                                     *owner < 0 ? "the host" : "GPU ",
                                                     *owner < 0 ? "" : absl::StrCat(*owner)));
    }
  }
  std::vector<const void*> sources(srcs.begin(), srcs.end());
  Enqueue(queue, {.run =
                      [this, dtype, dst, sources, bytes, count] {
                        if (sources.size() == 1) {
                          std::memmove(dst, sources[0], bytes);
                          return;
                        }
                        reducer_.Sum2(dtype, dst, sources[0], sources[1], count);
                        for (size_t i = 2; i < sources.size(); ++i) {
                          reducer_.Sum(dtype, dst, sources[i], count);
                        }
                      },
                  .log = absl::StrCat("reduce ", srcs.size(), " on ", gpu)});
  return absl::OkStatus();
}

absl::Status HostGpuOps::DivideAsync(int queue, common::DataType dtype, void* dst, size_t count,
                                     uint64_t divisor) {
  if (absl::Status s = CheckQueue(queue); !s.ok()) return s;
  const int gpu = queue_gpu_[queue];
  if (divisor == 0) return absl::InvalidArgumentError("divisor must be >= 1");
  absl::StatusOr<int> owner = Owner(dst, count * common::DataTypeSize(dtype));
  if (!owner.ok()) return owner.status();
  if (*owner != gpu) return absl::InvalidArgumentError("a queue divides its own GPU's memory");
  Enqueue(queue, {.run = [this, dtype, dst, count,
                          divisor] { reducer_.Divide(dtype, dst, count, divisor); },
                  .log = absl::StrCat("divide on ", gpu)});
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> HostGpuOps::Fence(int queue) {
  if (absl::Status s = CheckQueue(queue); !s.ok()) return s;
  const uint64_t fence = next_fence_++;
  fences_[fence] = queue;
  Enqueue(queue, {.run = nullptr,
                  .log = absl::StrCat("fence ", queue_gpu_[queue]),
                  .fence = fence,
                  .kind = Item::kFence});
  return fence;
}

absl::Status HostGpuOps::WaitFence(int queue, uint64_t fence) {
  if (absl::Status s = CheckQueue(queue); !s.ok()) return s;
  if (recording_) return absl::FailedPreconditionError("a host wait while recording");
  auto it = fences_.find(fence);
  if (it == fences_.end()) return absl::InvalidArgumentError("unknown or already waited fence");
  fences_.erase(it);
  if (absl::Status s = RunUntil([&] { return reached_.count(fence) > 0; }); !s.ok()) return s;
  log_.push_back(absl::StrCat("wait ", queue_gpu_[queue]));
  return absl::OkStatus();
}

absl::Status HostGpuOps::QueueWaitFence(int queue, uint64_t fence) {
  if (absl::Status s = CheckQueue(queue); !s.ok()) return s;
  if (!fences_.count(fence)) return absl::InvalidArgumentError("unknown or released fence");
  Enqueue(queue, {.run = nullptr,
                  .log = absl::StrCat("qwait ", queue_gpu_[queue]),
                  .fence = fence,
                  .kind = Item::kWait});
  return absl::OkStatus();
}

absl::Status HostGpuOps::ReleaseFence(uint64_t fence) {
  if (!fences_.erase(fence)) return absl::InvalidArgumentError("unknown or released fence");
  return absl::OkStatus();
}

absl::Status HostGpuOps::Synchronize(int queue) {
  if (absl::Status s = CheckQueue(queue); !s.ok()) return s;
  if (recording_) return absl::FailedPreconditionError("a host wait while recording");
  return RunUntil([&] { return queues_[queue].empty(); });
}

absl::Status HostGpuOps::BeginRecording() {
  if (recording_) return absl::FailedPreconditionError("already recording");
  recording_ = true;
  recorded_.clear();
  recorded_fences_.clear();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> HostGpuOps::EndRecording() {
  if (!recording_) return absl::FailedPreconditionError("not recording");
  recording_ = false;
  recordings_[next_recording_] = {std::move(recorded_), std::move(recorded_fences_)};
  recorded_.clear();
  recorded_fences_.clear();
  log_.push_back("record");
  return next_recording_++;
}

absl::Status HostGpuOps::Replay(uint64_t recording, int queue) {
  if (absl::Status s = CheckQueue(queue); !s.ok()) return s;
  if (recording_) return absl::FailedPreconditionError("a replay while recording");
  auto it = recordings_.find(recording);
  if (it == recordings_.end()) return absl::InvalidArgumentError("unknown recording");
  ++replays_;
  log_.push_back("replay");
  // Fork: every queue of the recording starts after `queue`'s work so far.
  const uint64_t fork = next_fence_++;
  Enqueue(queue, {.run = nullptr, .log = "", .fence = fork, .kind = Item::kFence});
  std::set<int> used;
  for (const auto& [q, item] : it->second.items) used.insert(q);
  for (int q : used) {
    if (q != queue) Enqueue(q, {.run = nullptr, .log = "", .fence = fork, .kind = Item::kWait});
  }
  // The recorded work with fresh fences (a fence of an earlier replay is reached already).
  std::map<uint64_t, uint64_t> renamed;
  for (uint64_t f : it->second.fences) renamed[f] = next_fence_++;
  for (const auto& [q, item] : it->second.items) {
    Item copy = item;
    if (auto r = renamed.find(copy.fence); copy.kind != Item::kWork && r != renamed.end()) {
      copy.fence = r->second;
    }
    Enqueue(q, std::move(copy));
  }
  // Join: `queue`'s later work waits for every queue of the recording.
  for (int q : used) {
    if (q == queue) continue;
    const uint64_t join = next_fence_++;
    Enqueue(q, {.run = nullptr, .log = "", .fence = join, .kind = Item::kFence});
    Enqueue(queue, {.run = nullptr, .log = "", .fence = join, .kind = Item::kWait});
  }
  return absl::OkStatus();
}

absl::Status HostGpuOps::DropRecording(uint64_t recording) {
  if (!recordings_.erase(recording)) return absl::InvalidArgumentError("unknown recording");
  return absl::OkStatus();
}

}  // namespace tributary::dataplane
