#include "agent/control_ring_host.h"

#include <atomic>
#include <deque>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/shm_mapping.h"
#include "common/logging.h"
#include "common/shm_ring.h"
#include "common/status_macros.h"
#include "common/thread_name.h"

namespace tributary::agent {
namespace {

namespace ring = common::shm_ring;

constexpr auto Log = common::ComponentLog<"agent">;

}  // namespace

// One attached ring: its mapping, its thread, and the results waiting for completion slots.
class ControlRings::Host : public std::enable_shared_from_this<Host> {
 public:
  Host(LocalService* service, std::string session_id, std::shared_ptr<SharedMemoryMapping> mapping,
       ring::RingConfig config, Options options)
      : service_(service),
        session_id_(std::move(session_id)),
        mapping_(std::move(mapping)),
        view_(ring::ViewOf(mapping_->data(), config)),
        options_(options),
        spin_(options.spin),
        sq_(&view_.header->sq, view_.sq, config.sq_capacity),
        cq_(&view_.header->cq, view_.cq, config.cq_capacity) {}

  ~Host() {
    if (thread_.joinable()) thread_.join();  // only when never reaped (Start without Shutdown)
  }

  void Start() {
    // `this` outlives the thread: ControlRings joins it before letting the host go.
    thread_ = std::thread([this] { Run(); });
  }

  // Submits every entry in the submission queue now, on the calling thread, whatever the
  // in-flight bound (they were pushed before the caller's own submission). A corrupt queue is
  // left to the ring's thread.
  void Drain() {
    if (stop_.load(std::memory_order_acquire)) return;
    std::lock_guard intake(intake_mu_);
    ring::SubmissionEntry entry;
    while (sq_.Pop(&entry) == ring::RingResult::kOk) HandleEntry(entry);
  }

  // Asks the thread to end (it wakes at once); does not wait.
  void Stop() {
    stop_.store(true, std::memory_order_seq_cst);
    ring::Ring(&view_.header->sq.doorbell);
  }

  bool finished() const { return finished_.load(std::memory_order_acquire); }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

  // The result of ticket `ticket`: into the completion queue, or behind the ones waiting for
  // space. Any thread.
  void Complete(uint64_t ticket, const absl::Status& status) {
    bool notify = false;
    {
      std::lock_guard lock(cq_mu_);
      if (closed_) return;  // the session is over: nobody reads the ring any more
      pending_.push_back(ring::MakeCompletion(ticket, status));
      notify = FlushLocked();
    }
    if (notify) cq_.Notify();
  }

 private:
  // The thread: take submissions, flush waiting results, sleep on the doorbell.
  void Run() {
    common::SetCurrentThreadName("trib-ring");
    std::string corrupt;
    // When the ring thread last found the queue empty (none: it is taking entries).
    std::optional<std::chrono::steady_clock::time_point> idle_since;
    while (!stop_.load(std::memory_order_acquire)) {
      bool progressed = false;
      while (in_flight_.load(std::memory_order_acquire) < options_.max_in_flight &&
             !stop_.load(std::memory_order_relaxed)) {
        // Taken and handed to the service under intake_mu_, so that a Submit RPC of the same
        // session that drains the ring first (DrainSubmissions) finds every entry pushed before
        // it already submitted.
        std::lock_guard intake(intake_mu_);
        ring::SubmissionEntry entry;
        const ring::RingResult r = sq_.Pop(&entry);
        if (r == ring::RingResult::kEmpty) break;
        if (r == ring::RingResult::kCorrupt) {
          corrupt = absl::StrCat("its control ring is corrupt: submission head ",
                                 std::atomic_ref(view_.header->sq.head).load(),
                                 " is not within capacity ", view_.config.sq_capacity,
                                 " of the agent's tail ", sq_.tail());
          break;
        }
        if (idle_since) {
          spin_.Record(std::chrono::steady_clock::now() - *idle_since);
          idle_since.reset();
        }
        HandleEntry(entry);
        progressed = true;
      }
      if (!corrupt.empty()) break;
      bool notify = false;
      {
        std::lock_guard lock(cq_mu_);
        notify = FlushLocked();
        if (!cq_corrupt_.empty()) corrupt = cq_corrupt_;
      }
      if (notify) cq_.Notify();
      if (!corrupt.empty()) break;
      if (progressed) continue;
      if (in_flight_.load(std::memory_order_acquire) >= options_.max_in_flight) {
        // Entries wait in the queue; FlushLocked rings the doorbell when results go out, and
        // the client rings it when it frees completion slots that results wait for. The
        // sequence is read before the flag is set, as in RingConsumer::Sleep: a flush that
        // takes the flag rings after it. A client's ring that fell before the read freed the
        // slots, which the look under cq_mu_ then sees.
        if (options_.before_throttled_sleep) options_.before_throttled_sleep();
        const uint32_t seq =
            std::atomic_ref(view_.header->sq.doorbell).load(std::memory_order_seq_cst);
        throttled_.store(true, std::memory_order_seq_cst);
        bool results_fit = false;
        {
          std::lock_guard lock(cq_mu_);
          results_fit = (!pending_.empty() && cq_.free_slots() > 0) || !cq_corrupt_.empty();
        }
        if (results_fit) {
          throttled_.store(false, std::memory_order_seq_cst);  // the flush is ours to run
        } else if (in_flight_.load(std::memory_order_seq_cst) >= options_.max_in_flight &&
                   !stop_.load(std::memory_order_seq_cst)) {
          ring::FutexWait(&view_.header->sq.doorbell, seq, options_.idle_wake);
        }
        continue;
      }
      if (!idle_since) {
        // The start of an idle spell: poll first if the recent ones were short.
        idle_since = std::chrono::steady_clock::now();
        if (common::shm_ring::SpinUntil(spin_.NextSpin(), [&] {
              return sq_.HasWork() || stop_.load(std::memory_order_relaxed);
            })) {
          continue;
        }
      }
      sq_.Sleep(options_.idle_wake, [&] {
        if (stop_.load(std::memory_order_seq_cst)) return true;
        std::lock_guard lock(cq_mu_);
        return (!pending_.empty() && cq_.free_slots() > 0) || !cq_corrupt_.empty();
      });
    }
    {
      std::lock_guard lock(cq_mu_);
      closed_ = true;
      pending_.clear();
    }
    std::atomic_ref(view_.header->agent_closed).store(1, std::memory_order_seq_cst);
    ring::Ring(&view_.header->cq.doorbell);
    if (!corrupt.empty()) {
      Log()->error("session {}: {}; ending the session", session_id_, corrupt);
      service_->EndSession(session_id_, corrupt);
    }
    finished_.store(true, std::memory_order_release);
  }

