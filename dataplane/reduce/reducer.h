// Element-wise reduction kernels used by the summation service and local aggregation.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace tributary::dataplane {

// Element-wise arithmetic on typed buffers. Implementations are thread-safe.
//
// Buffers may have any alignment. `dst` and `src` either are the same buffer or do not overlap.
// Floating-point sums follow IEEE-754 with round-to-nearest-even; float16/bfloat16 add in
// float32 and round once to the 16-bit type (NaN stays NaN, overflow goes to Inf).
class Reducer {
 public:
  virtual ~Reducer() = default;

  // dst[i] += src[i] for i in [0, count).
  virtual void Sum(common::DataType dtype, void* dst, const void* src, size_t count) = 0;

  // dst[i] = a[i] + b[i] for i in [0, count). `dst` may alias `a` or `b`.
  virtual void Sum2(common::DataType dtype, void* dst, const void* a, const void* b,
                    size_t count) = 0;

  // dst[i] /= divisor for i in [0, count) (averaging). Floating types divide in their own
  // precision (16-bit types in float32, rounded once); integer types truncate toward zero.
  // divisor >= 1.
  virtual void Divide(common::DataType dtype, void* dst, size_t count, uint64_t divisor) = 0;
};

}  // namespace tributary::dataplane
