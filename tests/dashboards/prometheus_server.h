// A real Prometheus server (the `prometheus` binary) on loopback, for tests of the dashboards and
// alert rules against the metrics that Tributary processes really expose.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tributary::promtest {

// The path of `name` on $PATH, or empty.
std::string FindOnPath(const std::string& name);

// A loopback TCP port that was free a moment ago (bind 127.0.0.1:0, read it, close). Prometheus
// cannot listen on port 0 and report the port, so this is the best a test can do.
absl::StatusOr<int> PickFreePort();

// Query parameters of a GET, unencoded (the same type as httplib::Params).
using QueryParams = std::multimap<std::string, std::string>;

struct HttpReply {
  int status = 0;  // the HTTP status code
  std::string body;
};

// One GET of http://127.0.0.1:`port``path`?`params` (cpp-httplib; it URL-encodes the parameters).
// UNAVAILABLE when no reply came within `timeout`; any status code is a reply.
absl::StatusOr<HttpReply> HttpGet(int port, const std::string& path, const QueryParams& params,
                                  std::chrono::milliseconds timeout);

// Owns one prometheus process: Stop (or the destructor) sends SIGTERM and reaps it, so no stray
// server outlives the test. Not thread-safe.
class PrometheusServer {
 public:
  struct Options {
    std::string binary;  // the prometheus executable
    std::string dir;     // a writable folder: config, TSDB and log go there
    // Scrape targets, each with its own target labels (e.g. node="worker-0").
    struct Target {
      std::string address;  // "host:port"
      std::map<std::string, std::string> labels;
    };
    std::vector<Target> targets;
    // Rule files to load (absolute paths).
    std::vector<std::string> rule_files;
    // Scrape and rule-evaluation interval.
    std::chrono::seconds interval{1};
    std::chrono::milliseconds start_timeout{20000};
  };

  // Writes the config, starts prometheus and waits (bounded) until /-/ready answers 200.
  static absl::StatusOr<std::unique_ptr<PrometheusServer>> Start(const Options& options);
  ~PrometheusServer();
  void Stop();

  int port() const { return port_; }
  std::string log() const;

  // GET /api/v1/<path>?<params>; returns the parsed reply (any "status": Prometheus answers
  // 400/422 with a JSON error body).
  absl::StatusOr<nlohmann::json> Api(const std::string& path, const QueryParams& params = {});
  // An instant query; the reply's `data.result` on status "success", else an error naming the
  // query and Prometheus' error.
  absl::StatusOr<nlohmann::json> Query(const std::string& promql);

  // Waits until `up` of every target is 1 (bounded by `timeout`).
  absl::Status WaitForTargetsUp(size_t targets, std::chrono::milliseconds timeout);

 private:
  PrometheusServer() = default;

  Options options_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace tributary::promtest
