// StagingPipeline: GPU tensors to and from the network through host staging slots, by chunk,
// with the copy of one chunk overlapping the network transfer of another.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dataplane/staging/copy_engine.h"

namespace tributary::dataplane {

// A ring of `slots` staging buffers of `chunk_bytes` each, allocated once by a CopyEngine
// (page-locked on a GPU), through which tensors leave and enter (device) memory chunk by chunk:
//
//  * Send: chunk c is copied tensor -> slot on the engine's stream; when the copy is done the
//    chunk goes to the sink (the network send); when the sink releases it, its slot takes the
//    next chunk. Copies of chunks c+1 .. c+slots-1 run while chunk c is on the network.
//  * Receive: the source fills a free slot with chunk c (the network receive); when it says the
//    bytes are there, the slot is copied slot -> tensor on the engine's stream and is free again
//    when that copy is done. Chunks c+1 .. arrive while chunk c is copied.
//
// Invariants (tests/dataplane/staging): chunks reach the sink (and are asked of the source) in
// order, each exactly once; a slot is written only after the sink released it (Send) or its
// copy finished (Receive); at most `slots` chunks are between those two points.
//
// Threading: Send and Receive block the calling thread, which issues every copy and calls the
// sink and the source (a data plane runs them on a staging thread of its own, never on the
// transport's progress thread). `release` and `filled` may be called from any thread, inside
// or after the sink/source call. One Send or Receive at a time per pipeline.
class StagingPipeline {
 public:
  struct Options {
    size_t chunk_bytes = size_t{4} << 20;  // Bytes per chunk (the last one may be shorter).
    int slots = 4;                         // Staging buffers; >= 2 for any overlap.
  };

  // One chunk of a transfer: bytes [offset, offset + bytes) of the tensor, staged at `host`.
  struct Chunk {
    size_t index = 0;
    size_t offset = 0;
    size_t bytes = 0;
    void* host = nullptr;
  };

  // Send's sink: starts sending `chunk` (its bytes are final); calls `release` once, from any
  // thread, when the network no longer needs them.
  using Sink = absl::FunctionRef<void(const Chunk& chunk, absl::AnyInvocable<void()> release)>;
  // Receive's source: arranges for `chunk.bytes` bytes to be written at `chunk.host`; calls
  // `filled` once, from any thread, with OK when they are there (or the error that prevented it).
  using Source =
      absl::FunctionRef<void(const Chunk& chunk, absl::AnyInvocable<void(absl::Status)> filled)>;

  // INVALID_ARGUMENT for chunk_bytes == 0 or slots < 1; the engine's error when it cannot
  // allocate the staging memory. `engine` must outlive the pipeline.
  static absl::StatusOr<std::unique_ptr<StagingPipeline>> Create(CopyEngine& engine,
                                                                 Options options);
  ~StagingPipeline();

  // Copies `bytes` of tensor memory at `src` out through the slots to `sink`. Returns when every
  // chunk has been released (OK), on the first copy error, or DEADLINE_EXCEEDED after `timeout`
  // (the sink did not release, or the engine did not finish, in time). After an error the slots
  // still held by the sink stay out of use until released; a Send or Receive that starts while
  // one is still held fails FAILED_PRECONDITION.
  absl::Status Send(const void* src, size_t bytes, Sink sink, std::chrono::nanoseconds timeout);

  // Fills `bytes` of tensor memory at `dst` from `source` through the slots. Returns when every
  // chunk has been copied to `dst` (OK), on the first error of the source or of a copy, or
  // DEADLINE_EXCEEDED after `timeout`; then as Send.
  absl::Status Receive(void* dst, size_t bytes, Source source, std::chrono::nanoseconds timeout);

  const Options& options() const { return options_; }
  const char* engine_name() const { return engine_.name(); }

 private:
  struct State;
  StagingPipeline(CopyEngine& engine, Options options, std::vector<StagingMemory> slots);
  absl::Status CheckIdle(const void* tensor, size_t bytes) const;

  CopyEngine& engine_;
  Options options_;
  std::vector<StagingMemory> slots_;
  std::shared_ptr<State> state_;  // Shared with the engine's and the sink's callbacks.
};

}  // namespace tributary::dataplane
