// The inter-node split of DESIGN.md §1.1: how many bytes of every gradient each summation
// service owns. Pure: capacities in, split out; no I/O, no clocks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tributary::controller {

// What one machine can contribute.
struct MachineCapacity {
  std::string node_id;
  // NIC bandwidth available to this job, bytes/s in each direction (B_i). > 0.
  double nic_bytes_per_s = 0;
  // Rate at which its CPU summation service adds incoming bytes, bytes/s (C_i). A value <= 0
  // means "not limited by the CPU".
  double sum_bytes_per_s = 0;
};

// One summation service of the split.
struct ServerShare {
  std::string node_id;
  bool is_worker = false;
  // Fraction of every gradient this server owns (s_i / M), in [0, 1].
  double fraction = 0;
  // The same share as an integer out of kWeightTotal; the weights of a plan sum to exactly
  // kWeightTotal, so every node derives the same chunk map from them.
  uint64_t weight = 0;
};

struct SplitPlan {
  static constexpr uint64_t kWeightTotal = uint64_t{1} << 32;
  // Servers with a non-zero share: workers first (input order), then spare machines (input
  // order). Spare machines that the optimum does not need are left out.
  std::vector<ServerShare> servers;
  // Predicted all-reduce time per gradient byte (T / M) for this split, seconds/byte.
  double seconds_per_byte = 0;
  // Ring all-reduce over the same workers, seconds/byte: 2(n-1)/(n * min_i B_i).
  double ring_seconds_per_byte = 0;
};

// Solves: minimise T subject to, for every worker i, M + (n-2)s_i <= T*B_i and n*s_i <= T*C_i;
// for every spare machine j, n*s_j <= T*min(B_j, C_j); sum(s) = M; s >= 0.
// INVALID_ARGUMENT for no workers, non-positive bandwidths or duplicate node ids.
absl::StatusOr<SplitPlan> PlanSplit(const std::vector<MachineCapacity>& workers,
                                    const std::vector<MachineCapacity>& spares);

// The uniform closed form of DESIGN.md §1.1 for n workers and k spare machines (k is clamped to
// n), every NIC at `nic_bytes_per_s`, no CPU limit.
struct UniformSplit {
  double worker_fraction;   // x / M
  double spare_fraction;    // y / M
  double seconds_per_byte;  // t_opt / M
};
UniformSplit UniformClosedForm(int n, int k, double nic_bytes_per_s);

}  // namespace tributary::controller
