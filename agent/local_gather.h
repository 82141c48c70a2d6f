// The local gather: the R local processes' submissions of one (tensor, iteration) of a job
// must agree, and become one node-level operation handed to the data plane.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/collective_runner.h"
#include "agent/deferred.h"
#include "agent/gpu_aggregation.h"
#include "agent/mirror_stager.h"
#include "agent/op_handle.h"
#include "agent/session_registry.h"
#include "agent/shm_mapping.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "tributary/v1/agent.pb.h"

namespace tributary::agent {

// The one conversion of the API's op into the data plane's, and so the op's one validation:
// INVALID_ARGUMENT "unknown op N" for a value the API does not define.
absl::StatusOr<dataplane::Reduction> ToReduction(tributary::v1::CollectiveOp op);

// Failures the agent runs again on a newer plan when the process resubmits (see
// LocalService::Submit) start with this marker, then the epoch and "] ": "[retriable, plan v3]
// plan of job j changed from v3 to v4 during ...; retry". The client retries on it
// (client/client.cc); at the start of the message, the control ring never cuts it.
inline constexpr char kRetriableMarker[] = "[retriable, plan v";
// Collectives refused or failed because the job's membership changed (LocalService::Resync)
// are ABORTED and start with this marker: "[membership changed, generation 4] ..." or, while
// the agent waits for the controller's new generation, "[membership changed] ...". The client
// recognises it (client/client.h IsMembershipChanged); the control ring never cuts it.
inline constexpr char kMembershipChangedMarker[] = "[membership changed";
// `status` (UNAVAILABLE, carrying its epoch) with the marker in front of its message.
absl::Status MarkRetriable(const absl::Status& status, uint64_t epoch);

struct GatherKey {
  std::string job_id;
  std::string tensor;
  uint64_t iteration = 0;
  friend auto operator<=>(const GatherKey&, const GatherKey&) = default;
};

// One local process's part of a node-level operation, validated by LocalService.
struct Submission {
  uint32_t local_rank = 0;
  std::shared_ptr<SharedMemoryMapping> mapping;
  uint64_t offset = 0;  // bytes into `mapping`
  uint64_t count = 0;   // elements
  uint64_t bytes = 0;   // of the region (count x element size, x world size when blockwise)
  common::DataType dtype = common::DataType::kFloat32;
  dataplane::Reduction reduction = dataplane::Reduction::kSum;
  uint32_t root = 0;  // broadcast: the root's global rank
  int32_t priority = 0;
  std::shared_ptr<OpHandle> handle;
  std::string session_id;  // of the submitting process (for RetriableFailure)
  // A resubmission of an iteration that failed as retriable under this epoch (plan version):
  // the operation starts only once the job's plan is newer (LocalGather::JobsChanged).
  std::optional<uint64_t> retry_of_epoch;

  // "4 x float32 sum", "4 x float32 broadcast from rank 3".
  std::string Describe() const;
  // Same count, dtype and op (and root, for a broadcast).
  bool Agrees(const Submission& other) const;
};

// Not thread-safe: LocalService serializes every call under its mutex. Nothing here calls the
// runner or completes a handle directly: that work goes into the caller's `Deferred`, to run
// once the caller's lock is released.
class LocalGather {
 public:
  // An operation failed as retriable (`dataplane::EpochOf` its status: it ran under `epoch`):
  // called before its handles complete, on the thread that completes it, without the gather's
  // owner's lock, with the sessions that submitted it.
  using RetriableFailure = std::function<void(
      const GatherKey& key, const std::vector<std::string>& session_ids, uint64_t epoch)>;

  // `runner` and `clock` must outlive the gather. Operations on mirrored buffers
  // (SharedMemoryMapping::mirror) are staged on `stager` (mirror_stager.h StartMirrored).
  LocalGather(CollectiveRunner* runner, const common::Clock* clock,
              std::shared_ptr<MirrorStager> stager = nullptr);

  void SetRetriableFailureCallback(RetriableFailure callback) {
    on_retriable_ = std::move(callback);
  }
  // The GPUs a job's intra-node plan runs on when every local process's buffer of a sum or
  // average is GPU memory (agent/gpu_aggregation.h); MakeDeviceGpuOps unless replaced (tests).
  void SetGpuOpsFactory(GpuOpsFactory factory) { gpu_ops_factory_ = std::move(factory); }

