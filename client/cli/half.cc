#include "client/cli/half.h"

#include <bit>
#include <cmath>

namespace tributary::client::cli {

uint16_t FloatToHalf(float value) {
  // After F. Giesen's float_to_half_fast3_rtne: exact round-to-nearest-even in integer math,
  // with the FPU's own rounding doing the work for results that are fp16 subnormals.
  uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  uint16_t out;
  if (bits >= (127u + 16u) << 23) {
    // |value| >= 65536 (or inf/NaN): inf, or a quiet NaN.
    out = bits > 0x7f800000u ? 0x7e00 : 0x7c00;
  } else if (bits < 113u << 23) {
    // |value| < 2^-14: an fp16 subnormal or zero. Adding 0.5f lines the 10 mantissa bits up at
    // the bottom of the float, rounded to nearest even by the addition itself.
    constexpr uint32_t kMagic = 126u << 23;  // 0.5f
    const float aligned = std::bit_cast<float>(bits) + std::bit_cast<float>(kMagic);
    out = static_cast<uint16_t>(std::bit_cast<uint32_t>(aligned) - kMagic);
  } else {
    const uint32_t mantissa_odd = (bits >> 13) & 1u;
    bits += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;  // Rebias; round half down...
    bits += mantissa_odd;                                      // ...or up when odd: RNE.
    out = static_cast<uint16_t>(bits >> 13);  // May carry into inf: correct overflow.
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t FloatToBFloat16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // Quiet NaN, sign kept.
  }
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

float BFloat16ToFloat(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

}  // namespace tributary::client::cli
