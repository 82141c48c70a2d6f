#include "dataplane/collectives/allreduce_push_pull.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/buffer_pool.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/trace.h"

namespace tributary::dataplane {
namespace {

using common::DataType;
using common::DataTypeSize;

constexpr auto Log = common::ComponentLog<"dataplane">;

void UpdatePeak(std::atomic<uint64_t>& peak, uint64_t value) {
  uint64_t prev = peak.load();
  while (value > prev && !peak.compare_exchange_weak(prev, value)) {
  }
}

void AddGauge(std::atomic<uint64_t>& gauge, std::atomic<uint64_t>& peak, int64_t delta) {
  const uint64_t now = gauge.fetch_add(static_cast<uint64_t>(delta)) + delta;
  UpdatePeak(peak, now);
}

std::span<const std::byte> AsSpan(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// Descriptor fields that every contribution to one chunk must agree on.
bool SameDescriptor(const WireHeader& a, const WireHeader& b) {
  return a.dtype == b.dtype && a.reduce == b.reduce && a.tensor_count == b.tensor_count &&
         a.num_chunks == b.num_chunks && a.root == b.root && a.plan_version == b.plan_version;
}

std::string DescribeShape(const WireHeader& h) {
  return absl::StrCat(
      h.tensor_count, " x ", std::string(common::DataTypeName(static_cast<DataType>(h.dtype))),
      h.reduce == static_cast<uint8_t>(Reduction::kBroadcast)
          ? absl::StrCat(" broadcast from rank ", h.root)
          : absl::StrCat(" ", std::string(ReductionName(static_cast<Reduction>(h.reduce)))),
      " in ", h.num_chunks, " chunks (plan v", h.plan_version, ")");
}

uint64_t FloorKiB(uint64_t bytes) { return bytes / 1024 * 1024; }

}  // namespace

std::chrono::milliseconds RetainedLifetime(std::chrono::milliseconds op_timeout) {
  return std::max<std::chrono::milliseconds>(std::chrono::minutes(2),
                                             8 * (op_timeout + WorkerGrace(op_timeout)));
}

std::chrono::milliseconds WorkerGrace(std::chrono::milliseconds op_timeout) {
  return std::clamp<std::chrono::milliseconds>(op_timeout / 8, std::chrono::milliseconds(250),
                                               std::chrono::milliseconds(5000));
}

bool PartitionTuned(const JobView& job, uint64_t tensor_bytes) {
  return job.tune_partition && tensor_bytes >= 2 * kTuneMinPartition;
}

// ---------------------------------------------------------------------------------------------
// PushPullServer

PushPullServer::PushPullServer(Transport* transport, Reducer* reducer, const common::Clock* clock,
                               PushPullStats* stats)
    : transport_(transport), reducer_(reducer), clock_(clock), stats_(stats) {}

void PushPullServer::SetJob(const JobView& view) {
  std::vector<Parked> replay;
  std::vector<Outgoing> out;
  {
    std::lock_guard lock(mu_);
    auto old = jobs_.find(view.job_hash());
    if (old != jobs_.end() && old->second->plan_version < view.plan_version) {
      // A new epoch: what still accumulates under the old one can never complete consistently.
      FailEpochLocked(*old->second, view.plan_version, out);
    }
    if (old != jobs_.end() &&
        (old->second->partition_bytes != view.partition_bytes ||
         old->second->server_addresses.size() != view.server_addresses.size() ||
         !view.tune_partition)) {
      // The tuners' start and bounds came from the old plan: start over from the new one.
      const uint64_t job = view.job_hash();
      tuning_.erase(tuning_.lower_bound({job, 0}), tuning_.lower_bound({job + 1, 0}));
    }
    jobs_[view.job_hash()] = std::make_shared<const JobView>(view);
    absl::StatusOr<ChunkMap> map = ChunkMap::Create(view.server_weights);
    if (map.ok()) {
      maps_.insert_or_assign(view.job_hash(), *std::move(map));
    } else {
      maps_.erase(view.job_hash());
      Log()->error("job {} plan v{} has unusable weights: {}", view.job_id, view.plan_version,
                   map.status());
    }
    for (auto it = parked_.begin(); it != parked_.end();) {
      if (it->header.job == view.job_hash() && it->header.plan_version <= view.plan_version) {
        parked_bytes_ -= it->payload.size();
        replay.push_back(std::move(*it));
        it = parked_.erase(it);
      } else {
        ++it;
      }
    }
  }
  SendAll(std::move(out));
  for (const Parked& p : replay) HandlePush(p.header, p.payload);
}

void PushPullServer::FailEpochLocked(const JobView& job, uint64_t new_version,
                                     std::vector<Outgoing>& out) {
  const uint64_t job_hash = job.job_hash();
  // chunks_ is ordered by collective, then chunk: one descriptor per collective.
  std::vector<WireHeader> open;
  for (auto it = chunks_.lower_bound(ChunkKey{{job_hash, 0, 0}, 0});
       it != chunks_.end() && it->first.key.job == job_hash; ++it) {
    if (open.empty() || KeyOf(open.back()) != it->first.key) open.push_back(it->second.descriptor);
  }
  for (const WireHeader& h : open) {
    stats_->plan_change_failures++;
    const std::string what =
        absl::StrCat(Describe(h), " on summation server ", job.my_server_index);
    FailLocked(job, h,
               new_version == 0
                   ? WithEpoch(absl::UnavailableError(absl::StrCat(
                                   "job ", job.job_id, " (plan v", h.plan_version,
                                   ") left this node's plans during ", what, "; retry")),
                               h.plan_version)
                   : PlanChangedError(job.job_id, h.plan_version, new_version, what),
               out);
  }
}

void PushPullServer::RemoveJob(uint64_t job_hash) {
  std::vector<Outgoing> out;
  {
    std::lock_guard lock(mu_);
    if (auto job = jobs_.find(job_hash); job != jobs_.end()) {
      // Its unfinished collectives fail for every worker now, not at their deadline.
      FailEpochLocked(*job->second, 0, out);
    }
    jobs_.erase(job_hash);
    maps_.erase(job_hash);
    tuning_.erase(tuning_.lower_bound({job_hash, 0}), tuning_.lower_bound({job_hash + 1, 0}));
    for (auto it = chunks_.begin(); it != chunks_.end();) {
      if (it->first.key.job == job_hash) {
        if (it->second.sum) AddHeld(-static_cast<int64_t>(it->second.sum->size()));
        it = chunks_.erase(it);
      } else {
        ++it;
      }
    }
  }
  SendAll(std::move(out));
}

void PushPullServer::AddHeld(int64_t delta) {
  AddGauge(stats_->server_bytes_held, stats_->server_peak_bytes_held, delta);
}

void PushPullServer::HandlePush(const WireHeader& h, std::span<const std::byte> payload) {
  stats_->pushes_received++;
  std::vector<Outgoing> out;
  bool parked = false;
  {
    std::lock_guard lock(mu_);
    auto job_it = jobs_.find(h.job);
    if (job_it == jobs_.end() || h.plan_version > job_it->second->plan_version) {
      // The worker is ahead of us: park the push until our plan arrives.
      if (parked_bytes_ + payload.size() > kMaxParkedBytes) {
        Log()->warn(
            "push of {} for job {:016x} plan v{} dropped: no plan here and {} bytes "
            "already parked",
            Describe(h), h.job, h.plan_version, parked_bytes_);
        return;
      }
      parked_.push_back(Parked{h, {payload.begin(), payload.end()}, clock_->Now()});
      parked_bytes_ += payload.size();
      parked = true;
      Log()->debug("push of {} for job {:016x} plan v{} parked until the plan arrives", Describe(h),
                   h.job, h.plan_version);
    } else {
      HandlePushLocked(*job_it->second, h, payload, out);
    }
  }
  if (parked && on_plan_missing_) on_plan_missing_();
  SendAll(std::move(out));
}

void PushPullServer::HandlePushLocked(const JobView& job, const WireHeader& h,
                                      std::span<const std::byte> payload,
                                      std::vector<Outgoing>& out) {
  const uint32_t n = static_cast<uint32_t>(job.worker_addresses.size());
  if (h.sender >= n) {
    Log()->warn("push from rank {} of job {} with {} workers dropped", h.sender, job.job_id, n);
    stats_->malformed_messages++;
    return;
  }
  const CollectiveKey key = KeyOf(h);
  if (h.plan_version < job.plan_version) {
    // Epoch fencing: a push of an older plan is never summed. Its sender alone is told, for
    // its epoch, so that its attempt fails now (retriable) instead of at its deadline.
    stats_->fenced_messages++;
    if (Log()->should_log(spdlog::level::debug)) {
      Log()->debug("push of {} of job {} plan v{} from rank {} fenced: this server runs plan v{}",
                   Describe(h), job.job_id, h.plan_version, h.sender, job.plan_version);
    }
    ReplyErrorLocked(job, h,
                     PlanChangedError(job.job_id, h.plan_version, job.plan_version,
                                      absl::StrCat(Describe(h), " (summation server ",
                                                   job.my_server_index, ")")),
                     out);
  } else if (auto f = failures_.find({key, h.plan_version}); f != failures_.end()) {
    // A late contribution to a collective that already failed: tell its sender again.
    ReplyErrorLocked(job, h, f->second.status, out);
  } else if (auto map = maps_.find(h.job); map == maps_.end() || job.my_server_index < 0 ||
                                           map->second.ServerOf(h.tensor, h.num_chunks, h.chunk) !=
                                               static_cast<uint32_t>(job.my_server_index)) {
    FailLocked(job, h,
               absl::FailedPreconditionError(
                   absl::StrCat("job ", job.job_id, ": ", Describe(h), " pushed by rank ", h.sender,
                                " is not owned by summation server ", job.my_server_index)),
               out);
  } else {
    const ChunkKey ck{key, h.chunk};
    auto [it, inserted] = chunks_.try_emplace(ck);
    ChunkState& st = it->second;
    if (inserted) {
      st.descriptor = h;
      st.received.assign(n, false);
      st.started = clock_->Now();
      if (common::Trace::enabled()) st.first_push_at = std::chrono::steady_clock::now();
    }
    const bool broadcast = h.reduce == static_cast<uint8_t>(Reduction::kBroadcast);
    if (!SameDescriptor(st.descriptor, h)) {
      // Workers that disagree on the chunk count have lost track of the partition decisions
      // (say, one restarted): the tuner starts over from the plan's partition, as every worker
      // does on this error (PushPullWorker::HandleError), so the next iterations agree again.
      tuning_.erase({h.job, h.tensor});
      FailLocked(job, h,
                 absl::InvalidArgumentError(absl::StrCat(
                     "job ", job.job_id, ": workers disagree on ", Describe(h), ": rank ",
                     st.descriptor.sender, " submitted ", DescribeShape(st.descriptor), ", rank ",
                     h.sender, " submitted ", DescribeShape(h),
                     "; every worker must submit the same name with the same size and dtype")),
                 out);
    } else if (st.received[h.sender]) {
      // Summed once already: a duplicate is dropped, never added twice.
      stats_->duplicate_pushes++;
      Log()->warn("second push of {} of job {} from rank {} dropped", Describe(h), job.job_id,
                  h.sender);
    } else {
      st.received[h.sender] = true;
      st.num_received++;
      if (h.chunk == 0 && h.step != 0) {
        st.reports++;
        st.slowest_report = std::min(st.slowest_report, h.step);
      }

      if (!payload.empty()) {
        if (!st.sum) {
          st.sum = std::make_shared<std::vector<std::byte>>(payload.begin(), payload.end());
          AddHeld(static_cast<int64_t>(payload.size()));
        } else if (!broadcast) {
          const auto t0 = common::Trace::enabled() ? std::chrono::steady_clock::now()
                                                   : common::Trace::TimePoint{};
          reducer_->Sum(static_cast<DataType>(h.dtype), st.sum->data(), payload.data(),
                        h.chunk_count);
          if (common::Trace::enabled()) {
            common::Trace::Span("summation server: sum", "sum", t0,
                                std::chrono::steady_clock::now(),
                                {{"bytes", static_cast<int64_t>(payload.size())}});
          }
        }
        stats_->bytes_summed += payload.size();
        if (job.counters && h.sender < job.counters->summed.size()) {
          job.counters->summed[h.sender]->Increment(static_cast<double>(payload.size()));
        }
        if (Log()->should_log(spdlog::level::debug)) {
          Log()->debug("sum of {} ({} bytes) of job {} from worker {} ({}/{})", Describe(h),
                       payload.size(), job.job_id, h.sender, st.num_received, n);
        }
      }
      if (st.num_received == n) {
        if (common::Trace::enabled() && st.first_push_at.time_since_epoch().count() != 0) {
          common::Trace::Async("summation server: first to last push",
                               (h.tensor << 24) ^ (h.iteration << 16) ^ h.chunk, st.first_push_at,
                               std::chrono::steady_clock::now(),
                               {{"chunk", h.chunk}, {"last_rank", h.sender}});
        }
        WireHeader r = st.descriptor;
        r.kind = static_cast<uint8_t>(MessageKind::kResult);
        r.sender = WireHeader::kFromServer;
        r.chunk_offset = h.chunk_offset;
        r.chunk_count = h.chunk_count;
        r.step = 0;
        r.reserved1 = h.chunk == 0 ? DecideLocked(job, st) : 0;
        for (size_t w = 0; w < job.worker_addresses.size(); ++w) {
          out.push_back({job.worker_addresses[w], r, st.sum});
          if (job.counters && st.sum && w < job.counters->served.size()) {
            job.counters->served[w]->Increment(static_cast<double>(st.sum->size()));
          }
        }
        if (Log()->should_log(spdlog::level::debug)) {
          Log()->debug("result of {} of job {} complete, sent to {} workers", Describe(h),
                       job.job_id, job.worker_addresses.size());
        }
        AddHeld(-static_cast<int64_t>(st.sum ? st.sum->size() : 0));
        chunks_.erase(it);
      }
    }
  }
}

uint32_t PushPullServer::DecideLocked(const JobView& job, const ChunkState& st) {
  const WireHeader& h = st.descriptor;
  const uint64_t bytes = h.tensor_count * DataTypeSize(static_cast<DataType>(h.dtype));
  if (!PartitionTuned(job, bytes)) return 0;
  auto it = tuning_.find({h.job, h.tensor});
  if (it == tuning_.end()) {
    MiadTuner::Options o;
    o.min_bytes = kTuneMinPartition;
    const uint64_t servers = std::max<size_t>(1, job.server_addresses.size());
    o.max_bytes =
        std::max(kTuneMinPartition, FloorKiB(std::min(kTuneMaxPartition, bytes / servers)));
    o.initial_bytes = FloorKiB(job.partition_bytes);
    // Every size stays a whole number of KiB: min, max, initial and the steps are.
    it = tuning_.emplace(std::pair{h.job, h.tensor}, Tuning{MiadTuner(o), {}}).first;
  }
  Tuning& t = it->second;
  const uint64_t i = h.iteration;
  if (i >= 1 && st.reports == job.worker_addresses.size()) {
    // The reports measure iteration i - 1, cut by the newest decision of an iteration <= i - 3.
    uint64_t used = job.partition_bytes;
    if (i >= 3) {
      auto d = t.decided.upper_bound(i - 3);
      if (d != t.decided.begin()) used = std::prev(d)->second;
    }
    if (used == t.tuner.chunk_bytes()) {
      t.tuner.Report(static_cast<double>(st.slowest_report) * 1024);
    }
  }
  const uint64_t decision = t.tuner.chunk_bytes();
  t.decided[i] = decision;
  while (t.decided.size() > 8) t.decided.erase(t.decided.begin());
  return static_cast<uint32_t>(decision / 1024);
}

void PushPullServer::FailLocked(const JobView& job, const WireHeader& h, absl::Status status,
                                std::vector<Outgoing>& out) {
  const CollectiveKey key = KeyOf(h);
  // A failed collective carries no decision to the workers.
  if (auto t = tuning_.find({key.job, key.tensor}); t != tuning_.end()) {
    t->second.decided.erase(key.iteration);
  }
  Log()->warn("collective failed on summation server: {}", status.message());
  stats_->collectives_failed_on_server++;
  for (auto it = chunks_.lower_bound(ChunkKey{key, 0});
       it != chunks_.end() && it->first.key == key;) {
    if (it->second.sum) AddHeld(-static_cast<int64_t>(it->second.sum->size()));
    it = chunks_.erase(it);
  }
  failures_[{key, h.plan_version}] = Failure{status, clock_->Now() + 2 * job.op_timeout};
  WireHeader e = h;
  e.kind = static_cast<uint8_t>(MessageKind::kError);
  e.error_code = static_cast<uint32_t>(status.code());
  e.sender = WireHeader::kFromServer;
  const std::string msg(status.message());
  auto payload = std::make_shared<std::vector<std::byte>>(AsSpan(msg).begin(), AsSpan(msg).end());
  for (const std::string& addr : job.worker_addresses) out.push_back({addr, e, payload});
}

void PushPullServer::ReplyErrorLocked(const JobView& job, const WireHeader& h,
                                      const absl::Status& status, std::vector<Outgoing>& out) {
  WireHeader e = h;
  e.kind = static_cast<uint8_t>(MessageKind::kError);
  e.error_code = static_cast<uint32_t>(status.code());
  e.sender = WireHeader::kFromServer;
  const std::string msg(status.message());
  out.push_back({job.worker_addresses[h.sender], e,
                 std::make_shared<std::vector<std::byte>>(AsSpan(msg).begin(), AsSpan(msg).end())});
}

void PushPullServer::SendAll(std::vector<Outgoing> out) {
  for (Outgoing& o : out) {
    if (o.header.kind == static_cast<uint8_t>(MessageKind::kResult)) stats_->results_sent++;
    auto payload = o.payload;
    std::span<const std::byte> bytes;
    if (payload) bytes = *payload;
    const auto sent_at =
        common::Trace::enabled() ? std::chrono::steady_clock::now() : common::Trace::TimePoint{};
    transport_->Send(
        o.address, AsBytes(o.header), bytes,
        [this, payload, sent_at, addr = o.address, h = o.header](absl::Status s) {
          if (common::Trace::enabled() && sent_at.time_since_epoch().count() != 0) {
            common::Trace::Async(absl::StrCat("result to ", addr),
                                 (h.tensor << 24) ^ (h.iteration << 16) ^ h.chunk, sent_at,
                                 std::chrono::steady_clock::now(),
                                 {{"chunk", h.chunk},
                                  {"bytes", static_cast<int64_t>(payload ? payload->size() : 0)}});
          }
          if (!s.ok()) {
            stats_->send_failures++;
            // Described here, not per send: formatting it for every result cost the summation
            // servers 2.7% of their CPU on BERT-large's small tensors.
            Log()->warn("reply for {} to worker {} failed: {}", Describe(h), addr, s.message());
          }
        });
  }
}

void PushPullServer::HandleAbort(const WireHeader& h, std::string_view message) {
  std::vector<Outgoing> out;
  {
    std::lock_guard lock(mu_);
    auto job_it = jobs_.find(h.job);
    if (job_it == jobs_.end()) return;
    const JobView& job = *job_it->second;
    if (h.plan_version != job.plan_version) {
      stats_->fenced_messages++;  // an abort of another epoch's attempt
      Log()->debug("abort of {} of job {} plan v{} fenced: this server runs plan v{}", Describe(h),
                   job.job_id, h.plan_version, job.plan_version);
      return;
    }
    if (failures_.contains({KeyOf(h), h.plan_version})) return;
    FailLocked(
        job, h,
        absl::Status(static_cast<absl::StatusCode>(h.error_code),
                     absl::StrCat("job ", job.job_id, ": worker rank ", h.sender,
                                  " aborted tensor ", Describe(h), ": ", std::string(message))),
        out);
  }
  SendAll(std::move(out));
}

void PushPullServer::ExpireStale() {
  std::vector<Outgoing> out;
  {
    std::lock_guard lock(mu_);
    const auto now = clock_->Now();
    for (auto it = failures_.begin(); it != failures_.end();) {
      it = it->second.expires <= now ? failures_.erase(it) : std::next(it);
    }
    while (!parked_.empty() && now - parked_.front().arrived >= kMaxParkedAge) {
      Log()->warn("parked push of {} for job {:016x} plan v{} dropped: no such plan arrived",
                  Describe(parked_.front().header), parked_.front().header.job,
                  parked_.front().header.plan_version);
      parked_bytes_ -= parked_.front().payload.size();
      parked_.pop_front();
    }
    std::vector<std::pair<std::shared_ptr<const JobView>, WireHeader>> stale;
    std::vector<std::vector<bool>> stale_received;
    for (auto& [ck, st] : chunks_) {
      auto job = jobs_.find(ck.key.job);
      if (job == jobs_.end()) continue;
      if (now - st.started >= job->second->op_timeout) {
        stale.emplace_back(job->second, st.descriptor);
        stale_received.push_back(st.received);
      }
    }
    for (size_t i = 0; i < stale.size(); ++i) {
      const auto& [job, h] = stale[i];
      // Failed by an earlier chunk of this sweep.
      if (failures_.contains({KeyOf(h), h.plan_version})) continue;
      std::vector<uint32_t> missing;
      for (uint32_t r = 0; r < stale_received[i].size(); ++r) {
        if (!stale_received[i][r]) missing.push_back(r);
      }
      FailLocked(
          *job, h,
          absl::DeadlineExceededError(absl::StrCat(
              "job ", job->job_id, ": summation server ", job->my_server_index, " waited ",
              job->op_timeout.count(), " ms for ", Describe(h), " from worker ranks [",
              absl::StrJoin(missing, ","), "]; are they running and submitting the same tensors?")),
          out);
    }
  }
  SendAll(std::move(out));
}

// ---------------------------------------------------------------------------------------------
// PushPullWorker

struct PushPullWorker::OpState {
  Operation op;
  std::shared_ptr<const JobView> job;
  uint64_t job_hash = 0;
  uint64_t tensor_hash = 0;
  uint64_t seq = 0;
  uint32_t num_chunks = 0;
  size_t element_size = 0;
  ChunkMap map;
  // 0 queued; 1 being sent (holds credit); 3 sent, waiting for the sum; 4 summed before its
  // send completed (holds credit until then: the transport may still read the staging); 2 done;
  // 5 the operation failed while the chunk's send was in flight (see sends_at_failure).
  std::vector<uint8_t> chunk_state;
  uint32_t chunks_done = 0;
  // Chunks pushed to one server ahead of their sums, at most: kLonePushPullAhead for a lone op.
  uint32_t ahead() const { return op.lone ? kLonePushPullAhead : kPushPullAhead; }
  // Per server index: chunks pushed to it whose sum has not come back (at most ahead()), and
  // the positions (QueuedChunk::position) of its chunks still in the worker's queue.
  std::vector<uint32_t> outstanding;
  std::vector<std::set<uint32_t>> queued;
  common::Clock::TimePoint deadline;
  bool finished = false;
  // Results being written into the buffers outside the lock (HandleResult). A failure that
  // comes meanwhile completes the operation only when they are done (`failed`), so that the
  // caller, who may restore the inputs and retry, never races a late write of a sum.
  uint32_t writers = 0;
  std::optional<Completion> failed;
  // Sends the transport still held when the operation failed (chunks in state 5): they may read
  // the caller's buffer (a single local buffer is pushed without a copy), so the failure waits
  // for them too -- at most kFailedSendGrace from `failed_at`.
  uint32_t sends_at_failure = 0;
  common::Clock::TimePoint failed_at;
  // Partition tuning (see kTuneMinPartition): whether this op takes part, the partition it was
  // cut by, when it started on the injected clock, the report its chunk 0 carries (KiB/s) and
  // the decision its chunk-0 result carried (KiB).
  bool tuned = false;
  uint64_t partition = 0;
  common::Clock::TimePoint measure_start;
  uint32_t report = 0;
  uint32_t decision_kib = 0;
  // Wall-clock times for the trace (common/trace.h), kept only while one is recorded.
  common::Trace::TimePoint started_at;
  std::vector<common::Trace::TimePoint> sent_at, send_done_at;
  // Peer recovery (see kDefaultRetainBytes). `sums` receives a copy of every chunk's sum as it
  // is written (null: over the budget, or a single worker); `writing` marks chunks whose sum is
  // being written outside the lock, so that a peer's copy and the server's never both land.
  std::shared_ptr<std::byte[]> sums;
  std::vector<uint8_t> writing;
  bool recovering = false;
  absl::Status recovery_failure;  // what the op fails with if no peer has its sums
  common::Clock::TimePoint recovery_deadline;
  std::vector<bool> answered;  // by worker rank
  uint32_t answers_pending = 0;
  int fetch_from = -1;          // the peer asked for the missing chunks
  std::vector<uint32_t> haves;  // peers that answered yes, not asked yet (the next to ask)
  // Peers that asked about this op before it ended here: (rank, their attempt's epoch).
  std::vector<std::pair<uint32_t, uint64_t>> peer_queries;