  // Adds `sub` to the gather of `key` (created on the first submission, timed from then).
  // When all job.procs_per_node local ranks are in and agree, one node-level operation (every
  // rank's buffer, the lowest priority number) is started on the runner; if they disagree,
  // each submission fails with INVALID_ARGUMENT naming the first and the differing one. If
  // the runner refuses the operation, every submission fails with its error and the other
  // nodes are told (Abort). A gather still missing a rank that has ended fails with ABORTED.
  // A resubmission (Submission::retry_of_epoch) waits, complete, until the job's plan is newer
  // than that epoch (JobsChanged), at most the job's op timeout: then UNAVAILABLE, retriable.
  void Add(const LocalJob& job, const GatherKey& key, Submission sub, Deferred& after);
  // Local rank `rank` of `job_id` ended (`why`, for the message): gathers still missing it
  // fail with ABORTED, now and whenever a later one misses it, until RankJoined.
  void RankEnded(const std::string& job_id, uint32_t rank, const std::string& why, Deferred& after);
  // A new session holds local rank `rank` of `job_id`.
  void RankJoined(const std::string& job_id, uint32_t rank);
  // Fails every gather of `job_id`, open or waiting for a newer plan, with `status` (the job's
  // membership changed: none of its iterations can complete). Only the local handles: the data
  // plane already runs the new plan, whose iterations count again from 0. Forgets the job's
  // departed ranks: the new generation's gathers wait for every rank (up to the deadline).
  void AbortJob(const std::string& job_id, const absl::Status& status, Deferred& after);
  // Fails with DEADLINE_EXCEEDED, naming the missing local ranks, the gathers older than their
  // job's op_timeout at `now`; resubmissions that waited that long for a newer plan fail with
  // UNAVAILABLE (retriable).
  void Expire(common::Clock::TimePoint now, Deferred& after);
  // The jobs this node works for now: resubmissions waiting for a plan newer than their failed
  // epoch start when it is there; those of a job no longer planned here fail.
  void JobsChanged(const std::vector<LocalJob>& jobs, Deferred& after);

  size_t size() const { return gathers_.size() + waiting_.size(); }
  // Complete resubmissions waiting for a newer plan.
  size_t waiting_for_plan() const { return waiting_.size(); }

 private:
  struct Gather {
    LocalJob job;
    std::vector<std::optional<Submission>> slots;  // by local rank
    uint32_t filled = 0;
    common::Clock::TimePoint created;
    // The largest failed epoch among the submissions that are resubmissions.
    std::optional<uint64_t> retry_of_epoch;
  };

  // Fails every submission of `gather` with `status` and tells the other nodes.
  void Fail(const GatherKey& key, Gather& gather, const absl::Status& status, Deferred& after);
  // Every rank is in: check they agree, then start the node-level operation.
  void Complete(const GatherKey& key, std::unique_ptr<Gather> gather, Deferred& after);

  CollectiveRunner* runner_;
  const common::Clock* clock_;
  std::shared_ptr<MirrorStager> stager_;
  // Starts the node-level operation of a complete gather that agrees.
  void Start(const GatherKey& key, std::unique_ptr<Gather> gather, Deferred& after);

  std::map<GatherKey, std::unique_ptr<Gather>> gathers_;
  // Complete resubmissions waiting for a plan newer than their gather's retry_of_epoch; each
  // gather's `created` is reset to when it started waiting.
  std::map<GatherKey, std::unique_ptr<Gather>> waiting_;
  RetriableFailure on_retriable_;
  GpuOpsFactory gpu_ops_factory_;
  // Per job: the GPU aggregation of its plan version and its processes' devices (made on first
  // use, on the staging thread).
  std::map<std::string, std::pair<uint64_t, std::shared_ptr<GpuAggregationSlot>>> gpu_slots_;
  // The slot for `gather` when it is a sum or average, its plan has an intra-node part and every
  // buffer is GPU memory; null otherwise.
  std::shared_ptr<GpuAggregationSlot> GpuSlot(const GatherKey& key, const Gather& gather);
  // Local ranks whose session ended, per job, with why: a gather missing one of them can never
  // complete. A new session for the rank clears it.
  std::map<std::string, std::map<uint32_t, std::string>> departed_;
};

}  // namespace tributary::agent
