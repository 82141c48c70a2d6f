// Throughput of the CPU reducers against a plain streaming add over the same memory.
//
// For each dtype and thread count: CpuReducer::Sum (dst += src) at every ISA level this CPU
// supports, ScalarReducer (one thread), and the streaming reference: `d[i] += s[i]` on float,
// auto-vectorised by the compiler, split over the same number of threads. GB/s counts the bytes
// each call reads and writes (dst read + src read + dst write = 3 x buffer bytes) for every
// row alike; "vs stream" divides by the reference measured next to the row.
//
// Flags: --mib=N (size of dst and of src in MiB; default 64), --reps=N (timed repetitions per
// row, interleaved with the other rows of the same dtype and thread count, best one reported;
// default 7).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/dtype.h"
#include "dataplane/reduce/cpu/cpu_reducer.h"
#include "dataplane/reduce/cpu/scalar_reducer.h"

namespace tributary::dataplane {
namespace {

using common::DataType;

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t[], AlignedFree>;

Buffer Allocate(size_t bytes) {
  return Buffer(static_cast<uint8_t*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096)));
}

// Finite values of small magnitude for `dtype`, so that repeated sums stay in range for a while
// and never meet subnormals (which would measure microcode assists, not the reducer).
void FillSmall(DataType dtype, uint8_t* p, size_t bytes, uint32_t seed) {
  const size_t size = common::DataTypeSize(dtype);
  uint32_t x = seed;
  for (size_t off = 0; off + size <= bytes; off += size) {
    x = x * 1664525u + 1013904223u;
    const float f = static_cast<float>((x >> 8) & 0xFF) / 256.0f - 0.5f;  // [-0.5, 0.5).
    uint64_t bits = 0;
    switch (dtype) {
      case DataType::kFloat32:
        std::memcpy(&bits, &f, 4);
        break;
      case DataType::kFloat64: {
        const double d = f;
        std::memcpy(&bits, &d, 8);
        break;
      }
      case DataType::kFloat16:
        bits = 0x3000 | ((x >> 16) & 0x3FF) | (f < 0 ? 0x8000 : 0);  // |v| in [0.125, 0.25).
        break;
      case DataType::kBFloat16:
        bits = 0x3E00 | ((x >> 16) & 0x7F) | (f < 0 ? 0x8000 : 0);  // |v| in [0.125, 0.25).
        break;
      case DataType::kInt32:
      case DataType::kInt64:
        bits = x;
        break;
    }
    std::memcpy(p + off, &bits, size);
  }
}

// The memory-bandwidth reference: what the compiler makes of the obvious loop.
void StreamAdd(float* __restrict d, const float* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] += s[i];
}

void StreamAddThreads(uint8_t* dst, const uint8_t* src, size_t bytes, int threads) {
  const size_t n = bytes / sizeof(float);
  float* d = reinterpret_cast<float*>(dst);
  const float* s = reinterpret_cast<const float*>(src);
  if (threads == 1) return StreamAdd(d, s, n);
  const size_t per = (n + threads - 1) / threads / 16 * 16 + 16;
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t) {
    const size_t begin = std::min(n, per * t);
    workers.emplace_back(
        [=] { StreamAdd(d + begin, s + begin, std::min(n, begin + per) - begin); });
  }
  StreamAdd(d, s, std::min(n, per));
  for (std::thread& w : workers) w.join();
}

// One row of the table: something that processes `bytes` of dst and of src per run.
struct Candidate {
  std::string impl;
  std::string isa;
  std::function<void()> run;
  int reps;
  double best_seconds = 1e30;
};

// Times the candidates round-robin (one warm-up run each, then rep by rep) so that all of them
// see the same machine load; keeps each one's best run.
void MeasureInterleaved(std::vector<Candidate>& candidates) {
  int max_reps = 0;
  for (Candidate& c : candidates) {
    c.run();
    max_reps = std::max(max_reps, c.reps);
  }
  for (int r = 0; r < max_reps; ++r) {
    for (Candidate& c : candidates) {
      if (r >= c.reps) continue;
      const auto start = std::chrono::steady_clock::now();
      c.run();
      benchmark::ClobberMemory();
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      c.best_seconds = std::min(c.best_seconds, took.count());
    }
  }
}

