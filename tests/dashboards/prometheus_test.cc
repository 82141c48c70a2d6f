// The dashboards and alert rules of dashboards/ against a real Prometheus: a local cluster
// (controller, 3 worker agents, 1 spare, real processes on loopback) exposes /metrics, the
// `prometheus` binary scrapes it every second and evaluates the alert rules every second, and
// the tests run every panel query, variable query and alert expression through its HTTP API.
//
// The alert rules are loaded from a test copy (WriteTestRules): every `for:` is 0s and
// TributaryOperationStuck fires past 1 s instead of 30 s, so that freezing a summation server
// during a collective with a 4 s deadline (below the 5 s UCX connect timeout, so the
// deadline, not the connection attempt to the frozen server, ends the operation) fires it within
// the test.
//
// Skips when the prometheus (or promtool) binary is not installed (scripts/install_deps.sh
// installs the Debian package).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cluster/local_cluster.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/dashboards/dashboard_queries.h"
#include "tests/dashboards/prometheus_server.h"

namespace tributary::promtest {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

constexpr int kWorkers = 3;
constexpr int kSpares = 1;
constexpr uint32_t kProcsPerNode = 1;
constexpr char kStuckAlert[] = "TributaryOperationStuck";

const std::string kDashboardsDir = TRIBUTARY_DASHBOARDS_DIR;
const std::string kSourceDir = TRIBUTARY_SOURCE_DIR;
const std::string kAlertsFile = kDashboardsDir + "/alerts.yml";

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) return "";
  return tmpl;
}

// Runs `argv` to completion (bounded); returns the exit code and its output.
std::pair<int, std::string> RunToCompletion(const std::vector<std::string>& argv,
                                            const std::string& log) {
  auto pid = client::SpawnProcess(argv, log);
  if (!pid.ok()) return {-1, pid.status().ToString()};
  const int code = client::WaitProcess(*pid, seconds(30));
  return {code, ReadFile(log)};
}

std::vector<Dashboard> MustLoadDashboards() {
  auto d = LoadDashboards(kDashboardsDir);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : std::vector<Dashboard>{};
}

std::vector<AlertRule> MustLoadAlerts() {
  auto a = LoadAlertRules(kAlertsFile);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? *a : std::vector<AlertRule>{};
}

// ---------------------------------------------------------------------------------------------
// Static checks: no Prometheus needed.

