#include "dataplane/collectives/dataplane_metrics.h"

#include <map>
#include <utility>

#include "common/metrics/metrics.h"
#include "dataplane/collectives/data_plane_node.h"

namespace tributary::dataplane {
namespace {

using common::metrics::CounterFamily;
using common::metrics::GaugeFamily;
using common::metrics::HistogramFamily;

constexpr Algorithm kAlgorithms[] = {Algorithm::kRing, Algorithm::kHalvingDoubling,
                                     Algorithm::kRecursiveDoubling, Algorithm::kPushPull,
                                     Algorithm::kParameterServer};
constexpr const char* kReasons[] = {"DEADLINE_EXCEEDED", "UNAVAILABLE", "INVALID_ARGUMENT",
                                    "CANCELLED",         "NOT_FOUND",   "FAILED_PRECONDITION",
                                    "ALREADY_EXISTS",    "INTERNAL",    "UNKNOWN"};
constexpr const char* kSizeClasses[] = {"<64KiB", "<1MiB", "<16MiB", ">=16MiB"};

std::string AlgName(Algorithm a) { return std::string(AlgorithmName(a)); }

std::string Reason(const absl::Status& s) { return absl::StatusCodeToString(s.code()); }

prometheus::Histogram::BucketBoundaries DurationBuckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
}

}  // namespace

namespace {

// A series is a (family, label set). Several JobSeries can hold the same one: a job removed and
// planned again while a collective of its first life still holds the old view, or nodes that
// share one registry (tests, benches) and plan the same job. So each is counted, process-wide,
// and leaves its family when its last holder ends.
struct SeriesHolders {
  using Key = std::pair<const void*, prometheus::Labels>;
  std::mutex mu;
  std::map<Key, int> count;
};

SeriesHolders& Holders() {
  static auto* holders = new SeriesHolders();  // Never destroyed: series may end at exit.
  return *holders;
}

}  // namespace

// The series of one life of a job on one node (ForJob to RemoveJob), alive while the node's
// `live_` entry or a JobPeerCounters holds it; its end removes the series no one else holds.
// Its families live in the registry, which outlives every view of the node.
class DataPlaneMetrics::JobSeries {
 public:
  JobSeries() = default;
  JobSeries(const JobSeries&) = delete;
  JobSeries& operator=(const JobSeries&) = delete;

  ~JobSeries() {
    SeriesHolders& holders = Holders();
    std::lock_guard lock(holders.mu);
    for (auto& [key, remove] : held_) {
      auto it = holders.count.find(key);
      if (it != holders.count.end() && --it->second > 0) continue;
      if (it != holders.count.end()) holders.count.erase(it);
      remove();
    }
  }

  // The series `labels` of `family`, held by this life of the job. Calls are serialised by the
  // owner's live_mu_.
  template <typename T>
  T& Add(prometheus::Family<T>& family, const prometheus::Labels& labels) {
    SeriesHolders& holders = Holders();
    std::lock_guard lock(holders.mu);
    T& metric = family.Add(labels);
    SeriesHolders::Key key{&family, labels};
    if (!held_.contains(key)) {
      ++holders.count[key];
      held_.emplace(std::move(key), [&family, &metric] { family.Remove(&metric); });
    }
    return metric;
  }

 private:
  std::map<SeriesHolders::Key, std::function<void()>> held_;
};

const char* SizeClass(uint64_t bytes) {
  if (bytes < (uint64_t{64} << 10)) return kSizeClasses[0];
  if (bytes < (uint64_t{1} << 20)) return kSizeClasses[1];
  if (bytes < (uint64_t{16} << 20)) return kSizeClasses[2];
  return kSizeClasses[3];
}

