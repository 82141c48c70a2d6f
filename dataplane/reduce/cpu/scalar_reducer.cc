#include "dataplane/reduce/cpu/scalar_reducer.h"

#include "common/status_macros.h"
#include "dataplane/reduce/cpu/scalar_ops.h"

namespace tributary::dataplane {

using common::DataType;
namespace ri = reduce_internal;

void ScalarReducer::Sum(DataType dtype, void* dst, const void* src, size_t count) {
  Sum2(dtype, dst, dst, src, count);
}

void ScalarReducer::Sum2(DataType dtype, void* dst, const void* a, const void* b, size_t count) {
  switch (dtype) {
    case DataType::kFloat32:
      return ri::ScalarSum2<ri::F32Op>(dst, a, b, 0, count);
    case DataType::kFloat64:
      return ri::ScalarSum2<ri::F64Op>(dst, a, b, 0, count);
    case DataType::kFloat16:
      return ri::ScalarSum2<ri::F16Op>(dst, a, b, 0, count);
    case DataType::kBFloat16:
      return ri::ScalarSum2<ri::Bf16Op>(dst, a, b, 0, count);
    case DataType::kInt32:
      return ri::ScalarSum2<ri::I32Op>(dst, a, b, 0, count);
    case DataType::kInt64:
      return ri::ScalarSum2<ri::I64Op>(dst, a, b, 0, count);
  }
  TRIBUTARY_CHECK(false && "unknown DataType");
}

void ScalarReducer::Divide(DataType dtype, void* dst, size_t count, uint64_t divisor) {
  TRIBUTARY_CHECK(divisor >= 1);
  switch (dtype) {
    case DataType::kFloat32:
      return ri::ScalarDivide<ri::F32Op>(dst, divisor, 0, count);
    case DataType::kFloat64:
      return ri::ScalarDivide<ri::F64Op>(dst, divisor, 0, count);
    case DataType::kFloat16:
      return ri::ScalarDivide<ri::F16Op>(dst, divisor, 0, count);
    case DataType::kBFloat16:
      return ri::ScalarDivide<ri::Bf16Op>(dst, divisor, 0, count);
    case DataType::kInt32:
      return ri::ScalarDivide<ri::I32Op>(dst, divisor, 0, count);
    case DataType::kInt64:
      return ri::ScalarDivide<ri::I64Op>(dst, divisor, 0, count);
  }
  TRIBUTARY_CHECK(false && "unknown DataType");
}

}  // namespace tributary::dataplane
