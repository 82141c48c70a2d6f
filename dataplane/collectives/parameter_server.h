// Asynchronous parameter-server training with bounded staleness (SSP), on the summation servers
// of a job whose mode is async (JobView::async_mode).
//
// Parameters of a named tensor are sharded over the job's summation servers with push/pull's
// chunk map (PushPullChunks + ChunkMap::ServerOf), so every worker computes the same owner of
// every chunk. Each server keeps, per (job, tensor, chunk): the values, a version (deltas applied,
// monotonic) and one clock per worker (deltas that worker has pushed for the tensor). Workers
// are training processes (global ranks), not nodes: nothing is gathered across a node's
// processes and nothing waits for the other workers except a pull under SSP.
//
// Three operations (Reduction values, WireHeader::reduce):
//  * kPsInit: global rank 0 pushes the initial values (kPush); every other rank pulls them
//    (kPull), parked on the server until they are there (deadline: the job's op_timeout).
//  * kPsDelta: each chunk goes to its server (kPush, WireHeader::step = the worker's clock for
//    the tensor, 1-based), which applies params += scale * delta as it arrives, exactly once:
//    a clock it has already applied is acknowledged and dropped, a gap is FAILED_PRECONDITION.
//    scale: the call's (WireHeader::reserved1, float32 bits, 0 = none) or the job's delta_scale.
//  * kPsPull: the server answers (kResult, payload: 8-byte little-endian version, then the values)
//    at once, unless SSP holds it: with staleness s >= 0, a pull by worker w waits (parked) while
//    clock[w] - min(clocks) > s, and fails at the deadline with DEADLINE_EXCEEDED naming the
//    slowest worker(s). The version a pull returns is the smallest version over the tensor's
//    chunks; versions are monotonic, so a worker never receives one older than it has seen.
//
// Epoch fencing: the plan version is the epoch. A server drops a job's parameters when its plan
// changes (SetJob with another version) or the job leaves (RemoveJob); parked pulls and every
// message of another epoch get UNAVAILABLE "plan ... changed ...; retry" (retriable). The
// parameters are lost with the epoch: the client initialises again from rank 0 (init on every
// rank) and the workers' clocks start again at 0.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "dataplane/collectives/collective_algorithm.h"
#include "dataplane/collectives/job_view.h"
#include "dataplane/collectives/operation.h"
#include "dataplane/collectives/wire.h"
#include "dataplane/schedule/chunk_map.h"
#include "dataplane/transport/transport.h"

namespace tributary::dataplane {

// Counters for tests and metrics. Monotonic.
struct ParameterServerStats {
  std::atomic<uint64_t> deltas_applied{0};      // chunk deltas added into parameters
  std::atomic<uint64_t> duplicate_deltas{0};    // a clock already applied: acknowledged, dropped
  std::atomic<uint64_t> pulls_answered{0};      // chunk pulls answered with values
  std::atomic<uint64_t> pulls_parked{0};        // chunk pulls that had to wait (init or SSP)
  std::atomic<uint64_t> pulls_expired{0};       // parked pulls failed at their deadline
  std::atomic<uint64_t> fenced_messages{0};     // messages of another epoch, answered UNAVAILABLE
  std::atomic<uint64_t> errors_sent{0};         // error replies of the server
  std::atomic<uint64_t> malformed_messages{0};  // from a worker the job does not have, etc.
  std::atomic<uint64_t> ops_started{0};
  std::atomic<uint64_t> ops_completed{0};
  std::atomic<uint64_t> ops_failed{0};
};

// Both roles of one node, behind CollectiveAlgorithm (DataPlaneNode routes Algorithm
// kParameterServer messages and the kPs* operations here). Thread-safe: one mutex per role;
// sends and `done` callbacks run with no lock held.
class ParameterServer : public CollectiveAlgorithm {
 public:
  ParameterServer(Transport* transport, const common::Clock* clock);

  void SetJob(const JobView& view) override;
  void RemoveJob(uint64_t job_hash) override;
  // OK for the kPs* reductions with Algorithm::kParameterServer; declines the rest.
  absl::Status CanServe(Algorithm algorithm, const Operation& op) const override;
  // One process's operation: op.buffers holds exactly one buffer, op.ps_worker its global rank
  // (on this node). INVALID_ARGUMENT for bad sizes, ranks or buffers, FAILED_PRECONDITION for a
  // job that is not async or a node that is not a worker, ALREADY_EXISTS for a second
  // push_delta of the same tensor by the same worker while one is in flight.
  absl::Status Post(const std::string& job_id, Algorithm algorithm, Operation op) override;
  void HandleMessage(const WireHeader& h, std::span<const std::byte> payload) override;
  // Server: parked pulls past their deadline fail (DEADLINE_EXCEEDED naming the slowest
  // workers or the missing init). Worker: operations past twice the job's timeout fail (their
  // servers did not answer at all).
  void ExpireStale() override;
  // Nothing to do: parameter-server operations involve no other worker.
  void Abort(const std::string&, const std::string&, uint64_t, const absl::Status&) override {}

