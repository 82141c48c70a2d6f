#include "dataplane/schedule/miad_tuner.h"

#include <cmath>
#include <functional>
#include <random>

#include "gtest/gtest.h"

namespace tributary::dataplane {
namespace {

constexpr double kKiB = 1024;
constexpr double kMiB = 1024 * 1024;

// Overhead-bound below the optimum, pipeline-fill-bound above: peak at sqrt(overhead * fill).
std::function<double(double)> Unimodal(double overhead_bytes, double fill_bytes) {
  return [=](double x) { return 10e9 * x / (x + overhead_bytes) / (1 + x / fill_bytes); };
}

double PeakOf(const std::function<double(double)>& curve, double lo, double hi) {
  double best = 0;
  for (double x = lo; x <= hi; x *= 1.01) best = std::max(best, curve(x));
  return best;
}

// Feeds `steps` samples of curve(chunk) * noise; returns the final chunk size.
uint64_t Drive(MiadTuner& tuner, const std::function<double(double)>& curve, int steps,
               double noise = 0, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> jitter(1.0, noise);
  for (int i = 0; i < steps; ++i) {
    const double sample = curve(static_cast<double>(tuner.chunk_bytes()));
    tuner.Report(noise > 0 ? sample * jitter(rng) : sample);
  }
  return tuner.chunk_bytes();
}

MiadTuner::Options DefaultOptions() {
  MiadTuner::Options options;
  options.min_bytes = 16 * kKiB;
  options.max_bytes = 256 * kMiB;
  options.initial_bytes = 64 * kKiB;
  options.decrease_step = 256 * kKiB;
  options.samples_per_step = 3;
  options.threshold = 0.03;
  return options;
}

TEST(MiadTunerTest, UnimodalConverges) {
  const auto curve = Unimodal(256 * kKiB, 16 * kMiB);  // peak at 2 MiB
  MiadTuner tuner(DefaultOptions());
  const uint64_t chunk = Drive(tuner, curve, 120);
  EXPECT_TRUE(tuner.settled());
  EXPECT_GE(curve(chunk), 0.9 * PeakOf(curve, 16 * kKiB, 256 * kMiB));
  EXPECT_GE(chunk, 1 * kMiB);
  EXPECT_LE(chunk, 4 * kMiB);
  EXPECT_LE(tuner.windows(), 40);
}

TEST(MiadTunerTest, NoisyUnimodalConverges) {
  const auto curve = Unimodal(256 * kKiB, 16 * kMiB);
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    MiadTuner::Options options = DefaultOptions();
    options.samples_per_step = 8;
    options.threshold = 0.04;
    MiadTuner tuner(options);
    const uint64_t chunk = Drive(tuner, curve, 400, /*noise=*/0.05, seed);
    EXPECT_GE(curve(chunk), 0.9 * PeakOf(curve, 16 * kKiB, 256 * kMiB)) << "seed " << seed;
  }
}

TEST(MiadTunerTest, PlateauStopsGrowing) {
  // Throughput saturates above 1 MiB: stay small once growth stops paying.
  const auto curve = [](double x) { return 10e9 * x / (x + 64 * kKiB); };
  MiadTuner tuner(DefaultOptions());
  const uint64_t chunk = Drive(tuner, curve, 200);
  EXPECT_TRUE(tuner.settled());
  EXPECT_GE(curve(chunk), 0.9 * 10e9);
  EXPECT_LE(chunk, 4 * kMiB);
}

TEST(MiadTunerTest, ClampsToRange) {
  MiadTuner::Options options = DefaultOptions();
  options.max_bytes = 512 * kKiB;
  MiadTuner tuner(options);
  // Monotonically rising curve: ends at the maximum and never beyond.
  for (int i = 0; i < 100; ++i) {
    EXPECT_LE(tuner.chunk_bytes(), options.max_bytes);
    EXPECT_GE(tuner.chunk_bytes(), options.min_bytes);
    tuner.Report(static_cast<double>(tuner.chunk_bytes()));
  }
  EXPECT_EQ(tuner.chunk_bytes(), options.max_bytes);
}

TEST(MiadTunerTest, FollowsShiftingOptimum) {
  const auto before = Unimodal(256 * kKiB, 16 * kMiB);  // peak 2 MiB
  const auto after = Unimodal(64 * kKiB, 1 * kMiB);     // peak 256 KiB
  MiadTuner::Options options = DefaultOptions();
  options.decrease_step = 128 * kKiB;
  MiadTuner tuner(options);
  Drive(tuner, before, 150);
  ASSERT_TRUE(tuner.settled());
  const uint64_t chunk = Drive(tuner, after, 300);
  EXPECT_GE(after(chunk), 0.9 * PeakOf(after, 16 * kKiB, 256 * kMiB));
  // And back up.
  const uint64_t again = Drive(tuner, before, 300);
  EXPECT_GE(before(again), 0.9 * PeakOf(before, 16 * kKiB, 256 * kMiB));
}

}  // namespace
}  // namespace tributary::dataplane