  // One submission, already copied out of the shared memory. intake_mu_ held.
  void HandleEntry(const ring::SubmissionEntry& e) {
    in_flight_.fetch_add(1, std::memory_order_acq_rel);
    if (e.name_bytes == 0 || e.name_bytes > ring::kMaxTensorName) {
      Complete(e.ticket, absl::InvalidArgumentError(absl::StrCat(
                             "control ring submission ", e.ticket, " of session ", session_id_,
                             ": tensor name length ", e.name_bytes, " is not in [1, ",
                             ring::kMaxTensorName, "] (longer names go through the Submit RPC)")));
      return;
    }
    // One request, reused: its strings keep their capacity, so a submission allocates none.
    tributary::v1::SubmitRequest& req = request_;
    if (req.session_id() != session_id_) req.set_session_id(session_id_);
    req.mutable_tensor_name()->assign(e.name, e.name_bytes);
    req.set_buffer_id(e.buffer_id);
    req.set_offset_bytes(e.offset_bytes);
    req.set_count(e.count);
    // Out-of-range values stay out of range: LocalService rejects them by name.
    req.set_dtype(static_cast<tributary::v1::DataType>(e.dtype));
    req.set_op(static_cast<tributary::v1::CollectiveOp>(e.op));
    req.set_root_rank(e.root_rank);
    req.set_priority(e.priority);
    const uint64_t ticket = e.ticket;
    absl::Status submitted = service_->SubmitWithCallback(
        req, [weak = weak_from_this(), ticket](const absl::Status& status) {
          if (auto self = weak.lock()) self->Complete(ticket, status);
        });
    if (!submitted.ok()) Complete(ticket, submitted);
  }

  // Moves waiting results into the completion queue while it has room; sets or clears the
  // header's cq_blocked. True when something was published (ring the client). cq_mu_ held.
  bool FlushLocked() {
    bool published = false;
    while (!pending_.empty()) {
      const ring::RingResult r = cq_.Push(pending_.front());
      if (r == ring::RingResult::kFull) {
        // Tell the client to ring us when it frees slots, then look once more: it may have
        // freed them before it could see the flag.
        std::atomic_ref(view_.header->cq_blocked).store(1, std::memory_order_seq_cst);
        if (cq_.free_slots() == 0) return published;
        continue;
      }
      if (r == ring::RingResult::kCorrupt) {
        if (cq_corrupt_.empty()) {
          cq_corrupt_ = absl::StrCat("its control ring is corrupt: completion tail ",
                                     std::atomic_ref(view_.header->cq.tail).load(),
                                     " is not within capacity ", view_.config.cq_capacity,
                                     " of the agent's head ", cq_.head());
          stop_.store(true, std::memory_order_seq_cst);
          ring::Ring(&view_.header->sq.doorbell);
        }
        pending_.clear();
        return published;
      }
      pending_.pop_front();
      in_flight_.fetch_sub(1, std::memory_order_seq_cst);
      if (throttled_.exchange(false, std::memory_order_seq_cst)) {
        ring::Ring(&view_.header->sq.doorbell);
      }
      published = true;
    }
    std::atomic_ref(view_.header->cq_blocked).store(0, std::memory_order_relaxed);
    return published;
  }

