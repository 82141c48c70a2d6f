#include "client/cli/job_stats_view.h"

#include <charconv>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/table.h"

namespace tributary::client::cli {
namespace {

// Bytes per second with a decimal unit, as NICs are quoted: "1.25 GB/s", "50.0 MB/s".
std::string FormatRate(double bytes_per_s) {
  if (bytes_per_s <= 0) return "-";
  if (bytes_per_s >= 1e9) return FormatFixed(bytes_per_s / 1e9, 2) + " GB/s";
  if (bytes_per_s >= 1e6) return FormatFixed(bytes_per_s / 1e6, 1) + " MB/s";
  if (bytes_per_s >= 1e3) return FormatFixed(bytes_per_s / 1e3, 1) + " kB/s";
  return FormatFixed(bytes_per_s, 0) + " B/s";
}

// Seconds per byte as nanoseconds per byte ("-" for 0: no data).
std::string FormatPerByte(double seconds_per_byte) {
  return seconds_per_byte > 0 ? FormatFixed(seconds_per_byte * 1e9, 3) + " ns/B" : "-";
}

std::string FormatFraction(double f, bool have) {
  return have ? FormatFixed(100 * f, 1) + " %" : "-";
}

bool ParseUint(absl::string_view s, uint32_t* out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

absl::StatusOr<std::vector<std::pair<uint32_t, uint32_t>>> ParseWhatIf(const std::string& text) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (absl::string_view pair : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> parts = absl::StrSplit(pair, ':');
    uint32_t n = 0, k = 0;
    if (parts.size() != 2 || !ParseUint(parts[0], &n) || !ParseUint(parts[1], &k) || n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--what-if '", pair,
                       "': expected WORKERS:SPARES with WORKERS >= 1, e.g. --what-if 8:2,16:0"));
    }
    out.emplace_back(n, k);
  }
  return out;
}

std::string RenderJobStats(const tributary::v1::JobStats& s) {
  std::string out =
      absl::StrCat("job ", s.job_id(), ": plan v", s.plan_version(), ", ", s.workers(),
                   " workers, ", s.spares(), " spare servers; ", s.reporting_nodes(),
                   " nodes reported in the last ", FormatFixed(s.window_seconds(), 0), " s\n\n");
  const bool iterations = s.iterations() > 0;
  Table summary({"", "OBSERVED", "PREDICTED", "OBSERVED/PREDICTED"});
  for (size_t c : {1, 2, 3}) summary.SetAlign(c, Table::Align::kRight);
  summary.AddRow({"all-reduce time per byte", FormatPerByte(s.observed_seconds_per_byte()),
                  FormatPerByte(s.predicted_seconds_per_byte()),
                  s.observed_to_predicted() > 0 ? FormatFixed(s.observed_to_predicted(), 2) : "-"});
  summary.AddRow(
      {absl::StrCat("all-reduce of ", FormatBytes(s.model_bytes())),
       s.observed_seconds_per_byte() > 0
           ? FormatSeconds(s.observed_seconds_per_byte() * static_cast<double>(s.model_bytes()))
           : "-",
       FormatSeconds(s.predicted_seconds()), ""});
  summary.AddRow({"achieved bandwidth per worker (sent + received)",
                  FormatRate(s.achieved_bytes_per_s()), "", ""});
  summary.AddRow({"data-plane bytes (all nodes)", FormatBytes(s.wire_bytes()), "", ""});
  summary.AddRow({"collectives", std::to_string(s.collectives()), "", ""});
  summary.AddRow({"iterations", std::to_string(s.iterations()), "", ""});
  summary.AddRow({"iteration time mean / max",
                  iterations ? absl::StrCat(FormatSeconds(s.mean_iteration_seconds()), " / ",
                                            FormatSeconds(s.max_iteration_seconds()))
                             : "-",
                  "", ""});
  summary.AddRow({"communication fraction of the iteration",
                  FormatFraction(s.comm_fraction(), iterations), "", ""});
  absl::StrAppend(&out, summary.Render(), "\n");

  Table nodes({"NODE", "ROLE", "SENT", "RECEIVED", "BUSY", "BANDWIDTH", "COLLECTIVES", "ITERATION",
               "COMM", "AGE"});
  for (size_t c : {2, 3, 4, 5, 6, 7, 8, 9}) nodes.SetAlign(c, Table::Align::kRight);
  for (const auto& n : s.nodes()) {
    nodes.AddRow({n.node_id(), n.worker() ? "worker" : "server", FormatBytes(n.wire_bytes_sent()),
                  FormatBytes(n.wire_bytes_received()), FormatSeconds(n.busy_seconds()),
                  FormatRate(n.achieved_bytes_per_s()), std::to_string(n.collectives()),
                  n.iterations() > 0 ? FormatSeconds(n.mean_iteration_seconds()) : "-",
                  FormatFraction(n.comm_fraction(), n.iterations() > 0),
                  FormatSeconds(n.last_report_age_s())});
  }
  if (nodes.num_rows() > 0) {
    absl::StrAppend(&out, nodes.Render(), "\n");
  } else {
    absl::StrAppend(&out, "(no node reported the job in the window)\n\n");
  }

  absl::StrAppend(&out, "what if (DESIGN.md 1.1, every NIC at ", FormatRate(s.nic_bytes_per_s()),
                  "):\n");
  Table what_if({"WORKERS", "SPARES", "TIME PER BYTE", "ALL-REDUCE", "VS RING", ""});
  for (size_t c : {0, 1, 2, 3, 4}) what_if.SetAlign(c, Table::Align::kRight);
  for (const auto& w : s.what_if()) {
    what_if.AddRow({std::to_string(w.workers()), std::to_string(w.spares()),
                    FormatPerByte(w.seconds_per_byte()),
                    w.seconds_per_byte() > 0 ? FormatSeconds(w.allreduce_seconds()) : "-",
                    FormatFixed(w.speedup_vs_ring(), 2) + "x", w.current() ? "<- current" : ""});
  }
  absl::StrAppend(&out, what_if.Render());
  return out;
}

}  // namespace tributary::client::cli
