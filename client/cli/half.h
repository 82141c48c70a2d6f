// IEEE binary16 (fp16) and bfloat16 conversions for filling and checking benchmark buffers.
#pragma once

#include <cstdint>

namespace tributary::client::cli {

// float -> fp16 bits, rounding to nearest even; overflow gives +-inf, NaN stays NaN (quiet).
uint16_t FloatToHalf(float value);
// fp16 bits -> float (exact, subnormals included).
float HalfToFloat(uint16_t bits);
// float -> bfloat16 bits, rounding to nearest even; NaN stays NaN (quiet).
uint16_t FloatToBFloat16(float value);
// bfloat16 bits -> float (exact).
float BFloat16ToFloat(uint16_t bits);

}  // namespace tributary::client::cli
