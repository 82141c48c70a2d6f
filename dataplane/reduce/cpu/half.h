// The reducer's view of the 16-bit floating types: the project's one set of conversions
// (common/half.h) and the canonical NaNs every reduction writes.
#pragma once

#include <cstdint>

#include "common/half.h"

namespace tributary::dataplane::reduce_internal {

// Quiet NaNs every reduction writes in place of any NaN result (see README: "NaN results").
inline constexpr uint32_t kCanonicalNanF32 = 0x7FC00000u;
inline constexpr uint64_t kCanonicalNanF64 = 0x7FF8000000000000ull;
inline constexpr uint16_t kCanonicalNanF16 = 0x7E00u;
inline constexpr uint16_t kCanonicalNanBf16 = 0x7FC0u;

using common::Bf16ToFp32;
using common::Fp16ToFp32;
using common::Fp32ToBf16;
using common::Fp32ToFp16;

}  // namespace tributary::dataplane::reduce_internal
