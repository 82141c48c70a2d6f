// Shared Prometheus plumbing: building families on an injected registry, the /proc-based
// process collector, and the HTTP exposer that only `main` owns.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tributary::common::metrics {

prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& registry,
                                                       const std::string& name,
                                                       const std::string& help);
prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& registry,
                                                   const std::string& name,
                                                   const std::string& help);
prometheus::Family<prometheus::Histogram>& HistogramFamily(prometheus::Registry& registry,
                                                           const std::string& name,
                                                           const std::string& help);

// One sample of a scrape-time collector: a counter or gauge family with unlabelled or labelled
// values.
prometheus::MetricFamily MakeFamily(const std::string& name, const std::string& help,
                                    prometheus::MetricType type);
void AddSample(prometheus::MetricFamily& family, double value,
               std::vector<prometheus::ClientMetric::Label> labels = {});

// Reads /proc/self: CPU seconds, resident and virtual memory, threads, start time
// (tributary_process_*). Stateless; safe to collect from any thread.
class ProcessCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

// A collector computing its families at scrape time with `fn` (which must be thread-safe).
class FunctionCollector : public prometheus::Collectable {
 public:
  explicit FunctionCollector(std::function<std::vector<prometheus::MetricFamily>()> fn)
      : fn_(std::move(fn)) {}
  std::vector<prometheus::MetricFamily> Collect() const override { return fn_(); }

 private:
  std::function<std::vector<prometheus::MetricFamily>()> fn_;
};

// The value of a sample in `families` (nullptr when absent): for tests.
const prometheus::ClientMetric* FindSample(
    const std::vector<prometheus::MetricFamily>& families, const std::string& name,
    const std::vector<std::pair<std::string, std::string>>& labels = {});

// Owns the HTTP exposer serving /metrics (for `main` only).
class MetricsServer {
 public:
  // Listens on `listen` (HOST:PORT, port 0 picks one) and serves `collectables`. Writes the bound
  // port to `port_file` when not empty.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& listen, const std::string& port_file,
      const std::vector<std::weak_ptr<prometheus::Collectable>>& collectables);
  uint16_t port() const { return port_; }

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
  uint16_t port_ = 0;
};

}  // namespace tributary::common::metrics
