#include "dataplane/collectives/parameter_server.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/half.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace tributary::dataplane {
namespace {

constexpr auto Log = common::ComponentLog<"dataplane">;

using common::DataType;

template <typename T>
void AddScaled(std::byte* p, const std::byte* d, uint64_t n, double scale) {
  for (uint64_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, p + i * sizeof(T), sizeof(T));
    std::memcpy(&b, d + i * sizeof(T), sizeof(T));
    // scale 1: the exact sum in T (integer-valued data stays exact); else in double.
    const T r = scale == 1.0
                    ? static_cast<T>(a + b)
                    : static_cast<T>(static_cast<double>(a) + scale * static_cast<double>(b));
    std::memcpy(p + i * sizeof(T), &r, sizeof(T));
  }
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void AddScaledHalf(std::byte* p, const std::byte* d, uint64_t n, double scale) {
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t a, b;
    std::memcpy(&a, p + i * 2, 2);
    std::memcpy(&b, d + i * 2, 2);
    const uint16_t r = FromF(static_cast<float>(ToF(a) + scale * ToF(b)));
    std::memcpy(p + i * 2, &r, 2);
  }
}

// params += scale * delta over n elements of `dtype`.
void ApplyDelta(DataType dtype, std::byte* params, const std::byte* delta, uint64_t n,
                double scale) {
  switch (dtype) {
    case DataType::kFloat32:
      return AddScaled<float>(params, delta, n, scale);
    case DataType::kFloat64:
      return AddScaled<double>(params, delta, n, scale);
    case DataType::kInt32:
      return AddScaled<int32_t>(params, delta, n, scale);
    case DataType::kInt64:
      return AddScaled<int64_t>(params, delta, n, scale);
    case DataType::kFloat16:
      return AddScaledHalf<common::Fp16ToFp32, common::Fp32ToFp16>(params, delta, n, scale);
    case DataType::kBFloat16:
      return AddScaledHalf<common::Bf16ToFp32, common::Fp32ToBf16>(params, delta, n, scale);
  }
}

bool SameShape(const WireHeader& a, const WireHeader& b) {
  return a.dtype == b.dtype && a.tensor_count == b.tensor_count && a.num_chunks == b.num_chunks;
}

std::string Shape(const WireHeader& h) {
  return absl::StrCat(h.tensor_count, " ",
                      std::string(common::DataTypeName(static_cast<DataType>(h.dtype))), " in ",
                      h.num_chunks, " chunks");
}

// "tensor 0x.. chunk 2/5 of job J (worker 3)"
std::string What(const JobView& job, const WireHeader& h) {
  return absl::StrCat("parameters ", Describe(h), " of job ", job.job_id, " (worker ", h.root, ")");
}

double MsOf(std::chrono::nanoseconds d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

}  // namespace

struct ParameterServer::OpState {
  std::string job_id;
  std::string name;
  std::shared_ptr<const JobView> view;
  Reduction reduction = Reduction::kPsPull;
  bool pulls = false;  // the answers carry values (pull, or init on a rank other than 0)
  common::DataType dtype = common::DataType::kFloat32;
  uint64_t count = 0;
  std::byte* buffer = nullptr;
  uint32_t num_chunks = 0;
  std::vector<bool> chunk_done;
  uint32_t remaining = 0;
  uint64_t min_version = UINT64_MAX;
  uint64_t clock = 0;  // kPsDelta
  common::Clock::TimePoint deadline;
  std::function<void(absl::Status)> done;
  std::shared_ptr<uint64_t> version_out;
  std::shared_ptr<void> keepalive;
  std::tuple<uint64_t, uint64_t, uint32_t> tensor_key;
};

ParameterServer::ParameterServer(Transport* transport, const common::Clock* clock)
    : transport_(transport), clock_(clock) {}

// ---------------------------------------------------------------------------------------------
// Jobs

