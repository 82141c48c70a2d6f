// Portable kernels: the reference loops of scalar_ops.h, behind the KernelTable interface.
#include "dataplane/reduce/cpu/kernels.h"
#include "dataplane/reduce/cpu/scalar_ops.h"

namespace tributary::dataplane::reduce_internal {
namespace {

template <typename Op>
void Sum2(void* dst, const void* a, const void* b, size_t n) {
  ScalarSum2<Op>(dst, a, b, 0, n);
}

template <typename Op>
void Divide(void* dst, size_t n, uint64_t divisor) {
  ScalarDivide<Op>(dst, divisor, 0, n);
}

using common::DataType;

KernelTable MakeTable() {
  KernelTable t{};
  t.isa = "scalar";
  t.sum2[Slot(DataType::kFloat32)] = &Sum2<F32Op>;
  t.sum2[Slot(DataType::kFloat64)] = &Sum2<F64Op>;
  t.sum2[Slot(DataType::kFloat16)] = &Sum2<F16Op>;
  t.sum2[Slot(DataType::kBFloat16)] = &Sum2<Bf16Op>;
  t.sum2[Slot(DataType::kInt32)] = &Sum2<I32Op>;
  t.sum2[Slot(DataType::kInt64)] = &Sum2<I64Op>;
  t.divide[Slot(DataType::kFloat32)] = &Divide<F32Op>;
  t.divide[Slot(DataType::kFloat64)] = &Divide<F64Op>;
  t.divide[Slot(DataType::kFloat16)] = &Divide<F16Op>;
  t.divide[Slot(DataType::kBFloat16)] = &Divide<Bf16Op>;
  t.divide[Slot(DataType::kInt32)] = &Divide<I32Op>;
  t.divide[Slot(DataType::kInt64)] = &Divide<I64Op>;
  return t;
}

}  // namespace

const KernelTable& ScalarKernels() {
  static const KernelTable table = MakeTable();
  return table;
}

}  // namespace tributary::dataplane::reduce_internal
