// Per-element reference arithmetic shared by ScalarReducer, the scalar kernels and the tails
// of the SIMD kernels. Every SIMD kernel must produce exactly these bits.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "dataplane/reduce/cpu/half.h"

namespace tributary::dataplane::reduce_internal {

inline float CanonicalizeNan(float x) {
  return x != x ? std::bit_cast<float>(kCanonicalNanF32) : x;
}
inline double CanonicalizeNan(double x) {
  return x != x ? std::bit_cast<double>(kCanonicalNanF64) : x;
}

// Integer division truncating toward zero, for any int64 dividend and any divisor >= 1
// (divisor may exceed INT64_MAX). Works on magnitudes so that no step overflows.
inline int64_t DivideTruncating(int64_t x, uint64_t divisor) {
  const bool negative = x < 0;
  const uint64_t magnitude = negative ? 0 - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
  const uint64_t q = magnitude / divisor;
  return static_cast<int64_t>(negative ? 0 - q : q);
}

// One struct per DataType: `T` is the storage type, Add/Divide the reference operations.
struct F32Op {
  using T = float;
  static T Add(T a, T b) { return CanonicalizeNan(a + b); }
  static T Divide(T x, uint64_t d) { return CanonicalizeNan(x / static_cast<float>(d)); }
};
struct F64Op {
  using T = double;
  static T Add(T a, T b) { return CanonicalizeNan(a + b); }
  static T Divide(T x, uint64_t d) { return CanonicalizeNan(x / static_cast<double>(d)); }
};
struct F16Op {
  using T = uint16_t;
  static T Add(T a, T b) { return Fp32ToFp16(CanonicalizeNan(Fp16ToFp32(a) + Fp16ToFp32(b))); }
  static T Divide(T x, uint64_t d) {
    return Fp32ToFp16(CanonicalizeNan(Fp16ToFp32(x) / static_cast<float>(d)));
  }
};
struct Bf16Op {
  using T = uint16_t;
  static T Add(T a, T b) { return Fp32ToBf16(CanonicalizeNan(Bf16ToFp32(a) + Bf16ToFp32(b))); }
  static T Divide(T x, uint64_t d) {
    return Fp32ToBf16(CanonicalizeNan(Bf16ToFp32(x) / static_cast<float>(d)));
  }
};
struct I32Op {
  using T = int32_t;
  // Unsigned arithmetic: wraps modulo 2^32 without signed-overflow UB.
  static T Add(T a, T b) {
    return static_cast<T>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  }
  static T Divide(T x, uint64_t d) { return static_cast<T>(DivideTruncating(x, d)); }
};
struct I64Op {
  using T = int64_t;
  static T Add(T a, T b) {
    return static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  }
  static T Divide(T x, uint64_t d) { return DivideTruncating(x, d); }
};

// Element access through memcpy: pointers need not be aligned to the element type.
template <typename T>
inline T LoadElement(const void* base, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(base) + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
inline void StoreElement(void* base, size_t i, T v) {
  std::memcpy(static_cast<char*>(base) + i * sizeof(T), &v, sizeof(T));
}

// dst[i] = a[i] + b[i] for i in [begin, end). Each element is read before it is written, so
// dst may equal a or b.
template <typename Op>
inline void ScalarSum2(void* dst, const void* a, const void* b, size_t begin, size_t end) {
  using T = typename Op::T;
  for (size_t i = begin; i < end; ++i) {
    StoreElement<T>(dst, i, Op::Add(LoadElement<T>(a, i), LoadElement<T>(b, i)));
  }
}

// dst[i] = dst[i] / divisor for i in [begin, end).
template <typename Op>
inline void ScalarDivide(void* dst, uint64_t divisor, size_t begin, size_t end) {
  using T = typename Op::T;
  for (size_t i = begin; i < end; ++i) {
    StoreElement<T>(dst, i, Op::Divide(LoadElement<T>(dst, i), divisor));
  }
}

}  // namespace tributary::dataplane::reduce_internal