  const ParameterServerStats& stats() const { return stats_; }

  // Server side, for tests: the version and this worker's clock of a chunk; nullopt when the
  // chunk is not held here.
  struct ChunkInfo {
    uint64_t version = 0;
    std::vector<uint64_t> clocks;
    bool initialised = false;
  };
  std::optional<ChunkInfo> Inspect(const std::string& job_id, const std::string& tensor_name,
                                   uint32_t chunk) const;

 private:
  struct Outgoing {
    std::string address;
    WireHeader header;
    std::shared_ptr<std::vector<std::byte>> payload;
  };
  struct ParkedPull {
    WireHeader h;
    common::Clock::TimePoint deadline;
  };
  struct ChunkParams {
    WireHeader descriptor;  // of the init: dtype, tensor_count, num_chunks, chunk
    bool initialised = false;
    std::vector<std::byte> values;
    uint64_t version = 0;
    std::vector<uint64_t> clocks;  // per worker (global rank)
    std::vector<ParkedPull> parked;
  };
  using ChunkKey = std::tuple<uint64_t, uint64_t, uint32_t>;  // job, tensor, chunk
  struct ServerJob {
    std::shared_ptr<const JobView> view;
    ChunkMap map;
  };

  struct OpState;
  using OpKey = std::tuple<uint64_t, uint64_t, uint32_t, uint64_t>;  // job, tensor, worker, req
  using Completion = std::pair<std::function<void(absl::Status)>, absl::Status>;

  // --- server role (server_mu_) ---
  void ServerHandle(const ServerJob& job, const WireHeader& h, std::span<const std::byte> payload,
                    std::vector<Outgoing>& out);
  // Answers or keeps parking the chunk's pulls now that its state changed.
  void ReleaseParked(const JobView& job, ChunkParams& st, std::vector<Outgoing>& out);
  // Whether worker `w`'s pull may be answered now (init done; SSP bound kept).
  static bool PullReady(const JobView& job, const ChunkParams& st, const WireHeader& h);
  void Reply(const JobView& job, const WireHeader& h, const ChunkParams* st,
             std::vector<Outgoing>& out);
  void ReplyError(const JobView& job, const WireHeader& h, const absl::Status& status,
                  std::vector<Outgoing>& out);
  // Drops every chunk of the job, failing parked pulls with `status`.
  void DropJobLocked(const JobView& job, const absl::Status& status, std::vector<Outgoing>& out);

  // --- worker role (worker_mu_) ---
  void WorkerHandle(const WireHeader& h, std::span<const std::byte> payload,
                    std::vector<Completion>& done);
  void FailOpLocked(const OpKey& key, absl::Status status, std::vector<Completion>& done);

  void SendAll(std::vector<Outgoing> out);
  static void RunAll(std::vector<Completion> done);

  Transport* transport_;
  const common::Clock* clock_;
  ParameterServerStats stats_;

  mutable std::mutex server_mu_;
  std::map<uint64_t, ServerJob> server_jobs_;  // Guarded by server_mu_.
  std::map<ChunkKey, ChunkParams> chunks_;     // Guarded by server_mu_.

  std::mutex worker_mu_;
  std::map<uint64_t, std::shared_ptr<const JobView>> worker_jobs_;  // Guarded by worker_mu_.
  std::map<OpKey, std::shared_ptr<OpState>> ops_;                   // Guarded by worker_mu_.
  // Per (job, tensor, worker): the clock of the last delta acknowledged, the epoch it counts in,
  // whether a delta is in flight, and the newest version the worker has seen.
  struct WorkerTensor {
    uint64_t epoch = 0;
    uint64_t clock = 0;
    bool delta_in_flight = false;
    uint64_t last_version = 0;
  };
  std::map<std::tuple<uint64_t, uint64_t, uint32_t>, WorkerTensor> tensors_;  // worker_mu_
  uint64_t next_request_ = 1;                                                 // worker_mu_
};

}  // namespace tributary::dataplane