  OpState(ChunkMap m) : map(std::move(m)) {}

  bool is_broadcast() const { return op.reduction == Reduction::kBroadcast; }
  WireHeader Header(uint32_t chunk) const {
    WireHeader h;
    h.kind = static_cast<uint8_t>(MessageKind::kPush);
    h.dtype = static_cast<uint8_t>(op.dtype);
    h.reduce = static_cast<uint8_t>(op.reduction);
    h.algorithm = static_cast<uint8_t>(Algorithm::kPushPull);
    h.job = job_hash;
    h.tensor = tensor_hash;
    h.iteration = op.iteration;
    h.plan_version = job->plan_version;
    h.tensor_count = op.count;
    h.num_chunks = num_chunks;
    h.chunk = chunk;
    const ChunkRange r = GetChunk(op.count, num_chunks, chunk);
    h.chunk_offset = r.offset;
    h.chunk_count = r.count;
    h.sender = static_cast<uint32_t>(job->my_worker_rank);
    h.root = is_broadcast() ? op.root_node : 0;
    if (chunk == 0) h.step = report;
    return h;
  }
  uint64_t ChunkBytes(uint32_t chunk) const {
    return GetChunk(op.count, num_chunks, chunk).count * element_size;
  }
  // Whether the chunk's input is in the buffers (StagedInput: copied in while the op runs).
  bool ChunkStaged(uint32_t chunk) const {
    if (op.staged == nullptr) return true;
    const ChunkRange r = GetChunk(op.count, num_chunks, chunk);
    return op.staged->ready() >= (r.offset + r.count) * element_size;
  }
};

PushPullWorker::PushPullWorker(Transport* transport, Reducer* reducer, const common::Clock* clock,
                               PushPullStats* stats)
    : transport_(transport), reducer_(reducer), clock_(clock), stats_(stats) {}

PushPullWorker::~PushPullWorker() = default;

void PushPullWorker::SetJob(const JobView& view) {
  std::vector<std::function<void()>> sends;
  std::vector<Completion> done;
  {
    std::lock_guard lock(mu_);
    const uint64_t job_hash = view.job_hash();
    if (auto old = jobs_.find(job_hash);
        old != jobs_.end() && old->second->generation != view.generation) {
      // A new membership generation counts its iterations from 0 again: the kept sums belong to
      // collectives no one will ask about.
      retained_.erase(retained_.lower_bound({job_hash, 0}),
                      retained_.lower_bound({job_hash + 1, 0}));
    }
    jobs_[job_hash] = std::make_shared<const JobView>(view);
    const std::set<std::string> worker_set(view.worker_addresses.begin(),
                                           view.worker_addresses.end());
    dedicated_servers_[job_hash] =
        std::any_of(view.server_addresses.begin(), view.server_addresses.end(),
                    [&](const std::string& a) { return !worker_set.contains(a); });
    // An operation of an older epoch that waits on a summation server the new plan dropped (it
    // died, or was taken away) can never complete: fail it now, retriable. The others go on:
    // their servers decide (PushPullServer fails what is unfinished when it switches plans).
    const std::set<std::string> servers(view.server_addresses.begin(), view.server_addresses.end());
    std::vector<std::pair<CollectiveKey, std::string>> lost;
    for (auto it = ops_.lower_bound({job_hash, 0, 0});
         it != ops_.end() && it->first.job == job_hash; ++it) {
      const OpState& op = *it->second;
      if (op.job->plan_version >= view.plan_version) continue;
      for (uint32_t c = 0; c < op.num_chunks; ++c) {
        if (op.chunk_state[c] == 2 || op.chunk_state[c] == 4) continue;  // summed
        const std::string& server =
            op.job->server_addresses[op.map.ServerOf(op.tensor_hash, op.num_chunks, c)];
        if (!servers.contains(server)) {
          lost.emplace_back(it->first, server);
          break;
        }
      }
    }
    for (const auto& [key, server] : lost) {
      const OpState& op = *ops_[key];
      stats_->plan_change_failures++;
      FailOrRecoverLocked(
          key,
          PlanChangedError(
              view.job_id, op.job->plan_version, view.plan_version,
              absl::StrCat("tensor '", op.op.tensor_name, "' iteration ", key.iteration,
                           " (summation server ", server, " left the plan)")),
          done);
    }
    // Peer recovery: a worker the new plan dropped will not answer (it died, or left an elastic
    // job).
    std::vector<CollectiveKey> recovering;
    for (auto it = ops_.lower_bound({job_hash, 0, 0});
         it != ops_.end() && it->first.job == job_hash; ++it) {
      OpState& op = *it->second;
      if (!op.recovering) continue;
      auto gone = [&](uint32_t r) { return !worker_set.contains(op.job->worker_addresses[r]); };
      for (uint32_t r = 0; r < op.answered.size(); ++r) {
        if (!op.answered[r] && gone(r)) {
          op.answered[r] = true;
          op.answers_pending--;
        }
      }
      std::erase_if(op.haves, gone);
      if (op.fetch_from >= 0 && gone(static_cast<uint32_t>(op.fetch_from))) {
        op.fetch_from = -1;
        FetchNextLocked(op, done);
      }
      recovering.push_back(it->first);
    }
    for (const CollectiveKey& key : recovering) MaybeEndRecoveryLocked(key, done);
    // Before any push of the new view goes: the transport sets a limit before it posts any
    // send made after the call.
    UpdateUnsentLimitsLocked();
    PumpLocked(sends);
  }
  Flush(std::move(sends), std::move(done));
}

void PushPullWorker::UpdateUnsentLimitsLocked() {
  // The spare servers of every job, less every job's workers: a connection the ring may use
  // keeps the transport's default.
  std::set<std::string> spares, workers;
  for (const auto& [hash, job] : jobs_) {
    workers.insert(job->worker_addresses.begin(), job->worker_addresses.end());
    spares.insert(job->server_addresses.begin(), job->server_addresses.end());
  }
  const uint32_t limit = server_backlog_bytes_ > 0 ? spare_unsent_limit_ : 0;
  std::map<std::string, uint32_t> want;
  if (limit > 0) {
    for (const std::string& a : spares) {
      if (!workers.contains(a)) want[a] = limit;
    }
  }
  for (const auto& [address, bytes] : unsent_limits_) {
    if (!want.contains(address)) transport_->SetPeerUnsentLimit(address, 0);
  }
  for (const auto& [address, bytes] : want) {
    auto it = unsent_limits_.find(address);
    if (it == unsent_limits_.end() || it->second != bytes) {
      transport_->SetPeerUnsentLimit(address, bytes);
    }
  }
  unsent_limits_ = std::move(want);
}

void PushPullWorker::RemoveJob(uint64_t job_hash) {
  std::vector<Completion> done;
  {
    std::lock_guard lock(mu_);
    jobs_.erase(job_hash);
    dedicated_servers_.erase(job_hash);
    UpdateUnsentLimitsLocked();
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->first.job != job_hash) {
        ++it;
        continue;
      }
      for (Held& held : it->second) {
        done.emplace_back(std::move(held.op.done),
                          absl::CancelledError("the job was removed from this node's plan"));
      }
      it = held_.erase(it);
    }
    tuning_.erase(tuning_.lower_bound({job_hash, 0}), tuning_.lower_bound({job_hash + 1, 0}));
    retained_.erase(retained_.lower_bound({job_hash, 0}), retained_.lower_bound({job_hash + 1, 0}));
    std::vector<CollectiveKey> keys;
    for (auto& [key, op] : ops_) {
      if (key.job == job_hash) keys.push_back(key);
    }
    for (const auto& key : keys) {
      FailLocked(key, absl::CancelledError("the job was removed from this node's plan"), done);
    }
  }
  Flush({}, std::move(done));
}