DataPlaneMetrics::DataPlaneMetrics(prometheus::Registry& registry)
    : pushed_(CounterFamily(registry, "tributary_dataplane_pushed_bytes_total",
                            "Worker role: chunk bytes pushed to a summation server.")),
      pulled_(CounterFamily(registry, "tributary_dataplane_pulled_bytes_total",
                            "Worker role: sum bytes received from a summation server.")),
      summed_(CounterFamily(registry, "tributary_dataplane_summed_bytes_total",
                            "Server role: contribution bytes received from a worker and added.")),
      served_(CounterFamily(registry, "tributary_dataplane_served_bytes_total",
                            "Server role: sum bytes sent back to a worker.")),
      started_(CounterFamily(registry, "tributary_dataplane_operations_started_total",
                             "Node-level collective operations started.")),
      completed_(CounterFamily(registry, "tributary_dataplane_operations_completed_total",
                               "Node-level collective operations finished OK.")),
      failed_(CounterFamily(registry, "tributary_dataplane_operations_failed_total",
                            "Node-level collective operations that failed, by status code.")),
      duration_(HistogramFamily(registry, "tributary_dataplane_operation_duration_seconds",
                                "Start to completion of successful operations.")),
      recovery_(HistogramFamily(registry, "tributary_dataplane_recovery_seconds",
                                "Per job on this node: from the first collective that failed to "
                                "the next one that succeeded (faults and their recovery).")
                    .Add({}, prometheus::Histogram::BucketBoundaries{0.05, 0.1, 0.25, 0.5, 1, 2, 5,
                                                                     10, 30, 60, 120, 300})),
      pending_(GaugeFamily(registry, "tributary_dataplane_pending_operations",
                           "Operations started and not finished.")),
      oldest_(GaugeFamily(registry, "tributary_dataplane_oldest_pending_operation_age_seconds",
                          "Age of the oldest pending operation; 0 when none.")) {
  for (Algorithm a : kAlgorithms) {
    const int i = static_cast<int>(a);
    started_by_alg_[i] = &started_.Add({{"algorithm", AlgName(a)}});
    completed_by_alg_[i] = &completed_.Add({{"algorithm", AlgName(a)}});
    for (const char* r : kReasons) failed_.Add({{"algorithm", AlgName(a)}, {"reason", r}});
    for (const char* c : kSizeClasses) {
      duration_.Add({{"algorithm", AlgName(a)}, {"size_class", c}}, DurationBuckets());
    }
  }
}

DataPlaneMetrics::~DataPlaneMetrics() {
  std::map<std::string, std::shared_ptr<JobSeries>> live;  // ended after the lock
  std::lock_guard lock(live_mu_);
  live.swap(live_);
}

std::shared_ptr<const JobPeerCounters> DataPlaneMetrics::ForJob(const JobView& view) {
  auto c = std::make_shared<JobPeerCounters>();
  auto peer = [](const std::vector<std::string>& ids, const std::vector<std::string>& addrs,
                 size_t i) { return i < ids.size() && !ids[i].empty() ? ids[i] : addrs[i]; };
  std::lock_guard lock(live_mu_);
  std::shared_ptr<JobSeries>& series = live_[view.job_id];
  if (series == nullptr) series = std::make_shared<JobSeries>();
  for (size_t s = 0; s < view.server_addresses.size(); ++s) {
    const prometheus::Labels l{{"job", view.job_id},
                               {"peer_node", peer(view.server_node_ids, view.server_addresses, s)}};
    c->pushed.push_back(&series->Add(pushed_, l));
    c->pulled.push_back(&series->Add(pulled_, l));
  }
  for (size_t w = 0; w < view.worker_addresses.size(); ++w) {
    const prometheus::Labels l{{"job", view.job_id},
                               {"peer_node", peer(view.worker_node_ids, view.worker_addresses, w)}};
    c->summed.push_back(&series->Add(summed_, l));
    c->served.push_back(&series->Add(served_, l));
  }
  c->series = series;
  return c;
}

