#include "client/cli/plan_view.h"

#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/table.h"

namespace tributary::client::cli {
namespace {

std::string Seconds(double seconds) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.4g", seconds);
  return buf;
}

std::string Speedup(double predicted, double ring) {
  if (predicted <= 0 || ring <= 0) return "-";
  return FormatFixed(ring / predicted, 2);
}

std::string GBps(double bytes_per_s) {
  return bytes_per_s > 0 ? FormatFixed(bytes_per_s / 1e9, 2) : "-";
}

}  // namespace

uint64_t PlanModelBytes(const v1::Job& job, std::optional<uint64_t> override_bytes) {
  if (override_bytes.has_value()) return *override_bytes;
  if (job.plan().model_bytes() > 0) return job.plan().model_bytes();
  return job.spec().model_bytes();
}

uint64_t ServerBytes(const v1::SummationServer& server, uint64_t model_bytes) {
  if (server.weight() > 0) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(model_bytes) * server.weight()) >>
                                 32);
  }
  return static_cast<uint64_t>(server.share() * static_cast<double>(model_bytes));
}

double PredictedSeconds(const v1::JobPlan& plan, uint64_t model_bytes) {
  if (plan.predicted_seconds_per_byte() > 0) {
    return plan.predicted_seconds_per_byte() * static_cast<double>(model_bytes);
  }
  return model_bytes == plan.model_bytes() ? plan.predicted_seconds() : 0;
}

double RingSeconds(const v1::JobPlan& plan, uint64_t model_bytes) {
  if (plan.ring_seconds_per_byte() > 0) {
    return plan.ring_seconds_per_byte() * static_cast<double>(model_bytes);
  }
  return model_bytes == plan.model_bytes() ? plan.ring_seconds() : 0;
}

std::string RenderPlan(const v1::Job& job, uint64_t model_bytes) {
  const v1::JobPlan& plan = job.plan();
  std::vector<std::string> workers;
  for (const auto& worker : plan.workers()) workers.push_back(worker.node_id());
  std::string out =
      "job " + job.job_id() + ": plan version " + std::to_string(plan.version()) + ", workers " +
      JoinOrDash(workers) + " x " + std::to_string(plan.procs_per_node()) + " procs, partition " +
      FormatBytes(plan.partition_bytes()) + ", credit " + FormatBytes(plan.credit_bytes()) +
      ", fusion " +
      (plan.fusion_bytes() == 0
           ? std::string("off")
           : FormatBytes(plan.fusion_bytes()) +
                 (plan.fusion_cycle_us() == 0
                      ? std::string(" (cycle auto)")
                      : " (cycle " + std::to_string(plan.fusion_cycle_us()) + " us)")) +
      "\n";
  if (plan.algorithm() == v1::ALGORITHM_AUTO && plan.selector_nic_bytes_per_s() > 0) {
    out += "algorithm per tensor by size, priced at the job's slowest NIC (" +
           GBps(plan.selector_nic_bytes_per_s()) + " GB/s) on every node\n";
  }
  if (job.spec().elastic() || plan.generation() > 0) {
    out += std::string(job.spec().elastic() ? "elastic, " : "") + "membership generation " +
           std::to_string(plan.generation()) + "\n";
  }
  if (plan.mode() == v1::JOB_MODE_ASYNC) {
    out += "mode async (parameter server), staleness " +
           (plan.staleness() < 0 ? std::string("unbounded") : std::to_string(plan.staleness())) +
           ", delta scale " + absl::StrCat(plan.delta_scale()) + "\n";
  }
  if (!job.message().empty()) out += job.message() + "\n";
  if (job.has_plan_page()) {
    // A dry run's preview of a very large job: its reply holds the first page of the plan.
    out += "preview cut at its first page: " + std::to_string(job.plan_page().count()) + " of " +
           std::to_string(job.plan_page().total()) +
           " workers, intra-node plans and servers shown (a created job is read whole)\n";
  }
  out += "split of a " + FormatBytes(model_bytes) + " model over " +
         std::to_string(plan.servers_size()) + " summation servers:\n";
  Table table({"SERVER", "ROLE", "SHARE", "BYTES", "NIC GB/s", "SUM GB/s", "DATA PLANE"});
  for (size_t c : {2, 3, 4, 5}) table.SetAlign(c, Table::Align::kRight);
  for (const auto& server : plan.servers()) {
    table.AddRow({server.node_id(), server.is_worker() ? "worker" : "spare",
                  FormatFixed(server.share() * 100, 1) + "%",
                  std::to_string(ServerBytes(server, model_bytes)), GBps(server.nic_bytes_per_s()),
                  GBps(server.sum_bytes_per_s()), server.data_plane_address()});
  }
  out += table.Render();
  const double predicted = PredictedSeconds(plan, model_bytes);
  const double ring = RingSeconds(plan, model_bytes);
  out += "predicted " + Seconds(predicted) + " s vs ring all-reduce " + Seconds(ring) +
         " s (speed-up " + Speedup(predicted, ring) + " x)\n";
  if (plan.intra_node_size() > 0) {
    out += "intra-node aggregation per worker node:\n";
    Table intra({"NODE", "GPUS", "STRATEGY", "ROOT", "BCAST GB/s (BOUND)", "ALLREDUCE GB/s (BOUND)",
                 "TREES", "RING GB/s"});
    for (const auto& n : plan.intra_node()) {
      std::string gpus;
      for (int g : n.gpus()) gpus += (gpus.empty() ? "" : ",") + std::to_string(g);
      intra.AddRow({n.node_id(), gpus.empty() ? "-" : gpus,
                    n.error().empty() ? n.strategy() : "error: " + n.error(),
                    n.root_gpu() >= 0 ? std::to_string(n.root_gpu()) : "-",
                    GBps(n.broadcast_achieved_bytes_per_s()) + " (" +
                        GBps(n.broadcast_bound_bytes_per_s()) + ")",
                    GBps(n.allreduce_achieved_bytes_per_s()) + " (" +
                        GBps(n.allreduce_bound_bytes_per_s()) + ")",
                    std::to_string(n.broadcast_trees_size()) + "/" +
                        std::to_string(n.allreduce_trees_size()),
                    n.ring_exists() ? GBps(n.ring_bytes_per_s()) : "none"});
    }
    out += intra.Render();
    for (const auto& n : plan.intra_node()) {
      if (!n.reason().empty()) out += "  " + n.node_id() + ": " + n.reason() + "\n";
    }
  }
  return out;
}