void ParameterServer::SetJob(const JobView& in) {
  auto view = std::make_shared<const JobView>(in);
  const uint64_t job_hash = view->job_hash();
  std::vector<Outgoing> out;
  std::vector<Completion> done;
  absl::StatusOr<ChunkMap> map = ChunkMap::Create(view->server_weights);
  {
    std::lock_guard lock(server_mu_);
    auto it = server_jobs_.find(job_hash);
    if (it != server_jobs_.end() && it->second.view->plan_version != view->plan_version) {
      // The parameters are lost with the epoch: the client initialises again from rank 0.
      const JobView& old = *it->second.view;
      DropJobLocked(old,
                    PlanChangedError(old.job_id, old.plan_version, view->plan_version,
                                     "a parameter-server pull"),
                    out);
    }
    if (map.ok()) {
      server_jobs_.insert_or_assign(job_hash, ServerJob{view, *std::move(map)});
    } else {
      Log()->error("job {}: no chunk map for the parameter server: {}", view->job_id,
                   map.status().message());
      server_jobs_.erase(job_hash);
    }
  }
  {
    std::lock_guard lock(worker_mu_);
    for (auto it = ops_.begin(); it != ops_.end();) {
      auto next = std::next(it);
      const OpState& op = *it->second;
      if (std::get<0>(it->first) == job_hash && op.view->plan_version != view->plan_version) {
        FailOpLocked(it->first,
                     PlanChangedError(op.job_id, op.view->plan_version, view->plan_version,
                                      absl::StrCat(std::string(ReductionName(op.reduction)),
                                                   " of '", op.name, "'")),
                     done);
      }
      it = next;
    }
    worker_jobs_[job_hash] = view;
  }
  SendAll(std::move(out));
  RunAll(std::move(done));
}

void ParameterServer::RemoveJob(uint64_t job_hash) {
  std::vector<Outgoing> out;
  std::vector<Completion> done;
  {
    std::lock_guard lock(server_mu_);
    if (auto it = server_jobs_.find(job_hash); it != server_jobs_.end()) {
      const JobView& old = *it->second.view;
      DropJobLocked(
          old, PlanChangedError(old.job_id, old.plan_version, 0, "a parameter-server pull"), out);
      server_jobs_.erase(it);
    }
  }
  {
    std::lock_guard lock(worker_mu_);
    for (auto it = ops_.begin(); it != ops_.end();) {
      auto next = std::next(it);
      if (std::get<0>(it->first) == job_hash) {
        FailOpLocked(it->first, absl::CancelledError("job removed from this node"), done);
      }
      it = next;
    }
    worker_jobs_.erase(job_hash);
  }
  SendAll(std::move(out));
  RunAll(std::move(done));
}

void ParameterServer::DropJobLocked(const JobView& job, const absl::Status& status,
                                    std::vector<Outgoing>& out) {
  const uint64_t job_hash = job.job_hash();
  for (auto it = chunks_.lower_bound({job_hash, 0, 0});
       it != chunks_.end() && std::get<0>(it->first) == job_hash;) {
    for (const ParkedPull& p : it->second.parked) ReplyError(job, p.h, status, out);
    it = chunks_.erase(it);
  }
}

