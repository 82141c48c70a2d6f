// Throughput of the CUDA reduction kernels against the device's own copy bandwidth.
//
// On CUDA device 0: a device-to-device cudaMemcpyAsync of the buffer size (the reference every
// row is divided by), then CudaReducer::ReduceAsync for every dtype and k = 1, 2, 4, 8 sources
// (sum; average for k = 8), each into a separate destination, and Sum (dst += src, k = 2 with
// dst aliasing source 0). GB/s counts the bytes each call moves in device memory: the copy
// reads and writes the buffer (2 x bytes), a k-source pass reads k buffers and writes one
// ((k + 1) x bytes), like nccl-tests' algorithm bandwidth. Also printed: the theoretical peak
// from the memory clock and bus width. Time by CUDA events, best of --reps after one warm-up.
//
// Flags (bench/cuda_bench_flags.h): --mib N (each buffer's size, default 256), --reps N
// (default 20), --device N.
// Without a CUDA device it prints why and exits 77 (scripts/gpu_check.sh reports "skipped").
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/cuda_bench_flags.h"
#include "common/dtype.h"
#include "dataplane/cuda/cuda_status.h"
#include "dataplane/reduce/cuda/cuda_reducer.h"

namespace tributary::dataplane {
namespace {

using common::DataType;

[[noreturn]] void Die(const absl::Status& s) {
  std::fprintf(stderr, "cuda_reduce_bench: %s\n", s.ToString().c_str());
  std::exit(1);
}
void Check(cudaError_t e, const char* call) {
  if (absl::Status s = cuda::CudaStatus(e, call); !s.ok()) Die(s);
}

// Best time in seconds of `reps` runs of `run` on `stream`, after one warm-up run.
template <typename F>
double BestSeconds(cudaStream_t stream, int reps, F&& run) {
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  run();
  Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  float best_ms = 1e30f;
  for (int r = 0; r < reps; ++r) {
    Check(cudaEventRecord(start, stream), "cudaEventRecord");
    run();
    Check(cudaEventRecord(stop, stream), "cudaEventRecord");
    Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    best_ms = std::min(best_ms, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best_ms / 1e3;
}

int Main(int argc, char** argv) {
  bench::CudaBenchFlags flags;
  if (std::optional<int> exit = bench::ParseCudaBenchFlags(
          argc, argv, "CUDA reduction kernels against the device-to-device copy", flags)) {
    return *exit;
  }
  const size_t mib = flags.mib;
  const int reps = flags.reps, device = flags.device;
  absl::StatusOr<std::unique_ptr<CudaReducer>> reducer = CudaReducer::Create(device);
  if (!reducer.ok()) {
    std::fprintf(stderr, "cuda_reduce_bench needs a CUDA device: %s\n",
                 reducer.status().ToString().c_str());
    return reducer.status().code() == absl::StatusCode::kFailedPrecondition ? 77 : 1;
  }
  Check(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  int clock_khz = 0, bus_bits = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device);
  const double peak_gbs = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;  // DDR: 2 per clock.

  const size_t bytes = mib << 20;
  constexpr int kMaxK = 8;
  std::vector<void*> buffers(kMaxK + 1);
  for (void*& b : buffers) {
    Check(cudaMalloc(&b, bytes), "cudaMalloc");
    Check(cudaMemset(b, 0, bytes), "cudaMemset");  // Zeros: no NaN or subnormal slow paths.
  }
  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  const double copy_s = BestSeconds(stream, reps, [&] {
    Check(cudaMemcpyAsync(buffers[0], buffers[1], bytes, cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync");
  });
  const double copy_gbs = 2.0 * bytes / copy_s / 1e9;
  std::printf("device %d: %s, %d SMs, memory peak %.0f GB/s (clock x bus width)\n", device,
              prop.name, prop.multiProcessorCount, peak_gbs);
  std::printf("buffers of %zu MiB, best of %d; GB/s = bytes read + written per second\n", mib,
              reps);
  std::printf("%-9s %-14s %9s %10s %9s %9s\n", "dtype", "op", "time_us", "GB/s", "vs_copy",
              "vs_peak");
  std::printf("%-9s %-14s %9.1f %10.1f %9.3f %9.3f\n", "bytes", "memcpy D2D", copy_s * 1e6,
              copy_gbs, 1.0, copy_gbs / peak_gbs);

  for (DataType dtype : common::kAllDataTypes) {
    const size_t count = bytes / common::DataTypeSize(dtype);
    struct Row {
      const char* name;
      int k;
      bool average;
      bool in_place;
    };
    const Row rows[] = {{"k=1 (copy)", 1, false, false}, {"k=2 sum", 2, false, false},
                        {"dst+=src", 2, false, true},    {"k=4 sum", 4, false, false},
                        {"k=8 sum", 8, false, false},    {"k=8 average", 8, true, false}};
    for (const Row& row : rows) {
      std::vector<const void*> srcs;
      for (int s = 0; s < row.k; ++s) srcs.push_back(buffers[row.in_place ? s : s + 1]);
      void* dst = buffers[0];
      const double s = BestSeconds(stream, reps, [&] {
        if (absl::Status st = (*reducer)->ReduceAsync(dtype, dst, srcs, count, row.average, stream);
            !st.ok()) {
          Die(st);
        }
      });
      const double gbs = (row.k + 1.0) * bytes / s / 1e9;
      std::printf("%-9s %-14s %9.1f %10.1f %9.3f %9.3f\n",
                  std::string(common::DataTypeName(dtype)).c_str(), row.name, s * 1e6, gbs,
                  gbs / copy_gbs, gbs / peak_gbs);
    }
  }
  for (void* b : buffers) cudaFree(b);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace tributary::dataplane

int main(int argc, char** argv) { return tributary::dataplane::Main(argc, argv); }
