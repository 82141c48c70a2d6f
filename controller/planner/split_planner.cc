// Exact solver for the inter-node split of DESIGN.md §1.1. See README.md in this folder for the
// math and the tie-breaks.
#include "controller/planner/split_planner.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tributary::controller {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Relative slack within which dropping a spare machine counts as "T did not increase".
constexpr double kDropTolerance = 1e-9;

// A line a*T + b (the share bound of one constraint, as a function of T, with M = 1).
struct Line {
  double a = 0;
  double b = 0;
  double At(double t) const { return a * t + b; }
};

// The largest feasible share of one machine as a function of T: the minimum of its lines. No
// lines means unbounded (an n = 2 worker without a CPU limit). Every line has a > 0, so a cap
// is continuous, concave and strictly increasing wherever it is bounded.
struct Cap {
  std::vector<Line> lines;
  bool Unbounded() const { return lines.empty(); }
  double At(double t) const {
    double v = kInf;
    for (const Line& l : lines) v = std::min(v, l.At(t));
    return v;
  }
};

bool CpuLimited(double sum_bytes_per_s) {
  return std::isfinite(sum_bytes_per_s) && sum_bytes_per_s > 0;
}

// Worker i (n >= 2): M + (n-2) s_i <= T B_i and n s_i <= T C_i.
Cap WorkerCap(const MachineCapacity& m, int n) {
  Cap cap;
  if (n > 2) cap.lines.push_back({m.nic_bytes_per_s / (n - 2), -1.0 / (n - 2)});
  if (CpuLimited(m.sum_bytes_per_s)) cap.lines.push_back({m.sum_bytes_per_s / n, 0});
  return cap;
}

// Spare machine j: n s_j <= T min(B_j, C_j).
Cap SpareCap(const MachineCapacity& m, int n) {
  double rate = m.nic_bytes_per_s;
  if (CpuLimited(m.sum_bytes_per_s)) rate = std::min(rate, m.sum_bytes_per_s);
  return Cap{{Line{rate / n, 0}}};
}

double SumCaps(const std::vector<const Cap*>& caps, double t) {
  double sum = 0;
  for (const Cap* c : caps) sum += c->At(t);
  return sum;
}

// The smallest T >= t0 with sum of caps(T) >= 1. The sum is piecewise linear and increasing, so
// the root is found exactly: locate the linear segment between consecutive breakpoints that
// holds it, then solve the segment's linear equation.
double SolveMinT(const std::vector<const Cap*>& caps, double t0) {
  for (const Cap* c : caps) {
    if (c->Unbounded()) return t0;
  }
  if (SumCaps(caps, t0) >= 1) return t0;
  std::vector<double> breakpoints;
  for (const Cap* c : caps) {
    for (size_t p = 0; p < c->lines.size(); ++p) {
      for (size_t q = p + 1; q < c->lines.size(); ++q) {
        const Line& l1 = c->lines[p];
        const Line& l2 = c->lines[q];
        if (l1.a == l2.a) continue;
        const double t = (l2.b - l1.b) / (l1.a - l2.a);
        if (t > t0 && std::isfinite(t)) breakpoints.push_back(t);
      }
    }
  }
  std::sort(breakpoints.begin(), breakpoints.end());
  double lo = t0;
  double hi = kInf;
  for (double bp : breakpoints) {
    if (SumCaps(caps, bp) >= 1) {
      hi = bp;
      break;
    }
    lo = bp;
  }
  // Inside (lo, hi) every cap follows one fixed line: the one lowest at an interior point.
  const double probe = std::isfinite(hi) ? lo + (hi - lo) / 2 : 2 * lo + 1;
  double slope = 0;
  double intercept = 0;
  for (const Cap* c : caps) {
    const Line* active = &c->lines.front();
    for (const Line& l : c->lines) {
      if (l.At(probe) < active->At(probe)) active = &l;
    }
    slope += active->a;
    intercept += active->b;
  }
  return std::clamp((1 - intercept) / slope, lo, hi);
}