absl::Status ParameterServer::CanServe(Algorithm algorithm, const Operation& op) const {
  if (algorithm != Algorithm::kParameterServer || !IsParameterServer(op.reduction)) {
    return absl::FailedPreconditionError(
        "the parameter server runs init_params, push_delta and pull_params only");
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Worker role

absl::Status ParameterServer::Post(const std::string& job_id, Algorithm algorithm, Operation op) {
  RETURN_IF_ERROR(CanServe(algorithm, op));
  const std::string what =
      absl::StrCat(std::string(ReductionName(op.reduction)), " of '", op.tensor_name, "' in job '",
                   job_id, "' (worker ", op.ps_worker, ")");
  const size_t esize = common::DataTypeSize(op.dtype);
  if (op.buffers.size() != 1 || op.buffers[0] == nullptr || op.count == 0 || esize == 0 ||
      op.count > UINT64_MAX / esize) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": needs one buffer of at least one element of a known dtype"));
  }
  const uint64_t job_hash = common::StableHash64(job_id);
  const uint64_t tensor_hash = common::StableHash64(op.tensor_name);
  auto state = std::make_shared<OpState>();
  std::vector<Outgoing> out;
  {
    std::lock_guard lock(worker_mu_);
    auto it = worker_jobs_.find(job_hash);
    if (it == worker_jobs_.end()) {
      return absl::NotFoundError(absl::StrCat(what, ": the job has no plan on this node"));
    }
    const std::shared_ptr<const JobView>& job = it->second;
    if (!job->async_mode) {
      return absl::FailedPreconditionError(absl::StrCat(
          what,
          ": the job is synchronous; init_params, push_delta and pull_params need a job "
          "created with --mode async"));
    }
    if (job->my_worker_rank < 0) {
      return absl::FailedPreconditionError(absl::StrCat(what, ": this node is not a worker"));
    }
    if (op.ps_worker >= job->world_size() ||
        op.ps_worker / job->procs_per_node != static_cast<uint32_t>(job->my_worker_rank)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": worker ", op.ps_worker,
                                                     " is not a process of this node (worker node ",
                                                     job->my_worker_rank, ")"));
    }
    absl::StatusOr<ChunkMap> map = ChunkMap::Create(job->server_weights);
    if (!map.ok()) return map.status();
    const uint32_t num_chunks =
        PushPullChunks(op.count, esize, job->partition_bytes, map->num_servers());
    const auto tkey = std::make_tuple(job_hash, tensor_hash, op.ps_worker);
    WorkerTensor& wt = tensors_[tkey];
    if (wt.epoch != job->plan_version) wt = WorkerTensor{job->plan_version, 0, false, 0};
    if (op.reduction == Reduction::kPsDelta) {
      if (wt.delta_in_flight) {
        return absl::AlreadyExistsError(
            absl::StrCat(what,
                         ": the previous push_delta of this tensor is still in flight; "
                         "wait for it first (deltas of one worker are applied in order)"));
      }
      wt.delta_in_flight = true;
      state->clock = wt.clock + 1;
    }
    const uint64_t request = next_request_++;
    state->job_id = job_id;
    state->name = op.tensor_name;
    state->view = job;
    state->reduction = op.reduction;
    state->pulls = op.reduction == Reduction::kPsPull ||
                   (op.reduction == Reduction::kPsInit && op.ps_worker != 0);
    state->dtype = op.dtype;
    state->count = op.count;
    state->buffer = op.buffers[0];
    state->num_chunks = num_chunks;
    state->chunk_done.assign(num_chunks, false);
    state->remaining = num_chunks;
    // The server parks a pull up to the job's timeout and then answers; this deadline catches
    // servers that never answer at all.
    state->deadline = clock_->Now() + 2 * job->op_timeout;
    state->done = std::move(op.done);
    state->version_out = std::move(op.ps_version);
    state->keepalive = std::move(op.keepalive);
    state->tensor_key = tkey;

    WireHeader h;
    h.kind = static_cast<uint8_t>(state->pulls ? MessageKind::kPull : MessageKind::kPush);
    h.dtype = static_cast<uint8_t>(op.dtype);
    h.reduce = static_cast<uint8_t>(op.reduction);
    h.algorithm = static_cast<uint8_t>(Algorithm::kParameterServer);
    h.job = job_hash;
    h.tensor = tensor_hash;
    h.iteration = request;
    h.plan_version = job->plan_version;
    h.tensor_count = op.count;
    h.world_size = job->world_size();
    h.sender = op.ps_worker;
    h.root = op.ps_worker;
    h.num_chunks = num_chunks;
    if (op.reduction == Reduction::kPsDelta) {
      h.step = static_cast<uint32_t>(state->clock);
      const float scale = static_cast<float>(op.ps_scale);
      h.reserved1 = std::bit_cast<uint32_t>(scale);
    }
    for (uint32_t c = 0; c < num_chunks; ++c) {
      const ChunkRange r = GetChunk(op.count, num_chunks, c);
      h.chunk = c;
      h.chunk_offset = r.offset;
      h.chunk_count = r.count;
      Outgoing o{job->server_addresses[map->ServerOf(tensor_hash, num_chunks, c)], h, nullptr};
      out.push_back(std::move(o));
    }
    ops_[{job_hash, tensor_hash, op.ps_worker, request}] = state;
    stats_.ops_started++;
  }
  // Sends outside the lock: an answer may complete the op before the last send is issued, so
  // every send keeps the buffer alive itself.
  for (Outgoing& o : out) {
    std::span<const std::byte> payload;
    if (o.header.kind == static_cast<uint8_t>(MessageKind::kPush)) {
      payload = {state->buffer + o.header.chunk_offset * esize, o.header.chunk_count * esize};
    }
    const OpKey key{o.header.job, o.header.tensor, o.header.root, o.header.iteration};
    transport_->Send(o.address, AsBytes(o.header), payload,
                     [this, key, keep = state, addr = o.address](absl::Status s) {
                       if (s.ok()) return;
                       std::vector<Completion> done;
                       {
                         std::lock_guard lock(worker_mu_);
                         FailOpLocked(
                             key,
                             absl::UnavailableError(absl::StrCat("send to summation server ", addr,
                                                                 " failed: ", s.message())),
                             done);
                       }
                       RunAll(std::move(done));
                     });
  }
  return absl::OkStatus();
}

