#include "dataplane/collectives/algorithm_selector.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tributary::dataplane {
namespace {

int FloorLog2(int n) {
  int l = 0;
  while ((2 << l) <= n) ++l;
  return l;
}

// The model as a + b·M.
struct Linear {
  double a = 0;
  double b = 0;
};

Linear Model(Algorithm algorithm, int n, int k, const CostModel& m) {
  if (n <= 1) return {};
  const double nd = n;
  switch (algorithm) {
    case Algorithm::kRing:
      return {2 * (nd - 1) * m.alpha_seconds, 2 * (nd - 1) / nd * m.beta_seconds_per_byte};
    case Algorithm::kHalvingDoubling: {
      const int l = FloorLog2(n);
      const double p = static_cast<double>(1 << l);
      Linear c{2 * l * m.alpha_seconds,
               2 * (p - 1) / p * m.beta_seconds_per_byte + (p - 1) / p * m.gamma_seconds_per_byte};
      if (p != nd) {
        c.a += 2 * m.alpha_seconds;
        c.b += 2 * m.beta_seconds_per_byte + m.gamma_seconds_per_byte;
      }
      return c;
    }
    case Algorithm::kRecursiveDoubling: {
      const int l = FloorLog2(n);
      const double step = m.beta_seconds_per_byte + m.gamma_seconds_per_byte;
      Linear c{l * m.alpha_seconds, l * step};
      if ((1 << l) != n) {
        c.a += 2 * m.alpha_seconds;
        c.b += 2 * m.beta_seconds_per_byte + m.gamma_seconds_per_byte;
      }
      return c;
    }
    case Algorithm::kPushPull: {
      const double kd = std::max(k, 0);
      const double d = nd * nd + kd * nd - 2 * kd;
      return {2 * (nd + kd - 1) * m.alpha_seconds, 2 * nd * (nd - 1) / d * m.beta_seconds_per_byte};
    }
    case Algorithm::kAuto:
    case Algorithm::kParameterServer:
      break;
  }
  return {};
}

// Smallest M >= 0 (in bytes) from which `late` is not slower than `early`, or UINT64_MAX.
uint64_t Crossover(const Linear& early, const Linear& late) {
  if (late.a <= early.a && late.b <= early.b) return 0;
  if (late.b >= early.b) return UINT64_MAX;
  const double m = (late.a - early.a) / (early.b - late.b);
  if (m >= static_cast<double>(std::numeric_limits<uint64_t>::max() / 2)) return UINT64_MAX;
  return static_cast<uint64_t>(std::ceil(m));
}

}  // namespace

std::string_view AlgorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kHalvingDoubling:
      return "halving_doubling";
    case Algorithm::kPushPull:
      return "push_pull";
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kParameterServer:
      return "parameter_server";
    case Algorithm::kRecursiveDoubling:
      return "recursive_doubling";
  }
  return "unknown";
}

bool IsValidAlgorithm(uint32_t raw) { return raw >= 1 && raw <= 5; }

double PredictSeconds(Algorithm algorithm, uint64_t bytes, int n, int extra_servers,
                      const CostModel& model) {
  const Linear c = Model(algorithm, n, extra_servers, model);
  return c.a + c.b * static_cast<double>(bytes);
}

SelectorThresholds ModelThresholds(int n, int extra_servers, const CostModel& model) {
  SelectorThresholds t;
  // `bandwidth` scaled by (1 - kSelectorMargin): the latency-optimal algorithm is picked only
  // where the model predicts it that much faster (see the header).
  auto margin = [](Linear bandwidth) {
    return Linear{bandwidth.a * (1 - kSelectorMargin), bandwidth.b * (1 - kSelectorMargin)};
  };
  const Linear ring = Model(Algorithm::kRing, n, extra_servers, model);
  const Linear hd = Model(Algorithm::kHalvingDoubling, n, extra_servers, model);
  t.halving_doubling_below = n <= 1 ? 0 : Crossover(hd, margin(ring));
  const Linear rd = Model(Algorithm::kRecursiveDoubling, n, extra_servers, model);
  t.recursive_doubling_below =
      n <= 1 ? 0 : std::min(Crossover(rd, margin(hd)), Crossover(rd, margin(ring)));
  t.push_pull_from = UINT64_MAX;
  if (n > 1 && extra_servers > 0) {
    t.push_pull_from =
        Crossover(ring, margin(Model(Algorithm::kPushPull, n, extra_servers, model)));
  }
  return t;
}