// j[key], or null when j is not an object or lacks it (const operator[] must not miss).
const nlohmann::json& At(const nlohmann::json& j, const std::string& key) {
  static const nlohmann::json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

bool UsesDatasourceVariable(const nlohmann::json& ds) {
  return ds.is_object() && ds.value("type", "") == "prometheus" &&
         ds.value("uid", "") == "${datasource}";
}

TEST(DashboardsTest, FollowGrafanaConventions) {
  const auto dashboards = MustLoadDashboards();
  ASSERT_GE(dashboards.size(), 3u) << "cluster overview, job and node dashboards";
  std::set<std::string> uids;
  std::set<std::string> variables_seen;
  const std::regex literal_range(R"(\[[0-9]+[smhdw]\])");
  const std::regex var_use(R"(\$\{?([a-zA-Z_][a-zA-Z0-9_]*)\}?)");
  for (const auto& d : dashboards) {
    SCOPED_TRACE(d.file);
    const std::string uid = d.json.value("uid", "");
    EXPECT_FALSE(uid.empty()) << "a stable uid";
    EXPECT_TRUE(uids.insert(uid).second) << "duplicate uid " << uid;
    EXPECT_FALSE(d.json.value("title", "").empty());
    EXPECT_GE(d.json.value("schemaVersion", 0), 36);
    EXPECT_TRUE(At(d.json, "id").is_null()) << "provisioned dashboards carry no database id";
    std::set<std::string> defined = {"__rate_interval", "__interval", "__range"};
    bool has_datasource_var = false;
    for (const auto& v : At(At(d.json, "templating"), "list")) {
      const std::string name = v.value("name", "");
      defined.insert(name);
      variables_seen.insert(name);
      if (v.value("type", "") == "datasource") {
        has_datasource_var = name == "datasource" && v.value("query", "") == "prometheus";
      } else if (v.value("type", "") == "query") {
        EXPECT_TRUE(UsesDatasourceVariable(At(v, "datasource"))) << "variable " << name;
      }
    }
    EXPECT_TRUE(has_datasource_var) << "a `datasource` variable of type datasource (prometheus)";
    const auto panels = Panels(d.json);
    EXPECT_GE(panels.size(), 5u);
    std::set<int> ids;
    for (const auto& p : panels) {
      const std::string title = p.value("title", "");
      SCOPED_TRACE(title);
      EXPECT_FALSE(title.empty());
      EXPECT_TRUE(ids.insert(p.value("id", 0)).second) << "duplicate panel id";
      EXPECT_FALSE(p.value("description", "").empty()) << "every panel has a description";
      EXPECT_TRUE(UsesDatasourceVariable(At(p, "datasource"))) << "panel datasource";
      EXPECT_FALSE(At(At(p, "fieldConfig"), "defaults").value("unit", "").empty()) << "a unit";
      ASSERT_TRUE(At(p, "targets").is_array() && !At(p, "targets").empty());
      for (const auto& t : At(p, "targets")) {
        EXPECT_TRUE(UsesDatasourceVariable(At(t, "datasource"))) << "target datasource";
        const std::string expr = t.value("expr", "");
        EXPECT_FALSE(expr.empty());
        if (expr.find("rate(") != std::string::npos ||
            expr.find("increase(") != std::string::npos) {
          EXPECT_NE(expr.find("$__rate_interval"), std::string::npos) << expr;
        }
        EXPECT_FALSE(std::regex_search(expr, literal_range)) << "a fixed range in " << expr;
        for (auto it = std::sregex_iterator(expr.begin(), expr.end(), var_use);
             it != std::sregex_iterator(); ++it) {
          EXPECT_TRUE(defined.count((*it)[1].str())) << "undefined variable in " << expr;
        }
      }
    }
  }
  for (const char* v : {"datasource", "job", "instance", "node"}) {
    EXPECT_TRUE(variables_seen.count(v)) << "no dashboard has a `" << v << "` variable";
  }
}

TEST(DashboardsTest, ProvisioningFilesDeclareProviderAndDatasource) {
  const std::string provider = ReadFile(kDashboardsDir + "/provisioning/dashboards/tributary.yaml");
  EXPECT_NE(provider.find("type: file"), std::string::npos);
  EXPECT_NE(provider.find("path:"), std::string::npos);
  const std::string ds = ReadFile(kDashboardsDir + "/provisioning/datasources/prometheus.yaml");
  EXPECT_NE(ds.find("type: prometheus"), std::string::npos);
}

TEST(AlertRulesTest, EveryAlertHasForSeverityAndAnnotations) {
  const auto rules = MustLoadAlerts();
  std::set<std::string> names;
  for (const auto& r : rules) {
    SCOPED_TRACE(r.name);
    names.insert(r.name);
    EXPECT_FALSE(r.for_duration.empty()) << "a `for:`";
    EXPECT_TRUE(r.label_names.count("severity"));
    EXPECT_TRUE(r.annotation_names.count("summary"));
    EXPECT_TRUE(r.annotation_names.count("description"));
  }
  for (const char* a : {"TributaryTargetDown", "TributaryNodeDead", kStuckAlert,
                        "TributaryObservedSlowerThanPredicted", "TributaryOperationErrors"}) {
    EXPECT_TRUE(names.count(a)) << "missing alert " << a;
  }
}

TEST(AlertRulesTest, PromtoolAcceptsTheRulesAndTheirTestCopy) {
  const std::string promtool = FindOnPath("promtool");
  if (promtool.empty()) GTEST_SKIP() << "promtool not installed (apt-get install prometheus)";
  const std::string dir = MakeTempDir("tributary-promtool");
  ASSERT_FALSE(dir.empty());
  auto [code, out] = RunToCompletion({promtool, "check", "rules", kAlertsFile}, dir + "/check.log");
  EXPECT_EQ(code, 0) << out;
  ASSERT_TRUE(WriteTestRules(kAlertsFile, dir + "/alerts_test.yml", kStuckAlert, "1").ok());
  auto [code2, out2] =
      RunToCompletion({promtool, "check", "rules", dir + "/alerts_test.yml"}, dir + "/copy.log");
  EXPECT_EQ(code2, 0) << out2;
  fs::remove_all(dir);
}

// Metric names used by dashboards and alerts exist in the contract and in the code.
TEST(MetricNamesTest, DashboardAndAlertMetricsExistInContractAndCode) {
  std::map<std::string, std::set<std::string>> used;  // metric -> where
  for (const auto& d : MustLoadDashboards()) {
    for (const auto& q : PanelQueries(d)) {
      for (const auto& n : MetricNames(q.expr)) used[n].insert(d.file + ": " + q.panel);
    }
    for (const auto& q : VariableQueries(d)) {
      for (const auto& n : MetricNames(q.expr)) used[n].insert(d.file + ": " + q.panel);
    }
  }
  for (const auto& r : MustLoadAlerts()) {
    for (const auto& n : MetricNames(r.expr)) used[n].insert("alerts.yml: " + r.name);
  }
  ASSERT_GE(used.size(), 20u);

  const std::string contract = ReadFile(kDashboardsDir + "/METRICS.md");
  ASSERT_FALSE(contract.empty()) << "dashboards/METRICS.md";
  std::string code;
  for (const char* dir : {"common", "agent", "controller", "dataplane"}) {
    for (const auto& e : fs::recursive_directory_iterator(kSourceDir + "/" + dir)) {
      const auto ext = e.path().extension();
      if (ext == ".cc" || ext == ".h") code += ReadFile(e.path().string());
    }
  }
  ASSERT_FALSE(code.empty());

  std::vector<std::string> missing;
  for (const auto& [name, where] : used) {
    std::string base = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s = suffix;
      if (contract.find("`" + name + "`") == std::string::npos && base.size() > s.size() &&
          base.compare(base.size() - s.size(), s.size(), s) == 0) {
        base = base.substr(0, base.size() - s.size());
      }
    }
    const bool in_contract = contract.find("`" + base + "`") != std::string::npos;
    const bool in_code = code.find("\"" + base + "\"") != std::string::npos;
    if (!in_contract || !in_code) {
      missing.push_back(absl::StrCat(name, in_contract ? "" : " (not in METRICS.md)",
                                     in_code ? "" : " (not in the C++ sources)", " used by ",
                                     absl::StrJoin(where, ", ")));
    }
  }
  EXPECT_TRUE(missing.empty()) << absl::StrJoin(missing, "\n");
}

