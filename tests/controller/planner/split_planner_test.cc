#include "controller/planner/split_planner.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tributary::controller {
namespace {

using ::testing::HasSubstr;

constexpr double kGBps = 1e9;
constexpr double kTotal = static_cast<double>(SplitPlan::kWeightTotal);

std::vector<MachineCapacity> Uniform(const std::string& prefix, int count, double b, double c = 0) {
  std::vector<MachineCapacity> out;
  for (int i = 0; i < count; ++i) out.push_back({absl::StrCat(prefix, i), b, c});
  return out;
}

const ServerShare* Find(const SplitPlan& plan, const std::string& id) {
  for (const ServerShare& s : plan.servers) {
    if (s.node_id == id) return &s;
  }
  return nullptr;
}

double FractionOf(const SplitPlan& plan, const std::string& id) {
  const ServerShare* s = Find(plan, id);
  return s == nullptr ? 0.0 : s->fraction;
}

int CountSpares(const SplitPlan& plan) {
  return static_cast<int>(std::count_if(plan.servers.begin(), plan.servers.end(),
                                        [](const ServerShare& s) { return !s.is_worker; }));
}

// Plan-wide invariants: weights sum to exactly 2^32, every weight is positive and within one
// unit of fraction * 2^32, fractions sum to 1, workers come first, and the order is the input
// order.
void ExpectWellFormed(const SplitPlan& plan, const std::vector<MachineCapacity>& workers,
                      const std::vector<MachineCapacity>& spares) {
  uint64_t weight_sum = 0;
  double fraction_sum = 0;
  for (const ServerShare& s : plan.servers) {
    EXPECT_GT(s.weight, 0u) << s.node_id;
    EXPECT_GT(s.fraction, 0) << s.node_id;
    EXPECT_LE(s.fraction, 1) << s.node_id;
    EXPECT_LE(std::abs(static_cast<double>(s.weight) - s.fraction * kTotal), 1.0) << s.node_id;
    weight_sum += s.weight;
    fraction_sum += s.fraction;
  }
  EXPECT_EQ(weight_sum, SplitPlan::kWeightTotal);
  EXPECT_NEAR(fraction_sum, 1.0, 1e-8);
  std::vector<std::string> expected_order;
  for (const auto& m : workers) expected_order.push_back(m.node_id);
  for (const auto& m : spares) expected_order.push_back(m.node_id);
  size_t cursor = 0;
  for (const ServerShare& s : plan.servers) {
    while (cursor < expected_order.size() && expected_order[cursor] != s.node_id) ++cursor;
    ASSERT_LT(cursor, expected_order.size()) << s.node_id << " out of order or unknown";
    EXPECT_EQ(s.is_worker, cursor < workers.size()) << s.node_id;
  }
}

// Every constraint of the problem holds for the plan's shares at the plan's T (M = 1).
void ExpectFeasible(const SplitPlan& plan, const std::vector<MachineCapacity>& workers,
                    const std::vector<MachineCapacity>& spares) {
  const int n = static_cast<int>(workers.size());
  const double t = plan.seconds_per_byte;
  auto le = [](double lhs, double rhs) { return lhs <= rhs * (1 + 1e-9) + 1e-15; };
  for (const auto& w : workers) {
    const double s = FractionOf(plan, w.node_id);
    EXPECT_TRUE(le(1 + (n - 2) * s, t * w.nic_bytes_per_s)) << "NIC of worker " << w.node_id;
    if (w.sum_bytes_per_s > 0) {
      EXPECT_TRUE(le(n * s, t * w.sum_bytes_per_s)) << "CPU of worker " << w.node_id;
    }
  }
  for (const auto& m : spares) {
    const double s = FractionOf(plan, m.node_id);
    double rate = m.nic_bytes_per_s;
    if (m.sum_bytes_per_s > 0) rate = std::min(rate, m.sum_bytes_per_s);
    EXPECT_TRUE(le(n * s, t * rate)) << "spare " << m.node_id;
  }
}

// ---------------------------------------------------------------------------------------------
// An independent reference: a dense simplex (Bland's rule) on the same problem, reformulated
// with z = 1/T and w = s/T so that every right-hand side is non-negative and the origin is a
// basic feasible solution:
//   maximise z  s.t.  z + (n-2) w_i <= B_i,  n w_i <= C_i  (workers),  n w_j <= min(B_j, C_j)
//   (spares),  sum(w) - z <= 0,  z - sum(w) <= 0,  w, z >= 0.
// Returns T = 1/z.
double ReferenceT(const std::vector<MachineCapacity>& workers,
                  const std::vector<MachineCapacity>& spares) {
  const int n = static_cast<int>(workers.size());
  const int m = static_cast<int>(workers.size() + spares.size());
  const int vars = m + 1;  // w_0..w_{m-1}, z
  const int z = m;
  std::vector<std::vector<double>> rows;  // coefficients over vars, then rhs
  auto add_row = [&](std::vector<double> row) { rows.push_back(std::move(row)); };
  // Rates in GB/s keep the tableau well scaled.
  for (int i = 0; i < n; ++i) {
    std::vector<double> r(vars + 1, 0);
    r[z] = 1;
    r[i] = n - 2;
    r[vars] = workers[i].nic_bytes_per_s / kGBps;
    add_row(r);
    if (workers[i].sum_bytes_per_s > 0) {
      std::vector<double> c(vars + 1, 0);
      c[i] = n;
      c[vars] = workers[i].sum_bytes_per_s / kGBps;
      add_row(c);
    }
  }
  for (size_t j = 0; j < spares.size(); ++j) {
    double rate = spares[j].nic_bytes_per_s;
    if (spares[j].sum_bytes_per_s > 0) rate = std::min(rate, spares[j].sum_bytes_per_s);
    std::vector<double> r(vars + 1, 0);
    r[n + j] = n;
    r[vars] = rate / kGBps;
    add_row(r);
  }
  std::vector<double> up(vars + 1, 0), down(vars + 1, 0);
  for (int i = 0; i < m; ++i) {
    up[i] = 1;
    down[i] = -1;
  }
  up[z] = -1;
  down[z] = 1;
  add_row(up);
  add_row(down);

  const int r_count = static_cast<int>(rows.size());
  const int cols = vars + r_count;  // structural + slack
  std::vector<std::vector<double>> tab(r_count, std::vector<double>(cols + 1, 0));
  std::vector<int> basis(r_count);
  for (int r = 0; r < r_count; ++r) {
    for (int c = 0; c < vars; ++c) tab[r][c] = rows[r][c];
    tab[r][vars + r] = 1;
    tab[r][cols] = rows[r][vars];
    basis[r] = vars + r;
  }
  std::vector<double> obj(cols + 1, 0);  // reduced costs of "maximise z": row holds -c
  obj[z] = -1;
  constexpr double kEps = 1e-12;
  for (int iter = 0; iter < 10000; ++iter) {
    int enter = -1;
    for (int c = 0; c < cols; ++c) {
      if (obj[c] < -kEps) {
        enter = c;
        break;
      }
    }
    if (enter < 0) break;
    int leave = -1;
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r < r_count; ++r) {
      if (tab[r][enter] > kEps) {
        const double ratio = tab[r][cols] / tab[r][enter];
        if (ratio < best - kEps ||
            (ratio <= best + kEps && leave >= 0 && basis[r] < basis[leave])) {
          best = std::min(best, ratio);
          leave = r;
        }
      }
    }
    EXPECT_GE(leave, 0) << "reference LP unbounded";
    if (leave < 0) return 0;
    const double piv = tab[leave][enter];
    for (double& v : tab[leave]) v /= piv;
    for (int r = 0; r < r_count; ++r) {
      if (r == leave || tab[r][enter] == 0) continue;
      const double f = tab[r][enter];
      for (int c = 0; c <= cols; ++c) tab[r][c] -= f * tab[leave][c];
    }
    const double f = obj[enter];
    for (int c = 0; c <= cols; ++c) obj[c] -= f * tab[leave][c];
    basis[leave] = enter;
  }
  const double z_value = obj[cols];  // objective value
  return 1.0 / (z_value * kGBps);
}

