#include "common/dtype.h"

#include "absl/strings/str_cat.h"

namespace tributary::common {

size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kFloat32:
    case DataType::kInt32:
      return 4;
    case DataType::kFloat64:
    case DataType::kInt64:
      return 8;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
  }
  return 0;
}

std::string_view DataTypeName(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kFloat16:
      return "float16";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
  }
  return "unknown";
}

absl::StatusOr<DataType> ParseDataType(std::string_view name) {
  for (DataType t : kAllDataTypes) {
    if (DataTypeName(t) == name) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown data type '", std::string(name),
                   "'; use float32, float64, float16, bfloat16, int32 or int64"));
}

bool IsValidDataType(uint32_t raw) { return raw >= 1 && raw <= 6; }

}  // namespace tributary::common