  LocalService* const service_;
  const std::string session_id_;
  const std::shared_ptr<SharedMemoryMapping> mapping_;
  const ring::RingView view_;
  const Options options_;
  ring::SpinPolicy spin_;                         // the ring thread only
  ring::RingConsumer<ring::SubmissionEntry> sq_;  // the ring thread only
  tributary::v1::SubmitRequest request_;          // the ring thread only (HandleEntry)
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  // The thread waits for in_flight_ to drop below max_in_flight.
  std::atomic<bool> throttled_{false};
  // Accepted and not yet in the completion queue.
  std::atomic<size_t> in_flight_{0};
  // Held while an entry is taken from the submission queue and handed to the service (sq_'s
  // consumer end and request_ are used under it).
  std::mutex intake_mu_;

  std::mutex cq_mu_;
  ring::RingProducer<ring::CompletionEntry> cq_;  // Guarded by cq_mu_.
  std::deque<ring::CompletionEntry> pending_;     // Guarded by cq_mu_: waiting for slots.
  std::string cq_corrupt_;                        // Guarded by cq_mu_.
  bool closed_ = false;                           // Guarded by cq_mu_.
};

ControlRings::ControlRings(LocalService* service, Options options)
    : service_(service), options_(options) {}

ControlRings::~ControlRings() { Shutdown(); }

absl::Status ControlRings::Attach(const tributary::v1::AttachControlRingRequest& req,
                                  tributary::v1::AttachControlRingResponse* resp) {
  auto exists = [&] {
    return absl::AlreadyExistsError(
        absl::StrCat("session '", req.session_id(), "' already has a control ring"));
  };
  {
    std::lock_guard lock(mu_);
    if (shut_down_) return absl::UnavailableError("the agent is shutting down");
    ReapLocked();
    if (hosts_.contains(req.session_id())) return exists();
  }
  // System calls and the service with no lock of ours held.
  ASSIGN_OR_RETURN(std::shared_ptr<SharedMemoryMapping> mapping,
                   service_->FindBuffer(req.session_id(), req.buffer_id()));
  absl::StatusOr<ring::RingConfig> config = ring::ReadHeader(mapping->data(), mapping->size());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat("session '", req.session_id(), "', control ring in buffer ",
                                     req.buffer_id(), ": ", config.status().message()));
  }
  auto host =
      std::make_shared<Host>(service_, req.session_id(), std::move(mapping), *config, options_);
  {
    std::lock_guard lock(mu_);
    if (shut_down_) return absl::UnavailableError("the agent is shutting down");
    if (!hosts_.emplace(req.session_id(), host).second) return exists();
  }
  const absl::Status watched =
      service_->WatchSession(req.session_id(), [weak = std::weak_ptr<Host>(host)] {
        if (auto h = weak.lock()) h->Stop();
      });
  if (!watched.ok()) {
    std::lock_guard lock(mu_);
    hosts_.erase(req.session_id());
    return watched;
  }
  host->Start();
  Log()->info("session {} attached control ring in buffer {} ({}/{} entries)", req.session_id(),
              req.buffer_id(), config->sq_capacity, config->cq_capacity);
  resp->set_version(ring::kVersion);
  return absl::OkStatus();
}

void ControlRings::ReapLocked() {
  for (auto it = hosts_.begin(); it != hosts_.end();) {
    if (it->second->finished()) {
      it->second->Join();
      it = hosts_.erase(it);
    } else {
      ++it;
    }
  }
}

void ControlRings::Shutdown() {
  std::map<std::string, std::shared_ptr<Host>> hosts;
  {
    std::lock_guard lock(mu_);
    shut_down_ = true;
    hosts.swap(hosts_);
  }
  for (auto& [id, host] : hosts) host->Stop();
  for (auto& [id, host] : hosts) host->Join();
}

void ControlRings::DrainSubmissions(const std::string& session_id) {
  std::shared_ptr<Host> host;
  {
    std::lock_guard lock(mu_);
    auto it = hosts_.find(session_id);
    if (it == hosts_.end()) return;
    host = it->second;
  }
  host->Drain();
}

size_t ControlRings::num_active() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [id, host] : hosts_) n += host->finished() ? 0 : 1;
  return n;
}

}  // namespace tributary::agent