void PushPullWorker::ReleaseCreditLocked(OpState& op, uint32_t chunk) {
  const uint64_t bytes = op.ChunkBytes(chunk);
  in_flight_bytes_[op.job_hash] -= bytes;
  // Counted only while a backlog was set (PumpLocked); looked up whatever the limit is now, so a
  // limit set to 0 and back never leaves counts that no completion will take away.
  if (!server_unsent_.empty()) {
    auto u = server_unsent_.find(
        op.job->server_addresses[op.map.ServerOf(op.tensor_hash, op.num_chunks, chunk)]);
    if (u != server_unsent_.end()) {
      u->second -= std::min(u->second, bytes);
      if (u->second == 0) server_unsent_.erase(u);
    }
  }
  AddInFlight(-static_cast<int64_t>(bytes));
}

void PushPullWorker::AddInFlight(int64_t delta) {
  AddGauge(stats_->worker_bytes_in_flight, stats_->worker_peak_bytes_in_flight, delta);
  if (delta > 0) {
    stats_->worker_chunks_in_flight++;
  } else if (delta < 0) {
    stats_->worker_chunks_in_flight--;
  }
}

absl::Status PushPullWorker::Start(const std::string& job_id, Operation op) {
  std::vector<std::function<void()>> sends;
  {
    std::lock_guard lock(mu_);
    if (absl::Status s = StartLocked(job_id, op, std::nullopt); !s.ok()) return s;
    PumpLocked(sends);
  }
  Flush(std::move(sends), {});
  return absl::OkStatus();
}