// Deterministic across standard libraries: only the raw mt19937_64 stream is specified.
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double Uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(gen_() >> 11) * 0x1.0p-53;
  }

 private:
  std::mt19937_64 gen_;
};

// ---------------------------------------------------------------------------------------------

TEST(UniformClosedFormTest, MatchesDesignFormulas) {
  const UniformSplit s = UniformClosedForm(4, 4, 1.0);
  EXPECT_DOUBLE_EQ(s.worker_fraction, 0.0);
  EXPECT_DOUBLE_EQ(s.spare_fraction, 0.25);
  EXPECT_DOUBLE_EQ(s.seconds_per_byte, 1.0);
  const UniformSplit ring = UniformClosedForm(4, 0, 2.0);
  EXPECT_DOUBLE_EQ(ring.worker_fraction, 0.25);
  EXPECT_DOUBLE_EQ(ring.seconds_per_byte, 2.0 * 3 / (4 * 2.0));
  const UniformSplit clamped = UniformClosedForm(3, 7, 1.0);
  EXPECT_DOUBLE_EQ(clamped.seconds_per_byte, 1.0);
  EXPECT_DOUBLE_EQ(clamped.spare_fraction, 1.0 / 3);
  const UniformSplit one = UniformClosedForm(1, 3, 1.0);
  EXPECT_EQ(one.worker_fraction, 1.0);
  EXPECT_EQ(one.spare_fraction, 0.0);
  EXPECT_EQ(one.seconds_per_byte, 0.0);
}