void ParameterServer::FailOpLocked(const OpKey& key, absl::Status status,
                                   std::vector<Completion>& done) {
  auto it = ops_.find(key);
  if (it == ops_.end()) return;
  std::shared_ptr<OpState> op = it->second;
  ops_.erase(it);
  if (auto t = tensors_.find(op->tensor_key);
      t != tensors_.end() && op->reduction == Reduction::kPsDelta) {
    // Not acknowledged: the retry pushes the same delta with the same clock, and the chunks the
    // servers applied already are acknowledged without being applied twice.
    t->second.delta_in_flight = false;
  }
  stats_.ops_failed++;
  if (status.code() == absl::StatusCode::kUnavailable && !EpochOf(status)) {
    status = WithEpoch(std::move(status), op->view->plan_version);
  }
  done.emplace_back(std::move(op->done), std::move(status));
}

void ParameterServer::WorkerHandle(const WireHeader& h, std::span<const std::byte> payload,
                                   std::vector<Completion>& done) {
  const OpKey key{h.job, h.tensor, h.root, h.iteration};
  auto it = ops_.find(key);
  if (it == ops_.end()) return;  // late answer of a finished or failed op
  OpState& op = *it->second;
  if (h.plan_version != op.view->plan_version) {
    stats_.fenced_messages++;
    return;
  }
  const std::string what = absl::StrCat(std::string(ReductionName(op.reduction)), " of '", op.name,
                                        "' in job '", op.job_id, "' (worker ", h.root, ")");
  if (h.kind == static_cast<uint8_t>(MessageKind::kError)) {
    const absl::string_view msg(reinterpret_cast<const char*>(payload.data()), payload.size());
    FailOpLocked(
        key,
        absl::Status(static_cast<absl::StatusCode>(h.error_code), absl::StrCat(what, ": ", msg)),
        done);
    return;
  }
  if (h.kind != static_cast<uint8_t>(MessageKind::kResult)) {
    stats_.malformed_messages++;
    return;
  }
  const size_t esize = common::DataTypeSize(op.dtype);
  if (h.num_chunks != op.num_chunks || h.tensor_count != op.count ||
      h.dtype != static_cast<uint8_t>(op.dtype) || h.chunk >= op.num_chunks) {
    stats_.malformed_messages++;
    FailOpLocked(key,
                 absl::InternalError(absl::StrCat(what, ": the server answered ", Describe(h),
                                                  " for another shape")),
                 done);
    return;
  }
  if (op.chunk_done[h.chunk]) return;
  if (op.pulls) {
    if (payload.size() != sizeof(uint64_t) + h.chunk_count * esize) {
      stats_.malformed_messages++;
      FailOpLocked(key, absl::InternalError(absl::StrCat(what, ": answer without values")), done);
      return;
    }
    uint64_t version;
    std::memcpy(&version, payload.data(), sizeof(version));
    std::memcpy(op.buffer + h.chunk_offset * esize, payload.data() + sizeof(version),
                h.chunk_count * esize);
    op.min_version = std::min(op.min_version, version);
  }
  op.chunk_done[h.chunk] = true;
  if (--op.remaining > 0) return;

  std::shared_ptr<OpState> state = it->second;
  ops_.erase(it);
  WorkerTensor& wt = tensors_[state->tensor_key];
  absl::Status result;
  if (state->reduction == Reduction::kPsDelta) {
    wt.clock = state->clock;
    wt.delta_in_flight = false;
  } else {
    const uint64_t version = state->pulls ? state->min_version : 0;
    if (version < wt.last_version) {
      // Cannot happen within an epoch (every chunk's version only grows); checked because the
      // promise to the caller depends on it.
      result = absl::InternalError(absl::StrCat(what, ": version ", version,
                                                " is older than the version ", wt.last_version,
                                                " this worker has seen"));
    } else {
      wt.last_version = version;
      if (state->version_out) *state->version_out = version;
    }
  }
  if (result.ok()) {
    stats_.ops_completed++;
  } else {
    stats_.ops_failed++;
  }
  done.emplace_back(std::move(state->done), std::move(result));
}