// ---------------------------------------------------------------------------------------------
// Against a real Prometheus scraping a local cluster.

class PrometheusClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string binary = FindOnPath("prometheus");
    if (binary.empty()) {
      skip_reason_ = "prometheus not installed (apt-get install prometheus)";
      return;
    }
    dir_ = MakeTempDir("tributary-prometheus");
    if (dir_.empty()) {
      setup_error_ = "mkdtemp failed";
      return;
    }
    client::LocalClusterOptions o;
    o.bin_dir = TRIBUTARY_BIN_DIR;
    o.workers = kWorkers;
    o.spares = kSpares;
    o.sum_gbps = 4;
    o.metrics = true;
    o.heartbeat_timeout = seconds(30);  // a frozen node stays alive: the job must not re-plan
    auto c = client::LocalCluster::Start(o);
    if (!c.ok()) {
      setup_error_ = c.status().ToString();
      return;
    }
    cluster_ = c->release();

    if (auto s = WriteTestRules(kAlertsFile, dir_ + "/alerts_test.yml", kStuckAlert, "1");
        !s.ok()) {
      setup_error_ = s.ToString();
      return;
    }
    PrometheusServer::Options po;
    po.binary = binary;
    po.dir = dir_;
    po.rule_files = {dir_ + "/alerts_test.yml"};
    po.targets.push_back({cluster_->controller_metrics_address(), {}});
    for (int i = 0; i < cluster_->num_nodes(); ++i) {
      po.targets.push_back({cluster_->metrics_address(i), {{"node", cluster_->node_id(i)}}});
    }
    auto p = PrometheusServer::Start(po);
    if (!p.ok()) {
      setup_error_ = p.status().ToString();
      return;
    }
    prometheus_ = p->release();
    if (auto s = prometheus_->WaitForTargetsUp(po.targets.size(), seconds(20)); !s.ok()) {
      setup_error_ = s.ToString() + "\nprometheus log:\n" + prometheus_->log();
    }
  }

  static void TearDownTestSuite() {
    delete prometheus_;  // SIGTERM and reap: no stray prometheus
    prometheus_ = nullptr;
    delete cluster_;
    cluster_ = nullptr;
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  void SetUp() override {
    if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_;
    ASSERT_TRUE(setup_error_.empty()) << setup_error_;
  }

  void TearDown() override {
    for (const auto& id : jobs_) {
      tributary::v1::DeleteJobRequest req;
      req.set_job_id(id);
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
      tributary::v1::DeleteJobResponse resp;
      EXPECT_TRUE(cluster_->controller().DeleteJob(&ctx, req, &resp).ok());
    }
  }

  void CreateJob(const std::string& id, uint32_t timeout_ms) {
    tributary::v1::CreateJobRequest req;
    req.set_job_id(id);
    for (const auto& w : cluster_->worker_node_ids()) req.mutable_spec()->add_worker_nodes(w);
    req.mutable_spec()->set_procs_per_node(kProcsPerNode);
    req.mutable_spec()->set_partition_bytes(64 << 10);
    req.mutable_spec()->set_credit_bytes(256 << 10);
    req.mutable_spec()->set_op_timeout_ms(timeout_ms);
    req.mutable_spec()->set_algorithm(tributary::v1::ALGORITHM_PUSH_PULL);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    tributary::v1::Job job;
    grpc::Status s = cluster_->controller().CreateJob(&ctx, req, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
    jobs_.push_back(id);
    ASSERT_EQ(job.plan().servers_size(), kWorkers + kSpares) << "the spare owns a share";
  }

  // Starts one test worker per (node, local rank); returns (pid, log path) of each.
  std::vector<std::pair<pid_t, std::string>> SpawnWorkers(const std::string& job,
                                                          const std::vector<std::string>& args) {
    std::vector<std::pair<pid_t, std::string>> procs;
    for (int node = 0; node < kWorkers; ++node) {
      for (uint32_t r = 0; r < kProcsPerNode; ++r) {
        std::vector<std::string> argv = {std::string(TRIBUTARY_BIN_DIR) + "/tributary_test_worker",
                                         "--agent",
                                         cluster_->agent_address(node),
                                         "--job",
                                         job,
                                         "--local-rank",
                                         std::to_string(r),
                                         "--local-size",
                                         std::to_string(kProcsPerNode)};
        argv.insert(argv.end(), args.begin(), args.end());
        const std::string log = absl::StrCat(dir_, "/", job, "-", node, "-", r, ".log");
        auto pid = client::SpawnProcess(argv, log);
        EXPECT_TRUE(pid.ok()) << pid.status();
        if (pid.ok()) procs.emplace_back(*pid, log);
      }
    }
    return procs;
  }

  static void ExpectWorkersPassed(const std::vector<std::pair<pid_t, std::string>>& procs) {
    for (const auto& [pid, log] : procs) {
      EXPECT_EQ(client::WaitProcess(pid, seconds(60)), 0) << log << ":\n" << ReadFile(log);
    }
  }

  // Polls `promql` until it returns a non-empty result (bounded).
  static bool WaitForData(const std::string& promql, milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      auto r = prometheus_->Query(promql);
      if (r.ok() && !r->empty()) return true;
      std::this_thread::sleep_for(milliseconds(200));  // polling scrapes
    }
    return false;
  }

  static inline std::string skip_reason_;
  static inline std::string setup_error_;
  static inline std::string dir_;
  static inline client::LocalCluster* cluster_ = nullptr;
  static inline PrometheusServer* prometheus_ = nullptr;
  std::vector<std::string> jobs_;
};

