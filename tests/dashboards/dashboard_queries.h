// Reads the Grafana dashboards and Prometheus alert rules of dashboards/ into the PromQL they
// run, so that a test can evaluate each of them against a real Prometheus.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tributary::promtest {

struct Dashboard {
  std::string file;  // base name, e.g. "job.json"
  nlohmann::json json;
};

// One PromQL query of a dashboard: a panel target or a template variable.
struct DashboardQuery {
  std::string dashboard;  // file base name
  std::string panel;      // panel title, or "$name" for a template variable
  std::string ref;        // the target's refId ("var" for a variable)
  std::string expr;       // as written in the dashboard
};

struct AlertRule {
  std::string group;
  std::string name;
  std::string expr;
  std::string for_duration;  // empty when absent
  std::set<std::string> label_names;
  std::set<std::string> annotation_names;
};

// Every *.json of `dir`, parsed, sorted by name.
absl::StatusOr<std::vector<Dashboard>> LoadDashboards(const std::string& dir);

// The panels of a dashboard, rows' nested panels included (rows themselves excluded).
std::vector<nlohmann::json> Panels(const nlohmann::json& dashboard);

// Panel targets' `expr`s, in panel order.
std::vector<DashboardQuery> PanelQueries(const Dashboard& d);

// `label_values(metric{...}, label)` variables, as an instant query that returns one series per
// value: `count by (label) (metric{...})`. Other variable kinds are left out.
std::vector<DashboardQuery> VariableQueries(const Dashboard& d);

// Grafana's substitution, for a test: $__rate_interval and $__interval become `rate_interval`,
// $__range becomes 1m, every other $var / ${var} / [[var]] becomes `all_value` (the dashboards
// use `=~"$var"`, so ".*" selects everything).
std::string SubstituteVariables(const std::string& expr, const std::string& rate_interval = "5s",
                                const std::string& all_value = ".*");

// Names of Tributary metrics (`tributary_...`) an expression reads, as written (a histogram's
// `_bucket` series included).
std::set<std::string> MetricNames(const std::string& expr);

// The alert rules of a Prometheus rule file.
absl::StatusOr<std::vector<AlertRule>> LoadAlertRules(const std::string& path);

// A copy of the rule file at `in` for tests, written to `out`: every `for:` becomes 0s, and the
// threshold after the last `>` of `fast_alert`'s expression becomes `fast_threshold`.
absl::Status WriteTestRules(const std::string& in, const std::string& out,
                            const std::string& fast_alert, const std::string& fast_threshold);

}  // namespace tributary::promtest
