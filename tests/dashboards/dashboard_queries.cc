#include "tests/dashboards/dashboard_queries.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "yaml-cpp/yaml.h"

namespace tributary::promtest {
namespace {

namespace fs = std::filesystem;

void CollectPanels(const nlohmann::json& panels, std::vector<nlohmann::json>& out) {
  if (!panels.is_array()) return;
  for (const auto& p : panels) {
    if (p.value("type", "") == "row") {
      if (p.contains("panels")) CollectPanels(p["panels"], out);
      continue;
    }
    out.push_back(p);
  }
}

}  // namespace

absl::StatusOr<std::vector<Dashboard>> LoadDashboards(const std::string& dir) {
  std::vector<Dashboard> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".json") continue;
    std::ifstream f(e.path());
    nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded())
      return absl::InvalidArgumentError(absl::StrCat(e.path().string(), ": not JSON"));
    out.push_back({e.path().filename().string(), std::move(j)});
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": ", ec.message()));
  std::sort(out.begin(), out.end(),
            [](const Dashboard& a, const Dashboard& b) { return a.file < b.file; });
  return out;
}

std::vector<nlohmann::json> Panels(const nlohmann::json& dashboard) {
  std::vector<nlohmann::json> out;
  if (dashboard.contains("panels")) CollectPanels(dashboard["panels"], out);
  return out;
}

std::vector<DashboardQuery> PanelQueries(const Dashboard& d) {
  std::vector<DashboardQuery> out;
  for (const auto& p : Panels(d.json)) {
    if (!p.contains("targets")) continue;
    for (const auto& t : p["targets"]) {
      if (!t.contains("expr")) continue;
      out.push_back(
          {d.file, p.value("title", ""), t.value("refId", ""), t["expr"].get<std::string>()});
    }
  }
  return out;
}

std::vector<DashboardQuery> VariableQueries(const Dashboard& d) {
  std::vector<DashboardQuery> out;
  if (!d.json.contains("templating")) return out;
  static const std::regex kLabelValues(
      R"(^\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$)");
  for (const auto& v : d.json["templating"]["list"]) {
    if (v.value("type", "") != "query") continue;
    std::string q;
    if (v["query"].is_string()) {
      q = v["query"].get<std::string>();
    } else if (v["query"].is_object()) {
      q = v["query"].value("query", "");
    }
    std::smatch m;
    if (!std::regex_match(q, m, kLabelValues)) continue;
    out.push_back({d.file, "$" + v.value("name", ""), "var",
                   absl::StrCat("count by (", m[2].str(), ") (", m[1].str(), ")")});
  }
  return out;
}

std::string SubstituteVariables(const std::string& expr, const std::string& rate_interval,
                                const std::string& all_value) {
  std::string s = expr;
  s = std::regex_replace(s, std::regex(R"(\$__rate_interval|\$\{__rate_interval\})"),
                         rate_interval);
  s = std::regex_replace(s, std::regex(R"(\$__interval|\$\{__interval\})"), rate_interval);
  s = std::regex_replace(s, std::regex(R"(\$__range|\$\{__range\})"), "1m");
  s = std::regex_replace(
      s,
      std::regex(
          R"(\$\{[a-zA-Z_][a-zA-Z0-9_]*(:[a-z]+)?\}|\$[a-zA-Z_][a-zA-Z0-9_]*|\[\[[a-zA-Z_][a-zA-Z0-9_]*\]\])"),
      all_value);
  return s;
}

std::set<std::string> MetricNames(const std::string& expr) {
  std::set<std::string> out;
  static const std::regex kName(R"((^|[^a-zA-Z0-9_:"])(tributary_[a-zA-Z0-9_:]+))");
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), kName);
       it != std::sregex_iterator(); ++it) {
    out.insert((*it)[2].str());
  }
  return out;
}

absl::StatusOr<std::vector<AlertRule>> LoadAlertRules(const std::string& path) {
  std::vector<AlertRule> out;
  try {
    const YAML::Node root = YAML::LoadFile(path);
    for (const auto& g : root["groups"]) {
      for (const auto& r : g["rules"]) {
        if (!r["alert"]) continue;
        AlertRule a;
        a.group = g["name"].as<std::string>();
        a.name = r["alert"].as<std::string>();
        a.expr = r["expr"].as<std::string>();
        if (r["for"]) a.for_duration = r["for"].as<std::string>();
        for (const auto& l : r["labels"]) a.label_names.insert(l.first.as<std::string>());
        for (const auto& l : r["annotations"]) a.annotation_names.insert(l.first.as<std::string>());
        out.push_back(std::move(a));
      }
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  return out;
}

absl::Status WriteTestRules(const std::string& in, const std::string& out,
                            const std::string& fast_alert, const std::string& fast_threshold) {
  try {
    YAML::Node root = YAML::LoadFile(in);
    bool found = false;
    for (auto g : root["groups"]) {
      for (auto r : g["rules"]) {
        if (r["for"]) r["for"] = "0s";
        if (r["alert"] && r["alert"].as<std::string>() == fast_alert) {
          std::string expr = r["expr"].as<std::string>();
          const size_t gt = expr.rfind('>');
          if (gt == std::string::npos)
            return absl::InvalidArgumentError(fast_alert + " has no `>`");
          r["expr"] = absl::StrCat(expr.substr(0, gt), "> ", fast_threshold);
          found = true;
        }
      }
    }
    if (!found) return absl::NotFoundError(absl::StrCat("no alert ", fast_alert, " in ", in));
    std::ofstream f(out);
    f << YAML::Dump(root) << "\n";
    if (!f) return absl::InternalError("cannot write " + out);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(in, ": ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace tributary::promtest
