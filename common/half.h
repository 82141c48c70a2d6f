// Bit-exact conversions between float32 and the 16-bit floating types (IEEE binary16 and
// bfloat16), in portable integer arithmetic. One implementation for the whole project: the CPU
// reducer's scalar reference (its SIMD kernels must match these bit for bit) and the CLI's
// benchmark data both use it.
#pragma once

#include <bit>
#include <cstdint>

namespace tributary::common {

// binary16 -> float32. Exact for every input (subnormals are normalised); NaN payloads are kept.
inline float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1Fu) {
    bits = sign | 0x7F800000u | (mant << 13);  // Inf or NaN.
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // Rebias 15 -> 127.
  } else if (mant == 0) {
    bits = sign;  // +-0.
  } else {
    // Subnormal: mant * 2^-24. Shift the leading one into the implicit position.
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// float32 -> binary16 with round-to-nearest-even. Overflow (|f| >= 65520) gives Inf, results
// below the smallest subnormal round to +-0, NaN stays a quiet NaN (top payload bits kept).
inline uint16_t Fp32ToFp16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x > 0x7F800000u) {
    return sign | 0x7E00u | static_cast<uint16_t>((x >> 13) & 0x3FFu);
  }
  if (x >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 (or Inf): rounds to Inf.
  if (x >= 0x38800000u) {                       // >= 2^-14: a normal binary16.
    const uint32_t m = x - 0x38000000u;         // Rebias the exponent 127 -> 15.
    return sign | static_cast<uint16_t>((m + 0xFFFu + ((m >> 13) & 1u)) >> 13);
  }
  if (x < 0x33000000u) return sign;  // < 2^-25: rounds to zero.
  // Subnormal result: the value in units of 2^-24, rounded to nearest even.
  const uint32_t shift = 126 - (x >> 23);  // In [14, 24].
  const uint32_t mant = (x & 0x7FFFFFu) | 0x800000u;
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u) != 0)) ++q;  // May carry into the smallest normal.
  return sign | static_cast<uint16_t>(q);
}

// bfloat16 -> float32 (exact).
inline float Bf16ToFp32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// float32 -> bfloat16 with round-to-nearest-even; subnormals are kept (no flush to zero),
// overflow gives Inf, NaN stays a quiet NaN.
inline uint16_t Fp32ToBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace tributary::common