void PushPullWorker::Pump() {
  std::vector<std::function<void()>> sends;
  {
    std::lock_guard lock(mu_);
    PumpLocked(sends);
  }
  Flush(std::move(sends), {});
}

bool PushPullWorker::IsHeldLocked(const CollectiveKey& key) const {
  if (key.iteration < 2) return false;
  auto it = held_.find(CollectiveKey{key.job, key.tensor, key.iteration - 2});
  if (it == held_.end()) return false;
  return std::any_of(it->second.begin(), it->second.end(),
                     [&](const Held& h) { return h.op.iteration == key.iteration; });
}

void PushPullWorker::ReleaseHeldLocked(const CollectiveKey& key, std::vector<Completion>& done) {
  auto it = held_.find(key);
  if (it == held_.end()) return;
  std::vector<Held> held = std::move(it->second);
  held_.erase(it);
  for (Held& h : held) {
    if (absl::Status s = StartLocked(h.job_id, h.op, h.deadline); !s.ok()) {
      done.emplace_back(std::move(h.op.done), std::move(s));
    }
  }
}

absl::Status PushPullWorker::StartLocked(const std::string& job_id, Operation& op,
                                         std::optional<common::Clock::TimePoint> deadline) {
  const uint64_t job_hash = common::StableHash64(job_id);
  {
    auto job_it = jobs_.find(job_hash);
    if (job_it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("job '", job_id, "' has no plan on this node"));
    }
    std::shared_ptr<const JobView> job = job_it->second;
    if (job->my_worker_rank < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("this node is not a worker of job '", job_id, "'"));
    }
    const std::string what = absl::StrCat("job '", job_id, "' tensor '", op.tensor_name, "'");
    const size_t element_size = DataTypeSize(op.dtype);
    if (element_size == 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": unknown dtype"));
    }
    if (op.count == 0 || op.count > (uint64_t{1} << 40) / element_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": count ", op.count, " must be in [1, 2^40 bytes / element size]"));
    }
    if (op.buffers.size() != job->procs_per_node) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", op.buffers.size(),
                                                     " local buffers for ", job->procs_per_node,
                                                     " processes per node"));
    }
    if (std::find(op.buffers.begin(), op.buffers.end(), nullptr) != op.buffers.end()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": null buffer"));
    }
    if (op.reduction == Reduction::kBroadcast &&
        (op.root_node >= job->worker_addresses.size() || op.root_local >= op.buffers.size())) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": broadcast root out of range"));
    }
    const uint64_t tensor_hash = common::StableHash64(op.tensor_name);
    const CollectiveKey key{job_hash, tensor_hash, op.iteration};
    if (ops_.contains(key) || IsHeldLocked(key)) {
      return absl::AlreadyExistsError(
          absl::StrCat(what, " iteration ", op.iteration, " is already running"));
    }
    auto map = ChunkMap::Create(job->server_weights);
    if (!map.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", job_id, "' has an invalid plan: ", map.status().message()));
    }
    // A lone collective's chunks are its own (PushPullChunks): no partition to tune, and no
    // iteration held for the one two before.
    const bool tuned = !op.lone && PartitionTuned(*job, op.count * element_size);
    if (tuned && op.iteration >= 2) {
      // The partition of iteration j is decided by iteration j - 2's result: wait for it.
      const CollectiveKey before{job_hash, tensor_hash, op.iteration - 2};
      if (ops_.contains(before) || IsHeldLocked(before)) {
        if (Log()->should_log(spdlog::level::debug)) {
          Log()->debug("{} iteration {} waits for iteration {} (partition tuning)", what,
                       op.iteration, before.iteration);
        }
        held_[before].push_back(Held{
            job_id, std::move(op),
            deadline.value_or(clock_->Now() + job->op_timeout + WorkerGrace(job->op_timeout))});
        stats_->ops_held++;
        return absl::OkStatus();
      }
    }
    uint64_t partition = job->partition_bytes;
    if (tuned) {
      TensorTuning& t = tuning_[{job_hash, tensor_hash}];
      if (op.iteration >= 2) {
        auto d = t.decisions.upper_bound(op.iteration - 2);
        if (d != t.decisions.begin()) partition = std::prev(d)->second;
      }
      if (partition != (t.last_partition == 0 ? job->partition_bytes : t.last_partition)) {
        stats_->partition_decisions_applied++;
        Log()->debug("{}: partition {} -> {} bytes from iteration {}", what,
                     t.last_partition == 0 ? job->partition_bytes : t.last_partition, partition,
                     op.iteration);
        if (common::Trace::enabled()) {
          common::Trace::Counter(absl::StrCat("partition ", op.tensor_name),
                                 std::chrono::steady_clock::now(), static_cast<int64_t>(partition));
        }
      }
      t.last_partition = partition;
    }
    auto state = std::make_shared<OpState>(*std::move(map));
    state->job = job;
    state->job_hash = job_hash;
    state->tensor_hash = tensor_hash;
    state->seq = next_seq_++;
    state->element_size = element_size;
    state->tuned = tuned;
    state->partition = partition;
    state->measure_start = clock_->Now();
    state->num_chunks =
        PushPullChunks(op.count, element_size, partition, state->map.num_servers(), op.lone);
    state->chunk_state.assign(state->num_chunks, 0);
    state->outstanding.assign(state->map.num_servers(), 0);
    state->queued.assign(state->map.num_servers(), {});
    state->deadline =
        deadline.value_or(clock_->Now() + job->op_timeout + WorkerGrace(job->op_timeout));
    if (common::Trace::enabled()) {
      state->started_at = std::chrono::steady_clock::now();
      state->sent_at.resize(state->num_chunks);
      state->send_done_at.resize(state->num_chunks);
    }
    const std::vector<uint32_t> order = state->map.SendOrder(
        tensor_hash, state->num_chunks, static_cast<uint32_t>(job->my_worker_rank));
    std::multiset<uint64_t>& queued = queued_bytes_[job_hash];
    for (uint32_t p = 0; p < order.size(); ++p) {
      const uint32_t chunk = order[p];
      const uint64_t chunk_bytes =
          GetChunk(op.count, state->num_chunks, chunk).count * element_size;  // ChunkBytes
      const uint32_t server = state->map.ServerOf(tensor_hash, state->num_chunks, chunk);
      queue_.insert(QueuedChunk{op.priority, state->seq, p, chunk, key, server, chunk_bytes});
      state->queued[server].insert(p);
      queued.insert(chunk_bytes);
    }
    const uint64_t bytes = op.count * element_size;
    if (job->num_workers() > 1 && dedicated_servers_[job_hash]) {
      // Peer recovery keeps a copy of the sums (see kDefaultRetainBytes).
      // From the process's pool: last iteration's pages, already mapped (common/buffer_pool.h).
      // The budget counts the memory held, the buffer's size class (up to a quarter more).
      const uint64_t held = common::BufferPool::ClassBytes(bytes);
      if (stats_->worker_retained_bytes.load() + held <= retain_budget_) {
        stats_->worker_retained_bytes += held;
        std::shared_ptr<std::byte[]> buffer = common::BufferPool::Process().Get(bytes);
        std::byte* const data = buffer.get();
        state->sums = std::shared_ptr<std::byte[]>(
            data, [this, held, buffer = std::move(buffer)](std::byte*) mutable {
              stats_->worker_retained_bytes -= held;
              buffer.reset();
            });
      }
    }
    state->writing.assign(state->num_chunks, 0);
    state->op = std::move(op);
    ops_[key] = std::move(state);
    stats_->ops_started++;
  }
  return absl::OkStatus();
}

