// The project's one set of fp16 / bf16 conversions (common/half.h), checked against exact
// references, the F16C hardware, and the cases the CLI's benchmark data relies on.
#include "common/half.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/cpu_features.h"
#include "gtest/gtest.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tributary::common {
namespace {

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t u) { return std::bit_cast<float>(u); }

TEST(HalfTest, Fp16ToFp32KnownValues) {
  EXPECT_EQ(Fp16ToFp32(0x3C00), 1.0f);
  EXPECT_EQ(Fp16ToFp32(0xC000), -2.0f);
  EXPECT_EQ(Fp16ToFp32(0x7BFF), 65504.0f);
  EXPECT_EQ(Fp16ToFp32(0x0001), std::ldexp(1.0f, -24));  // Smallest subnormal.
  EXPECT_EQ(Fp16ToFp32(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(Fp16ToFp32(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(Bits(Fp16ToFp32(0x8000)), 0x80000000u);
  EXPECT_EQ(Fp16ToFp32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Fp16ToFp32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bits(Fp16ToFp32(0x7E00)), 0x7FC00000u);
  EXPECT_EQ(Bits(Fp16ToFp32(0xFD01)), 0xFFA02000u);  // Payload and sign kept.
}

TEST(HalfTest, Fp16RoundTripsEveryNonNanValue) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = Fp16ToFp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      // NaN stays NaN and becomes quiet.
      EXPECT_EQ(Fp32ToFp16(f), h | 0x0200u) << std::hex << h;
    } else {
      EXPECT_EQ(Fp32ToFp16(f), h) << std::hex << h;
    }
  }
}

TEST(HalfTest, Fp32ToFp16RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to the even 1.
  EXPECT_EQ(Fp32ToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(Fp32ToFp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(Fp32ToFp16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3C01);
  EXPECT_EQ(Fp32ToFp16(65504.0f), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7C00);  // Tie with 65536: even -> Inf.
  EXPECT_EQ(Fp32ToFp16(-1e9f), 0xFC00);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -25)), 0x0000);  // Tie with 2^-24: even -> 0.
  EXPECT_EQ(Fp32ToFp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: tie -> even 2.
  EXPECT_EQ(Fp32ToFp16(-std::ldexp(1.0f, -30)), 0x8000);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -26)), 0x0400);  // Carry.
  EXPECT_EQ(Fp32ToFp16(FromBits(0x7FC00000u)), 0x7E00);
  EXPECT_EQ(Fp32ToFp16(FromBits(0xFF800001u)), 0xFE00);  // Signalling NaN becomes quiet.
}

TEST(HalfTest, Bf16KnownValues) {
  EXPECT_EQ(Bf16ToFp32(0x3F80), 1.0f);
  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3F80);
  EXPECT_EQ(Fp32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // Tie -> even.
  EXPECT_EQ(Fp32ToBf16(1.0f + 3 * std::ldexp(1.0f, -9)), 0x3F81);  // 0.75 ulp -> up.
  EXPECT_EQ(Fp32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // Tie -> even.
  EXPECT_EQ(Fp32ToBf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(Fp32ToBf16(FromBits(0x00010000u)), 0x0001);  // Subnormals are not flushed.
  EXPECT_EQ(Fp32ToBf16(FromBits(0x80008000u)), 0x8000);  // Tie -> even (-0).
  EXPECT_EQ(Fp32ToBf16(FromBits(0x7F800001u)), 0x7FC0);  // Quiet NaN.
  EXPECT_EQ(Fp32ToBf16(FromBits(0xFFC00000u)), 0xFFC0);
}

// Exact reference: pick the nearer of the two bf16 neighbours in double arithmetic.
uint16_t ReferenceBf16(uint32_t x) {
  const uint32_t lo = x & 0xFFFF0000u;
  const double value = std::fabs(static_cast<double>(FromBits(x)));
  const double down = std::fabs(static_cast<double>(FromBits(lo)));
  // The upper neighbour may be 2^128 (rounds to Inf), which float cannot hold.
  const double up = ((lo & 0x7FFFFFFFu) == 0x7F7F0000u)
                        ? std::ldexp(1.0, 128)
                        : std::fabs(static_cast<double>(FromBits(lo + 0x10000u)));
  const uint16_t down_bits = static_cast<uint16_t>(lo >> 16);
  if (value - down < up - value) return down_bits;
  if (value - down > up - value) return down_bits + 1;
  return (down_bits & 1) ? down_bits + 1 : down_bits;
}

TEST(HalfTest, Fp32ToBf16MatchesExactReferenceOnSampledFloats) {
  // Strided over all non-NaN floats, plus each 2^16 neighbourhood's interesting low bits.
  for (uint64_t x = 0; x < 0x100000000ull; x += 65521) {
    for (uint32_t low : {0x0000u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      const uint32_t bits = (static_cast<uint32_t>(x) & 0xFFFF0000u) | low;
      if ((bits & 0x7FFFFFFFu) >= 0x7F800000u) continue;
      ASSERT_EQ(Fp32ToBf16(FromBits(bits)), ReferenceBf16(bits)) << std::hex << bits;
    }
  }
}

// --- The cases the CLI's benchmark data relies on (formerly its own copy, client/cli/half.cc) ---

TEST(HalfTest, ExactValuesRoundTrip) {
  EXPECT_EQ(Fp32ToFp16(0.0f), 0x0000);
  EXPECT_EQ(Fp32ToFp16(-0.0f), 0x8000);
  EXPECT_EQ(Fp32ToFp16(1.0f), 0x3c00);
  EXPECT_EQ(Fp32ToFp16(-2.0f), 0xc000);
  EXPECT_EQ(Fp32ToFp16(65504.0f), 0x7bff);               // Largest finite.
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -14)), 0x0400);  // Smallest normal.
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -24)), 0x0001);  // Smallest subnormal.
  // Every fp16 value converts to float and back unchanged.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) continue;  // NaN payloads.
    ASSERT_EQ(Fp32ToFp16(Fp16ToFp32(h)), h) << std::hex << bits;
  }
  for (int i = 0; i <= 2048; ++i) EXPECT_EQ(Fp16ToFp32(Fp32ToFp16(i)), i);
}