void DataPlaneMetrics::RemoveJob(const std::string& job_id) {
  std::shared_ptr<JobSeries> ended;  // released after the lock (declared before it)
  std::lock_guard lock(live_mu_);
  auto it = live_.find(job_id);
  if (it == live_.end()) return;
  ended = std::move(it->second);
  live_.erase(it);
  // The gauges go now, whoever still holds the counters.
  for (prometheus::Family<prometheus::Gauge>* family : {&pending_, &oldest_}) {
    const prometheus::Labels l{{"job", job_id}};
    if (family->Has(l)) family->Remove(&family->Add(l));
  }
}

void DataPlaneMetrics::OperationStarted(Algorithm algorithm) {
  started_by_alg_[static_cast<int>(algorithm)]->Increment();
}

void DataPlaneMetrics::OperationFinished(Algorithm algorithm, uint64_t bytes, double seconds,
                                         const absl::Status& status) {
  if (status.ok()) {
    completed_by_alg_[static_cast<int>(algorithm)]->Increment();
    duration_
        .Add({{"algorithm", AlgName(algorithm)}, {"size_class", SizeClass(bytes)}},
             DurationBuckets())
        .Observe(seconds);
  } else {
    failed_.Add({{"algorithm", AlgName(algorithm)}, {"reason", Reason(status)}}).Increment();
  }
}

void DataPlaneMetrics::RecoveryObserved(double seconds) { recovery_.Observe(seconds); }

void DataPlaneMetrics::OperationRefused(Algorithm algorithm, const absl::Status& status) {
  failed_.Add({{"algorithm", AlgName(algorithm)}, {"reason", Reason(status)}}).Increment();
}

void DataPlaneMetrics::SetPending(const std::string& job_id, size_t pending,
                                  double oldest_age_seconds) {
  std::lock_guard lock(live_mu_);
  if (!live_.contains(job_id)) return;
  pending_.Add({{"job", job_id}}).Set(static_cast<double>(pending));
  oldest_.Add({{"job", job_id}}).Set(oldest_age_seconds);
}

std::vector<prometheus::MetricFamily> DataPlaneStatsCollector::Collect() const {
  using common::metrics::AddSample;
  using common::metrics::MakeFamily;
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  auto add = [&](const char* name, const char* help, MetricType type, double v) {
    out.push_back(MakeFamily(name, help, type));
    AddSample(out.back(), v);
  };
  const PushPullStats& p = node_->push_pull().stats();
  const CollectiveEngineStats& e = node_->engine().stats();
  add("tributary_dataplane_chunks_in_flight",
      "Worker role: chunks handed to the transport and not yet sent (they hold credit).",
      MetricType::Gauge, p.worker_chunks_in_flight.load());
  add("tributary_dataplane_bytes_in_flight", "Worker role: bytes of the chunks in flight.",
      MetricType::Gauge, p.worker_bytes_in_flight.load());
  add("tributary_dataplane_queued_chunks", "Worker role: chunks waiting for credit.",
      MetricType::Gauge, p.worker_queued_chunks.load());
  add("tributary_dataplane_credit_waits_total",
      "Times the worker had a chunk ready but no credit left.", MetricType::Counter,
      p.credit_waits.load());
  add("tributary_dataplane_push_backlog_waits_total",
      "Times the worker's next chunk waited because its summation server's connection had its "
      "backlog of unsent pushes (--push-backlog-kib).",
      MetricType::Counter, p.backlog_waits.load());
  add("tributary_dataplane_server_held_bytes", "Server role: accumulator bytes held now.",
      MetricType::Gauge, p.server_bytes_held.load());
  add("tributary_dataplane_staging_bytes", "Worker role: staging bytes held now.",
      MetricType::Gauge, p.worker_staging_bytes.load());
  add("tributary_dataplane_transport_errors_total", "Data-plane sends that failed.",
      MetricType::Counter, p.send_failures.load() + e.send_failures.load());
  add("tributary_dataplane_malformed_messages_total",
      "Incoming data-plane messages dropped as malformed.", MetricType::Counter,
      node_->malformed_messages());
  add("tributary_dataplane_fenced_messages_total",
      "Incoming data-plane messages dropped because they belong to another epoch (plan version) "
      "of their job than the receiver's collective; never summed.",
      MetricType::Counter, p.fenced_messages.load() + e.fenced_messages.load());
  add("tributary_dataplane_duplicate_pushes_total",
      "Server role: second pushes of one chunk by one worker, dropped (never summed twice).",
      MetricType::Counter, p.duplicate_pushes.load());
  add("tributary_dataplane_plan_change_failures_total",
      "Collectives failed as retriable (UNAVAILABLE) because their job's plan changed under "
      "them, on this node (worker or server role).",
      MetricType::Counter, p.plan_change_failures.load());
  add("tributary_dataplane_peer_recoveries_total",
      "Worker role: collectives that a summation server's loss (or a deadline) would have failed "
      "with every chunk pushed, completed from another worker's copy of the sums instead (the "
      "server had reached only some workers).",
      MetricType::Counter, p.peer_recoveries.load());
  add("tributary_dataplane_peer_recovery_attempts_total",
      "Worker role: collectives that asked the job's other workers for their sums before failing.",
      MetricType::Counter, p.peer_recoveries_started.load());
  add("tributary_dataplane_retained_bytes",
      "Worker role: memory holding sums kept for peer recovery (the last completed collective of "
      "each tensor, and the ones in flight), in bytes.",
      MetricType::Gauge, p.worker_retained_bytes.load());
  add("tributary_dataplane_p2p_sent_bytes_total",
      "Ring / halving-doubling engine: payload bytes sent.", MetricType::Counter,
      e.bytes_sent.load());
  add("tributary_dataplane_p2p_received_bytes_total",
      "Ring / halving-doubling engine: payload bytes received.", MetricType::Counter,
      e.bytes_received.load());
  return out;
}

