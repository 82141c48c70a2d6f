// Element types the data plane reduces, shared by the client, agent and data plane.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace tributary::common {

// Values match tributary.v1.DataType.
enum class DataType : uint8_t {
  kFloat32 = 1,
  kFloat64 = 2,
  kFloat16 = 3,
  kBFloat16 = 4,
  kInt32 = 5,
  kInt64 = 6,
};

inline constexpr DataType kAllDataTypes[] = {DataType::kFloat32, DataType::kFloat64,
                                             DataType::kFloat16, DataType::kBFloat16,
                                             DataType::kInt32,   DataType::kInt64};

// Size of one element in bytes; 0 for an unknown value.
size_t DataTypeSize(DataType t);
// "float32", "float64", "float16", "bfloat16", "int32", "int64".
std::string_view DataTypeName(DataType t);
absl::StatusOr<DataType> ParseDataType(std::string_view name);
// Whether `raw` names a known DataType (for validating wire and RPC input).
bool IsValidDataType(uint32_t raw);

}  // namespace tributary::common