void PushPullWorker::PumpLocked(std::vector<std::function<void()>>& sends) {
  // Jobs none of whose queued chunks fits the credit left: once every job with queued chunks is
  // one, no chunk further down the queue can go, and the walk stops (with every tensor of an
  // iteration queued at once, walking the rest for every result cost more than the sends).
  // An operation's chunks are consecutive in the queue (it is ordered by priority, then op):
  // the op is looked up once for all of them, and an op none of whose queued chunks has room in
  // its server's window is passed over in one step. (Walking each of its chunks, for every
  // result, was a tenth of a worker agent's CPU on ResNet-50 with every tensor queued at once:
  // 370 chunks passed per result, nearly all held by the window.) Within an operation, the walk
  // jumps past chunks whose server's window is full, and past all of them when not even its
  // smallest chunk fits the credit left: it passes each operation at most once, not each chunk.
  const auto window_full = [](const OpState& o) {
    for (size_t s = 0; s < o.queued.size(); ++s) {
      if (!o.queued[s].empty() && o.outstanding[s] < o.ahead()) return false;
    }
    return true;
  };
  const auto next_op = [this](const QueuedChunk& c) {
    return queue_.lower_bound(QueuedChunk{c.priority, c.seq + 1, 0, 0, CollectiveKey{}});
  };
  // The op's next queued chunk after `c` whose server has room; else the next op's first.
  const auto next_with_room = [this, &next_op](const OpState& o, const QueuedChunk& c) {
    uint32_t next = std::numeric_limits<uint32_t>::max();
    for (size_t s = 0; s < o.queued.size(); ++s) {
      if (o.outstanding[s] >= o.ahead()) continue;
      auto p = o.queued[s].upper_bound(c.position);
      if (p != o.queued[s].end()) next = std::min(next, *p);
    }
    if (next == std::numeric_limits<uint32_t>::max()) return next_op(c);
    return queue_.lower_bound(QueuedChunk{c.priority, c.seq, next, 0, CollectiveKey{}});
  };
  std::vector<uint64_t> credit_bound;
  // Jobs whose next chunk's connection is at its backlog (SetServerBacklog): passed over.
  std::vector<uint64_t> backlog_bound;
  // Whether every job with queued chunks is bound by its credit or its backlog.
  const auto all_bound = [&] {
    size_t n = credit_bound.size();
    for (uint64_t j : backlog_bound) {
      n += std::find(credit_bound.begin(), credit_bound.end(), j) == credit_bound.end();
    }
    return n == queued_bytes_.size();
  };
  std::shared_ptr<OpState> op;  // the op of the chunk at `it`, once looked up
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (!backlog_bound.empty() &&
        std::find(backlog_bound.begin(), backlog_bound.end(), it->key.job) != backlog_bound.end()) {
      it = next_op(*it);
      continue;
    }
    if (op == nullptr || op->seq != it->seq) {  // seq: unique per operation
      auto op_it = ops_.find(it->key);
      if (op_it == ops_.end() || op_it->second->seq != it->seq) {
        // Its operation ended (a retry of the same collective is a new operation with its own
        // chunks, server and sizes).
        op = nullptr;
        it = EraseQueuedLocked(it, nullptr);
        continue;
      }
      op = op_it->second;
      if (window_full(*op)) {
        stats_->ahead_waits++;
        it = next_op(*it);
        continue;
      }
    }
    if (!op->ChunkStaged(it->chunk)) {
      stats_->staging_waits++;
      ++it;  // its input is still being copied in (StagedInput): later chunks, other ops may go
      continue;
    }
    const uint64_t bytes = it->bytes;
    const uint32_t server = it->server;
    if (op->outstanding[server] >= op->ahead()) {
      stats_->ahead_waits++;
      it = next_with_room(*op, *it);  // its chunks for other servers, and other ops, may go
      continue;
    }
    uint64_t& in_flight = in_flight_bytes_[op->job_hash];
    if (in_flight > 0 && in_flight + bytes > op->job->credit_bytes) {
      stats_->credit_waits++;
      // (Operations started under an earlier plan carry its credit: after a plan change the
      // bound may hold one of them back until the next pump, never for good.)
      const auto queued = queued_bytes_.find(op->job_hash);
      if (queued != queued_bytes_.end() &&
          in_flight + *queued->second.begin() > op->job->credit_bytes &&
          std::find(credit_bound.begin(), credit_bound.end(), op->job_hash) == credit_bound.end()) {
        credit_bound.push_back(op->job_hash);
        if (all_bound()) break;
      }
      // Another job's credit, or a smaller chunk, may still go. An even split makes every chunk
      // of this op at least count / num_chunks elements (GetChunk): when that does not fit,
      // none of its chunks does.
      const uint64_t smallest = op->op.count / op->num_chunks * op->element_size;
      it = in_flight + smallest > op->job->credit_bytes ? next_op(*it) : std::next(it);
      continue;
    }
    if (server_backlog_bytes_ > 0) {
      uint64_t& unsent = server_unsent_[op->job->server_addresses[server]];
      if (unsent > 0 && unsent + bytes > server_backlog_bytes_) {
        // Lockstep (SetServerBacklog): the job hands nothing further down its queue until this
        // connection has sent more.
        stats_->backlog_waits++;
        backlog_bound.push_back(op->job_hash);
        if (all_bound()) break;
        it = next_op(*it);
        continue;
      }
      unsent += bytes;
    }
    in_flight += bytes;
    op->outstanding[server]++;
    if (it->chunk == 0 && op->tuned) {
      // Chunk 0 reports this worker's throughput of the previous iteration to the home server.
      auto t = tuning_.find({op->job_hash, op->tensor_hash});
      if (t != tuning_.end() && t->second.has_report &&
          t->second.reported_iteration + 1 == op->op.iteration) {
        op->report = t->second.report_kib_s;
      }
    }
    AddInFlight(static_cast<int64_t>(bytes));
    op->chunk_state[it->chunk] = 1;
    if (!op->sent_at.empty()) op->sent_at[it->chunk] = std::chrono::steady_clock::now();
    sends.push_back([this, op, chunk = it->chunk] { SendChunk(op, chunk); });
    const QueuedChunk sent = *it;
    it = EraseQueuedLocked(it, op.get());
    if (it != queue_.end() && it->seq == sent.seq && window_full(*op)) it = next_op(sent);
  }
  stats_->worker_queued_chunks = queue_.size();
}

std::set<PushPullWorker::QueuedChunk>::iterator PushPullWorker::EraseQueuedLocked(
    std::set<QueuedChunk>::iterator it, OpState* op) {
  if (op != nullptr) op->queued[it->server].erase(it->position);
  auto job = queued_bytes_.find(it->key.job);
  if (job != queued_bytes_.end()) {
    auto size = job->second.find(it->bytes);
    if (size != job->second.end()) job->second.erase(size);
    if (job->second.empty()) queued_bytes_.erase(job);
  }
  return queue_.erase(it);
}

void PushPullWorker::SendChunk(std::shared_ptr<OpState> op, uint32_t chunk) {
  const WireHeader h = op->Header(chunk);
  const uint64_t bytes = h.chunk_count * op->element_size;
  const uint64_t offset = h.chunk_offset * op->element_size;
  const std::string& server =
      op->job->server_addresses[op->map.ServerOf(h.tensor, h.num_chunks, chunk)];
  std::span<const std::byte> payload;
  std::shared_ptr<std::vector<std::byte>> staging;
  const auto& buffers = op->op.buffers;
  if (op->is_broadcast()) {
    if (h.sender == h.root) payload = {buffers[op->op.root_local] + offset, bytes};
  } else if (buffers.size() == 1) {
    payload = {buffers[0] + offset, bytes};
  } else {
    // Aggregate the local processes' chunks first: one push per node.
    staging = std::shared_ptr<std::vector<std::byte>>(
        new std::vector<std::byte>(bytes), [this](std::vector<std::byte>* v) {
          AddGauge(stats_->worker_staging_bytes, stats_->worker_peak_staging_bytes,
                   -static_cast<int64_t>(v->size()));
          delete v;
        });
    AddGauge(stats_->worker_staging_bytes, stats_->worker_peak_staging_bytes,
             static_cast<int64_t>(bytes));
    reducer_->Sum2(op->op.dtype, staging->data(), buffers[0] + offset, buffers[1] + offset,
                   h.chunk_count);
    for (size_t b = 2; b < buffers.size(); ++b) {
      reducer_->Sum(op->op.dtype, staging->data(), buffers[b] + offset, h.chunk_count);
    }
    payload = *staging;
  }
  stats_->chunks_pushed++;
  stats_->bytes_pushed += payload.size();
  const uint32_t server_index = op->map.ServerOf(h.tensor, h.num_chunks, chunk);
  if (op->job->counters && server_index < op->job->counters->pushed.size()) {
    op->job->counters->pushed[server_index]->Increment(static_cast<double>(payload.size()));
  }
  if (Log()->should_log(spdlog::level::debug)) {
    Log()->debug("push of {} ({} bytes) of job {} tensor '{}' to server {}", Describe(h),
                 payload.size(), op->job->job_id, op->op.tensor_name, server);
  }
  const CollectiveKey key{op->job_hash, op->tensor_hash, op->op.iteration};
  transport_->Send(
      server, AsBytes(h), payload,
      [this, op, chunk, staging = std::move(staging), key, server, h](absl::Status s) mutable {
        // The transport is done with the payload: free the staging now, before more
        // chunks are pumped below, not when the transport gets round to destroying
        // this callback (staging stays within the credit window plus one chunk).
        staging.reset();
        if (!s.ok()) stats_->send_failures++;
        std::vector<std::function<void()>> sends;
        std::vector<Completion> done;
        {
          std::lock_guard lock(mu_);
          uint8_t& state = op->chunk_state[chunk];
          if (!op->send_done_at.empty()) {
            op->send_done_at[chunk] = std::chrono::steady_clock::now();
          }
          if (state == 5) {
            // The operation failed meanwhile; the transport is done with the buffer.
            state = 2;
            if (--op->sends_at_failure == 0 && op->writers == 0 && op->failed) {
              done.push_back(*std::move(op->failed));
              op->failed.reset();
              std::erase(draining_, op);
            }
          } else if (state == 4) {
            // The sum overtook this completion: now the chunk is done.
            ReleaseCreditLocked(*op, chunk);
            ChunkDoneLocked(op, chunk, done);
            PumpLocked(sends);
          } else if (!op->finished && state == 1) {
            if (s.ok()) {
              // Sent: the credit covers only what waits to be sent, so that no worker
              // waits for another worker's pushes to free its own window (with
              // different submission orders that would deadlock), and later
              // high-priority chunks still go first.
              ReleaseCreditLocked(*op, chunk);
              state = 3;
              PumpLocked(sends);
            } else {
              FailLocked(key,
                         absl::UnavailableError(absl::StrCat("push of ", Describe(h),
                                                             " to summation server ", server,
                                                             " failed: ", s.message())),
                         done);
              PumpLocked(sends);  // ops held for this one may have started
            }
          }  // else the operation failed meanwhile: FailLocked returned the credit
        }
        Flush(std::move(sends), std::move(done));
      });
}

