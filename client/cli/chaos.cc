#include "client/cli/chaos.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tributary::client::cli {

bool ChaosFaultRecovers(std::string_view fault, bool elastic) {
  return elastic || fault != "worker-agent-kill";
}

std::string FormatChaosIteration(const ChaosIteration& it) {
  nlohmann::json j = {{"chaos", 1},
                      {"rank", it.rank},
                      {"world", it.world},
                      {"step", it.step},
                      {"start_ms", it.start_ms},
                      {"end_ms", it.end_ms},
                      {"max_op_ms", it.max_op_ms},
                      {"ok", it.ok},
                      {"error", it.error},
                      {"wrong", it.wrong}};
  return j.dump();
}

absl::StatusOr<ChaosIteration> ParseChaosIteration(std::string_view line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("chaos")) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a chaos record: ", std::string(line.substr(0, 80))));
  }
  try {
    ChaosIteration it;
    it.rank = j.at("rank").get<uint32_t>();
    it.world = j.value("world", 0u);
    it.step = j.at("step").get<uint64_t>();
    it.start_ms = j.at("start_ms").get<int64_t>();
    it.end_ms = j.at("end_ms").get<int64_t>();
    it.max_op_ms = j.at("max_op_ms").get<int64_t>();
    it.ok = j.at("ok").get<bool>();
    it.error = j.at("error").get<std::string>();
    it.wrong = j.at("wrong").get<uint64_t>();
    return it;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad chaos record (", e.what(), "): ", std::string(line)));
  }
}

ChaosVerdict JudgeChaosTrial(const ChaosTrial& trial) {
  ChaosVerdict v;
  v.hangs = trial.stuck_processes;
  v.expected_to_recover = ChaosFaultRecovers(trial.fault, trial.elastic);
  // Per agreed step: which ranks completed it, and when the last of them did.
  struct Step {
    std::set<uint32_t> ok_ranks;
    bool any_failed = false;
    int64_t first_start = INT64_MAX;
    int64_t last_end = 0;
  };
  std::map<std::pair<uint64_t, uint32_t>, Step> steps;  // by (step, world size)
  for (const ChaosIteration& it : trial.iterations) {
    if (it.max_op_ms > 2 * trial.op_deadline_ms) ++v.hangs;
    v.wrong_elements += it.wrong;
    if (!it.ok) {
      if (it.wrong == 0 && trial.stop_ms > 0 && it.end_ms >= trial.stop_ms) {
        ++v.failed_at_stop;
      } else {
        ++v.failed_iterations;
      }
      continue;
    }
    Step& s = steps[{it.step, it.world > 0 ? it.world : trial.world_size}];
    s.ok_ranks.insert(it.rank);
    s.first_start = std::min(s.first_start, it.start_ms);
    s.last_end = std::max(s.last_end, it.end_ms);
  }
  for (const auto& [key, s] : steps) {
    if (s.ok_ranks.size() == key.second) {
      if (!v.recovery_ms && s.first_start >= trial.fault_ms)
        v.recovery_ms = s.last_end - trial.fault_ms;
    } else {
      ++v.split_steps;
    }
  }
  return v;
}

namespace {

// The q-quantile (nearest rank) of sorted values.
int64_t Quantile(const std::vector<int64_t>& sorted, double q) {
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

}  // namespace

std::vector<ChaosSummary> SummarizeChaos(
    const std::vector<std::pair<std::string, ChaosVerdict>>& trials) {
  std::vector<ChaosSummary> out;
  std::map<std::string, std::vector<int64_t>> recoveries;
  auto summary_of = [&](const std::string& fault) -> ChaosSummary& {
    for (ChaosSummary& s : out) {
      if (s.fault == fault) return s;
    }
    ChaosSummary fresh;
    fresh.fault = fault;
    out.push_back(std::move(fresh));
    return out.back();
  };
  for (const auto& [fault, v] : trials) {
    ChaosSummary& s = summary_of(fault);
    ++s.trials;
    s.hangs += v.hangs;
    if (v.wrong_elements > 0) ++s.trials_with_wrong_sums;
    s.failed_iterations += v.failed_iterations;
    s.failed_at_stop += v.failed_at_stop;
    if (v.expected_to_recover) ++s.expected_to_recover;
    if (v.recovery_ms) {
      ++s.recovered;
      recoveries[fault].push_back(*v.recovery_ms);
    }
  }
  for (ChaosSummary& s : out) {
    std::vector<int64_t>& r = recoveries[s.fault];
    if (r.empty()) continue;
    std::sort(r.begin(), r.end());
    s.recovery_p50_ms = Quantile(r, 0.5);
    s.recovery_p99_ms = Quantile(r, 0.99);
    s.recovery_max_ms = r.back();
  }
  return out;
}

}  // namespace tributary::client::cli