// Fractions -> integer weights summing to exactly kWeightTotal, by largest remainder. Ties go
// to the lower index when adding a unit and to the higher index when taking one away.
std::vector<uint64_t> ToWeights(const std::vector<double>& fractions) {
  const double total = static_cast<double>(SplitPlan::kWeightTotal);
  std::vector<uint64_t> weights(fractions.size());
  std::vector<double> remainders(fractions.size());
  int64_t deficit = static_cast<int64_t>(SplitPlan::kWeightTotal);
  for (size_t i = 0; i < fractions.size(); ++i) {
    const double q = std::clamp(fractions[i], 0.0, 1.0) * total;
    const double f = std::floor(q);
    weights[i] = static_cast<uint64_t>(f);
    remainders[i] = q - f;
    deficit -= static_cast<int64_t>(weights[i]);
  }
  // |deficit| is at most the number of servers when the fractions sum to 1; the loops below
  // stay bounded even if they do not.
  // Only servers with a positive fraction take part, so a machine with no share never gets one.
  std::vector<size_t> order;
  for (size_t i = 0; i < fractions.size(); ++i) {
    if (fractions[i] > 0) order.push_back(i);
  }
  if (order.empty()) return weights;
  if (deficit > 0) {
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return remainders[a] > remainders[b]; });
    const int64_t size = static_cast<int64_t>(order.size());
    for (int64_t i = 0; i < size; ++i) {
      weights[order[i]] += static_cast<uint64_t>(deficit / size + (i < deficit % size ? 1 : 0));
    }
  } else if (deficit < 0) {
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return remainders[a] < remainders[b] || (remainders[a] == remainders[b] && a > b);
    });
    while (deficit < 0) {
      for (size_t i = 0; i < order.size() && deficit < 0; ++i) {
        const uint64_t take = std::min<uint64_t>(weights[order[i]], 1);
        weights[order[i]] -= take;
        deficit += static_cast<int64_t>(take);
      }
    }
  }
  return weights;
}

