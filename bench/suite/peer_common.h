// What the suite's peer programs (Gloo, MPI) share: flags, sizes, the input pattern and its check,
// and the output lines, which match `tributary bench-rank --csv`:
//   CSV,size,count,type,op,time_us,algbw,busbw,wrong
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/byte_size.h"

namespace tributary::bench {

struct PeerFlags {
  std::string sizes = "4K:256M";    // MIN:MAX (powers of 2) or a comma list; K/M/G suffixes.
  std::vector<uint64_t> size_list;  // `sizes` parsed (by ParsePeerFlags).
  int iters = 10;                   // Timed iterations per size below `large_from`.
  int warmup = 2;
  int large_iters = 3;  // Timed iterations per size from `large_from`.
  uint64_t large_from = 16ull << 20;
  std::string algorithm;  // Peer-specific.
  bool check = true;
  // A model's gradient list (see `tributary bench-rank --tensors`) instead of --sizes, all-reduced
  // the way PyTorch DistributedDataParallel does: packed in backward order into buckets of at
  // most `bucket_bytes` (DDP's default 25 MiB), one all-reduce per bucket.
  std::string tensors;
  std::string workload_name = "workload";
  uint64_t bucket_bytes = 25ull << 20;
};

// A size flag's value ("16M"), parsed as the CLI parses it; false, with the reason on stderr.
inline bool ParseSizeFlag(const std::string& flag, const std::string& text, uint64_t& out) {
  std::string error;
  const std::optional<uint64_t> size = common::ParseByteSize(text, &error);
  if (!size) {
    std::fprintf(stderr, "%s: %s\n", flag.c_str(), error.c_str());
    return false;
  }
  out = *size;
  return true;
}

// Parses --sizes, --iters, --warmup, --large-iters, --large-from, --algorithm, --no-check,
// --tensors, --workload-name, --bucket-bytes; other "--flag value" pairs are handed to `extra`
// (return false there to reject them). Sizes are parsed as the CLI parses them
// (common/byte_size.h); false, with the reason on stderr, on a bad one.
template <typename Extra>
bool ParsePeerFlags(int argc, char** argv, PeerFlags& f, Extra extra) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--no-check") {
      f.check = false;
      continue;
    }
    if (i + 1 >= argc) return false;
    const std::string value = argv[++i];
    bool ok = true;
    if (flag == "--sizes") {
      f.sizes = value;
    } else if (flag == "--iters") {
      f.iters = std::atoi(value.c_str());
    } else if (flag == "--warmup") {
      f.warmup = std::atoi(value.c_str());
    } else if (flag == "--large-iters") {
      f.large_iters = std::atoi(value.c_str());
    } else if (flag == "--large-from") {
      ok = ParseSizeFlag(flag, value, f.large_from);
    } else if (flag == "--algorithm") {
      f.algorithm = value;
    } else if (flag == "--tensors") {
      f.tensors = value;
    } else if (flag == "--workload-name") {
      f.workload_name = value;
    } else if (flag == "--bucket-bytes") {
      ok = ParseSizeFlag(flag, value, f.bucket_bytes);
    } else {
      ok = extra(flag, value);
    }
    if (!ok) return false;
  }
  std::string error;
  std::optional<std::vector<uint64_t>> sizes = common::ParseByteSizeList(f.sizes, &error);
  if (!sizes) {
    std::fprintf(stderr, "--sizes: %s\n", error.c_str());
    return false;
  }
  f.size_list = std::move(*sizes);
  return true;
}

// Element counts of the DDP-style buckets of a "name count" file (backward order): tensors are
// packed in file order while the bucket stays within `bucket_bytes` of float32 (a larger tensor
// is a bucket of its own). Empty on a read error.
inline std::vector<size_t> ReadBuckets(const std::string& path, uint64_t bucket_bytes,
                                       size_t* tensors) {
  std::ifstream in(path);
  std::vector<size_t> buckets;
  std::string line;
  size_t current = 0;
  *tensors = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name;
    long long count = 0;
    if (!(fields >> name >> count) || count <= 0) return {};
    ++*tensors;
    if (current > 0 && (current + count) * sizeof(float) > bucket_bytes) {
      buckets.push_back(current);
      current = 0;
    }
    current += static_cast<size_t>(count);
  }
  if (current > 0) buckets.push_back(current);
  return buckets;
}