TEST(PlanSplitTest, UniformGridReproducesClosedForm) {
  const double b = 12.5 * kGBps;  // 100 Gbit/s
  for (int n : {1, 2, 3, 4, 5, 8, 16}) {
    std::vector<int> ks = {0, 1, 2, n - 1, n, n + 1, 2 * n};
    std::sort(ks.begin(), ks.end());
    ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
    for (int k : ks) {
      if (k < 0) continue;
      SCOPED_TRACE(absl::StrCat("n=", n, " k=", k));
      const auto workers = Uniform("w", n, b);
      const auto spares = Uniform("s", k, b);
      absl::StatusOr<SplitPlan> plan = PlanSplit(workers, spares);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ExpectWellFormed(*plan, workers, spares);
      ExpectFeasible(*plan, workers, spares);
      const UniformSplit closed = UniformClosedForm(n, k, b);
      if (n == 1) {
        EXPECT_EQ(plan->seconds_per_byte, 0);
        EXPECT_EQ(plan->ring_seconds_per_byte, 0);
        ASSERT_EQ(plan->servers.size(), 1u);
        EXPECT_EQ(plan->servers[0].weight, SplitPlan::kWeightTotal);
        continue;
      }
      EXPECT_NEAR(plan->seconds_per_byte, closed.seconds_per_byte, 1e-9 * closed.seconds_per_byte);
      const double ring = 2.0 * (n - 1) / (n * b);
      EXPECT_NEAR(plan->ring_seconds_per_byte, ring, 1e-12 * ring);
      if (k == 0) {
        EXPECT_NEAR(plan->seconds_per_byte, ring, 1e-9 * ring);
      }
      if (k <= n) {
        const double speedup = 1.0 + static_cast<double>(k) * (n - 2) / (n * n);
        EXPECT_NEAR(plan->ring_seconds_per_byte / plan->seconds_per_byte, speedup, 1e-9);
      }
      if (k > n) {
        EXPECT_NEAR(plan->seconds_per_byte, 1.0 / b, 1e-9 / b);
        // With n = 2 no spare ever helps (see README), so all of them are dropped.
        EXPECT_EQ(CountSpares(*plan), n == 2 ? 0 : n);
      }
      if (n >= 3 && k <= n) {
        for (const auto& w : workers) {
          EXPECT_NEAR(FractionOf(*plan, w.node_id), closed.worker_fraction, 1e-9) << w.node_id;
        }
        for (const auto& s : spares) {
          EXPECT_NEAR(FractionOf(*plan, s.node_id), closed.spare_fraction, 1e-9) << s.node_id;
        }
      }
    }
  }
}

TEST(PlanSplitTest, DesignSpeedups) {
  for (auto [n, expected] : {std::pair{4, 1.5}, std::pair{8, 1.75}, std::pair{2, 1.0}}) {
    absl::StatusOr<SplitPlan> plan = PlanSplit(Uniform("w", n, kGBps), Uniform("s", n, kGBps));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_NEAR(plan->ring_seconds_per_byte / plan->seconds_per_byte, expected, 1e-9) << n;
  }
}

