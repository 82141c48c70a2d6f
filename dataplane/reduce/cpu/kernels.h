// Internal: tables of single-threaded element-wise kernels, one table per instruction-set
// level. CpuReducer picks a table once and splits large calls across threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/dtype.h"

namespace tributary::dataplane::reduce_internal {

// dst[i] = a[i] + b[i] for i in [0, n); dst may equal a or b. Any alignment.
using Sum2Fn = void (*)(void* dst, const void* a, const void* b, size_t n);
// dst[i] /= divisor for i in [0, n); divisor >= 1. Any alignment.
using DivideFn = void (*)(void* dst, size_t n, uint64_t divisor);

// Indexed by the numeric value of common::DataType (1..6); slot 0 is unused.
inline constexpr int kDataTypeSlots = 7;

struct KernelTable {
  std::string_view isa;  // "scalar", "avx2", "avx512".
  Sum2Fn sum2[kDataTypeSlots];
  DivideFn divide[kDataTypeSlots];
};

inline int Slot(common::DataType t) { return static_cast<int>(t); }

// Portable C++; always available.
const KernelTable& ScalarKernels();
// AVX2 + F16C. nullptr when not built for x86 (whether the CPU supports it is checked by
// the caller).
const KernelTable* Avx2Kernels();
// AVX-512 F/BW/VL (+ AVX2, F16C). nullptr when not built for x86.
const KernelTable* Avx512Kernels();

}  // namespace tributary::dataplane::reduce_internal