nlohmann::json PlanToJson(const v1::Job& job, uint64_t model_bytes) {
  const v1::JobPlan& plan = job.plan();
  nlohmann::json out;
  out["job_id"] = job.job_id();
  out["plan_version"] = plan.version();
  out["generation"] = plan.generation();
  out["elastic"] = job.spec().elastic();
  out["model_bytes"] = model_bytes;
  out["procs_per_node"] = plan.procs_per_node();
  out["partition_bytes"] = plan.partition_bytes();
  if (job.has_plan_page()) {
    out["plan_cut"] = {{"shown", job.plan_page().count()}, {"total", job.plan_page().total()}};
  }
  out["credit_bytes"] = plan.credit_bytes();
  out["fusion_bytes"] = plan.fusion_bytes();
  out["fusion_cycle_us"] = plan.fusion_cycle_us();
  out["selector_nic_bytes_per_s"] = plan.selector_nic_bytes_per_s();
  out["workers"] = nlohmann::json::array();
  for (const auto& worker : plan.workers()) out["workers"].push_back(worker.node_id());
  out["servers"] = nlohmann::json::array();
  for (const auto& server : plan.servers()) {
    out["servers"].push_back({{"node_id", server.node_id()},
                              {"role", server.is_worker() ? "worker" : "spare"},
                              {"share", server.share()},
                              {"bytes", ServerBytes(server, model_bytes)},
                              {"nic_bytes_per_s", server.nic_bytes_per_s()},
                              {"sum_bytes_per_s", server.sum_bytes_per_s()},
                              {"data_plane_address", server.data_plane_address()}});
  }
  const double predicted = PredictedSeconds(plan, model_bytes);
  const double ring = RingSeconds(plan, model_bytes);
  out["predicted_seconds"] = predicted;
  out["ring_seconds"] = ring;
  out["speedup"] = predicted > 0 && ring > 0 ? ring / predicted : 0.0;
  out["intra_node"] = nlohmann::json::array();
  for (const auto& n : plan.intra_node()) {
    auto trees = [](const auto& list) {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& t : list) {
        nlohmann::json edges = nlohmann::json::array();
        for (const auto& e : t.edges()) edges.push_back({e.parent(), e.child()});
        a.push_back({{"root", t.root()}, {"weight", t.weight_bytes_per_s()}, {"edges", edges}});
      }
      return a;
    };
    out["intra_node"].push_back(
        {{"node_id", n.node_id()},
         {"gpus", std::vector<int>(n.gpus().begin(), n.gpus().end())},
         {"strategy", n.strategy()},
         {"reason", n.reason()},
         {"root_gpu", n.root_gpu()},
         {"broadcast",
          {{"bound_bytes_per_s", n.broadcast_bound_bytes_per_s()},
           {"achieved_bytes_per_s", n.broadcast_achieved_bytes_per_s()},
           {"trees", trees(n.broadcast_trees())}}},
         {"allreduce",
          {{"bound_bytes_per_s", n.allreduce_bound_bytes_per_s()},
           {"achieved_bytes_per_s", n.allreduce_achieved_bytes_per_s()},
           {"trees", trees(n.allreduce_trees())}}},
         {"ring", {{"exists", n.ring_exists()}, {"bytes_per_s", n.ring_bytes_per_s()}}},
         {"error", n.error()}});
  }
  if (!job.message().empty()) out["message"] = job.message();
  return out;
}

}  // namespace tributary::client::cli
