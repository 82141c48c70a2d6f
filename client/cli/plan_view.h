// How the CLI shows a job's plan: the per-server split and the predicted time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "nlohmann/json.hpp"
#include "tributary/v1/controller.pb.h"

namespace tributary::client::cli {

// Model size the plan is shown for: `override_bytes` if given, else the plan's model_bytes.
uint64_t PlanModelBytes(const v1::Job& job, std::optional<uint64_t> override_bytes);
// Bytes of a `model_bytes` tensor that `server` owns (exact, from its 2^32 weight when set).
uint64_t ServerBytes(const v1::SummationServer& server, uint64_t model_bytes);
// Predicted and ring all-reduce times of `model_bytes`, seconds.
double PredictedSeconds(const v1::JobPlan& plan, uint64_t model_bytes);
double RingSeconds(const v1::JobPlan& plan, uint64_t model_bytes);

// Text: a header line, a table of servers (node, worker|spare, share %, bytes, NIC GB/s, sum
// GB/s, data-plane address), then "predicted X s vs ring all-reduce Y s (speed-up Z x)".
std::string RenderPlan(const v1::Job& job, uint64_t model_bytes);
// The same as JSON.
nlohmann::json PlanToJson(const v1::Job& job, uint64_t model_bytes);

}  // namespace tributary::client::cli