void PushPullWorker::Abort(const std::string& job_id, const std::string& tensor_name,
                           uint64_t iteration, const absl::Status& reason) {
  std::shared_ptr<const JobView> job;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(common::StableHash64(job_id));
    if (it == jobs_.end() || it->second->my_worker_rank < 0) return;
    job = it->second;
  }
  auto map = ChunkMap::Create(job->server_weights);
  if (!map.ok()) return;
  WireHeader h;
  h.kind = static_cast<uint8_t>(MessageKind::kAbort);
  h.algorithm = static_cast<uint8_t>(Algorithm::kPushPull);
  h.job = job->job_hash();
  h.tensor = common::StableHash64(tensor_name);
  h.iteration = iteration;
  h.plan_version = job->plan_version;
  h.sender = static_cast<uint32_t>(job->my_worker_rank);
  h.error_code = static_cast<uint32_t>(reason.code());
  auto msg = std::make_shared<std::string>(reason.message());
  // Chunk 0 of any size lands on the same server: that server has seen (or will see) every
  // worker of this collective.
  const std::string& home = job->server_addresses[map->ServerOf(h.tensor, 1, 0)];
  transport_->Send(home, AsBytes(h), AsSpan(*msg), [msg, home](absl::Status s) {
    if (!s.ok()) Log()->warn("abort to summation server {} failed: {}", home, s.message());
  });
}

void PushPullWorker::HandleResult(const WireHeader& h, std::span<const std::byte> payload) {
  // A sum from a summation server, or a copy of one from a worker (peer recovery).
  const bool from_peer = h.sender != WireHeader::kFromServer;
  std::shared_ptr<OpState> op;
  {
    std::lock_guard lock(mu_);
    auto it = ops_.find(KeyOf(h));
    if (it == ops_.end()) {
      Log()->debug("result for {} of no running operation dropped", Describe(h));
      return;
    }
    op = it->second;
    if (h.plan_version != op->job->plan_version) {
      // Epoch fencing: a sum of another attempt of this iteration (say, a late result of the
      // attempt that failed before a re-plan) never lands in this attempt's buffers.
      stats_->fenced_messages++;
      Log()->debug("result for {} of plan v{} fenced: the operation runs plan v{}", Describe(h),
                   h.plan_version, op->job->plan_version);
      return;
    }
    if (from_peer && (!op->recovering || static_cast<int>(h.sender) != op->fetch_from)) {
      Log()->debug("sum of {} from worker {} dropped: not asked for", Describe(h), h.sender);
      return;
    }
    // A peer's copy may also fill a chunk this attempt never pushed (state 0, see
    // FailOrRecoverLocked).
    if (h.num_chunks != op->num_chunks || h.tensor_count != op->op.count ||
        h.dtype != static_cast<uint8_t>(op->op.dtype) ||
        (op->chunk_state[h.chunk] != 1 && op->chunk_state[h.chunk] != 3 &&
         !(from_peer && op->chunk_state[h.chunk] == 0))) {
      if (from_peer && op->num_chunks == h.num_chunks) return;  // the server's sum came first
      Log()->warn("result for {} does not match the running operation; dropped", Describe(h));
      stats_->malformed_messages++;
      return;
    }
    if (op->writing[h.chunk]) return;  // the same sum, from the server and from a peer
    if (!op->ChunkStaged(h.chunk)) {
      // A peer's copy of a chunk whose input is still being copied in (never pushed): the copy
      // would overwrite it. Dropped; the operation ends by its deadline if nothing else comes.
      Log()->debug("sum of {} from worker {} dropped: its input is still being staged", Describe(h),
                   h.sender);
      return;
    }
    op->writing[h.chunk] = 1;
    op->writers++;
  }
  // Write the sum into every local buffer outside the lock. The buffers stay mapped: `op` holds
  // the keepalive, and only this chunk's range is touched.
  const uint64_t offset = h.chunk_offset * op->element_size;
  const auto& buffers = op->op.buffers;
  stats_->bytes_pulled += payload.size();
  const uint32_t server_index = op->map.ServerOf(h.tensor, h.num_chunks, h.chunk);
  if (!from_peer && op->job->counters && server_index < op->job->counters->pulled.size()) {
    op->job->counters->pulled[server_index]->Increment(static_cast<double>(payload.size()));
  }
  if (Log()->should_log(spdlog::level::debug)) {
    Log()->debug("result of {} ({} bytes) of job {} tensor '{}' from {}", Describe(h),
                 payload.size(), op->job->job_id, op->op.tensor_name,
                 from_peer ? absl::StrCat("worker ", h.sender)
                           : absl::StrCat("server ", op->job->server_addresses[server_index]));
  }
  if (op->sums) std::memcpy(op->sums.get() + offset, payload.data(), payload.size());
  if (op->is_broadcast()) {
    const bool root_node = static_cast<uint32_t>(op->job->my_worker_rank) == op->op.root_node;
    for (size_t b = 0; b < buffers.size(); ++b) {
      if (root_node && b == op->op.root_local) continue;
      std::memcpy(buffers[b] + offset, payload.data(), payload.size());
    }
  } else {
    std::memcpy(buffers[0] + offset, payload.data(), payload.size());
    if (op->op.reduction == Reduction::kAverage) {
      reducer_->Divide(op->op.dtype, buffers[0] + offset, h.chunk_count, op->job->world_size());
    }
    for (size_t b = 1; b < buffers.size(); ++b) {
      std::memcpy(buffers[b] + offset, buffers[0] + offset, payload.size());
    }
  }
  // The chunk's result is in every buffer: it may be copied back while the rest still runs.
  if (op->op.staged != nullptr) op->op.staged->Final(offset, payload.size());
  std::vector<std::function<void()>> sends;
  std::vector<Completion> done;
  {
    std::lock_guard lock(mu_);
    if (--op->writers == 0 && op->sends_at_failure == 0 && op->failed) {
      done.push_back(*std::move(op->failed));  // failed while this sum was being written
      op->failed.reset();
      std::erase(draining_, op);
    }
    op->writing[h.chunk] = 0;
    // Unless the operation failed meanwhile:
    if (!op->finished && from_peer && op->chunk_state[h.chunk] == 0) {
      // Never pushed (nothing outstanding, no credit held): done with the copy.
      if (h.chunk == 0 && op->tuned) op->decision_kib = h.reserved1;
      ChunkDoneLocked(op, h.chunk, done);
      PumpLocked(sends);
    } else if (!op->finished && (op->chunk_state[h.chunk] == 1 || op->chunk_state[h.chunk] == 3)) {
      if (!op->sent_at.empty() && !from_peer) TraceChunkLocked(*op, h.chunk, server_index);
      if (h.chunk == 0 && op->tuned) op->decision_kib = h.reserved1;
      op->outstanding[server_index]--;
      if (op->chunk_state[h.chunk] == 1) {
        // The sum overtook the push's send completion: the chunk (its credit, and the staging
        // the transport may still read) is done only at that completion.
        op->chunk_state[h.chunk] = 4;
      } else {
        ChunkDoneLocked(op, h.chunk, done);
      }
      PumpLocked(sends);
    }
  }
  Flush(std::move(sends), std::move(done));
}

void PushPullWorker::TraceChunkLocked(const OpState& op, uint32_t chunk, uint32_t server) {
  // Per server, three phases of each chunk: waiting for credit (queued), handed to the transport
  // until its send completed (on the NIC), and from there until the sum came back.
  const auto now = std::chrono::steady_clock::now();
  const int64_t bytes = static_cast<int64_t>(op.ChunkBytes(chunk));
  const uint64_t id = (op.seq << 20) ^ chunk;
  const std::string s = absl::StrCat(" s", server);
  common::Trace::Async(absl::StrCat("credit wait", s), id, op.started_at, op.sent_at[chunk],
                       {{"chunk", chunk}, {"bytes", bytes}});
  const auto send_done = op.send_done_at[chunk].time_since_epoch().count() != 0
                             ? op.send_done_at[chunk]
                             : now;  // the sum overtook the send completion
  common::Trace::Async(absl::StrCat("push", s), id, op.sent_at[chunk], send_done,
                       {{"chunk", chunk}, {"bytes", bytes}});
  common::Trace::Async(absl::StrCat("wait for sum", s), id, send_done, now,
                       {{"chunk", chunk}, {"bytes", bytes}});
}

void PushPullWorker::ChunkDoneLocked(const std::shared_ptr<OpState>& op, uint32_t chunk,
                                     std::vector<Completion>& done) {
  op->chunk_state[chunk] = 2;
  if (++op->chunks_done < op->num_chunks) return;
  op->finished = true;
  const CollectiveKey key{op->job_hash, op->tensor_hash, op->op.iteration};
  ops_.erase(key);
  stats_->ops_completed++;
  if (op->tuned) {
    const uint64_t bytes = op->op.count * op->element_size;
    const double seconds =
        std::max(std::chrono::duration<double>(clock_->Now() - op->measure_start).count(), 1e-6);
    double throughput = static_cast<double>(bytes) / seconds;
    if (throughput_hook_) {
      throughput = throughput_hook_(op->op.tensor_name, op->op.iteration, op->partition,
                                    op->num_chunks, throughput);
    }
    TensorTuning& t = tuning_[{op->job_hash, op->tensor_hash}];
    t.has_report = true;
    t.reported_iteration = op->op.iteration;
    t.report_kib_s = static_cast<uint32_t>(std::clamp(throughput / 1024, 1.0, 4294967295.0));
    if (op->decision_kib != 0) {
      t.decisions[op->op.iteration] = uint64_t{op->decision_kib} * 1024;
      while (t.decisions.size() > 8) t.decisions.erase(t.decisions.begin());
    }
  }
  if (op->sums) {
    // The earlier sums go back to the pool (or, while a copy is being sent from them to a
    // peer, once it is sent), for a later collective's copy.
    retained_[{op->job_hash, op->tensor_hash}] =
        Retained{op->op.iteration,
                 op->op.count,
                 static_cast<uint8_t>(op->op.dtype),
                 op->num_chunks,
                 op->decision_kib,
                 op->job,
                 op->sums,
                 clock_->Now() + RetainedLifetime(op->job->op_timeout)};
  }
  if (op->recovering) {
    stats_->peer_recoveries++;
    Log()->warn("tensor '{}' iteration {} completed from worker {}'s copy of its sums",
                op->op.tensor_name, op->op.iteration, op->fetch_from);
  }
  AnswerQueriesLocked(*op, op->sums != nullptr, done);
  ReleaseHeldLocked(key, done);
  if (!op->sent_at.empty()) {
    common::Trace::Async(absl::StrCat("push/pull ", op->op.tensor_name), op->seq, op->started_at,
                         std::chrono::steady_clock::now(),
                         {{"bytes", static_cast<int64_t>(op->op.count * op->element_size)},
                          {"chunks", op->num_chunks},
                          {"iteration", static_cast<int64_t>(op->op.iteration)}});
  }
  done.emplace_back(std::move(op->op.done), absl::OkStatus());
}

