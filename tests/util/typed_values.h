// Reads and writes one element of a typed buffer as a double: the tests' inputs are small
// integers, exact in every dtype, and so are their sums.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "dataplane/reduce/cpu/half.h"

namespace tributary::testing {

inline void PutValue(common::DataType t, void* base, uint64_t i, double v) {
  auto* b = static_cast<std::byte*>(base);
  switch (t) {
    case common::DataType::kFloat32: {
      const float f = static_cast<float>(v);
      std::memcpy(b + 4 * i, &f, 4);
      return;
    }
    case common::DataType::kFloat64:
      std::memcpy(b + 8 * i, &v, 8);
      return;
    case common::DataType::kInt32: {
      const int32_t x = static_cast<int32_t>(v);
      std::memcpy(b + 4 * i, &x, 4);
      return;
    }
    case common::DataType::kInt64: {
      const int64_t x = static_cast<int64_t>(v);
      std::memcpy(b + 8 * i, &x, 8);
      return;
    }
    case common::DataType::kFloat16: {
      const uint16_t h = dataplane::reduce_internal::Fp32ToFp16(static_cast<float>(v));
      std::memcpy(b + 2 * i, &h, 2);
      return;
    }
    case common::DataType::kBFloat16: {
      const uint16_t h = dataplane::reduce_internal::Fp32ToBf16(static_cast<float>(v));
      std::memcpy(b + 2 * i, &h, 2);
      return;
    }
  }
}

inline double GetValue(common::DataType t, const void* base, uint64_t i) {
  const auto* b = static_cast<const std::byte*>(base);
  switch (t) {
    case common::DataType::kFloat32: {
      float f;
      std::memcpy(&f, b + 4 * i, 4);
      return f;
    }
    case common::DataType::kFloat64: {
      double d;
      std::memcpy(&d, b + 8 * i, 8);
      return d;
    }
    case common::DataType::kInt32: {
      int32_t x;
      std::memcpy(&x, b + 4 * i, 4);
      return x;
    }
    case common::DataType::kInt64: {
      int64_t x;
      std::memcpy(&x, b + 8 * i, 8);
      return static_cast<double>(x);
    }
    case common::DataType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, b + 2 * i, 2);
      return dataplane::reduce_internal::Fp16ToFp32(h);
    }
    case common::DataType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, b + 2 * i, 2);
      return dataplane::reduce_internal::Bf16ToFp32(h);
    }
  }
  return NAN;
}

}  // namespace tributary::testing
