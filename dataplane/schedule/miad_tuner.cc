#include "dataplane/schedule/miad_tuner.h"

#include <algorithm>
#include <cmath>

namespace tributary::dataplane {

MiadTuner::MiadTuner(Options options) : options_(options) {
  options_.min_bytes = std::max<uint64_t>(options_.min_bytes, 1);
  options_.max_bytes = std::max(options_.max_bytes, options_.min_bytes);
  options_.increase_factor = std::max(options_.increase_factor, 1.01);
  options_.decrease_step = std::max<uint64_t>(options_.decrease_step, 1);
  options_.samples_per_step = std::max(options_.samples_per_step, 1);
  options_.threshold = std::max(options_.threshold, 0.0);
  size_ = Clamp(static_cast<double>(options_.initial_bytes));
}

uint64_t MiadTuner::Clamp(double bytes) const {
  const double clamped = std::clamp(bytes, static_cast<double>(options_.min_bytes),
                                    static_cast<double>(options_.max_bytes));
  return static_cast<uint64_t>(std::llround(clamped));
}

void MiadTuner::Report(double throughput_bytes_per_s) {
  window_sum_ += throughput_bytes_per_s;
  if (++window_count_ < options_.samples_per_step) return;
  const double mean = window_sum_ / window_count_;
  window_sum_ = 0;
  window_count_ = 0;
  ++windows_;
  Decide(mean);
}

void MiadTuner::StartProbe(double mean) {
  phase_ = Phase::kGrow;
  history_.clear();
  history_.push_back({size_, mean});
  previous_mean_ = mean;
  const uint64_t next = Clamp(static_cast<double>(size_) * options_.increase_factor);
  if (next == size_) {
    // At the top already: probe downwards instead.
    phase_ = Phase::kBackOff;
    const uint64_t lower = size_ > options_.decrease_step ? size_ - options_.decrease_step : 0;
    size_ = Clamp(static_cast<double>(lower));
    if (size_ == history_.back().first) Settle();
    return;
  }
  size_ = next;
}

// Holds the smallest size of this probe whose mean is within the threshold of the best mean.
void MiadTuner::Settle() {
  phase_ = Phase::kSettled;
  double best = 0;
  for (const auto& [size, mean] : history_) best = std::max(best, mean);
  uint64_t chosen = size_;
  bool found = false;
  for (const auto& [size, mean] : history_) {
    if (mean >= best * (1 - options_.threshold) && (!found || size < chosen)) {
      chosen = size;
      found = true;
    }
  }
  size_ = chosen;
  reference_ = -1;
}

void MiadTuner::Decide(double mean) {
  switch (phase_) {
    case Phase::kSettled: {
      if (reference_ < 0) {
        reference_ = mean;
        return;
      }
      // The environment changed (a shifting optimum): probe again from here.
      const double band = 2 * options_.threshold;
      if (mean < reference_ * (1 - band) || mean > reference_ * (1 + band)) StartProbe(mean);
      return;
    }
    case Phase::kGrow: {
      if (previous_mean_ < 0) {
        StartProbe(mean);
        return;
      }
      history_.push_back({size_, mean});
      if (mean > previous_mean_ * (1 + options_.threshold)) {
        previous_mean_ = mean;
        const uint64_t next = Clamp(static_cast<double>(size_) * options_.increase_factor);
        if (next == size_) {
          Settle();
        } else {
          size_ = next;
        }
        return;
      }
      if (mean < previous_mean_ * (1 - options_.threshold)) {
        // Overshot: additive decrease from here.
        phase_ = Phase::kBackOff;
        previous_mean_ = mean;
        const uint64_t lower = size_ > options_.decrease_step ? size_ - options_.decrease_step : 0;
        const uint64_t next = Clamp(static_cast<double>(lower));
        if (next == size_) {
          Settle();
        } else {
          size_ = next;
        }
        return;
      }
      Settle();  // plateau: growing does not pay
      return;
    }
    case Phase::kBackOff: {
      history_.push_back({size_, mean});
      if (mean >= previous_mean_) {
        previous_mean_ = mean;
        const uint64_t lower = size_ > options_.decrease_step ? size_ - options_.decrease_step : 0;
        const uint64_t next = Clamp(static_cast<double>(lower));
        if (next == size_) {
          Settle();
        } else {
          size_ = next;
        }
        return;
      }
      Settle();
      return;
    }
  }
}

}  // namespace tributary::dataplane