void PushPullWorker::HandleError(const WireHeader& h, std::string_view message) {
  std::vector<std::function<void()>> sends;
  std::vector<Completion> done;
  {
    std::lock_guard lock(mu_);
    if (auto it = ops_.find(KeyOf(h));
        it != ops_.end() && h.plan_version != it->second->job->plan_version) {
      // An error of another attempt of this iteration (another epoch) does not fail this one.
      stats_->fenced_messages++;
      Log()->debug("error for {} of plan v{} fenced: the operation runs plan v{}", Describe(h),
                   h.plan_version, it->second->job->plan_version);
      return;
    }
    if (h.error_code == static_cast<uint32_t>(absl::StatusCode::kInvalidArgument)) {
      // The workers disagreed (on the chunk count, perhaps): forget this tensor's partition
      // decisions before anything held starts, as the home server forgets its tuner.
      tuning_.erase({h.job, h.tensor});
    }
    absl::Status status(static_cast<absl::StatusCode>(h.error_code), std::string(message));
    if (status.code() == absl::StatusCode::kDeadlineExceeded) {
      // The server timed the chunk out: the workers it waited for may have completed this
      // collective under an earlier epoch (the fan-out hole), so ask them first.
      FailOrRecoverLocked(KeyOf(h), std::move(status), done);
    } else {
      FailLocked(KeyOf(h), std::move(status), done);
    }
    PumpLocked(sends);  // ops held for this one may have started
  }
  Flush(std::move(sends), std::move(done));
}

void PushPullWorker::FailLocked(const CollectiveKey& key, absl::Status status,
                                std::vector<Completion>& done) {
  auto it = ops_.find(key);
  if (it == ops_.end()) return;
  std::shared_ptr<OpState> op = it->second;
  ops_.erase(it);
  op->finished = true;
  AnswerQueriesLocked(*op, false, done);
  ReleaseHeldLocked(key, done);
  for (uint32_t c = 0; c < op->num_chunks; ++c) {
    if (op->chunk_state[c] == 1 || op->chunk_state[c] == 4) {
      ReleaseCreditLocked(*op, c);
      op->chunk_state[c] = 5;  // Its send completes later (SendChunk's callback).
      op->sends_at_failure++;
    }
  }
  stats_->ops_failed++;
  // A server's verdict names the tensor by its hash (all a server knows): say which tensor it
  // was, which the caller can act on (payloads, the epoch included, stay). Messages that start
  // with a marker the agent and client read ("[retriable, ...", "[membership changed ...") are
  // left as they are.
  if (!op->op.tensor_name.empty() && !absl::StartsWith(status.message(), "[") &&
      status.message().find(op->op.tensor_name) == absl::string_view::npos) {
    absl::Status named(status.code(), absl::StrCat("tensor '", op->op.tensor_name, "' iteration ",
                                                   op->op.iteration, ": ", status.message()));
    status.ForEachPayload([&named](absl::string_view url, const absl::Cord& payload) {
      named.SetPayload(url, payload);
    });
    status = std::move(named);
  }
  Log()->warn("{} of tensor '{}' iteration {} failed: {}",
              op->is_broadcast() ? "broadcast" : "all-reduce", op->op.tensor_name, op->op.iteration,
              status.message());
  // Retriable failures carry the epoch this attempt ran under: the agent runs the iteration
  // again once it has a newer plan.
  if (status.code() == absl::StatusCode::kUnavailable) {
    status = WithEpoch(std::move(status), op->job->plan_version);
  }
  if (op->writers > 0 || op->sends_at_failure > 0) {
    // HandleResult's last writer or SendChunk's last send completes it (ExpireStale at the
    // latest, for sends).
    op->failed.emplace(std::move(op->op.done), std::move(status));
    if (op->sends_at_failure > 0) {
      op->failed_at = clock_->Now();
      draining_.push_back(op);
    }
    return;
  }
  done.emplace_back(std::move(op->op.done), std::move(status));
}

void PushPullWorker::ExpireStale() {
  std::vector<std::function<void()>> sends;
  std::vector<Completion> done;
  {
    std::lock_guard lock(mu_);
    const auto now = clock_->Now();
    // Held ops first: one whose wait is over must not be started by the failures below.
    std::vector<CollectiveKey> expired_held;
    for (auto it = held_.begin(); it != held_.end();) {
      auto& list = it->second;
      for (auto h = list.begin(); h != list.end();) {
        if (h->deadline > now) {
          ++h;
          continue;
        }
        done.emplace_back(
            std::move(h->op.done),
            absl::DeadlineExceededError(
                absl::StrCat("job '", h->job_id, "' tensor '", h->op.tensor_name, "' iteration ",
                             h->op.iteration, " timed out while waiting for iteration ",
                             it->first.iteration, " of the same tensor to finish on this worker")));
        expired_held.push_back(CollectiveKey{it->first.job, it->first.tensor, h->op.iteration});
        h = list.erase(h);
      }
      it = list.empty() ? held_.erase(it) : std::next(it);
    }
    // What waited for those may go now.
    for (const auto& key : expired_held) ReleaseHeldLocked(key, done);
    std::vector<CollectiveKey> expired;
    std::vector<CollectiveKey> unrecovered;
    for (auto& [key, op] : ops_) {
      if (op->recovering) {
        if (op->recovery_deadline <= now) unrecovered.push_back(key);
      } else if (op->deadline <= now) {
        expired.push_back(key);
      }
    }
    for (const auto& key : unrecovered) {
      OpState& op = *ops_[key];
      Log()->warn("tensor '{}' iteration {}: {} of the other workers did not answer in time",
                  op.op.tensor_name, op.op.iteration, op.answers_pending);
      FailLocked(key, op.recovery_failure, done);
    }
    for (const auto& key : expired) {
      auto op = ops_[key];
      if (auto job = jobs_.find(key.job);
          job != jobs_.end() && job->second->plan_version > op->job->plan_version) {
        // It ran under a plan that has been replaced meanwhile: retriable.
        stats_->plan_change_failures++;
        FailOrRecoverLocked(
            key,
            PlanChangedError(
                op->job->job_id, op->job->plan_version, job->second->plan_version,
                absl::StrCat("tensor '", op->op.tensor_name, "' iteration ", key.iteration,
                             " (timed out after ", op->job->op_timeout.count(), " ms)")),
            done);
        continue;
      }
      std::set<std::string> waiting;
      for (uint32_t c = 0; c < op->num_chunks; ++c) {
        if (op->chunk_state[c] != 2 && op->chunk_state[c] != 4) {  // 4: summed already
          waiting.insert(
              op->job->server_addresses[op->map.ServerOf(op->tensor_hash, op->num_chunks, c)]);
        }
      }
      FailOrRecoverLocked(
          key,
          absl::DeadlineExceededError(absl::StrCat(
              "job '", op->job->job_id, "' tensor '", op->op.tensor_name, "' iteration ",
              op->op.iteration, " timed out after ", op->job->op_timeout.count(), " ms with ",
              op->chunks_done, "/", op->num_chunks, " chunks done; waiting on summation servers [",
              absl::StrJoin(waiting, ", "), "]")),
          done);
    }
    if (!expired.empty() || !expired_held.empty() || !unrecovered.empty()) PumpLocked(sends);
    // Kept sums past their lifetime go back to the pool (a copy being sent to a peer holds them
    // until it is sent).
    std::erase_if(retained_, [now](const auto& r) { return r.second.expires <= now; });
    // Failed operations whose sends the transport has held for kFailedSendGrace are completed
    // anyway: every wait has a deadline (the transport is told nothing; it may still read).
    std::vector<std::shared_ptr<OpState>> overdue;
    for (const auto& op : draining_) {
      if (now - op->failed_at >= kFailedSendGrace && op->writers == 0) overdue.push_back(op);
    }
    for (const auto& op : overdue) {
      Log()->warn(
          "tensor '{}' iteration {}: completing its failure with {} sends still held by "
          "the transport",
          op->op.tensor_name, op->op.iteration, op->sends_at_failure);
      if (op->failed) done.push_back(*std::move(op->failed));
      op->failed.reset();
      std::erase(draining_, op);
    }
  }
  Flush(std::move(sends), std::move(done));
}

void PushPullWorker::FailOrRecoverLocked(const CollectiveKey& key, absl::Status status,
                                         std::vector<Completion>& done) {
  auto it = ops_.find(key);
  if (it == ops_.end()) return;
  OpState& op = *it->second;
  if (op.recovering) return;  // already asking: its deadline and the answers decide
  const int n = op.job->num_workers();
  const int me = op.job->my_worker_rank;
  if (n < 2 || me < 0) {
    FailLocked(key, std::move(status), done);
    return;
  }
  // Even with chunks never pushed (held back by kPushPullAhead), another worker may have
  // completed the collective under an earlier epoch (this is then a retry). What is still queued
  // is not pushed any more: this attempt ends with a copy or with `status`.
  for (auto q = queue_.begin(); q != queue_.end();) {
    q = q->key == key ? EraseQueuedLocked(q, q->seq == op.seq ? &op : nullptr) : std::next(q);
  }
  if (status.code() == absl::StatusCode::kUnavailable) {
    status = WithEpoch(std::move(status), op.job->plan_version);
  }
  op.recovering = true;
  op.recovery_failure = std::move(status);
  op.recovery_deadline = std::max(clock_->Now(), op.deadline) + WorkerGrace(op.job->op_timeout);
  op.answered.assign(n, false);
  op.answered[me] = true;
  op.answers_pending = n - 1;
  stats_->peer_recoveries_started++;
  Log()->warn("tensor '{}' iteration {} ({}): asking the other {} workers for their sums",
              op.op.tensor_name, op.op.iteration, op.recovery_failure.message(), n - 1);
  AnswerQueriesLocked(op, false, done);  // peers asking this one: it has nothing to give
  const WireHeader about = op.Header(0);
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    SendPeerLocked(*op.job, MessageKind::kPeerQuery, about, r, op.job->plan_version,
                   absl::StatusCode::kOk, done);
  }
}

void PushPullWorker::SendPeerLocked(const JobView& job, MessageKind kind, const WireHeader& about,
                                    uint32_t rank, uint64_t plan_version, absl::StatusCode code,
                                    std::vector<Completion>& done,
                                    std::shared_ptr<std::vector<uint32_t>> chunks) {
  if (rank >= job.worker_addresses.size() || job.my_worker_rank < 0) return;
  WireHeader h = about;
  h.kind = static_cast<uint8_t>(kind);
  h.algorithm = static_cast<uint8_t>(Algorithm::kPushPull);
  h.job = job.job_hash();
  h.plan_version = plan_version;
  h.sender = static_cast<uint32_t>(job.my_worker_rank);
  h.chunk = 0;
  h.chunk_offset = 0;
  h.chunk_count = 0;
  h.step = 0;
  h.reserved1 = 0;
  h.error_code = static_cast<uint32_t>(code);
  std::string to = job.worker_addresses[rank];
  // Sent once the lock is released (completions run in Flush).
  done.emplace_back(
      [this, h, to = std::move(to), chunks = std::move(chunks)](absl::Status) {
        std::span<const std::byte> payload;
        if (chunks) {
          payload = {reinterpret_cast<const std::byte*>(chunks->data()), chunks->size() * 4};
        }
        transport_->Send(to, AsBytes(h), payload, [chunks, to, what = Describe(h)](absl::Status s) {
          if (!s.ok())
            Log()->debug("peer message about {} to {} failed: {}", what, to, s.message());
        });
      },
      absl::OkStatus());
}

