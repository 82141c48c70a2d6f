// The reference Reducer: one element at a time, portable C++.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "dataplane/reduce/reducer.h"

namespace tributary::dataplane {

// Plain element-by-element reference implementation of Reducer. Defines the exact bits every
// other reducer must produce (see dataplane/reduce/README.md): float16/bfloat16 add in float32
// and round once to nearest even, any NaN result is the canonical quiet NaN, integers wrap.
//
// Stateless and thread-safe. Runs on the calling thread; slow for the 16-bit types.
class ScalarReducer final : public Reducer {
 public:
  void Sum(common::DataType dtype, void* dst, const void* src, size_t count) override;
  void Sum2(common::DataType dtype, void* dst, const void* a, const void* b, size_t count) override;
  void Divide(common::DataType dtype, void* dst, size_t count, uint64_t divisor) override;
};

}  // namespace tributary::dataplane