TEST_F(PrometheusClusterTest, EveryDashboardQueryAndAlertExpressionEvaluates) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("dash", 30000));
  ExpectWorkersPassed(SpawnWorkers("dash", {"--scenario", "iterations", "--iterations", "20"}));
  // The traffic and the controller's observations of it are scraped.
  ASSERT_TRUE(
      WaitForData(R"(tributary_dataplane_summed_bytes_total{job="dash"} > 0)", seconds(15)));
  ASSERT_TRUE(
      WaitForData(R"(tributary_controller_observed_bytes_total{job="dash"} > 0)", seconds(15)));
  // GetJobStats' gauges: present while the job has reports in the controller's window.
  ASSERT_TRUE(WaitForData(R"(tributary_controller_job_comm_fraction{job="dash"})", seconds(15)));
  ASSERT_TRUE(WaitForData(R"(tributary_controller_job_achieved_bytes_per_second{job="dash"} > 0)",
                          seconds(15)));
  // Per-job series appear with the plan, just before the traffic: rate() needs two samples of
  // them in its window.
  ASSERT_TRUE(
      WaitForData(R"(rate(tributary_dataplane_pushed_bytes_total{job="dash"}[5s]))", seconds(15)));
  ASSERT_TRUE(WaitForData(R"(rate(tributary_controller_observed_bytes_total{job="dash"}[5s]))",
                          seconds(15)));
  if (auto r = prometheus_->Query(R"(count by (__name__) ({job="dash"}))"); r.ok()) {
    for (const auto& s : *r) {
      std::printf("series of job dash: %s %s\n", s["metric"].value("__name__", "").c_str(),
                  s["value"][1].get<std::string>().c_str());
    }
  }

  struct Row {
    std::string dashboard, panel, ref, expr;
    std::string series;  // count, or the error
    bool failed = false;
  };
  std::vector<Row> rows;
  std::vector<std::string> failures;
  for (const auto& d : MustLoadDashboards()) {
    auto queries = PanelQueries(d);
    const auto vars = VariableQueries(d);
    queries.insert(queries.end(), vars.begin(), vars.end());
    for (const auto& q : queries) {
      const std::string expr = SubstituteVariables(q.expr);
      Row row{q.dashboard, q.panel, q.ref, expr, "", false};
      auto r = prometheus_->Query(expr);
      if (!r.ok()) {
        row.series = "ERROR";
        row.failed = true;
        failures.push_back(
            absl::StrCat(q.dashboard, " / ", q.panel, " ", q.ref, ": ", r.status().message()));
      } else {
        row.series = std::to_string(r->size());
        if (r->empty()) {
          row.failed = true;
          failures.push_back(
              absl::StrCat(q.dashboard, " / ", q.panel, " ", q.ref, ": no data for ", expr));
        }
      }
      rows.push_back(row);
    }
  }
  for (const auto& a : MustLoadAlerts()) {
    Row row{"alerts.yml", a.name, "-", a.expr, "", false};
    auto r = prometheus_->Query(a.expr);
    if (!r.ok()) {
      row.series = "ERROR";
      row.failed = true;
      failures.push_back(absl::StrCat("alert ", a.name, ": ", r.status().message()));
    } else {
      row.series = std::to_string(r->size());  // may well be 0: nothing to alert about
    }
    rows.push_back(row);
  }
  std::printf("\n%-22s | %-38s | %-3s | %-6s | %s\n", "dashboard", "panel", "ref", "series",
              "query");
  std::printf("%s\n", std::string(140, '-').c_str());
  for (const auto& r : rows) {
    std::string one_line = r.expr;
    std::replace(one_line.begin(), one_line.end(), '\n', ' ');
    std::printf("%-22s | %-38.38s | %-3s | %-6s | %s%s\n", r.dashboard.c_str(), r.panel.c_str(),
                r.ref.c_str(), r.series.c_str(), one_line.c_str(), r.failed ? "   <-- FAIL" : "");
  }
  std::fflush(stdout);
  EXPECT_GE(rows.size(), 50u);
  EXPECT_TRUE(failures.empty()) << failures.size() << " queries without data or failing:\n"
                                << absl::StrJoin(failures, "\n");

  // The loaded rule copy is healthy.
  auto rules = prometheus_->Api("rules", {{"type", "alert"}});
  ASSERT_TRUE(rules.ok()) << rules.status();
  size_t loaded = 0;
  for (const auto& g : (*rules)["data"]["groups"]) {
    for (const auto& r : g["rules"]) {
      ++loaded;
      EXPECT_EQ(r.value("health", ""), "ok") << r.dump();
    }
  }
  EXPECT_EQ(loaded, MustLoadAlerts().size());
}