TEST(PlanSplitTest, HeterogeneousMatchesReferenceLp) {
  Rng rng(20240611);
  int cases = 0;
  for (int n = 2; n <= 8; ++n) {
    for (int k = 0; k <= 4; ++k) {
      for (int rep = 0; rep < 12; ++rep, ++cases) {
        SCOPED_TRACE(absl::StrCat("n=", n, " k=", k, " rep=", rep));
        std::vector<MachineCapacity> workers, spares;
        // Odd reps spread NICs widely (T is then often the slowest worker's M/B bound); even
        // reps keep them close so that the sum of shares decides T. Every third rep has fast
        // CPUs. The mix covers both regimes and the dropping of spares and workers.
        auto draw = [&](const std::string& id) {
          const double nic = rep % 2 ? rng.Uniform(1, 12.5) : rng.Uniform(9, 12.5);
          MachineCapacity m{id, nic * kGBps, 0};
          // A third unlimited, the rest limited somewhere between well below and above the NIC.
          if (rng.Uniform(0, 1) > 1.0 / 3) {
            m.sum_bytes_per_s = rng.Uniform(0.3, 4) * (rep % 3 ? 1 : 4) * kGBps;
          }
          return m;
        };
        for (int i = 0; i < n; ++i) workers.push_back(draw(absl::StrCat("w", i)));
        for (int j = 0; j < k; ++j) spares.push_back(draw(absl::StrCat("s", j)));
        absl::StatusOr<SplitPlan> plan = PlanSplit(workers, spares);
        ASSERT_TRUE(plan.ok()) << plan.status();
        const double reference = ReferenceT(workers, spares);
        EXPECT_NEAR(plan->seconds_per_byte, reference, 1e-6 * reference);
        ExpectWellFormed(*plan, workers, spares);
        ExpectFeasible(*plan, workers, spares);
      }
    }
  }
  EXPECT_EQ(cases, 7 * 5 * 12);
}

TEST(PlanSplitTest, ReferenceLpAgreesWithClosedForm) {
  // Guards the reference itself: it must reproduce the design's numbers.
  EXPECT_NEAR(ReferenceT(Uniform("w", 4, kGBps), Uniform("s", 2, kGBps)),
              UniformClosedForm(4, 2, kGBps).seconds_per_byte, 1e-15);
  EXPECT_NEAR(ReferenceT(Uniform("w", 8, kGBps), {}), 2.0 * 7 / (8 * kGBps), 1e-15);
}