absl::Status ValidateMachine(const MachineCapacity& m, const char* role, size_t index,
                             std::unordered_set<std::string>& seen) {
  if (m.node_id.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(role, " #", index, " has an empty node id"));
  }
  if (!std::isfinite(m.nic_bytes_per_s) || m.nic_bytes_per_s <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(role, " node ", m.node_id, " has NIC bandwidth ",
                                                   m.nic_bytes_per_s,
                                                   " bytes/s; it must be finite and > 0"));
  }
  if (std::isnan(m.sum_bytes_per_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        role, " node ", m.node_id, " has a NaN summation rate; use <= 0 for unlimited"));
  }
  if (!seen.insert(m.node_id).second) {
    return absl::InvalidArgumentError(
        absl::StrCat(role, " node ", m.node_id, " appears more than once"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SplitPlan> PlanSplit(const std::vector<MachineCapacity>& workers,
                                    const std::vector<MachineCapacity>& spares) {
  if (workers.empty()) return absl::InvalidArgumentError("split plan needs at least one worker");
  std::unordered_set<std::string> seen;
  for (size_t i = 0; i < workers.size(); ++i) {
    if (absl::Status s = ValidateMachine(workers[i], "worker", i, seen); !s.ok()) return s;
  }
  for (size_t j = 0; j < spares.size(); ++j) {
    if (absl::Status s = ValidateMachine(spares[j], "spare", j, seen); !s.ok()) return s;
  }

  SplitPlan plan;
  const int n = static_cast<int>(workers.size());
  if (n == 1) {
    // Nothing crosses the network: the lone worker owns the whole gradient.
    plan.servers.push_back({workers[0].node_id, true, 1.0, SplitPlan::kWeightTotal});
    return plan;
  }

  double min_b = kInf;
  for (const MachineCapacity& w : workers) min_b = std::min(min_b, w.nic_bytes_per_s);
  // Every worker sends at least M - s_i + (n-1) s_i >= M, so T >= M / B_i for every worker.
  const double t0 = 1.0 / min_b;
  plan.ring_seconds_per_byte = 2.0 * (n - 1) / (n * min_b);

  std::vector<Cap> caps;
  caps.reserve(workers.size() + spares.size());
  for (const MachineCapacity& w : workers) caps.push_back(WorkerCap(w, n));
  for (const MachineCapacity& s : spares) caps.push_back(SpareCap(s, n));

  std::vector<bool> active(caps.size(), true);
  auto active_caps = [&] {
    std::vector<const Cap*> out;
    for (size_t i = 0; i < caps.size(); ++i) {
      if (active[i]) out.push_back(&caps[i]);
    }
    return out;
  };
  const double t_opt = SolveMinT(active_caps(), t0);
  double t = t_opt;

  // Drop spare machines the optimum does not need, smallest capacity first (the later one in
  // input order on ties), while T stays within kDropTolerance of the optimum. Spare caps are
  // proportional to min(B, C), so the smallest is always the cheapest to drop.
  std::vector<size_t> spare_order(spares.size());
  std::iota(spare_order.begin(), spare_order.end(), workers.size());
  std::stable_sort(spare_order.begin(), spare_order.end(), [&](size_t a, size_t b) {
    const double ca = caps[a].lines.front().a;
    const double cb = caps[b].lines.front().a;
    return ca < cb || (ca == cb && a > b);
  });
  for (size_t idx : spare_order) {
    active[idx] = false;
    const double t_without = SolveMinT(active_caps(), t0);
    if (t_without > t_opt * (1 + kDropTolerance)) {
      active[idx] = true;
      break;
    }
    t = t_without;
  }
  plan.seconds_per_byte = t;

  // Shares at T: bounded machines get their cap, scaled so the total is 1 (only ever scaled
  // down, apart from rounding). Unbounded machines (n = 2 workers without a CPU limit) share
  // what the bounded ones leave, equally.
  std::vector<double> fractions(caps.size(), 0);
  double bounded_sum = 0;
  int unbounded = 0;
  for (size_t i = 0; i < caps.size(); ++i) {
    if (!active[i]) continue;
    if (caps[i].Unbounded()) {
      ++unbounded;
    } else {
      fractions[i] = std::max(0.0, caps[i].At(t));
      bounded_sum += fractions[i];
    }
  }
  const double rest = std::max(0.0, 1 - bounded_sum);
  const double scale = (unbounded > 0 && bounded_sum <= 1) ? 1.0 : 1.0 / bounded_sum;
  for (size_t i = 0; i < caps.size(); ++i) {
    if (!active[i]) continue;
    fractions[i] = caps[i].Unbounded() ? rest / unbounded : fractions[i] * scale;
  }

  for (double f : fractions) TRIBUTARY_CHECK(std::isfinite(f));
  const std::vector<uint64_t> weights = ToWeights(fractions);
  for (size_t i = 0; i < caps.size(); ++i) {
    if (weights[i] == 0) continue;
    const bool is_worker = i < workers.size();
    const MachineCapacity& m = is_worker ? workers[i] : spares[i - workers.size()];
    plan.servers.push_back({m.node_id, is_worker, fractions[i], weights[i]});
  }
  return plan;
}

UniformSplit UniformClosedForm(int n, int k, double nic_bytes_per_s) {
  if (n <= 1) return {1.0, 0.0, 0.0};
  k = std::clamp(k, 0, n);
  const double d = static_cast<double>(n) * n + static_cast<double>(k) * n - 2.0 * k;
  return {(n - k) / d, 2.0 * (n - 1) / d, 2.0 * n * (n - 1) / (d * nic_bytes_per_s)};
}

}  // namespace tributary::controller