// ---------------------------------------------------------------------------------------------
// Server role

bool ParameterServer::PullReady(const JobView& job, const ChunkParams& st, const WireHeader& h) {
  if (!st.initialised) return false;
  if (h.reduce != static_cast<uint8_t>(Reduction::kPsPull) || job.staleness < 0) return true;
  const uint64_t slowest = *std::min_element(st.clocks.begin(), st.clocks.end());
  return st.clocks[h.root] - slowest <= static_cast<uint64_t>(job.staleness);
}

void ParameterServer::Reply(const JobView& job, const WireHeader& h, const ChunkParams* st,
                            std::vector<Outgoing>& out) {
  Outgoing o;
  o.address = job.worker_addresses[h.root / job.procs_per_node];
  o.header = h;
  o.header.kind = static_cast<uint8_t>(MessageKind::kResult);
  o.header.sender = WireHeader::kFromServer;
  std::memset(o.header.mac, 0, sizeof(o.header.mac));
  if (st != nullptr) {
    auto payload = std::make_shared<std::vector<std::byte>>(sizeof(uint64_t) + st->values.size());
    std::memcpy(payload->data(), &st->version, sizeof(uint64_t));
    std::memcpy(payload->data() + sizeof(uint64_t), st->values.data(), st->values.size());
    o.payload = std::move(payload);
    stats_.pulls_answered++;
  }
  out.push_back(std::move(o));
}

void ParameterServer::ReplyError(const JobView& job, const WireHeader& h,
                                 const absl::Status& status, std::vector<Outgoing>& out) {
  Outgoing o;
  o.address = job.worker_addresses[h.root / job.procs_per_node];
  o.header = h;
  o.header.kind = static_cast<uint8_t>(MessageKind::kError);
  o.header.sender = WireHeader::kFromServer;
  o.header.error_code = static_cast<uint32_t>(status.code());
  std::memset(o.header.mac, 0, sizeof(o.header.mac));
  const absl::string_view msg = status.message();
  const auto* bytes = reinterpret_cast<const std::byte*>(msg.data());
  o.payload = std::make_shared<std::vector<std::byte>>(bytes, bytes + msg.size());
  stats_.errors_sent++;
  out.push_back(std::move(o));
}

void ParameterServer::ReleaseParked(const JobView& job, ChunkParams& st,
                                    std::vector<Outgoing>& out) {
  std::vector<ParkedPull> still;
  for (ParkedPull& p : st.parked) {
    if (st.initialised && !SameShape(st.descriptor, p.h)) {
      ReplyError(
          job, p.h,
          absl::InvalidArgumentError(absl::StrCat(What(job, p.h), ": pulled as ", Shape(p.h),
                                                  " but initialised as ", Shape(st.descriptor))),
          out);
    } else if (PullReady(job, st, p.h)) {
      Reply(job, p.h, &st, out);
    } else {
      still.push_back(p);
    }
  }
  st.parked = std::move(still);
}