TEST(PlanSplitTest, SlowNicWorkerGetsSmallerShare) {
  // n = 3: worker cap (T B_i - 1); 2(10T - 1) + (8T - 1) = 1 gives T = 1/7 (B in GB/s).
  const std::vector<MachineCapacity> workers = {
      {"a", 10 * kGBps, 0}, {"b", 10 * kGBps, 0}, {"slow", 8 * kGBps, 0}};
  absl::StatusOr<SplitPlan> plan = PlanSplit(workers, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(plan->seconds_per_byte * kGBps, 1.0 / 7, 1e-12);
  EXPECT_NEAR(plan->ring_seconds_per_byte * kGBps, 2.0 * 2 / (3 * 8), 1e-12);
  EXPECT_NEAR(FractionOf(*plan, "a"), 3.0 / 7, 1e-12);
  EXPECT_NEAR(FractionOf(*plan, "b"), 3.0 / 7, 1e-12);
  EXPECT_NEAR(FractionOf(*plan, "slow"), 1.0 / 7, 1e-12);
  ExpectWellFormed(*plan, workers, {});
}

TEST(PlanSplitTest, VerySlowWorkerBoundsTimeAndOwnsNothing) {
  // The slow worker must still send and receive M, so T = 1/5; at that T its share is 0.
  const std::vector<MachineCapacity> workers = {
      {"a", 10 * kGBps, 0}, {"b", 10 * kGBps, 0}, {"slow", 5 * kGBps, 0}};
  absl::StatusOr<SplitPlan> plan = PlanSplit(workers, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(plan->seconds_per_byte * kGBps, 0.2, 1e-12);
  EXPECT_EQ(Find(*plan, "slow"), nullptr);
  EXPECT_NEAR(FractionOf(*plan, "a"), 0.5, 1e-12);
  ExpectWellFormed(*plan, workers, {});
  ExpectFeasible(*plan, workers, {});
}

TEST(PlanSplitTest, CpuLimitedSpareIsCappedByMinOfNicAndCpu) {
  // n = 4, k = 1, B = 1, spare C = 0.5: 4(T-1)/2 + 0.5T/4 = 1 gives T = 24/17.
  const auto workers = Uniform("w", 4, kGBps);
  const std::vector<MachineCapacity> spares = {{"cpu", kGBps, 0.5 * kGBps}};
  absl::StatusOr<SplitPlan> plan = PlanSplit(workers, spares);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(plan->seconds_per_byte * kGBps, 24.0 / 17, 1e-12);
  EXPECT_NEAR(FractionOf(*plan, "cpu"), 3.0 / 17, 1e-12);
  EXPECT_NEAR(FractionOf(*plan, "w0"), 7.0 / 34, 1e-12);
  // A NIC slower than the CPU limits the same way: min(B, C).
  const std::vector<MachineCapacity> slow_nic = {{"nic", 0.5 * kGBps, 4 * kGBps}};
  absl::StatusOr<SplitPlan> plan2 = PlanSplit(workers, slow_nic);
  ASSERT_TRUE(plan2.ok()) << plan2.status();
  EXPECT_NEAR(plan2->seconds_per_byte, plan->seconds_per_byte, 1e-12 * plan->seconds_per_byte);
}

TEST(PlanSplitTest, CpuLimitsWorkerSummationService) {
  // n = 3, B = 1, worker 0 sums at 0.6: 2(T-1) + 0.6T/3 = 1 gives T = 15/11.
  const std::vector<MachineCapacity> workers = {
      {"w0", kGBps, 0.6 * kGBps}, {"w1", kGBps, 0}, {"w2", kGBps, -1}};
  absl::StatusOr<SplitPlan> plan = PlanSplit(workers, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(plan->seconds_per_byte * kGBps, 15.0 / 11, 1e-12);
  EXPECT_NEAR(FractionOf(*plan, "w0"), 3.0 / 11, 1e-12);
  EXPECT_NEAR(FractionOf(*plan, "w1"), 4.0 / 11, 1e-12);
  EXPECT_NEAR(FractionOf(*plan, "w2"), 4.0 / 11, 1e-12);
  ExpectFeasible(*plan, workers, {});
}

TEST(PlanSplitTest, TwoWorkers) {
  // No CPU limit: T = 1/min B, the remainder split equally, spares never needed.
  const std::vector<MachineCapacity> workers = {{"a", 2 * kGBps, 0}, {"b", kGBps, 0}};
  absl::StatusOr<SplitPlan> plan = PlanSplit(workers, Uniform("s", 3, kGBps));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(plan->seconds_per_byte * kGBps, 1.0, 1e-12);
  ASSERT_EQ(plan->servers.size(), 2u);
  EXPECT_EQ(plan->servers[0].weight, SplitPlan::kWeightTotal / 2);
  EXPECT_EQ(plan->servers[1].weight, SplitPlan::kWeightTotal / 2);
  // CPU-limited workers: 2 * (0.5 T / 2) = 1 gives T = 2; a spare then helps.
  const auto slow_cpu = Uniform("w", 2, kGBps, 0.5 * kGBps);
  plan = PlanSplit(slow_cpu, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(plan->seconds_per_byte * kGBps, 2.0, 1e-12);
  plan = PlanSplit(slow_cpu, Uniform("s", 1, kGBps));
  ASSERT_TRUE(plan.ok()) << plan.status();
  // 0.5T/2 * 2 + T/2 = 1 gives T = 1, which is also the NIC bound.
  EXPECT_NEAR(plan->seconds_per_byte * kGBps, 1.0, 1e-12);
  EXPECT_NEAR(FractionOf(*plan, "s0"), 0.5, 1e-12);
  // One limited, one unlimited worker: the limited one gets its cap, the other the rest.
  const std::vector<MachineCapacity> mixed = {{"lim", kGBps, 0.5 * kGBps}, {"free", kGBps, 0}};
  plan = PlanSplit(mixed, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(plan->seconds_per_byte * kGBps, 1.0, 1e-12);
  EXPECT_NEAR(FractionOf(*plan, "lim"), 0.25, 1e-12);
  EXPECT_NEAR(FractionOf(*plan, "free"), 0.75, 1e-12);
}

TEST(PlanSplitTest, SingleWorkerOwnsEverything) {
  absl::StatusOr<SplitPlan> plan = PlanSplit({{"only", kGBps, 0}}, Uniform("s", 2, kGBps));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->servers.size(), 1u);
  EXPECT_EQ(plan->servers[0].node_id, "only");
  EXPECT_TRUE(plan->servers[0].is_worker);
  EXPECT_EQ(plan->servers[0].fraction, 1.0);
  EXPECT_EQ(plan->servers[0].weight, SplitPlan::kWeightTotal);
  EXPECT_EQ(plan->seconds_per_byte, 0);
  EXPECT_EQ(plan->ring_seconds_per_byte, 0);
}

TEST(PlanSplitTest, DropsSmallestUnneededSparesLaterFirst) {
  // n = 4 at T = 1/B: spare caps are rate/4 and the workers' are 0. Spares 3..5 are not needed;
  // among equal caps the later ones go first, and the fast spare is kept.
  const auto workers = Uniform("w", 4, kGBps);
  std::vector<MachineCapacity> spares = Uniform("s", 6, kGBps);
  spares[2].nic_bytes_per_s = 2 * kGBps;
  absl::StatusOr<SplitPlan> plan = PlanSplit(workers, spares);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(plan->seconds_per_byte * kGBps, 1.0, 1e-12);
  ASSERT_EQ(plan->servers.size(), 3u);
  EXPECT_EQ(plan->servers[0].node_id, "s0");
  EXPECT_EQ(plan->servers[1].node_id, "s1");
  EXPECT_EQ(plan->servers[2].node_id, "s2");
  EXPECT_NEAR(plan->servers[2].fraction, 0.5, 1e-12);
}

TEST(PlanSplitTest, WeightsUseLargestRemainderWithIndexTieBreak) {
  absl::StatusOr<SplitPlan> plan = PlanSplit(Uniform("w", 3, kGBps), {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->servers.size(), 3u);
  // 2^32 / 3 = 1431655765.33..: one unit left over, which goes to the first server.
  EXPECT_EQ(plan->servers[0].weight, 1431655766u);
  EXPECT_EQ(plan->servers[1].weight, 1431655765u);
  EXPECT_EQ(plan->servers[2].weight, 1431655765u);
}

TEST(PlanSplitTest, IsDeterministic) {
  const std::vector<MachineCapacity> workers = {
      {"a", 3 * kGBps, 2 * kGBps}, {"b", 7 * kGBps, 0}, {"c", 5 * kGBps, 9 * kGBps}};
  const std::vector<MachineCapacity> spares = {{"x", 4 * kGBps, 1 * kGBps}};
  absl::StatusOr<SplitPlan> p1 = PlanSplit(workers, spares);
  absl::StatusOr<SplitPlan> p2 = PlanSplit(workers, spares);
  ASSERT_TRUE(p1.ok() && p2.ok());
  ASSERT_EQ(p1->servers.size(), p2->servers.size());
  for (size_t i = 0; i < p1->servers.size(); ++i) {
    EXPECT_EQ(p1->servers[i].node_id, p2->servers[i].node_id);
    EXPECT_EQ(p1->servers[i].weight, p2->servers[i].weight);
  }
}

TEST(PlanSplitTest, InvalidInputs) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    std::vector<MachineCapacity> workers, spares;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{}, {{"s", kGBps, 0}}, "worker"},
      {{{"w0", 0, 0}}, {}, "w0"},
      {{{"w0", kGBps, 0}, {"w1", -1, 0}}, {}, "w1"},
      {{{"w0", nan, 0}}, {}, "w0"},
      {{{"w0", inf, 0}}, {}, "w0"},
      {{{"w0", kGBps, nan}}, {}, "w0"},
      {{{"w0", kGBps, 0}}, {{"s7", 0, 0}}, "s7"},
      {{{"w0", kGBps, 0}}, {{"s7", kGBps, nan}}, "s7"},
      {{{"dup", kGBps, 0}, {"dup", kGBps, 0}}, {}, "dup"},
      {{{"w0", kGBps, 0}, {"both", kGBps, 0}}, {{"both", kGBps, 0}}, "both"},
      {{{"w0", kGBps, 0}, {"", kGBps, 0}}, {}, "worker #1"},
      {{{"w0", kGBps, 0}}, {{"", kGBps, 0}}, "spare #0"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SplitPlan> plan = PlanSplit(c.workers, c.spares);
    ASSERT_FALSE(plan.ok()) << c.needle;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << c.needle;
    EXPECT_THAT(plan.status().message(), HasSubstr(c.needle));
  }
}

}  // namespace
}  // namespace tributary::controller