void PrintRow(std::string_view dtype, int threads, std::string_view impl, std::string_view isa,
              double gbps, double stream_gbps) {
  std::printf("%-9s %7d  %-11s %-7s %8.2f %9.2f\n", std::string(dtype).c_str(), threads,
              std::string(impl).c_str(), std::string(isa).c_str(), gbps, gbps / stream_gbps);
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  size_t mib = 64;
  int reps = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--mib=")) {
      mib = std::strtoul(argv[i] + 6, nullptr, 10);
    } else if (arg.starts_with("--reps=")) {
      reps = std::max(1, std::atoi(argv[i] + 7));
    } else {
      std::fprintf(stderr, "usage: %s [--mib=N] [--reps=N]\n", argv[0]);
      return 2;
    }
  }
  const size_t bytes = mib << 20;
  Buffer dst = Allocate(bytes);
  Buffer src = Allocate(bytes);
  // The reference streams over its own pair of buffers of the same size and alignment: the
  // float view of the other dtypes' data would hold subnormals, which distort float timings.
  Buffer ref_dst = Allocate(bytes);
  Buffer ref_src = Allocate(bytes);
  FillSmall(DataType::kFloat32, ref_dst.get(), bytes, 3);
  FillSmall(DataType::kFloat32, ref_src.get(), bytes, 4);

  std::vector<CpuIsa> levels;
  for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kScalar}) {
    if (isa <= DetectCpuIsa()) levels.push_back(isa);
  }
  const int thread_counts[] = {1, 2};

  std::printf(
      "reduce_bench: dst += src, %zu MiB each, best of %d interleaved runs; GB/s = 3 x %zu MiB "
      "(dst read, src read, dst write) / time\n",
      mib, reps, mib);
  std::printf("%-9s %7s  %-11s %-7s %8s %9s\n", "dtype", "threads", "impl", "isa", "GB/s",
              "vs stream");
  ScalarReducer scalar;
  for (DataType dtype : common::kAllDataTypes) {
    const size_t count = bytes / common::DataTypeSize(dtype);
    FillSmall(dtype, dst.get(), bytes, 1);
    FillSmall(dtype, src.get(), bytes, 2);
    for (int threads : thread_counts) {
      std::vector<std::unique_ptr<CpuReducer>> reducers;
      std::vector<Candidate> candidates;
      candidates.push_back(
          {"stream-ref", "-",
           [&, threads] { StreamAddThreads(ref_dst.get(), ref_src.get(), bytes, threads); }, reps});
      for (CpuIsa isa : levels) {
        CpuReducer* reducer =
            reducers.emplace_back(std::make_unique<CpuReducer>(isa, threads)).get();
        candidates.push_back({"CpuReducer", std::string(reducer->isa()),
                              [&, reducer] { reducer->Sum(dtype, dst.get(), src.get(), count); },
                              reps});
      }
      if (threads == 1) {  // ScalarReducer always runs on the calling thread alone.
        candidates.push_back({"Scalar", "-",
                              [&] { scalar.Sum(dtype, dst.get(), src.get(), count); },
                              std::min(reps, 3)});
      }
      MeasureInterleaved(candidates);
      const double stream_gbps =
          3.0 * static_cast<double>(bytes) / candidates[0].best_seconds / 1e9;
      for (const Candidate& c : candidates) {
        const double gbps = 3.0 * static_cast<double>(bytes) / c.best_seconds / 1e9;
        PrintRow(common::DataTypeName(dtype), threads, c.impl, c.isa, gbps, stream_gbps);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace tributary::dataplane

int main(int argc, char** argv) { return tributary::dataplane::Main(argc, argv); }