// Freezing a summation server during a collective fires the stuck-operation alert (and, once the
// operation fails with DEADLINE_EXCEEDED, the operation-errors alert).
TEST_F(PrometheusClusterTest, FrozenSummationServerFiresStuckOperationAlert) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("stuck", /*timeout_ms=*/4000));
  const int spare = kWorkers;  // the spare: a summation server of the job only
  cluster_->FreezeNode(spare);
  const auto procs = SpawnWorkers("stuck", {"--scenario", "timeout"});
  // The spare stays frozen until every worker saw its deadline; meanwhile, collect the alerts.
  std::set<std::string> fired;
  nlohmann::json stuck;
  std::map<pid_t, int> exit_codes;
  const auto deadline = Clock::now() + seconds(30);
  while (Clock::now() < deadline && exit_codes.size() < procs.size()) {
    auto a = prometheus_->Api("alerts");
    if (a.ok()) {
      for (const auto& alert : (*a)["data"]["alerts"]) {
        if (alert.value("state", "") != "firing") continue;
        const std::string name = alert["labels"].value("alertname", "");
        if (name == kStuckAlert && alert["labels"].value("job", "") == "stuck") stuck = alert;
        fired.insert(name);
      }
    }
    for (const auto& [pid, log] : procs) {
      int status = 0;
      if (!exit_codes.count(pid) && waitpid(pid, &status, WNOHANG) == pid) {
        exit_codes[pid] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    std::this_thread::sleep_for(milliseconds(250));  // polling rule evaluations and workers
  }
  cluster_->ThawNode(spare);
  for (const auto& [pid, log] : procs) {
    const int code = exit_codes.count(pid) ? exit_codes[pid] : client::WaitProcess(pid, seconds(1));
    EXPECT_EQ(code, 0) << "each worker sees DEADLINE_EXCEEDED; " << log << ":\n" << ReadFile(log);
  }
  EXPECT_TRUE(fired.count(kStuckAlert)) << "fired: " << absl::StrJoin(fired, ", ");
  EXPECT_TRUE(fired.count("TributaryTargetDown")) << "the frozen agent stops answering scrapes";
  if (!stuck.is_null()) {
    std::printf("firing: %s\n", stuck.dump().c_str());
    EXPECT_FALSE(stuck["annotations"].value("summary", "").empty());
    EXPECT_EQ(stuck["labels"].value("severity", ""), "critical");
  }
  // The failed operations raise the errors alert.
  EXPECT_TRUE(WaitForData(
      R"(ALERTS{alertname="TributaryOperationErrors",alertstate="firing",reason="DEADLINE_EXCEEDED"})",
      seconds(15)));
}

}  // namespace
}  // namespace tributary::promtest