void ParameterServer::ServerHandle(const ServerJob& sj, const WireHeader& h,
                                   std::span<const std::byte> payload, std::vector<Outgoing>& out) {
  const JobView& job = *sj.view;
  if (h.root / job.procs_per_node >= static_cast<uint32_t>(job.num_workers())) {
    stats_.malformed_messages++;  // nobody to answer
    Log()->warn("parameter-server message from worker {} that job {} does not have dropped", h.root,
                job.job_id);
    return;
  }
  if (h.plan_version != job.plan_version) {
    stats_.fenced_messages++;
    ReplyError(job, h,
               h.plan_version < job.plan_version
                   ? PlanChangedError(job.job_id, h.plan_version, job.plan_version, What(job, h))
                   : WithEpoch(absl::UnavailableError(absl::StrCat(
                                   "summation server ", job.my_server_index, " of job ", job.job_id,
                                   " has plan v", job.plan_version, ", not yet v", h.plan_version,
                                   "; retry")),
                               h.plan_version),
               out);
    return;
  }
  if (!job.async_mode) {
    ReplyError(job, h,
               absl::FailedPreconditionError(
                   absl::StrCat("job ", job.job_id,
                                " is synchronous: no parameter server (create it with "
                                "--mode async)")),
               out);
    return;
  }
  if (h.world_size != job.world_size()) {
    ReplyError(job, h,
               absl::InvalidArgumentError(absl::StrCat(What(job, h), ": a world of ", h.world_size,
                                                       " workers, the job has ", job.world_size())),
               out);
    return;
  }
  if (job.my_server_index < 0 || sj.map.ServerOf(h.tensor, h.num_chunks, h.chunk) !=
                                     static_cast<uint32_t>(job.my_server_index)) {
    ReplyError(job, h,
               absl::FailedPreconditionError(absl::StrCat(
                   What(job, h), " is not owned by summation server ", job.my_server_index)),
               out);
    return;
  }
  const auto r = static_cast<Reduction>(h.reduce);
  const ChunkKey key{h.job, h.tensor, h.chunk};
  auto [it, inserted] = chunks_.try_emplace(key);
  ChunkParams& st = it->second;
  if (inserted) {
    st.descriptor = h;
    st.clocks.assign(job.world_size(), 0);
  }
  const uint64_t bytes = h.chunk_count * common::DataTypeSize(static_cast<DataType>(h.dtype));
  if (st.initialised && !SameShape(st.descriptor, h)) {
    ReplyError(job, h,
               absl::InvalidArgumentError(
                   absl::StrCat(What(job, h), ": ", std::string(ReductionName(r)), " as ", Shape(h),
                                " but initialised as ", Shape(st.descriptor))),
               out);
    return;
  }
  if (h.kind == static_cast<uint8_t>(MessageKind::kPush) && r == Reduction::kPsInit) {
    if (st.initialised && st.version > 0) {
      ReplyError(job, h,
                 absl::FailedPreconditionError(
                     absl::StrCat(What(job, h), ": already initialised and updated to version ",
                                  st.version, "; parameters are initialised once per plan epoch")),
                 out);
      return;
    }
    st.descriptor = h;
    st.initialised = true;
    st.values.assign(payload.begin(), payload.end());
    Reply(job, h, nullptr, out);
    ReleaseParked(job, st, out);
  } else if (h.kind == static_cast<uint8_t>(MessageKind::kPush)) {  // kPsDelta
    if (!st.initialised) {
      ReplyError(job, h,
                 absl::FailedPreconditionError(
                     absl::StrCat(What(job, h),
                                  ": push_delta before init_params (global rank 0 initialises "
                                  "the parameters; every rank calls init_params first)")),
                 out);
      return;
    }
    uint64_t& clock = st.clocks[h.root];
    if (h.step <= clock) {
      stats_.duplicate_deltas++;  // applied already: acknowledged, never applied twice
      Reply(job, h, nullptr, out);
      return;
    }
    if (h.step != clock + 1) {
      ReplyError(job, h,
                 absl::FailedPreconditionError(absl::StrCat(What(job, h), ": delta ", h.step,
                                                            " after delta ", clock,
                                                            " (deltas are applied in order)")),
                 out);
      return;
    }
    const float call_scale = std::bit_cast<float>(h.reserved1);
    const double scale = call_scale != 0.0f ? call_scale : job.delta_scale;
    ApplyDelta(static_cast<DataType>(h.dtype), st.values.data(), payload.data(), h.chunk_count,
               scale);
    clock = h.step;
    st.version++;
    stats_.deltas_applied++;
    Reply(job, h, nullptr, out);
    ReleaseParked(job, st, out);
  } else {  // kPull: kPsPull, or kPsInit on a rank other than 0
    if (st.initialised && st.values.size() != bytes) return;  // SameShape makes this impossible
    if (PullReady(job, st, h)) {
      Reply(job, h, &st, out);
    } else {
      stats_.pulls_parked++;
      st.parked.push_back(ParkedPull{h, clock_->Now() + job.op_timeout});
    }
  }
}