void PushPullWorker::AnswerQueriesLocked(OpState& op, bool have, std::vector<Completion>& done) {
  const WireHeader about = op.Header(0);
  for (const auto& [rank, plan_version] : op.peer_queries) {
    SendPeerLocked(*op.job, MessageKind::kPeerAnswer, about, rank, plan_version,
                   have ? absl::StatusCode::kOk : absl::StatusCode::kNotFound, done);
  }
  op.peer_queries.clear();
}

void PushPullWorker::FetchNextLocked(OpState& op, std::vector<Completion>& done) {
  if (op.haves.empty()) return;
  op.fetch_from = static_cast<int>(op.haves.front());
  op.haves.erase(op.haves.begin());
  // Every chunk without its sum: pushed and waiting, or never pushed (queued no more).
  auto missing = std::make_shared<std::vector<uint32_t>>();
  for (uint32_t c = 0; c < op.num_chunks; ++c) {
    if (op.chunk_state[c] != 2 && op.chunk_state[c] != 4) missing->push_back(c);
  }
  Log()->info("tensor '{}' iteration {}: worker {} completed it; fetching {} chunks",
              op.op.tensor_name, op.op.iteration, op.fetch_from, missing->size());
  if (!missing->empty()) {
    SendPeerLocked(*op.job, MessageKind::kPeerFetch, op.Header(0),
                   static_cast<uint32_t>(op.fetch_from), op.job->plan_version,
                   absl::StatusCode::kOk, done, std::move(missing));
  }
}

void PushPullWorker::MaybeEndRecoveryLocked(const CollectiveKey& key,
                                            std::vector<Completion>& done) {
  auto it = ops_.find(key);
  if (it == ops_.end()) return;
  OpState& op = *it->second;
  if (!op.recovering || op.answers_pending > 0 || op.fetch_from >= 0) return;
  Log()->info("tensor '{}' iteration {}: no other worker completed it", op.op.tensor_name,
              op.op.iteration);
  FailLocked(key, op.recovery_failure, done);
}

void PushPullWorker::HandlePeer(const WireHeader& h, std::span<const std::byte> payload) {
  std::vector<std::function<void()>> sends;
  std::vector<Completion> done;
  {
    std::lock_guard lock(mu_);
    const CollectiveKey key = KeyOf(h);
    auto job_it = jobs_.find(h.job);
    if (job_it == jobs_.end()) {
      Log()->debug("peer message about {} of no job here dropped", Describe(h));
      return;
    }
    // Answers and copies go by the current plan (ranks and addresses), never by the one the
    // kept sums completed under.
    const JobView& job = *job_it->second;
    if (job.my_worker_rank < 0 || h.sender >= job.worker_addresses.size()) {
      Log()->debug("peer message about {} from worker {} dropped: no such worker", Describe(h),
                   h.sender);
      return;
    }
    auto retained = retained_.find({h.job, h.tensor});
    // Kept sums of the same iteration, shape and membership generation (a new generation counts
    // its iterations from 0 again: the same number is another collective).
    const bool have = retained != retained_.end() && retained->second.iteration == h.iteration &&
                      retained->second.count == h.tensor_count &&
                      retained->second.dtype == h.dtype &&
                      retained->second.job->generation == job.generation && !ops_.contains(key);
    switch (static_cast<MessageKind>(h.kind)) {
      case MessageKind::kPeerQuery: {
        if (have) {
          SendPeerLocked(job, MessageKind::kPeerAnswer, h, h.sender, h.plan_version,
                         absl::StatusCode::kOk, done);
        } else if (auto op = ops_.find(key); op != ops_.end()) {
          OpState& state = *op->second;
          if (state.recovering || state.job->plan_version > h.plan_version) {
            // It has no sums to give, or this attempt is a later one (the asker's epoch failed
            // here too).
            SendPeerLocked(job, MessageKind::kPeerAnswer, h, h.sender, h.plan_version,
                           absl::StatusCode::kNotFound, done);
          } else {
            state.peer_queries.emplace_back(h.sender, h.plan_version);  // answered when it ends
          }
        } else {
          // Neither kept nor running here. Should this worker yet run the collective under the
          // asker's epoch and complete it (its servers got the asker's pushes before the asker
          // gave up, and survived), the asker's retry under the next epoch times out at its
          // servers waiting for this worker, asks again, and then gets the sums.
          SendPeerLocked(job, MessageKind::kPeerAnswer, h, h.sender, h.plan_version,
                         absl::StatusCode::kNotFound, done);
        }
        break;
      }
      case MessageKind::kPeerAnswer: {
        auto op = ops_.find(key);
        if (op == ops_.end() || !op->second->recovering ||
            op->second->job->plan_version != h.plan_version ||
            h.sender >= op->second->answered.size()) {
          Log()->debug("peer answer about {} from worker {} dropped: not asked", Describe(h),
                       h.sender);
          break;
        }
        OpState& state = *op->second;
        if (state.answered[h.sender]) {
          if (static_cast<int>(h.sender) == state.fetch_from && h.error_code != 0) {
            // The worker it fetched from no longer keeps the sums: the next that said yes.
            state.fetch_from = -1;
            FetchNextLocked(state, done);
            MaybeEndRecoveryLocked(key, done);
          }
          break;
        }
        state.answered[h.sender] = true;
        state.answers_pending--;
        if (h.error_code == 0) {
          state.haves.push_back(h.sender);
          if (state.fetch_from < 0) FetchNextLocked(state, done);
        }
        MaybeEndRecoveryLocked(key, done);
        break;
      }
      case MessageKind::kPeerFetch: {
        if (!have) {
          SendPeerLocked(job, MessageKind::kPeerAnswer, h, h.sender, h.plan_version,
                         absl::StatusCode::kNotFound, done);
          break;
        }
        const Retained& r = retained->second;
        const std::string to = job.worker_addresses[h.sender];
        const size_t element_size = DataTypeSize(static_cast<DataType>(r.dtype));
        for (size_t i = 0; i + 4 <= payload.size(); i += 4) {
          uint32_t c;
          std::memcpy(&c, payload.data() + i, 4);
          if (c >= h.num_chunks) break;
          WireHeader out = h;
          out.kind = static_cast<uint8_t>(MessageKind::kResult);
          out.sender = static_cast<uint32_t>(job.my_worker_rank);
          out.chunk = c;
          const ChunkRange range = GetChunk(h.tensor_count, h.num_chunks, c);
          out.chunk_offset = range.offset;
          out.chunk_count = range.count;
          out.step = 0;
          out.error_code = 0;
          // Chunk 0's sum carries the home server's partition decision: so does its copy.
          out.reserved1 = c == 0 && h.num_chunks == r.num_chunks ? r.decision_kib : 0;
          stats_->peer_chunks_served++;
          sends.push_back([this, out, to, sums = r.sums, element_size] {
            const std::span<const std::byte> bytes(sums.get() + out.chunk_offset * element_size,
                                                   out.chunk_count * element_size);
            transport_->Send(to, AsBytes(out), bytes, [sums, to](absl::Status s) {
              if (!s.ok()) Log()->warn("sum copy to worker {} failed: {}", to, s.message());
            });
          });
        }
        break;
      }
      default:
        break;
    }
  }
  Flush(std::move(sends), std::move(done));
}

void PushPullWorker::Flush(std::vector<std::function<void()>> sends, std::vector<Completion> done) {
  for (auto& send : sends) send();
  for (auto& [fn, status] : done) {
    if (fn) fn(status);
  }
}

// ---------------------------------------------------------------------------------------------
// PushPull

PushPull::PushPull(Transport* transport, Reducer* reducer, const common::Clock* clock)
    : server_(transport, reducer, clock, &stats_), worker_(transport, reducer, clock, &stats_) {}

void PushPull::SetJob(const JobView& view) {
  server_.SetJob(view);
  worker_.SetJob(view);
}

void PushPull::RemoveJob(uint64_t job_hash) {
  server_.RemoveJob(job_hash);
  worker_.RemoveJob(job_hash);
}

absl::Status PushPull::CanServe(Algorithm algorithm, const Operation& op) const {
  if (algorithm != Algorithm::kPushPull) {
    return absl::FailedPreconditionError(
        absl::StrCat(std::string(AlgorithmName(algorithm)),
                     " runs among the worker nodes, not on summation servers"));
  }
  if (IsBlockwise(op.reduction)) {
    return absl::UnimplementedError(
        absl::StrCat("push/pull does not implement ", std::string(ReductionName(op.reduction)),
                     " (ring and halving-doubling do, among the worker nodes)"));
  }
  return absl::OkStatus();
}

absl::Status PushPull::Post(const std::string& job_id, Algorithm algorithm, Operation op) {
  if (absl::Status s = CanServe(algorithm, op); !s.ok()) return s;
  return worker_.Start(job_id, std::move(op));
}

void PushPull::ExpireStale() {
  server_.ExpireStale();
  worker_.ExpireStale();
}

void PushPull::Abort(const std::string& job_id, const std::string& tensor_name, uint64_t iteration,
                     const absl::Status& reason) {
  worker_.Abort(job_id, tensor_name, iteration, reason);
}

void PushPull::HandleMessage(const WireHeader& h, std::span<const std::byte> payload) {
  const std::string_view message(reinterpret_cast<const char*>(payload.data()), payload.size());
  switch (static_cast<MessageKind>(h.kind)) {
    case MessageKind::kPush:
      server_.HandlePush(h, payload);
      return;
    case MessageKind::kResult:
      worker_.HandleResult(h, payload);
      return;
    case MessageKind::kError:
      worker_.HandleError(h, message);
      return;
    case MessageKind::kAbort:
      server_.HandleAbort(h, message);
      return;
    case MessageKind::kPeerQuery:
    case MessageKind::kPeerAnswer:
    case MessageKind::kPeerFetch:
      worker_.HandlePeer(h, payload);
      return;
    case MessageKind::kData:
    case MessageKind::kPull:
      break;
  }
  stats_.malformed_messages++;
  Log()->warn("{} message of kind {} dropped: not a push/pull message", Describe(h), h.kind);
}

}  // namespace tributary::dataplane
