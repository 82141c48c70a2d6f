// A timeline of what one process did, in Chrome's Trace Event Format (JSON array form), for
// chrome://tracing and https://ui.perfetto.dev. Processes on one machine share the monotonic clock
// that timestamps every event, so the traces of a training process and of the agents of an
// emulated cluster can be concatenated into one timeline (scripts/merge_traces.py).
//
// Off unless Start was called; then every recording call is one relaxed atomic load. Events are
// buffered and appended to the file by a writer thread a few times a second, so a process killed
// without warning loses at most the last fraction of a second (the JSON array form needs no
// closing bracket). At most `max_events` are recorded; later ones are counted and dropped.
//
// Threading: every function is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"

namespace tributary::common {

class Trace {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Args = std::initializer_list<std::pair<std::string_view, int64_t>>;

  // Starts recording into `path` (truncated) with `process_name` as the process's label.
  // FAILED_PRECONDITION when already recording, the file's error when it cannot be created.
  static absl::Status Start(const std::string& path, std::string_view process_name,
                            uint64_t max_events = 4'000'000);
  // Writes what is buffered, closes the array and the file. A no-op when not recording.
  static absl::Status Stop();
  static bool enabled();
  static uint64_t dropped();

  // A span on the row `track` (rows are named per process): ph "X". Spans on one track should
  // not overlap; use Async for spans that may.
  static void Span(std::string_view track, std::string_view name, TimePoint start, TimePoint end,
                   Args args = {});
  // A span that may overlap others with the same name: ph "b"/"e", grouped by name and id.
  static void Async(std::string_view name, uint64_t id, TimePoint start, TimePoint end,
                    Args args = {});
  // A value over time: ph "C".
  static void Counter(std::string_view name, TimePoint t, int64_t value);
};

}  // namespace tributary::common
