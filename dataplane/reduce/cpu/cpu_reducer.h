// The production CPU Reducer: SIMD kernels chosen at run time, large buffers split across a
// small pool of threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "common/dtype.h"
#include "dataplane/reduce/cpu/worker_pool.h"
#include "dataplane/reduce/reducer.h"

namespace tributary::dataplane {

namespace reduce_internal {
struct KernelTable;
}  // namespace reduce_internal

// Instruction-set levels of CpuReducer, lowest first.
enum class CpuIsa {
  kScalar,  // Portable C++ (the ScalarReducer loops); any CPU.
  kAvx2,    // x86 AVX2 + F16C.
  kAvx512,  // x86 AVX-512 F + BW + VL (with AVX2, F16C).
};

// "scalar", "avx2", "avx512".
std::string_view CpuIsaName(CpuIsa isa);

// The highest level both this build and the running CPU (and OS) support.
CpuIsa DetectCpuIsa();

// Reducer on SIMD kernels. Produces exactly the bits of ScalarReducer for every dtype, ISA level
// and thread count.
//
// Ownership and threading: owns max_threads - 1 worker threads, started in the constructor and
// joined in the destructor; no thread is created per call. Sum, Sum2 and Divide are thread-safe:
// any number of threads may call them concurrently (on buffers that do not overlap); each call
// runs part of its work on the calling thread and returns when the whole buffer is done.
class CpuReducer final : public Reducer {
 public:
  // Uses the best ISA level of this CPU, or the one named by the environment variable
  // TRIBUTARY_REDUCE_ISA (scalar|avx2|avx512; for tests and benchmarks; a level the CPU lacks
  // falls back to the best available one, with a warning).
  //   max_threads: most threads one call uses, the caller included; 0 = hardware concurrency.
  //   min_bytes_per_thread: a call uses floor(bytes of dst / this) threads, clamped to
  //     [1, max_threads]; smaller buffers run on the calling thread alone.
  explicit CpuReducer(int max_threads = 0, size_t min_bytes_per_thread = size_t{1} << 20);
  // Same, at the requested level (lowered, with a warning, to what the CPU supports); ignores
  // TRIBUTARY_REDUCE_ISA.
  explicit CpuReducer(CpuIsa isa, int max_threads = 0,
                      size_t min_bytes_per_thread = size_t{1} << 20);
  ~CpuReducer() override;

  CpuReducer(const CpuReducer&) = delete;
  CpuReducer& operator=(const CpuReducer&) = delete;

  void Sum(common::DataType dtype, void* dst, const void* src, size_t count) override;
  void Sum2(common::DataType dtype, void* dst, const void* a, const void* b, size_t count) override;
  void Divide(common::DataType dtype, void* dst, size_t count, uint64_t divisor) override;

  // Name of the ISA level in use: "scalar", "avx2" or "avx512".
  std::string_view isa() const;
  // Most threads one call uses (>= 1), the caller included.
  int max_threads() const { return max_threads_; }

 private:
  // Splits [0, count) into at most max_threads_ ranges of whole cache lines and runs
  // fn(begin, end) for each, in parallel when the buffer is large enough.
  void ForEachRange(size_t count, size_t elem_size,
                    absl::FunctionRef<void(size_t begin, size_t end)> fn);

  const reduce_internal::KernelTable* kernels_;
  int max_threads_;
  size_t min_bytes_per_thread_;
  std::unique_ptr<WorkerPool> pool_;
};

}  // namespace tributary::dataplane
