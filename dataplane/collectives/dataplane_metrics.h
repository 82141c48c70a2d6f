// Prometheus metrics of one node's data plane (dashboards/METRICS.md, "Agent: data plane").
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dataplane/collectives/algorithm_selector.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tributary::dataplane {

struct JobView;
class DataPlaneNode;

// Per-peer byte counters of one job, resolved once per plan so that the per-chunk path only
// increments: indexed by server index (worker role) and by worker rank (server role).
struct JobPeerCounters {
  std::vector<prometheus::Counter*> pushed;  // by server index
  std::vector<prometheus::Counter*> pulled;  // by server index
  std::vector<prometheus::Counter*> summed;  // by worker rank
  std::vector<prometheus::Counter*> served;  // by worker rank
  // Keeps the series behind these pointers registered while this is alive, even after the job
  // was removed (DataPlaneMetrics::RemoveJob).
  std::shared_ptr<const void> series;
};

// "<64KiB", "<1MiB", "<16MiB", ">=16MiB".
const char* SizeClass(uint64_t bytes);

// Families built on an injected registry (which must outlive this). Thread-safe.
class DataPlaneMetrics {
 public:
  explicit DataPlaneMetrics(prometheus::Registry& registry);
  // Ends the live jobs' series (those still held by a view end with it).
  ~DataPlaneMetrics();

  // The peer counters of `view`'s job (series created at zero, or continued from the job's
  // earlier plans). Peer labels are the view's node ids, or the addresses when the view has
  // none.
  std::shared_ptr<const JobPeerCounters> ForJob(const JobView& view);
  // The job has ended on this node: its series leave the registry, the pending gauges at once
  // and the peer byte counters once no JobPeerCounters of the job is left (a collective still
  // holding its job's view counts into them until it ends). An agent that has run many jobs
  // exports the live ones only. A later ForJob of the same job id continues the series a view of
  // the removed life still holds, and starts the others at zero.
  void RemoveJob(const std::string& job_id);

  void OperationStarted(Algorithm algorithm);
  // `status` OK: completed (duration observed); otherwise failed{reason}.
  void OperationFinished(Algorithm algorithm, uint64_t bytes, double seconds,
                         const absl::Status& status);
  // A start refused before running (failed{reason}, not started).
  void OperationRefused(Algorithm algorithm, const absl::Status& status);
  // Sets the job's pending gauges; ignored for a job without a live ForJob (never planned here,
  // or removed), so a late update cannot bring back a removed job's series.
  void SetPending(const std::string& job_id, size_t pending, double oldest_age_seconds);
  // A job's collectives succeed again on this node `seconds` after the first of them failed
  // (recovery from a fault: a lost server, a re-plan, a membership change).
  void RecoveryObserved(double seconds);

 private:
  // One life of a job's series on this node (dataplane_metrics.cc).
  class JobSeries;

  prometheus::Family<prometheus::Counter>& pushed_;
  prometheus::Family<prometheus::Counter>& pulled_;
  prometheus::Family<prometheus::Counter>& summed_;
  prometheus::Family<prometheus::Counter>& served_;
  prometheus::Family<prometheus::Counter>& started_;
  prometheus::Family<prometheus::Counter>& completed_;
  prometheus::Family<prometheus::Counter>& failed_;
  prometheus::Family<prometheus::Histogram>& duration_;
  prometheus::Histogram& recovery_;
  prometheus::Family<prometheus::Gauge>& pending_;
  prometheus::Family<prometheus::Gauge>& oldest_;
  // Pre-resolved per algorithm (index = Algorithm value).
  // Indexed by Algorithm (kAuto's slot stays empty).
  prometheus::Counter* started_by_alg_[kAlgorithmValues] = {};
  prometheus::Counter* completed_by_alg_[kAlgorithmValues] = {};
  // The jobs planned on this node and not removed, with their series.
  std::mutex live_mu_;
  std::map<std::string, std::shared_ptr<JobSeries>> live_;
};

// Scrape-time view of a node's push/pull and engine counters (flow control, malformed messages,
// transport errors, p2p bytes). Borrows the node; it must outlive any scrape.
class DataPlaneStatsCollector : public prometheus::Collectable {
 public:
  explicit DataPlaneStatsCollector(const DataPlaneNode* node) : node_(node) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const DataPlaneNode* node_;
};

// What the data-plane transport's listener refused (TcpTransport's counters; zero for transports
// without them).
struct TransportListenerStats {
  uint64_t rejected_connections = 0;
  uint64_t protocol_errors = 0;
  // AuthenticatingTransport (message_auth.h): messages dropped for a wrong job MAC, and messages
  // of jobs whose secret never arrived (park full or expired).
  uint64_t unauthenticated_messages = 0;
  uint64_t unknown_job_messages = 0;
  // Verified messages from an agent process the job's plan does not name (a previous
  // incarnation of a restarted agent): dropped.
  uint64_t old_incarnation_messages = 0;
};

// Scrape-time view of the transport listener's counters, read through `read` (which must stay
// valid as long as scrapes can happen).
class TransportStatsCollector : public prometheus::Collectable {
 public:
  explicit TransportStatsCollector(std::function<TransportListenerStats()> read)
      : read_(std::move(read)) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::function<TransportListenerStats()> read_;
};

}  // namespace tributary::dataplane