TEST(HalfTest, RoundsToNearestEvenAroundOneAndSubnormals) {
  // Between 1 and 1 + 2^-10: the midpoint rounds to even (1), just above it rounds up.
  EXPECT_EQ(Fp32ToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(Fp32ToFp16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  // Between 1 + 2^-10 (odd) and 1 + 2^-9: the midpoint rounds to the even one above.
  EXPECT_EQ(Fp32ToFp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // 2049 is a midpoint between 2048 and 2050: even mantissa is 2048.
  EXPECT_EQ(Fp16ToFp32(Fp32ToFp16(2049.0f)), 2048.0f);
  EXPECT_EQ(Fp16ToFp32(Fp32ToFp16(2051.0f)), 2052.0f);
  // Subnormal midpoint: 1.5 * 2^-24 rounds to 2 * 2^-24.
  EXPECT_EQ(Fp32ToFp16(1.5f * std::ldexp(1.0f, -24)), 0x0002);
  EXPECT_EQ(Fp32ToFp16(0.5f * std::ldexp(1.0f, -24)), 0x0000);
}

TEST(HalfTest, OverflowAndSpecials) {
  EXPECT_EQ(Fp32ToFp16(65519.0f), 0x7bff);  // Below the rounding midpoint.
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7c00);  // Midpoint rounds to inf.
  EXPECT_EQ(Fp32ToFp16(1e10f), 0x7c00);
  EXPECT_EQ(Fp32ToFp16(-1e10f), 0xfc00);
  EXPECT_EQ(Fp32ToFp16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(Fp16ToFp32(Fp32ToFp16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(Fp16ToFp32(0x7c00)));
  EXPECT_EQ(Fp16ToFp32(0x8001), -std::ldexp(1.0f, -24));
}

TEST(BFloat16Test, ConvertsAndRoundsToNearestEven) {
  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Fp32ToBf16(-2.0f), 0xc000);
  EXPECT_EQ(Bf16ToFp32(0x3f80), 1.0f);
  for (int i = 0; i <= 256; ++i) EXPECT_EQ(Bf16ToFp32(Fp32ToBf16(i)), i);
  // 257 is the midpoint of 256 and 258 -> even (256); 259 -> 260.
  EXPECT_EQ(Bf16ToFp32(Fp32ToBf16(257.0f)), 256.0f);
  EXPECT_EQ(Bf16ToFp32(Fp32ToBf16(259.0f)), 260.0f);
  EXPECT_EQ(Bf16ToFp32(Fp32ToBf16(257.5f)), 258.0f);  // Above the midpoint.
  EXPECT_TRUE(std::isnan(Bf16ToFp32(Fp32ToBf16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(Bf16ToFp32(Fp32ToBf16(std::numeric_limits<float>::max()))));
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("f16c"))) uint16_t HardwareFp32ToFp16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
__attribute__((target("f16c"))) float HardwareFp16ToFp32(uint16_t h) { return _cvtsh_ss(h); }

TEST(HalfTest, MatchesF16cHardware) {
  if (!CpuHasF16c()) GTEST_SKIP() << "no F16C on this cpu";
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float hw = HardwareFp16ToFp32(static_cast<uint16_t>(h));
    const float sw = Fp16ToFp32(static_cast<uint16_t>(h));
    if (std::isnan(hw)) {
      ASSERT_TRUE(std::isnan(sw)) << std::hex << h;
    } else {
      ASSERT_EQ(Bits(sw), Bits(hw)) << std::hex << h;
    }
  }
  // Every float with a stride coprime to the binary16 rounding boundaries, plus the values
  // around each boundary (ties and their neighbours).
  for (uint64_t x = 0; x < 0x100000000ull; x += 4099) {
    const uint32_t bits = static_cast<uint32_t>(x);
    ASSERT_EQ(Fp32ToFp16(FromBits(bits)), HardwareFp32ToFp16(FromBits(bits))) << std::hex << bits;
  }
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const uint32_t mid = Bits(Fp16ToFp32(static_cast<uint16_t>(h))) + 0x1000u;  // Rough tie.
    for (uint32_t delta = 0; delta < 0x2200u; delta += 0x80u) {
      for (uint32_t bits : {mid - 0x1100u + delta, mid - 1, mid + 1}) {
        for (uint32_t sign : {0u, 0x80000000u}) {
          const float f = FromBits(bits | sign);
          ASSERT_EQ(Fp32ToFp16(f), HardwareFp32ToFp16(f)) << std::hex << (bits | sign);
        }
      }
    }
  }
}
#endif

}  // namespace
}  // namespace tributary::common