std::vector<prometheus::MetricFamily> TransportStatsCollector::Collect() const {
  using common::metrics::AddSample;
  using common::metrics::MakeFamily;
  const TransportListenerStats stats = read_ ? read_() : TransportListenerStats{};
  std::vector<prometheus::MetricFamily> out;
  out.push_back(MakeFamily("tributary_dataplane_rejected_connections_total",
                           "Connections to the data-plane port closed before completing the "
                           "handshake (bad bytes, handshake deadline, over the half-open cap).",
                           prometheus::MetricType::Counter));
  AddSample(out.back(), static_cast<double>(stats.rejected_connections));
  out.push_back(MakeFamily("tributary_dataplane_protocol_errors_total",
                           "Data-plane connections closed for breaking the framing after the "
                           "handshake (bad magic, lengths over a limit, truncated frames).",
                           prometheus::MetricType::Counter));
  AddSample(out.back(), static_cast<double>(stats.protocol_errors));
  out.push_back(MakeFamily("tributary_dataplane_unauthenticated_messages_total",
                           "Data-plane messages dropped because they did not carry their job's "
                           "MAC (a peer without the job's secret); never summed.",
                           prometheus::MetricType::Counter));
  AddSample(out.back(), static_cast<double>(stats.unauthenticated_messages));
  out.push_back(MakeFamily("tributary_dataplane_unknown_job_messages_total",
                           "Data-plane messages of a job whose secret never reached this node "
                           "(dropped when the bounded park overflowed or timed out).",
                           prometheus::MetricType::Counter));
  AddSample(out.back(), static_cast<double>(stats.unknown_job_messages));
  out.push_back(MakeFamily("tributary_dataplane_old_incarnation_messages_total",
                           "Data-plane messages dropped because their sender is an agent process "
                           "the job's plan no longer names (a restarted agent's previous "
                           "incarnation); never summed.",
                           prometheus::MetricType::Counter));
  AddSample(out.back(), static_cast<double>(stats.old_incarnation_messages));
  return out;
}

}  // namespace tributary::dataplane
