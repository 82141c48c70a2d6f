#include "agent/mirror_stager.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/gpu_aggregation.h"
#include "common/logging.h"
#include "common/thread_name.h"

namespace tributary::agent {
namespace {

constexpr auto Log = common::ComponentLog<"agent">;

std::atomic<uint64_t> staging_chunk_bytes{kDefaultMirrorStagingChunk};

// One streamed operation's copies (StartMirrored with `streaming`). Touched only on the
// stager's thread, in the order its tasks were posted.
struct Streamed {
  std::vector<MirroredRegion> regions;
  std::chrono::milliseconds timeout;
  uint64_t bytes = 0;        // per region
  uint64_t chunk = 0;        // staging chunk
  uint64_t copied_back = 0;  // bytes per region the data plane reported final and were copied
  absl::Status error;        // the first copy's failure
  bool ended = false;        // the operation's done ran: no more copies in
};

// Copies bytes [offset, offset + bytes) of region `r` into its mirror (`in`) or back to the
// process's memory. The error names the buffer and is logged.
absl::Status CopyRegion(const MirroredRegion& r, uint64_t offset, uint64_t bytes, bool in,
                        std::chrono::milliseconds timeout) {
  MirroredMemory& memory = *r.mapping->mirror();
  const absl::Status copied = in ? memory.CopyIn(r.offset + offset, bytes, timeout)
                                 : memory.CopyOut(r.offset + offset, bytes, timeout);
  if (copied.ok()) return copied;
  absl::Status error(copied.code(),
                     absl::StrCat(in ? "copying the input from " : "copying the result back to ",
                                  r.mapping->name(), " failed: ", copied.message()));
  Log()->warn("{}", error.message());
  return error;
}

// Every region whole, in or back, in order; the first failure.
absl::Status CopyWhole(const std::vector<MirroredRegion>& regions, bool in,
                       std::chrono::milliseconds timeout) {
  for (const MirroredRegion& r : regions) {
    if (absl::Status s = CopyRegion(r, 0, r.bytes, in, timeout); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Copies chunk `index` of every region in, tells the data plane, and posts the next chunk.
void StreamIn(std::shared_ptr<MirrorStager> stager, std::shared_ptr<Streamed> st,
              std::shared_ptr<dataplane::StagedInput> staged, MirrorStreaming hooks,
              uint64_t index) {
  // An operation that ended early (it failed) reads no more input: the mirror may already be
  // the next operation's.
  if (st->ended) return;
  const uint64_t begin = index * st->chunk;
  const uint64_t end = std::min(st->bytes, begin + st->chunk);
  for (const MirroredRegion& r : st->regions) {
    if (absl::Status copied = CopyRegion(r, begin, end - begin, /*in=*/true, st->timeout);
        !copied.ok()) {
      st->error = copied;
      hooks.abort(copied);  // the operation's done follows, with this error
      return;
    }
  }
  staged->Advance(end);
  hooks.advanced();
  if (end < st->bytes) {
    // A task per chunk: copies back of finished chunks run in between.
    stager->Post([stager, st, staged, hooks, index] {
      StreamIn(stager, st, std::move(staged), hooks, index + 1);
    });
  }
}

// The streaming path of StartMirrored; runs on the stager's thread.
void StartStreamed(const std::shared_ptr<MirrorStager>& stager, std::vector<MirroredRegion> regions,
                   dataplane::Operation op, std::chrono::milliseconds timeout,
                   const std::function<void(const absl::Status&)>& failed, uint64_t chunk,
                   MirrorStreaming hooks) {
  auto st = std::make_shared<Streamed>();
  st->bytes = regions.front().bytes;
  st->regions = std::move(regions);
  st->timeout = timeout;
  st->chunk = chunk;
  auto staged = std::make_shared<dataplane::StagedInput>(st->bytes);
  staged->SetFinalSink([stager, st](uint64_t offset, uint64_t bytes) {
    stager->Post([st, offset, bytes] {
      if (!st->error.ok()) return;  // the operation fails: nothing more goes back
      for (const MirroredRegion& r : st->regions) {
        if (absl::Status copied = CopyRegion(r, offset, bytes, /*in=*/false, st->timeout);
            !copied.ok()) {
          st->error = copied;
          return;
        }
      }
      st->copied_back += bytes;
    });
  });
  op.staged = staged;
  // After every copy back posted before it (the stager runs its tasks in order).
  op.done = [stager, st, done = std::move(op.done)](absl::Status status) {
    stager->Post([st, done, status]() mutable {
      st->ended = true;
      // A failed copy is the cause wherever the operation's own error came from (a server that
      // waited for this node's chunks in vain, the abort the copy's failure sent).
      if (!st->error.ok()) status = st->error;
      if (status.ok() && st->copied_back != st->bytes) {
        // The algorithm reported nothing final (it waited for the whole input): all of it.
        status = CopyWhole(st->regions, /*in=*/false, st->timeout);
      }
      done(status);
    });
  };
  if (absl::Status started = hooks.start(std::move(op)); !started.ok()) {
    failed(started);
    return;
  }
  StreamIn(stager, std::move(st), std::move(staged), std::move(hooks), 0);
}

}  // namespace

void SetMirrorStagingChunkBytes(uint64_t bytes) { staging_chunk_bytes = bytes; }
uint64_t MirrorStagingChunkBytes() { return staging_chunk_bytes; }

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
  common::SetCurrentThreadName("trib-mirror");
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
                   std::shared_ptr<GpuAggregationSlot> gpu,
                   std::optional<MirrorStreaming> streaming) {
  if (regions.empty()) {
    start(std::move(op));
    return;
  }
  stager->Post([stager, regions = std::move(regions), op = std::move(op), timeout,
                start = std::move(start), failed = std::move(failed), gpu = std::move(gpu),
                streaming = std::move(streaming)]() mutable {
    // The GPU path when the job's plan can run on GPUs, else the copies.
    GpuAggregation* aggregation = nullptr;
    if (gpu != nullptr) {
      absl::StatusOr<GpuAggregation*> a = gpu->Get();
      if (a.ok()) aggregation = *a;
    }
    const uint64_t chunk = MirrorStagingChunkBytes();
    if (aggregation == nullptr && streaming && chunk > 0 &&
        (op.reduction == dataplane::Reduction::kSum ||
         op.reduction == dataplane::Reduction::kAverage) &&
        regions.front().bytes > chunk &&
        std::all_of(regions.begin(), regions.end(),
                    [&](const MirroredRegion& r) { return r.bytes == regions.front().bytes; })) {
      StartStreamed(stager, std::move(regions), std::move(op), timeout, failed,
                    std::max<uint64_t>(chunk / common::DataTypeSize(op.dtype), 1) *
                        common::DataTypeSize(op.dtype),
                    *std::move(streaming));
      return;
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
          status = CopyWhole(regions, /*in=*/false, timeout);
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
    if (absl::Status copied = CopyWhole(regions, /*in=*/true, timeout); !copied.ok()) {
      failed(copied);
      return;
    }
    start(std::move(op));
  });
}

}  // namespace tributary::agent
