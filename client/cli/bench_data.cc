#include "client/cli/bench_data.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/half.h"

namespace tributary::client::cli {
namespace {

using common::DataType;

bool IsHalfWidth(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
}

// Length of the input pattern: the value at index i depends only on i % Period.
size_t Period(DataType dtype) { return IsHalfWidth(dtype) ? 3 : 7; }

double RankFactor(DataType dtype, uint32_t rank) {
  return IsHalfWidth(dtype) ? static_cast<double>(rank % 2 + 1) : static_cast<double>(rank) + 1;
}

// Sum over ranks 0..world_size-1 of RankFactor.
double RankFactorSum(DataType dtype, uint32_t world_size) {
  const double n = world_size;
  if (!IsHalfWidth(dtype)) return n * (n + 1) / 2;
  const double odd_ranks = world_size / 2;  // Ranks 1, 3, ... contribute 2, the others 1.
  return n + odd_ranks;
}

// Storage of one element of `dtype`, and its conversion from/to double.
template <DataType kType>
struct Element;
template <>
struct Element<DataType::kFloat32> {
  using T = float;
  static T From(double v) { return static_cast<T>(v); }
  static double To(T v) { return v; }
  static constexpr double kTolerance = 1e-6;
};
template <>
struct Element<DataType::kFloat64> {
  using T = double;
  static T From(double v) { return v; }
  static double To(T v) { return v; }
  static constexpr double kTolerance = 1e-12;
};
template <>
struct Element<DataType::kFloat16> {
  using T = uint16_t;
  static T From(double v) { return common::Fp32ToFp16(static_cast<float>(v)); }
  static double To(T v) { return common::Fp16ToFp32(v); }
  static constexpr double kTolerance = 1e-3;  // 2^-11 is fp16's half ulp.
};
template <>
struct Element<DataType::kBFloat16> {
  using T = uint16_t;
  static T From(double v) { return common::Fp32ToBf16(static_cast<float>(v)); }
  static double To(T v) { return common::Bf16ToFp32(v); }
  static constexpr double kTolerance = 8e-3;  // 2^-8 is bf16's half ulp.
};
template <>
struct Element<DataType::kInt32> {
  using T = int32_t;
  static T From(double v) { return static_cast<T>(v); }
  static double To(T v) { return v; }
  static constexpr double kTolerance = 0;
};
template <>
struct Element<DataType::kInt64> {
  using T = int64_t;
  static T From(double v) { return static_cast<T>(v); }
  static double To(T v) { return static_cast<double>(v); }
  static constexpr double kTolerance = 0;
};

template <DataType kType>
void FillTyped(uint32_t rank, void* data, size_t count, size_t first_index = 0) {
  using E = Element<kType>;
  const size_t period = Period(kType);
  typename E::T pattern[7];
  for (size_t i = 0; i < period; ++i) pattern[i] = E::From(InputValue(kType, rank, i));
  auto* out = static_cast<typename E::T*>(data);
  for (size_t i = 0, p = first_index % period; i < count; ++i) {
    out[i] = pattern[p];
    if (++p == period) p = 0;
  }
}

template <DataType kType>
size_t CountWrongTyped(BenchOp op, uint32_t world_size, uint32_t root, const void* data,
                       size_t count, size_t first_index) {
  using E = Element<kType>;
  const size_t period = Period(kType);
  double expected[7];
  for (size_t i = 0; i < period; ++i) {
    expected[i] = ExpectedValue(kType, op, world_size, root, i);
  }
  const bool exact = op != BenchOp::kAverage;
  const bool integral = kType == DataType::kInt32 || kType == DataType::kInt64;
  const auto* in = static_cast<const typename E::T*>(data);
  size_t wrong = 0;
  for (size_t i = 0, p = first_index % period; i < count; ++i) {
    const double got = E::To(in[i]);
    const double want = expected[p];
    bool ok;
    if (exact) {
      ok = got == want;
    } else if (integral) {
      ok = std::fabs(got - want) < 1.0;
    } else {
      ok = std::fabs(got - want) <= E::kTolerance * std::fabs(want);
    }
    wrong += ok ? 0 : 1;
    if (++p == period) p = 0;
  }
  return wrong;
}

}  // namespace

absl::StatusOr<BenchOp> ParseBenchOp(std::string_view name) {
  if (name == "sum") return BenchOp::kSum;
  if (name == "avg" || name == "average") return BenchOp::kAverage;
  if (name == "bcast" || name == "broadcast") return BenchOp::kBroadcast;
  if (name == "allgather" || name == "all-gather") return BenchOp::kAllGather;
  if (name == "reduce-scatter" || name == "reducescatter") return BenchOp::kReduceScatter;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown op '", std::string(name), "'; use sum, avg, bcast, allgather or reduce-scatter"));
}

std::string_view BenchOpName(BenchOp op) {
  switch (op) {
    case BenchOp::kSum:
      return "sum";
    case BenchOp::kAverage:
      return "avg";
    case BenchOp::kBroadcast:
      return "bcast";
    case BenchOp::kAllGather:
      return "allgather";
    case BenchOp::kReduceScatter:
      return "reduce-scatter";
  }
  return "unknown";
}

double InputValue(DataType dtype, uint32_t rank, size_t index) {
  return RankFactor(dtype, rank) * static_cast<double>(index % Period(dtype) + 1);
}

double ExpectedValue(DataType dtype, BenchOp op, uint32_t world_size, uint32_t root, size_t index) {
  const double base = static_cast<double>(index % Period(dtype) + 1);
  switch (op) {
    case BenchOp::kSum:
    case BenchOp::kReduceScatter:
      return RankFactorSum(dtype, world_size) * base;
    case BenchOp::kAverage:
      return RankFactorSum(dtype, world_size) * base / world_size;
    case BenchOp::kBroadcast:
    case BenchOp::kAllGather:
      return InputValue(dtype, root, index);
  }
  return 0;
}

void FillInput(DataType dtype, uint32_t rank, void* data, size_t count) {
  FillInputFrom(dtype, rank, data, count, 0);
}

void FillInputFrom(DataType dtype, uint32_t rank, void* data, size_t count, size_t first_index) {
  switch (dtype) {
    case DataType::kFloat32:
      return FillTyped<DataType::kFloat32>(rank, data, count, first_index);
    case DataType::kFloat64:
      return FillTyped<DataType::kFloat64>(rank, data, count, first_index);
    case DataType::kFloat16:
      return FillTyped<DataType::kFloat16>(rank, data, count, first_index);
    case DataType::kBFloat16:
      return FillTyped<DataType::kBFloat16>(rank, data, count, first_index);
    case DataType::kInt32:
      return FillTyped<DataType::kInt32>(rank, data, count, first_index);
    case DataType::kInt64:
      return FillTyped<DataType::kInt64>(rank, data, count, first_index);
  }
}

size_t CountWrong(DataType dtype, BenchOp op, uint32_t world_size, uint32_t root, const void* data,
                  size_t count, size_t first_index) {
  switch (dtype) {
    case DataType::kFloat32:
      return CountWrongTyped<DataType::kFloat32>(op, world_size, root, data, count, first_index);
    case DataType::kFloat64:
      return CountWrongTyped<DataType::kFloat64>(op, world_size, root, data, count, first_index);
    case DataType::kFloat16:
      return CountWrongTyped<DataType::kFloat16>(op, world_size, root, data, count, first_index);
    case DataType::kBFloat16:
      return CountWrongTyped<DataType::kBFloat16>(op, world_size, root, data, count, first_index);
    case DataType::kInt32:
      return CountWrongTyped<DataType::kInt32>(op, world_size, root, data, count, first_index);
    case DataType::kInt64:
      return CountWrongTyped<DataType::kInt64>(op, world_size, root, data, count, first_index);
  }
  return count;
}

void FillBlockwiseInput(DataType dtype, BenchOp op, uint32_t rank, uint32_t world_size, void* data,
                        size_t block_count) {
  const size_t region = block_count * world_size;
  if (op != BenchOp::kAllGather) return FillInput(dtype, rank, data, region);
  // All bits set: NaN in the float types, -1 in the integer ones; no rank's input is either.
  std::memset(data, 0xff, region * common::DataTypeSize(dtype));
  const size_t at = static_cast<size_t>(rank) * block_count;
  // The pattern continues from the block's first index, as CountWrongBlockwise expects.
  FillInputFrom(dtype, rank, static_cast<std::byte*>(data) + at * common::DataTypeSize(dtype),
                block_count, at);
}

size_t CountWrongBlockwise(DataType dtype, BenchOp op, uint32_t rank, uint32_t world_size,
                           const void* data, size_t block_count) {
  const size_t esize = common::DataTypeSize(dtype);
  const auto* bytes = static_cast<const std::byte*>(data);
  if (op == BenchOp::kAllGather) {
    size_t wrong = 0;
    for (uint32_t b = 0; b < world_size; ++b) {
      const size_t at = static_cast<size_t>(b) * block_count;
      wrong += CountWrong(dtype, op, world_size, /*root=*/b, bytes + at * esize, block_count, at);
    }
    return wrong;
  }
  if (op == BenchOp::kReduceScatter) {
    const size_t at = static_cast<size_t>(rank) * block_count;
    return CountWrong(dtype, op, world_size, 0, bytes + at * esize, block_count, at);
  }
  return CountWrong(dtype, op, world_size, 0, data, block_count * world_size);
}

}  // namespace tributary::client::cli