void ParameterServer::HandleMessage(const WireHeader& h, std::span<const std::byte> payload) {
  if (h.sender == WireHeader::kFromServer) {
    std::vector<Completion> done;
    {
      std::lock_guard lock(worker_mu_);
      WorkerHandle(h, payload, done);
    }
    RunAll(std::move(done));
    return;
  }
  if (h.kind == static_cast<uint8_t>(MessageKind::kError)) {
    stats_.malformed_messages++;  // workers never send errors
    return;
  }
  std::vector<Outgoing> out;
  {
    std::lock_guard lock(server_mu_);
    auto it = server_jobs_.find(h.job);
    if (it == server_jobs_.end()) {
      // No plan of the job here (yet): nobody's address to answer; the worker's deadline ends it.
      stats_.malformed_messages++;
      Log()->debug("parameter-server message for an unknown job dropped: {}", Describe(h));
    } else {
      ServerHandle(it->second, h, payload, out);
    }
  }
  SendAll(std::move(out));
}

void ParameterServer::ExpireStale() {
  const common::Clock::TimePoint now = clock_->Now();
  std::vector<Outgoing> out;
  {
    std::lock_guard lock(server_mu_);
    for (auto& [key, st] : chunks_) {
      if (st.parked.empty()) continue;
      auto j = server_jobs_.find(std::get<0>(key));
      if (j == server_jobs_.end()) continue;
      const JobView& job = *j->second.view;
      std::vector<ParkedPull> still;
      for (ParkedPull& p : st.parked) {
        if (p.deadline > now) {
          still.push_back(p);
          continue;
        }
        stats_.pulls_expired++;
        const double waited = MsOf(job.op_timeout);
        if (!st.initialised) {
          ReplyError(job, p.h,
                     absl::DeadlineExceededError(absl::StrCat(
                         What(job, p.h), ": not initialised after ", waited,
                         " ms (global rank 0 initialises the parameters with init_params; after "
                         "a plan change they are lost and rank 0 initialises them again)")),
                     out);
          continue;
        }
        const uint64_t slowest = *std::min_element(st.clocks.begin(), st.clocks.end());
        std::vector<uint32_t> behind;
        for (uint32_t w = 0; w < st.clocks.size(); ++w) {
          if (st.clocks[w] == slowest) behind.push_back(w);
        }
        ReplyError(job, p.h,
                   absl::DeadlineExceededError(absl::StrCat(
                       What(job, p.h), ": worker ", p.h.root, " has pushed ", st.clocks[p.h.root],
                       " deltas, more than the staleness bound ", job.staleness,
                       " ahead of the slowest worker(s) ", absl::StrJoin(behind, ", "), " (",
                       slowest, " deltas), after ", waited, " ms; is a worker stuck or gone?")),
                   out);
      }
      st.parked = std::move(still);
    }
  }
  SendAll(std::move(out));
  std::vector<Completion> done;
  {
    std::lock_guard lock(worker_mu_);
    for (auto it = ops_.begin(); it != ops_.end();) {
      auto next = std::next(it);
      const OpState& op = *it->second;
      if (op.deadline <= now) {
        FailOpLocked(
            it->first,
            absl::DeadlineExceededError(absl::StrCat(
                std::string(ReductionName(op.reduction)), " of '", op.name, "' in job '", op.job_id,
                "' (worker ", std::get<2>(it->first), "): ", op.remaining, " of ", op.num_chunks,
                " chunks unanswered by their summation servers after ",
                MsOf(2 * op.view->op_timeout), " ms")),
            done);
      }
      it = next;
    }
  }
  RunAll(std::move(done));
}

std::optional<ParameterServer::ChunkInfo> ParameterServer::Inspect(const std::string& job_id,
                                                                   const std::string& tensor_name,
                                                                   uint32_t chunk) const {
  std::lock_guard lock(server_mu_);
  auto it = chunks_.find({common::StableHash64(job_id), common::StableHash64(tensor_name), chunk});
  if (it == chunks_.end()) return std::nullopt;
  return ChunkInfo{it->second.version, it->second.clocks, it->second.initialised};
}

void ParameterServer::SendAll(std::vector<Outgoing> out) {
  for (Outgoing& o : out) {
    std::span<const std::byte> bytes;
    if (o.payload) bytes = *o.payload;
    transport_->Send(o.address, AsBytes(o.header), bytes,
                     [payload = o.payload, addr = o.address](absl::Status s) {
                       if (!s.ok()) {
                         Log()->warn("parameter-server answer to worker {} failed: {}", addr,
                                     s.message());
                       }
                     });
  }
}

void ParameterServer::RunAll(std::vector<Completion> done) {
  for (auto& [fn, status] : done) {
    if (fn) fn(std::move(status));
  }
}

}  // namespace tributary::dataplane
