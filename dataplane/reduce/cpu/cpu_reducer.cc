#include "dataplane/reduce/cpu/cpu_reducer.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "common/cpu_features.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "dataplane/reduce/cpu/kernels.h"

namespace tributary::dataplane {
namespace {

constexpr auto Log = common::ComponentLog<"dataplane">;

using common::DataType;
namespace ri = reduce_internal;

constexpr char kIsaEnv[] = "TRIBUTARY_REDUCE_ISA";
// Ranges handed to threads start on multiples of this many bytes from the buffer start, so
// threads never share a cache line and every range keeps the buffer's vector alignment.
constexpr size_t kRangeGranuleBytes = 64;

bool CpuSupports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
#if defined(__x86_64__) || defined(__i386__)
    case CpuIsa::kAvx2:
      // __builtin_cpu_supports also checks that the OS saves the YMM/ZMM state.
      return __builtin_cpu_supports("avx2") && common::CpuHasF16c();
    case CpuIsa::kAvx512:
      return CpuSupports(CpuIsa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
    case CpuIsa::kAvx2:
    case CpuIsa::kAvx512:
      return false;
#endif
  }
  return false;
}

std::optional<CpuIsa> ParseIsa(std::string_view name) {
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (CpuIsaName(isa) == name) return isa;
  }
  return std::nullopt;
}

// The requested level, lowered to what the CPU supports.
CpuIsa Usable(CpuIsa requested) {
  const CpuIsa best = DetectCpuIsa();
  if (requested <= best) return requested;
  Log()->warn("cpu reducer: isa {} is not supported by this cpu or build, using {}",
              CpuIsaName(requested), CpuIsaName(best));
  return best;
}

CpuIsa IsaFromEnvironment() {
  const char* value = std::getenv(kIsaEnv);
  if (value == nullptr || *value == '\0') return DetectCpuIsa();
  if (std::optional<CpuIsa> isa = ParseIsa(value)) return Usable(*isa);
  Log()->warn("cpu reducer: ignoring {}='{}'; use scalar, avx2 or avx512", kIsaEnv, value);
  return DetectCpuIsa();
}

const ri::KernelTable* Kernels(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return ri::Avx512Kernels();
    case CpuIsa::kAvx2:
      return ri::Avx2Kernels();
    case CpuIsa::kScalar:
      break;
  }
  return &ri::ScalarKernels();
}

int ResolveThreads(int max_threads) {
  TRIBUTARY_CHECK(max_threads >= 0);
  if (max_threads > 0) return max_threads;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

size_t ElementSize(DataType dtype) {
  const size_t size = common::DataTypeSize(dtype);
  TRIBUTARY_CHECK(size != 0 && "unknown DataType");
  return size;
}

}  // namespace

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

CpuIsa DetectCpuIsa() {
  static const CpuIsa detected = [] {
    if (ri::Avx512Kernels() != nullptr && CpuSupports(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
    if (ri::Avx2Kernels() != nullptr && CpuSupports(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
    return CpuIsa::kScalar;
  }();
  return detected;
}

CpuReducer::CpuReducer(int max_threads, size_t min_bytes_per_thread)
    : CpuReducer(IsaFromEnvironment(), max_threads, min_bytes_per_thread) {}

CpuReducer::CpuReducer(CpuIsa isa, int max_threads, size_t min_bytes_per_thread)
    : kernels_(Kernels(Usable(isa))),
      max_threads_(ResolveThreads(max_threads)),
      min_bytes_per_thread_(std::max<size_t>(1, min_bytes_per_thread)),
      pool_(std::make_unique<WorkerPool>(max_threads_ - 1)) {
  Log()->debug("cpu reducer: isa {}, up to {} threads, {} bytes per thread at least", kernels_->isa,
               max_threads_, min_bytes_per_thread_);
}

CpuReducer::~CpuReducer() = default;

std::string_view CpuReducer::isa() const { return kernels_->isa; }

void CpuReducer::ForEachRange(size_t count, size_t elem_size,
                              absl::FunctionRef<void(size_t begin, size_t end)> fn) {
  const size_t bytes = count * elem_size;
  const size_t threads =
      std::min<size_t>(static_cast<size_t>(max_threads_), bytes / min_bytes_per_thread_);
  if (threads <= 1) {
    fn(0, count);
    return;
  }
  const size_t granule = std::max<size_t>(1, kRangeGranuleBytes / elem_size);
  const size_t per_range = ((count + threads - 1) / threads + granule - 1) / granule * granule;
  const int ranges = static_cast<int>((count + per_range - 1) / per_range);
  pool_->ParallelFor(ranges, [&](int r) {
    const size_t begin = static_cast<size_t>(r) * per_range;
    fn(begin, std::min(count, begin + per_range));
  });
}

void CpuReducer::Sum(DataType dtype, void* dst, const void* src, size_t count) {
  Sum2(dtype, dst, dst, src, count);
}

void CpuReducer::Sum2(DataType dtype, void* dst, const void* a, const void* b, size_t count) {
  const size_t elem = ElementSize(dtype);
  const ri::Sum2Fn kernel = kernels_->sum2[ri::Slot(dtype)];
  char* d = static_cast<char*>(dst);
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  ForEachRange(count, elem, [&](size_t begin, size_t end) {
    const size_t offset = begin * elem;
    kernel(d + offset, pa + offset, pb + offset, end - begin);
  });
}

void CpuReducer::Divide(DataType dtype, void* dst, size_t count, uint64_t divisor) {
  TRIBUTARY_CHECK(divisor >= 1);
  const size_t elem = ElementSize(dtype);
  const ri::DivideFn kernel = kernels_->divide[ri::Slot(dtype)];
  char* d = static_cast<char*>(dst);
  ForEachRange(count, elem,
               [&](size_t begin, size_t end) { kernel(d + begin * elem, end - begin, divisor); });
}

}  // namespace tributary::dataplane