// Rank r's input: element i is (r + 1) + (i % 7); the sum over n ranks is exact in float32.
inline void Fill(float* data, size_t count, int rank) {
  for (size_t i = 0; i < count; ++i)
    data[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 7));
}

inline size_t CountWrong(const float* data, size_t count, int world) {
  size_t wrong = 0;
  const float base = static_cast<float>(world * (world + 1) / 2);
  for (size_t i = 0; i < count; ++i) {
    const float expected = base + static_cast<float>(world * static_cast<int>(i % 7));
    wrong += data[i] != expected;
  }
  return wrong;
}

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One peer's DDP-style workload (f.tensors in buckets of f.bucket_bytes): f.warmup + f.iters
// iterations, each filling every bucket, calling `barrier()`, then timing `allreduce(i, data,
// count)` over the buckets in order, and checking every element. `prepare(i, data, count)` runs
// once per bucket first (for algorithms that register their buffers). ok is false when the file
// cannot be read.
struct WorkloadResult {
  bool ok = false;
  size_t tensors = 0;
  size_t buckets = 0;
  size_t bytes = 0;
  double seconds = 0;  // per iteration
  size_t wrong = 0;    // on this rank
  // Steady-clock seconds from the first timed iteration's start (its input fill) to the last
  // one's end (its check): the window in which the suite meters CPU per iteration.
  double timed_from = 0, timed_to = 0;
  std::vector<double> iteration_ms;  // each iteration's time, warm-up first
};

template <typename Prepare, typename Barrier, typename AllReduce>
WorkloadResult RunBucketedWorkload(const PeerFlags& f, int rank, int world, Prepare prepare,
                                   Barrier barrier, AllReduce allreduce) {
  WorkloadResult r;
  const std::vector<size_t> buckets = ReadBuckets(f.tensors, f.bucket_bytes, &r.tensors);
  if (buckets.empty()) return r;
  std::vector<size_t> offsets;
  size_t total = 0;
  for (size_t b : buckets) {
    offsets.push_back(total);
    total += b;
  }
  std::vector<float> data(total);
  for (size_t i = 0; i < buckets.size(); ++i) prepare(i, data.data() + offsets[i], buckets[i]);
  double seconds = 0;
  for (int it = -f.warmup; it < f.iters; ++it) {
    if (it == 0) r.timed_from = Now();
    for (size_t i = 0; i < buckets.size(); ++i) Fill(data.data() + offsets[i], buckets[i], rank);
    barrier();
    const double start = Now();
    for (size_t i = 0; i < buckets.size(); ++i) allreduce(i, data.data() + offsets[i], buckets[i]);
    const double took = Now() - start;
    r.iteration_ms.push_back(took * 1e3);
    if (it < 0) continue;
    seconds += took;
    if (!f.check) continue;
    for (size_t i = 0; i < buckets.size(); ++i) {
      r.wrong += CountWrong(data.data() + offsets[i], buckets[i], world);
    }
  }
  r.timed_to = Now();
  r.ok = true;
  r.buckets = buckets.size();
  r.bytes = total * sizeof(float);
  r.seconds = f.iters > 0 ? seconds / f.iters : 0;
  return r;
}

