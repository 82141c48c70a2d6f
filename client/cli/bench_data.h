// Inputs with exact expected results for the benchmark sweep, and the element-wise check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace tributary::client::cli {

enum class BenchOp { kSum, kAverage, kBroadcast };

// "sum", "avg" (or "average"), "bcast" (or "broadcast").
absl::StatusOr<BenchOp> ParseBenchOp(std::string_view name);
// "sum", "avg", "bcast".
std::string_view BenchOpName(BenchOp op);

// The value global rank `rank` contributes at element `index`. Small integers, so every sum is
// exact: (rank + 1) * (index % 7 + 1) for 32/64-bit types; (rank % 2 + 1) * (index % 3 + 1) for
// fp16/bf16, whose integers are exact only up to 2048/256.
double InputValue(common::DataType dtype, uint32_t rank, size_t index);

// The result every rank must hold at element `index` after `op` over `world_size` ranks
// (`root` is the broadcast root).
double ExpectedValue(common::DataType dtype, BenchOp op, uint32_t world_size, uint32_t root,
                     size_t index);

// Writes rank `rank`'s input into the `count` elements of `dtype` at `data`.
void FillInput(common::DataType dtype, uint32_t rank, void* data, size_t count);

// Number of the `count` elements at `data` that differ from ExpectedValue. Sums and broadcasts
// must match exactly; averages within the type's rounding (and for integer types, within 1, so
// both truncating and rounding division pass).
size_t CountWrong(common::DataType dtype, BenchOp op, uint32_t world_size, uint32_t root,
                  const void* data, size_t count);

}  // namespace tributary::client::cli
