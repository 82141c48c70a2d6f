// Inputs with exact expected results for the benchmark sweep, and the element-wise check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace tributary::client::cli {

// kAllGather and kReduceScatter (sum) work on world_size blocks: block b of the region belongs to
// global rank b.
enum class BenchOp { kSum, kAverage, kBroadcast, kAllGather, kReduceScatter };

// "sum", "avg" (or "average"), "bcast" (or "broadcast"), "allgather" (or "all-gather"),
// "reduce-scatter" (or "reducescatter").
absl::StatusOr<BenchOp> ParseBenchOp(std::string_view name);
// "sum", "avg", "bcast", "allgather", "reduce-scatter".
std::string_view BenchOpName(BenchOp op);

// The value global rank `rank` contributes at element `index`. Small integers, so every sum is
// exact: (rank + 1) * (index % 7 + 1) for 32/64-bit types; (rank % 2 + 1) * (index % 3 + 1) for
// fp16/bf16, whose integers are exact only up to 2048/256.
double InputValue(common::DataType dtype, uint32_t rank, size_t index);

// The result every rank must hold at element `index` after `op` over `world_size` ranks
// (`root` is the broadcast root; for kAllGather, the rank whose block holds `index`).
// kReduceScatter: the sum (at the elements of the rank's own block).
double ExpectedValue(common::DataType dtype, BenchOp op, uint32_t world_size, uint32_t root,
                     size_t index);

// Writes rank `rank`'s input into the `count` elements of `dtype` at `data`.
void FillInput(common::DataType dtype, uint32_t rank, void* data, size_t count);
// The same for elements first_index, first_index + 1, ... of the region, written from `data`.
void FillInputFrom(common::DataType dtype, uint32_t rank, void* data, size_t count,
                   size_t first_index);

// Number of the `count` elements at `data` that differ from ExpectedValue; `data` holds the
// elements first_index, first_index + 1, ... of the region. Sums, broadcasts and all-gathers
// must match exactly; averages within the type's rounding (and for integer types, within 1, so
// both truncating and rounding division pass).
size_t CountWrong(common::DataType dtype, BenchOp op, uint32_t world_size, uint32_t root,
                  const void* data, size_t count, size_t first_index = 0);

// Writes rank `rank`'s input for `op` into a region of `block_count` * world_size elements:
// kAllGather: its own block (the others are filled with a value no rank contributes, so a block
// left unwritten is counted wrong); other ops: the whole region, as FillInput.
void FillBlockwiseInput(common::DataType dtype, BenchOp op, uint32_t rank, uint32_t world_size,
                        void* data, size_t block_count);
// Wrong elements of rank `rank`'s region after `op`: kAllGather checks every block, kReduceScatter
// the rank's own block.
size_t CountWrongBlockwise(common::DataType dtype, BenchOp op, uint32_t rank, uint32_t world_size,
                           const void* data, size_t block_count);

}  // namespace tributary::client::cli
