#include "dataplane/staging/staging_pipeline.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tributary::dataplane {

// What the engine's and the sink's callbacks report, under one mutex.
struct StagingPipeline::State {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int> free_slots;  // Slots neither being copied nor held by the sink/source.
  std::vector<char> done;      // Per chunk of the current transfer: its copy (or fill) finished.
  size_t completed = 0;        // Chunks whose slot came back (released / copied to the tensor).
  absl::Status error;          // The first error a callback reported.
  uint64_t generation = 0;     // Bumped when a Receive ends: late `filled` calls free their slot.
};

namespace {

absl::Status Deadline(const char* what, size_t completed, size_t chunks) {
  return absl::DeadlineExceededError(absl::StrCat(
      what, " of ", chunks, " staged chunks timed out after ", completed,
      " completed: the network side did not release or fill a slot, or the copy engine did not "
      "finish, in time"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<StagingPipeline>> StagingPipeline::Create(CopyEngine& engine,
                                                                         Options options) {
  if (options.chunk_bytes == 0) return absl::InvalidArgumentError("chunk_bytes must be > 0");
  if (options.slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("slots must be >= 1, not ", options.slots));
  }
  std::vector<StagingMemory> slots;
  for (int i = 0; i < options.slots; ++i) {
    absl::StatusOr<StagingMemory> m = engine.AllocateStaging(options.chunk_bytes);
    if (!m.ok()) return m.status();
    slots.push_back(std::move(*m));
  }
  return std::unique_ptr<StagingPipeline>(new StagingPipeline(engine, options, std::move(slots)));
}

StagingPipeline::StagingPipeline(CopyEngine& engine, Options options,
                                 std::vector<StagingMemory> slots)
    : engine_(engine),
      options_(options),
      slots_(std::move(slots)),
      state_(std::make_shared<State>()) {
  for (int i = 0; i < options_.slots; ++i) state_->free_slots.push_back(i);
}

StagingPipeline::~StagingPipeline() {
  // No copy may still write into a slot that is about to be freed.
  engine_.Synchronize().IgnoreError();
}

absl::Status StagingPipeline::CheckIdle(const void* tensor, size_t bytes) const {
  if (tensor == nullptr && bytes > 0) return absl::InvalidArgumentError("tensor pointer is null");
  std::lock_guard lock(state_->mu);
  if (state_->free_slots.size() != slots_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat(slots_.size() - state_->free_slots.size(), " of ", slots_.size(),
                     " staging slots are still held by an earlier transfer's network side"));
  }
  return absl::OkStatus();
}

absl::Status StagingPipeline::Send(const void* src, size_t bytes, Sink sink,
                                   std::chrono::nanoseconds timeout) {
  if (absl::Status s = CheckIdle(src, bytes); !s.ok()) return s;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const size_t chunk_bytes = options_.chunk_bytes;
  const size_t chunks = (bytes + chunk_bytes - 1) / chunk_bytes;
  State& st = *state_;
  std::vector<int> slot_of(chunks, -1);
  size_t next_copy = 0, next_deliver = 0;
  // After an error: once the engine is idle, the slots of chunks the sink never got are free.
  auto fail = [&](absl::Status error) {
    engine_.Synchronize().IgnoreError();
    std::lock_guard l(st.mu);
    for (size_t c = next_deliver; c < next_copy; ++c) st.free_slots.push_back(slot_of[c]);
    return error;
  };
  std::unique_lock lock(st.mu);
  st.done.assign(chunks, 0);
  st.completed = 0;
  st.error = absl::OkStatus();
  while (st.completed < chunks) {
    if (!st.error.ok()) {
      absl::Status error = st.error;
      lock.unlock();
      return fail(error);
    }
    // Every free slot takes the next chunk's copy.
    while (next_copy < chunks && !st.free_slots.empty()) {
      const int slot = st.free_slots.front();
      st.free_slots.pop_front();
      slot_of[next_copy] = slot;
      const size_t c = next_copy++;
      const size_t offset = c * chunk_bytes;
      const size_t n = std::min(chunk_bytes, bytes - offset);
      lock.unlock();
      absl::Status s =
          engine_.CopyAsync(slots_[slot].data(), static_cast<const char*>(src) + offset, n);
      if (s.ok()) {
        s = engine_.NotifyAsync([state = state_, c](absl::Status copied) {
          std::lock_guard l(state->mu);
          if (copied.ok()) {
            state->done[c] = 1;
          } else if (state->error.ok()) {
            state->error = copied;
          }
          state->cv.notify_all();
        });
      }
      lock.lock();
      if (!s.ok()) {
        lock.unlock();
        return fail(s);
      }
    }
    // Copied chunks go to the sink in order.
    if (next_deliver < next_copy && st.done[next_deliver]) {
      const size_t c = next_deliver++;
      const int slot = slot_of[c];
      const size_t offset = c * chunk_bytes;
      const Chunk chunk{c, offset, std::min(chunk_bytes, bytes - offset), slots_[slot].data()};
      lock.unlock();
      sink(chunk, [state = state_, slot, once = false]() mutable {
        if (std::exchange(once, true)) return;
        std::lock_guard l(state->mu);
        state->free_slots.push_back(slot);
        ++state->completed;
        state->cv.notify_all();
      });
      lock.lock();
      continue;
    }
    if (st.completed == chunks) break;
    // Woken by what the loop acts on. A copy's error can arrive while the copies above run
    // unlocked, before this wait: checked here, not lost (it used to wait out the deadline).
    if (!st.cv.wait_until(lock, deadline, [&] {
          return !st.error.ok() || st.completed == chunks ||
                 (next_deliver < next_copy && st.done[next_deliver]) ||
                 (next_copy < chunks && !st.free_slots.empty());
        })) {
      const size_t completed = st.completed;
      lock.unlock();
      return fail(Deadline("send", completed, chunks));
    }
  }
  return absl::OkStatus();
}

absl::Status StagingPipeline::Receive(void* dst, size_t bytes, Source source,
                                      std::chrono::nanoseconds timeout) {
  if (absl::Status s = CheckIdle(dst, bytes); !s.ok()) return s;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const size_t chunk_bytes = options_.chunk_bytes;
  const size_t chunks = (bytes + chunk_bytes - 1) / chunk_bytes;
  State& st = *state_;
  std::vector<int> slot_of(chunks, -1);
  size_t next_fill = 0, next_copy = 0;
  // After an error: once the engine is idle, the slots of filled chunks not copied yet are free;
  // the source frees the others when it calls `filled` (late).
  auto fail = [&](absl::Status error) {
    engine_.Synchronize().IgnoreError();
    std::lock_guard l(st.mu);
    ++st.generation;
    for (size_t c = next_copy; c < next_fill; ++c) {
      if (st.done[c]) st.free_slots.push_back(slot_of[c]);
    }
    return error;
  };
  std::unique_lock lock(st.mu);
  st.done.assign(chunks, 0);  // Here: the source filled the chunk's slot.
  st.completed = 0;
  st.error = absl::OkStatus();
  while (st.completed < chunks) {
    if (!st.error.ok()) {
      absl::Status error = st.error;
      lock.unlock();
      return fail(error);
    }
    // Filled chunks are copied to the tensor in order; their slot is free once that is done.
    if (next_copy < next_fill && st.done[next_copy]) {
      const size_t c = next_copy++;
      const int slot = slot_of[c];
      const size_t offset = c * chunk_bytes;
      const size_t n = std::min(chunk_bytes, bytes - offset);
      lock.unlock();
      absl::Status s = engine_.CopyAsync(static_cast<char*>(dst) + offset, slots_[slot].data(), n);
      if (s.ok()) {
        s = engine_.NotifyAsync([state = state_, slot](absl::Status copied) {
          std::lock_guard l(state->mu);
          if (copied.ok()) {
            state->free_slots.push_back(slot);
            ++state->completed;
          } else if (state->error.ok()) {
            state->error = copied;
          }
          state->cv.notify_all();
        });
      }
      lock.lock();
      if (!s.ok()) {
        st.free_slots.push_back(slot);
        lock.unlock();
        return fail(s);
      }
      continue;
    }
    // Every free slot is offered to the source for the next chunk.
    if (next_fill < chunks && !st.free_slots.empty()) {
      const int slot = st.free_slots.front();
      st.free_slots.pop_front();
      slot_of[next_fill] = slot;
      const size_t c = next_fill++;
      const size_t offset = c * chunk_bytes;
      const Chunk chunk{c, offset, std::min(chunk_bytes, bytes - offset), slots_[slot].data()};
      lock.unlock();
      const uint64_t generation = st.generation;
      source(chunk,
             [state = state_, c, slot, generation, once = false](absl::Status filled) mutable {
               if (std::exchange(once, true)) return;
               std::lock_guard l(state->mu);
               if (generation != state->generation) {  // That Receive has ended.
                 state->free_slots.push_back(slot);
               } else if (filled.ok()) {
                 state->done[c] = 1;
               } else {
                 state->free_slots.push_back(slot);
                 if (state->error.ok()) state->error = filled;
               }
               state->cv.notify_all();
             });
      lock.lock();
      continue;
    }
    if (st.completed == chunks) break;
    if (!st.cv.wait_until(lock, deadline, [&] {
          return !st.error.ok() || st.completed == chunks ||
                 (next_copy < next_fill && st.done[next_copy]) ||
                 (next_fill < chunks && !st.free_slots.empty());
        })) {
      const size_t completed = st.completed;
      lock.unlock();
      return fail(Deadline("receive", completed, chunks));
    }
  }
  ++st.generation;  // Under `lock`.
  return absl::OkStatus();
}

}  // namespace tributary::dataplane
