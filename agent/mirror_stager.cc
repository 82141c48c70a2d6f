#include "agent/mirror_stager.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/gpu_aggregation.h"
#include "common/logging.h"

namespace tributary::agent {
namespace {

constexpr auto Log = common::ComponentLog<"agent">;

}  // namespace

MirrorStager::~MirrorStager() {
  Stop();
  // Stop joined the thread unless this is it (the last owner let go inside a task).
  if (thread_.joinable()) thread_.detach();
}

void MirrorStager::Post(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    if (!exited_) {
      queue_.push_back(std::move(task));
      if (!started_) {
        started_ = true;
        thread_ = std::thread([this] { Run(); });
      }
      cv_.notify_one();
      return;
    }
  }
  task();  // after Stop: on the caller's thread
}

void MirrorStager::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    if (!started_) exited_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

uint64_t MirrorStager::tasks_run() const {
  std::lock_guard lock(mu_);
  return tasks_run_;
}

void MirrorStager::Run() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) {
        exited_ = true;
        return;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
    task = nullptr;
    std::lock_guard lock(mu_);
    tasks_run_++;
  }
}

void StartMirrored(const std::shared_ptr<MirrorStager>& stager, std::vector<MirroredRegion> regions,
                   dataplane::Operation op, std::chrono::milliseconds timeout,
                   std::function<void(dataplane::Operation)> start,
                   std::function<void(const absl::Status&)> failed,
                   std::shared_ptr<GpuAggregationSlot> gpu) {
  if (regions.empty()) {
    start(std::move(op));
    return;
  }
  stager->Post([stager, regions = std::move(regions), op = std::move(op), timeout,
                start = std::move(start), failed = std::move(failed),
                gpu = std::move(gpu)]() mutable {
    // The GPU path when the job's plan can run on GPUs, else the copies.
    GpuAggregation* aggregation = nullptr;
    if (gpu != nullptr) {
      absl::StatusOr<GpuAggregation*> a = gpu->Get();
      if (a.ok()) aggregation = *a;
    }
    const common::DataType dtype = op.dtype;
    const uint64_t count = op.count;
    // The results go back before the handles complete: the process's next work must see them.
    op.done = [stager, regions, timeout, gpu, aggregation, dtype, count,
               done = std::move(op.done)](absl::Status status) {
      stager->Post([regions, timeout, gpu, aggregation, dtype, count, done, status]() mutable {
        if (status.ok() && aggregation != nullptr) {
          absl::Status back = aggregation->After(regions, dtype, count, timeout);
          if (!back.ok()) {
            status = back;
            Log()->warn("{}", status.message());
          }
        } else if (status.ok()) {
          for (const MirroredRegion& r : regions) {
            absl::Status copied = r.mapping->mirror()->CopyOut(r.offset, r.bytes, timeout);
            if (!copied.ok()) {
              status = absl::Status(copied.code(),
                                    absl::StrCat("copying the result back to ", r.mapping->name(),
                                                 " failed: ", copied.message()));
              Log()->warn("{}", status.message());
              break;
            }
          }
        }
        done(status);
      });
    };
    if (aggregation != nullptr) {
      if (absl::Status s = aggregation->Before(regions, dtype, count, timeout); !s.ok()) {
        Log()->warn("summing the node's GPU tensors failed: {}", s.message());
        failed(s);
        return;
      }
      start(std::move(op));
      return;
    }
    for (const MirroredRegion& r : regions) {
      absl::Status copied = r.mapping->mirror()->CopyIn(r.offset, r.bytes, timeout);
      if (!copied.ok()) {
        const absl::Status status(copied.code(),
                                  absl::StrCat("copying the input from ", r.mapping->name(),
                                               " failed: ", copied.message()));
        Log()->warn("{}", status.message());
        failed(status);
        return;
      }
    }
    start(std::move(op));
  });
}

}  // namespace tributary::agent
