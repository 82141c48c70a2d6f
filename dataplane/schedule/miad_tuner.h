// MIAD chunk-size tuner (DESIGN.md §1.3): grows the chunk size multiplicatively while the
// measured throughput rises, backs off additively when it falls, clamps to [min, max], and
// re-probes when the throughput at the settled size shifts. Pure: throughput samples are
// injected, so tests drive it with synthetic curves. Not thread-safe. Push/pull's home servers
// run one per tensor for its partition (PartitionTuned in allreduce_push_pull.h).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace tributary::dataplane {

class MiadTuner {
 public:
  struct Options {
    uint64_t min_bytes = uint64_t{64} << 10;
    uint64_t max_bytes = uint64_t{64} << 20;  // e.g. tensor bytes / number of trees
    uint64_t initial_bytes = uint64_t{1} << 20;
    double increase_factor = 2.0;                  // > 1
    uint64_t decrease_step = uint64_t{256} << 10;  // > 0, bytes
    // Noise handling: decisions compare the means of windows of this many samples ...
    int samples_per_step = 3;
    // ... and count a change only beyond this relative difference.
    double threshold = 0.05;
  };

  explicit MiadTuner(Options options);

  // The chunk size to use now, bytes, within [min_bytes, max_bytes].
  uint64_t chunk_bytes() const { return size_; }
  // One throughput measurement (bytes/s) taken at chunk_bytes().
  void Report(double throughput_bytes_per_s);

  // True while holding a size (no probing in progress).
  bool settled() const { return phase_ == Phase::kSettled; }
  // Number of windows (decisions) so far.
  int windows() const { return windows_; }

 private:
  enum class Phase { kGrow, kBackOff, kSettled };
  void Decide(double mean);
  void StartProbe(double mean);
  void Settle();
  uint64_t Clamp(double bytes) const;

  Options options_;
  uint64_t size_;
  Phase phase_ = Phase::kGrow;
  double window_sum_ = 0;
  int window_count_ = 0;
  int windows_ = 0;
  double previous_mean_ = -1;  // mean of the previous window of this probe (-1: none yet)
  // (size, mean) of the windows of the current probe.
  std::vector<std::pair<uint64_t, double>> history_;
  double reference_ = -1;  // mean at the settled size (-1: to be measured)
};

}  // namespace tributary::dataplane