inline void PrintWorkload(const std::string& name, const WorkloadResult& r, int warmup,
                          size_t wrong) {
  std::printf("# %s: %zu tensors in %zu buckets, %zu bytes, %.1f us per iteration, %zu wrong\n",
              name.c_str(), r.tensors, r.buckets, r.bytes, r.seconds * 1e6, wrong);
  std::printf("# %s iterations (ms, %d warm-up first):", name.c_str(), warmup);
  for (double ms : r.iteration_ms) std::printf(" %.6g", ms);
  std::printf("\n");
  std::printf("WCSV,%s,%zu,%zu,%.3f,%zu\n", name.c_str(), r.tensors, r.bytes, r.seconds * 1e6,
              wrong);
  // The timed iterations' window on the steady clock (CLOCK_MONOTONIC, the suite's
  // time.monotonic()), in seconds: the suite meters the hosts' CPU in it. bench-rank prints the
  // same line.
  std::printf("WTIMED,%.6f,%.6f\n", r.timed_from, r.timed_to);
  std::fflush(stdout);
}

inline void PrintHeader(const char* peer, const std::string& algorithm, int world) {
  std::printf("# %s all-reduce, algorithm %s, world size %d, float32 sum\n", peer,
              algorithm.c_str(), world);
  std::printf("# %12s %14s %12s %10s %10s %8s\n", "size(B)", "count", "time(us)", "algbw(GB/s)",
              "busbw(GB/s)", "#wrong");
}

inline void PrintRow(size_t bytes, size_t count, double seconds, int world, size_t wrong) {
  const double algbw = static_cast<double>(bytes) / seconds / 1e9;
  const double busbw = algbw * 2.0 * (world - 1) / world;
  std::printf("  %12zu %14zu %12.1f %10.3f %10.3f %8zu\n", bytes, count, seconds * 1e6, algbw,
              busbw, wrong);
  std::printf("CSV,%zu,%zu,float32,sum,%.3f,%.6f,%.6f,%zu\n", bytes, count, seconds * 1e6, algbw,
              busbw, wrong);
  std::fflush(stdout);
}

// One peer's nccl-tests-style sweep over f.size_list (float32 sum). Per size: `setup(data,
// count)` once (for algorithms that register their buffer), f.warmup untimed iterations, then the
// timed ones (f.large_iters from f.large_from, else f.iters) of `allreduce(data, count)`, each on
// fresh input and, unless --no-check, checked. `reported_wrong(wrong)` turns this rank's wrong
// elements at one size into the number rank 0 reports (MPI sums them over the ranks, Gloo reports
// its own); `after_size()` runs after each size. Rank 0 prints the header and one row per size.
// Returns the sum of the reported wrong counts.
template <typename Setup, typename AllReduce, typename ReportedWrong, typename AfterSize>
size_t RunSizeSweep(const PeerFlags& f, int rank, int world, const char* peer, Setup setup,
                    AllReduce allreduce, ReportedWrong reported_wrong, AfterSize after_size) {
  uint64_t largest = 0;
  for (uint64_t s : f.size_list) largest = std::max(largest, s);
  std::vector<float> buffer(largest / sizeof(float));
  if (rank == 0) PrintHeader(peer, f.algorithm, world);
  size_t total_wrong = 0;
  for (uint64_t size : f.size_list) {
    const size_t count = size / sizeof(float);
    if (count == 0) continue;
    const int iters = size >= f.large_from ? f.large_iters : f.iters;
    setup(buffer.data(), count);
    for (int i = 0; i < f.warmup; ++i) {
      Fill(buffer.data(), count, rank);
      allreduce(buffer.data(), count);
    }
    double seconds = 0;
    size_t wrong = 0;
    for (int i = 0; i < iters; ++i) {
      Fill(buffer.data(), count, rank);
      const double start = Now();
      allreduce(buffer.data(), count);
      seconds += Now() - start;
      if (f.check) wrong += CountWrong(buffer.data(), count, world);
    }
    if (wrong > 0) {
      std::fprintf(stderr, "rank %d: %zu wrong elements at %zu B\n", rank, wrong,
                   static_cast<size_t>(size));
    }
    const size_t reported = reported_wrong(wrong);
    total_wrong += reported;
    if (rank == 0 && iters > 0) {
      PrintRow(count * sizeof(float), count, seconds / iters, world, reported);
    }
    after_size();
  }
  return total_wrong;
}

}  // namespace tributary::bench
