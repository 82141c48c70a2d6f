#include "common/metrics/metrics.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace tributary::common::metrics {

prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& registry,
                                                       const std::string& name,
                                                       const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}

prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& registry,
                                                   const std::string& name,
                                                   const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

prometheus::Family<prometheus::Histogram>& HistogramFamily(prometheus::Registry& registry,
                                                           const std::string& name,
                                                           const std::string& help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry);
}

prometheus::MetricFamily MakeFamily(const std::string& name, const std::string& help,
                                    prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

void AddSample(prometheus::MetricFamily& family, double value,
               std::vector<prometheus::ClientMetric::Label> labels) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (family.type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  family.metric.push_back(std::move(m));
}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  std::ifstream in("/proc/self/stat");
  std::string line;
  if (!std::getline(in, line)) return out;
  // Fields after the parenthesised command name (which may contain spaces).
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return out;
  std::istringstream rest(line.substr(close + 2));
  std::vector<std::string> f;
  for (std::string tok; rest >> tok;) f.push_back(tok);
  // f[0] is field 3 (state): field N is f[N - 3].
  if (f.size() < 22) return out;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  const double utime = std::stod(f[14 - 3]), stime = std::stod(f[15 - 3]);
  const double threads = std::stod(f[20 - 3]);
  const double start_ticks = std::stod(f[22 - 3]);
  const double vsize = std::stod(f[23 - 3]);
  const double rss_pages = std::stod(f[24 - 3]);
  double boot_time = 0;
  std::ifstream stat("/proc/stat");
  for (std::string l; std::getline(stat, l);) {
    if (l.rfind("btime ", 0) == 0) boot_time = std::stod(l.substr(6));
  }
  auto add = [&](const char* name, const char* help, MetricType type, double v) {
    out.push_back(MakeFamily(name, help, type));
    AddSample(out.back(), v);
  };
  add("tributary_process_cpu_seconds_total", "User and system CPU time of the process.",
      MetricType::Counter, (utime + stime) / ticks);
  add("tributary_process_resident_memory_bytes", "Resident set size.", MetricType::Gauge,
      rss_pages * page);
  add("tributary_process_virtual_memory_bytes", "Virtual memory size.", MetricType::Gauge, vsize);
  add("tributary_process_threads", "Threads of the process.", MetricType::Gauge, threads);
  add("tributary_process_start_time_seconds", "Process start, seconds since the Unix epoch.",
      MetricType::Gauge, boot_time + start_ticks / ticks);
  return out;
}

const prometheus::ClientMetric* FindSample(
    const std::vector<prometheus::MetricFamily>& families, const std::string& name,
    const std::vector<std::pair<std::string, std::string>>& labels) {
  for (const auto& family : families) {
    if (family.name != name) continue;
    for (const auto& m : family.metric) {
      bool match = true;
      for (const auto& [k, v] : labels) {
        bool found = false;
        for (const auto& l : m.label) found = found || (l.name == k && l.value == v);
        match = match && found;
      }
      if (match) return &m;
    }
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& listen, const std::string& port_file,
    const std::vector<std::weak_ptr<prometheus::Collectable>>& collectables) {
  auto server = std::make_unique<MetricsServer>();
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ", e.what()));
  }
  for (const auto& c : collectables) server->exposer_->RegisterCollectable(c);
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (!ports.empty()) server->port_ = static_cast<uint16_t>(ports.front());
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr) return absl::InternalError(absl::StrCat("cannot write ", port_file));
    std::fprintf(f, "%u\n", server->port_);
    std::fclose(f);
    std::rename(tmp.c_str(), port_file.c_str());
  }
  return server;
}

}  // namespace tributary::common::metrics