absl::StatusOr<MeasuredThresholds> ParseSelectorCalibration(std::string_view json) {
  const nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("selector calibration: not a JSON object");
  }
  MeasuredThresholds out;
  auto size = [](const nlohmann::json& v, const std::string& what) -> absl::StatusOr<uint64_t> {
    if (v.is_null()) return UINT64_MAX;  // never measured to win
    if (!v.is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat("selector calibration: ", what, " must be a byte count or null"));
    }
    return v.get<uint64_t>();
  };
  if (auto it = doc.find("ring_beats_halving_doubling_from"); it != doc.end()) {
    // null (ring never won) becomes UINT64_MAX: halving-doubling at every size.
    absl::StatusOr<uint64_t> v = size(*it, "ring_beats_halving_doubling_from");
    if (!v.ok()) return v.status();
    out.ring_beats_halving_doubling_from = *v;
  }
  if (auto it = doc.find("recursive_doubling_below"); it != doc.end()) {
    // null (recursive doubling never won): 0, never chosen.
    if (!it->is_null()) {
      absl::StatusOr<uint64_t> v = size(*it, "recursive_doubling_below");
      if (!v.ok()) return v.status();
      out.recursive_doubling_below = *v;
    }
  }
  if (auto it = doc.find("push_pull_beats_ring_from"); it != doc.end()) {
    if (!it->is_object()) {
      return absl::InvalidArgumentError(
          "selector calibration: push_pull_beats_ring_from must map \"k=N\" to sizes");
    }
    for (const auto& [key, value] : it->items()) {
      int k = -1;
      if (key.rfind("k=", 0) != 0 || !absl::SimpleAtoi(key.substr(2), &k) || k < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "selector calibration: push_pull_beats_ring_from key '", key, "' is not k=N"));
      }
      absl::StatusOr<uint64_t> v = size(value, "push_pull_beats_ring_from." + key);
      if (!v.ok()) return v.status();
      out.push_pull_beats_ring_from[k] = *v;
    }
  }
  return out;
}

SelectorThresholds MeasuredSelectorThresholds(const MeasuredThresholds& measured, int n,
                                              int extra_servers) {
  SelectorThresholds t;
  t.halving_doubling_below = n <= 2 ? 0 : measured.ring_beats_halving_doubling_from;
  t.recursive_doubling_below = n <= 1 ? 0 : measured.recursive_doubling_below;
  t.push_pull_from = UINT64_MAX;
  for (const auto& [k, from] : measured.push_pull_beats_ring_from) {
    if (k <= extra_servers) t.push_pull_from = from;  // the map is sorted: the largest k wins
  }
  return t;
}

Algorithm Select(uint64_t size_bytes, int n, const SelectorThresholds& thresholds) {
  if (n <= 1) return Algorithm::kRing;
  if (size_bytes >= thresholds.push_pull_from) return Algorithm::kPushPull;
  if (size_bytes < thresholds.recursive_doubling_below) return Algorithm::kRecursiveDoubling;
  if (size_bytes < thresholds.halving_doubling_below) return Algorithm::kHalvingDoubling;
  return Algorithm::kRing;
}

absl::StatusOr<Algorithm> SelectServable(uint64_t size_bytes, int n,
                                         const SelectorThresholds& thresholds,
                                         absl::FunctionRef<absl::Status(Algorithm)> can_serve) {
  const Algorithm order[] = {Select(size_bytes, n, thresholds), Algorithm::kRing,
                             Algorithm::kHalvingDoubling, Algorithm::kPushPull};
  absl::Status last = absl::UnimplementedError("no algorithm");
  for (Algorithm a : order) {
    last = can_serve(a);
    if (last.ok()) return a;
  }
  return last;
}

}  // namespace tributary::dataplane
