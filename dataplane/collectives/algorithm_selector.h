// Picks the all-reduce algorithm for a tensor by its size, from an alpha-beta cost model
// (DESIGN.md §1.4). Pure functions: no I/O, no state.
#pragma once

#include <cstdint>
#include <map>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tributary::dataplane {

// The collective algorithms of the data plane, and a job's choice among them. Values match
// tributary.v1.Algorithm (api/tributary/v1/controller.proto) and travel on the wire
// (WireHeader::algorithm, never kAuto there).
enum class Algorithm : uint8_t {
  kAuto = 0,             // a job's choice only: by size, from the selector's thresholds
  kPushPull = 1,         // allreduce_push_pull.h: summation servers (DESIGN §1.1)
  kRing = 2,             // allreduce_ring.h: reduce-scatter + all-gather around a ring
  kHalvingDoubling = 3,  // allreduce_halving_doubling.h: Rabenseifner
  // parameter_server.h: asynchronous parameter-server operations (kPs* reductions) only;
  // never a job's choice nor a pick of the selector.
  kParameterServer = 4,
  // allreduce_recursive_doubling.h: the whole tensor in log2 n exchanges (small tensors);
  // all-reduce only.
  kRecursiveDoubling = 5,
};
// One more than the largest Algorithm value (arrays indexed by it).
inline constexpr int kAlgorithmValues = 6;

// "auto", "push_pull", "ring", "halving_doubling", "parameter_server", "recursive_doubling".
std::string_view AlgorithmName(Algorithm a);
// Whether `raw` names an algorithm that runs (kAuto excluded).
bool IsValidAlgorithm(uint32_t raw);

// Costs of the network and the CPU, per node. The defaults are a model of a 100 Gb/s NIC with a
// few microseconds of software overhead per message and a CPU that sums ~10 GB/s; they are NOT
// measurements: bench/collectives_bench calibrates them per cluster.
struct CostModel {
  double alpha_seconds = 5e-6;                // fixed cost of one message (latency + overhead)
  double beta_seconds_per_byte = 1 / 12.5e9;  // NIC time per byte, each direction
  double gamma_seconds_per_byte = 1 / 10e9;   // CPU summation time per byte
};

// Predicted time of one all-reduce of `bytes` over `n` worker nodes; `extra_servers` (k of
// DESIGN §1.1) matters only for push/pull. The model:
//   ring:  2(n-1)·α + 2(n-1)/n·M·β            (summation pipelined under the transfers)
//   halving-doubling, p = 2^floor(log2 n):
//          2·log2(p)·α + 2(p-1)/p·M·β + (p-1)/p·M·γ   (steps are not pipelined: summation
//          is exposed)  + for n != p the fold: 2α + 2M·β + M·γ
//   recursive doubling: log2(p)·(α + M·β + M·γ)   (whole tensor each step, summation exposed)
//          + for n != p the fold: 2α + 2M·β + M·γ
//   push/pull: 2(n+k-1)·α + 2n(n-1)/D·M·β with D = n² + kn - 2k (a message to and from every
//          server; summation pipelined on the servers)
// n == 1 costs 0 for every algorithm, and kAuto (not an algorithm that runs) costs 0.
double PredictSeconds(Algorithm algorithm, uint64_t bytes, int n, int extra_servers,
                      const CostModel& model);

// Size ranges: [0, recursive_doubling_below) -> recursive doubling, [.., halving_doubling_below)
// -> halving-doubling, [.., push_pull_from) -> ring, [push_pull_from, inf) -> push/pull.
// Configuration: ModelThresholds gives model-based defaults, to be replaced by
// benchmark-calibrated values.
struct SelectorThresholds {
  uint64_t recursive_doubling_below = 0;
  uint64_t halving_doubling_below = 256 << 10;
  uint64_t push_pull_from = UINT64_MAX;  // never, unless summation servers are available
};

// The crossover sizes of PredictSeconds for this cluster shape (push/pull only when
// extra_servers > 0: with k = 0 it has no bandwidth advantage over ring in the model), with a
// margin: the algorithm that sends fewer messages but more bytes or exposed summation
// (recursive doubling before halving-doubling before ring before push/pull with spares) is
// picked only where the model predicts it at least kSelectorMargin faster than the one after it.
// Its per-message term is the model's least certain -- measured on shaped TCP, halving-doubling
// already loses to ring where the model has them equal (BENCHMARKS.md) -- and when many tensors
// are in flight at once, as in training, messages overlap and bytes count, not a lone
// operation's latency.
inline constexpr double kSelectorMargin = 0.1;
SelectorThresholds ModelThresholds(int n, int extra_servers, const CostModel& model = {});

// Crossovers measured by the benchmark suite on one cluster (bench/suite/run.py writes them to
// selector_calibration.json): from which size ring beat halving-doubling, and from which size
// push/pull with k spare hosts beat ring, at every measured size from there on; and below which
// size recursive doubling beat both ring and halving-doubling.
struct MeasuredThresholds {
  uint64_t recursive_doubling_below = 0;              // 0: never (also when not measured)
  uint64_t ring_beats_halving_doubling_from = 0;      // 0: ring at every size
  std::map<int, uint64_t> push_pull_beats_ring_from;  // by k; UINT64_MAX: never
};

// Parses selector_calibration.json. INVALID_ARGUMENT naming the field on anything unexpected.
absl::StatusOr<MeasuredThresholds> ParseSelectorCalibration(std::string_view json);

// The thresholds for a job of `n` workers and `extra_servers` spares from measurements: push/pull
// from the crossover measured with the largest k <= extra_servers (never without one).
SelectorThresholds MeasuredSelectorThresholds(const MeasuredThresholds& measured, int n,
                                              int extra_servers);

// The algorithm for a tensor of `size_bytes` over `n` worker nodes. n <= 1 -> ring (trivial).
Algorithm Select(uint64_t size_bytes, int n, const SelectorThresholds& thresholds);

// Like Select, but asks `can_serve` and falls back, in the order: the selected one, ring,
// halving-doubling, push/pull, until one accepts. Returns the last refusal if none does.
absl::StatusOr<Algorithm> SelectServable(uint64_t size_bytes, int n,
                                         const SelectorThresholds& thresholds,
                                         absl::FunctionRef<absl::Status(Algorithm)> can_serve);

}  // namespace tributary::dataplane
