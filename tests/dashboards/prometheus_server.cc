#include "tests/dashboards/prometheus_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cluster/local_cluster.h"
#include "common/status_macros.h"
#include "httplib.h"

namespace tributary::promtest {
namespace {

namespace fs = std::filesystem;

absl::Status Errno(const std::string& call) {
  return absl::InternalError(absl::StrCat(call, ": ", std::strerror(errno)));
}

// Closes a socket on every path out.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

sockaddr_in Loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

}  // namespace

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (const auto dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    if (dir.empty()) continue;
    const fs::path p = fs::path(std::string(dir)) / name;
    if (access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

absl::StatusOr<int> PickFreePort() {
  Fd s{socket(AF_INET, SOCK_STREAM, 0)};
  if (s.fd < 0) return Errno("socket");
  sockaddr_in a = Loopback(0);
  if (bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return Errno("bind");
  socklen_t len = sizeof(a);
  if (getsockname(s.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return Errno("getsockname");
  return ntohs(a.sin_port);
}

absl::StatusOr<HttpReply> HttpGet(int port, const std::string& path, const QueryParams& params,
                                  std::chrono::milliseconds timeout) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(timeout);
  client.set_read_timeout(timeout);
  client.set_write_timeout(timeout);
  const httplib::Result result = client.Get(path, params, httplib::Headers{});
  if (!result) {
    return absl::UnavailableError(
        absl::StrCat("GET 127.0.0.1:", port, path, ": ", httplib::to_string(result.error())));
  }
  return HttpReply{result->status, result->body};
}

absl::StatusOr<std::unique_ptr<PrometheusServer>> PrometheusServer::Start(const Options& o) {
  std::unique_ptr<PrometheusServer> p(new PrometheusServer());
  p->options_ = o;
  const std::string interval = absl::StrCat(o.interval.count(), "s");
  std::ostringstream cfg;
  cfg << "global:\n"
      << "  scrape_interval: " << interval << "\n"
      << "  scrape_timeout: " << o.interval.count() * 900 << "ms\n"
      << "  evaluation_interval: " << interval << "\n"
      << "rule_files:\n";
  for (const auto& f : o.rule_files) cfg << "  - '" << f << "'\n";
  // honor_labels: Tributary's per-job series carry a `job` label (the Tributary job id) that
  // must not be renamed to exported_job; see dashboards/README.md.
  cfg << "scrape_configs:\n"
      << "  - job_name: tributary\n"
      << "    honor_labels: true\n"
      << "    static_configs:\n";
  for (const auto& t : o.targets) {
    cfg << "      - targets: ['" << t.address << "']\n";
    if (t.labels.empty()) continue;
    cfg << "        labels:\n";
    for (const auto& [k, v] : t.labels) cfg << "          " << k << ": '" << v << "'\n";
  }
  const std::string config_path = o.dir + "/prometheus.yml";
  {
    std::ofstream f(config_path);
    f << cfg.str();
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", config_path));
  }
  for (int attempt = 0; attempt < 3; ++attempt) {  // the picked port may be taken meanwhile
    auto port = PickFreePort();
    if (!port.ok()) return port.status();
    p->port_ = *port;
    auto pid = client::SpawnProcess(
        {o.binary, "--config.file=" + config_path, "--storage.tsdb.path=" + o.dir + "/tsdb",
         absl::StrCat("--web.listen-address=127.0.0.1:", p->port_), "--log.level=warn"},
        o.dir + "/prometheus.log");
    if (!pid.ok()) return pid.status();
    p->pid_ = *pid;
    const auto deadline = std::chrono::steady_clock::now() + o.start_timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      auto ready = HttpGet(p->port_, "/-/ready", {}, std::chrono::milliseconds(500));
      if (ready.ok() && ready->status == 200) return p;
      int status = 0;
      if (waitpid(p->pid_, &status, WNOHANG) == p->pid_) {  // exited: config error or port taken
        p->pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polling readiness
    }
    p->Stop();
  }
  return absl::UnavailableError(absl::StrCat("prometheus did not become ready; log:\n", p->log()));
}

PrometheusServer::~PrometheusServer() { Stop(); }

void PrometheusServer::Stop() {
  if (pid_ < 0) return;
  kill(pid_, SIGTERM);
  client::WaitProcess(pid_, std::chrono::seconds(10));
  pid_ = -1;
}

std::string PrometheusServer::log() const {
  std::ifstream f(options_.dir + "/prometheus.log");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

absl::StatusOr<nlohmann::json> PrometheusServer::Api(const std::string& path,
                                                     const QueryParams& params) {
  ASSIGN_OR_RETURN(HttpReply reply,
                   HttpGet(port_, "/api/v1/" + path, params, std::chrono::seconds(10)));
  nlohmann::json j = nlohmann::json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    if (reply.status < 200 || reply.status > 299) {
      return absl::UnknownError(
          absl::StrCat("HTTP ", reply.status, " for /api/v1/", path, ": ", reply.body));
    }
    return absl::InternalError("unparsable reply: " + reply.body.substr(0, 200));
  }
  return j;
}

absl::StatusOr<nlohmann::json> PrometheusServer::Query(const std::string& promql) {
  auto j = Api("query", {{"query", promql}});
  if (!j.ok()) return j.status();
  if (j->value("status", "") != "success") {
    return absl::InvalidArgumentError(absl::StrCat(
        "query `", promql, "`: ", j->value("errorType", ""), ": ", j->value("error", "")));
  }
  return (*j)["data"]["result"];
}

absl::Status PrometheusServer::WaitForTargetsUp(size_t targets, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last = "no answer";
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = Query("up");
    if (r.ok()) {
      size_t up = 0;
      for (const auto& s : *r) up += s["value"][1] == "1";
      if (up == targets && r->size() == targets) return absl::OkStatus();
      last = r->dump();
    } else {
      last = r.status().ToString();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // polling scrapes
  }
  return absl::DeadlineExceededError(
      absl::StrCat("not all ", targets, " targets up; last `up`: ", last));
}

}  // namespace tributary::promtest
