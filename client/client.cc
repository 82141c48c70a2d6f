#include "client/client.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/agent_session.h"
#include "client/buffer_channel.h"
#include "client/cuda_export.h"
#include "client/input_pool.h"
#include "common/logging.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"
#include "common/tsan_annotations.h"

namespace tributary::client {
namespace internal {

// Holds the KeepAlive server stream open for the session's life (callback API: no thread of
// ours blocks on it). The agent ends the session when the stream ends; we end it by cancelling.
class KeepAliveReactor : public grpc::ClientReadReactor<v1::KeepAliveEvent> {
 public:
  KeepAliveReactor(std::shared_ptr<AgentSession> session) : session_(std::move(session)) {
    request_.set_session_id(session_->session_id());
    // No deadline: the stream lives as long as the session.
    session_->stub().async()->KeepAlive(&context_, &request_, this);
    StartRead(&event_);
    // gRPC runs the reactions on its threads, one after another and OnDone last; it synchronises
    // them where TSan cannot see (common/tsan_annotations.h).
    TRIBUTARY_TSAN_RELEASE(this);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    TRIBUTARY_TSAN_ACQUIRE(this);
    if (!ok) {
      TRIBUTARY_TSAN_RELEASE(this);
      return;  // OnDone follows.
    }
    common::Logger("client")->info("agent on session {}: {}", session_->session_id(),
                                   event_.message());
    TRIBUTARY_TSAN_RELEASE(this);
    StartRead(&event_);
  }

  void OnDone(const grpc::Status& status) override {
    TRIBUTARY_TSAN_ACQUIRE(this);
    absl::Status ended = absl::UnavailableError(
        absl::StrCat("session ", session_->session_id(), " with agent ", session_->agent_address(),
                     " ended (keepalive stream: ", common::FromGrpcStatus(status).ToString(),
                     "); the operation's result is lost"));
    // Wait RPCs that fail in transport stop retrying.
    session_->MarkEnded(ended);
    if (ControlRing* ring = session_->ring(); ring != nullptr) {
      // Wakes every waiter of the ring: results the agent wrote before are still read, the
      // others can no longer come.
      ring->Close(std::move(ended));
    }
    std::lock_guard lock(mu_);
    if (!cancelled_) {
      common::Logger("client")->warn(
          "keepalive stream of session {} with agent {} ended: {}; the session is over",
          session_->session_id(), session_->agent_address(), common::FromGrpcStatus(status));
    }
    done_ = true;
    cv_.notify_all();
  }

  // Cancels the stream and waits until gRPC is done with this object.
  void CancelAndWait() {
    {
      std::lock_guard lock(mu_);
      cancelled_ = true;
    }
    context_.TryCancel();
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return done_; });
  }

 private:
  const std::shared_ptr<AgentSession> session_;
  grpc::ClientContext context_;
  v1::KeepAliveRequest request_;
  v1::KeepAliveEvent event_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool cancelled_ = false;  // Guarded by mu_.
  bool done_ = false;       // Guarded by mu_.
};

}  // namespace internal

namespace {

using Clock = std::chrono::steady_clock;
using internal::ControlRing;
using std::chrono::milliseconds;

constexpr auto Log = common::ComponentLog<"client">;

constexpr milliseconds kInitialJoinBackoff{50};
constexpr milliseconds kMaxJoinBackoff{500};
// Longest single Wait RPC; longer waits loop, so a lost agent is noticed within this bound.
constexpr milliseconds kMaxWaitSlice{5000};
// Pauses between Wait RPCs that found the agent unreachable.
constexpr milliseconds kInitialWaitBackoff{20};
constexpr milliseconds kMaxWaitBackoff{500};

bool RetryableJoinError(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kFailedPrecondition;
}

absl::Status Annotate(const absl::Status& status, const std::string& prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

// The client's one conversion of its op; the agent validates and classifies what arrives.
v1::CollectiveOp ToCollectiveOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return v1::COLLECTIVE_OP_SUM;
    case ReduceOp::kAverage:
      return v1::COLLECTIVE_OP_AVERAGE;
  }
  return v1::COLLECTIVE_OP_UNSPECIFIED;  // not a ReduceOp: the agent rejects it
}

v1::CollectiveOp ToReduceScatterOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return v1::COLLECTIVE_OP_REDUCE_SCATTER_SUM;
    case ReduceOp::kAverage:
      return v1::COLLECTIVE_OP_REDUCE_SCATTER_AVERAGE;
  }
  return v1::COLLECTIVE_OP_UNSPECIFIED;  // not a ReduceOp: the agent rejects it
}

// All-gather and reduce-scatter: `count` is one process's block, the region world_size blocks.
bool IsBlockwise(v1::CollectiveOp op) {
  return op == v1::COLLECTIVE_OP_ALLGATHER || op == v1::COLLECTIVE_OP_REDUCE_SCATTER_SUM ||
         op == v1::COLLECTIVE_OP_REDUCE_SCATTER_AVERAGE;
}

// Creates the session's control ring, registers its memory over the buffer socket and has the
// agent attach it; null (Submit/Wait only) when there is no buffer socket, the agent serves no
// ring (UNIMPLEMENTED: an older agent) or refuses this one.
std::shared_ptr<ControlRing> AttachControlRing(v1::Agent::Stub& stub, const ClientOptions& options,
                                               const std::string& session_id,
                                               internal::BufferChannel* buffers) {
  if (buffers == nullptr) return nullptr;
  absl::StatusOr<std::unique_ptr<ControlRing>> ring =
      ControlRing::Create(options.control_ring_capacity, options.control_ring_spin);
  if (!ring.ok()) {
    Log()->warn("session {}: no control ring ({}); collectives go through Submit", session_id,
                ring.status());
    return nullptr;
  }
  absl::StatusOr<uint64_t> buffer_id =
      buffers->Register(session_id, (*ring)->memfd(), (*ring)->size_bytes(), options.rpc_timeout);
  if (!buffer_id.ok()) {
    Log()->warn("session {}: the agent took no control ring ({}); collectives go through Submit",
                session_id, buffer_id.status());
    return nullptr;
  }
  v1::AttachControlRingRequest request;
  request.set_session_id(session_id);
  request.set_buffer_id(*buffer_id);
  v1::AttachControlRingResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.rpc_timeout);
  const absl::Status attached =
      common::FromGrpcStatus(stub.AttachControlRing(&context, request, &response));
  if (!attached.ok()) {
    // The agent keeps no ring: it need not keep the ring's memory either.
    v1::UnregisterBufferRequest forget;
    forget.set_session_id(session_id);
    forget.set_buffer_id(*buffer_id);
    v1::UnregisterBufferResponse forgotten;
    grpc::ClientContext forget_context;
    forget_context.set_deadline(std::chrono::system_clock::now() + options.rpc_timeout);
    (void)stub.UnregisterBuffer(&forget_context, forget, &forgotten);
  }
  if (attached.code() == absl::StatusCode::kUnimplemented) {
    Log()->info("agent {} serves no control ring; collectives go through Submit",
                options.agent_address);
    return nullptr;
  }
  if (!attached.ok()) {
    Log()->warn(
        "agent {} refused the control ring of session {} ({}); collectives go through "
        "Submit",
        options.agent_address, session_id, attached);
    return nullptr;
  }
  (*ring)->CloseMemfd();  // mapped on both sides; gone with the last mapping
  return std::shared_ptr<ControlRing>(std::move(*ring));
}

absl::Status LeftError(const std::string& job_id) {
  return absl::FailedPreconditionError(
      absl::StrCat("the client has left job '", job_id, "'; connect again"));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Handle

namespace {

// What a submission asks of the agent; kept by a handle that may submit it again.
struct Request {
  std::string name;
  uint64_t buffer_id = 0;
  uint64_t offset_bytes = 0;
  uint64_t count = 0;
  v1::DataType dtype = v1::DATA_TYPE_UNSPECIFIED;
  v1::CollectiveOp op = v1::COLLECTIVE_OP_UNSPECIFIED;
  uint32_t root_rank = 0;
  int32_t priority = 0;
  double delta_scale = 0;  // COLLECTIVE_OP_PS_PUSH_DELTA
};

// Parameter-server operations go over the Submit RPC, which carries the version back (the
// control ring's completions carry a status only), and are never retried transparently.
bool IsParameterServerOp(v1::CollectiveOp op) {
  return op == v1::COLLECTIVE_OP_PS_INIT || op == v1::COLLECTIVE_OP_PS_PUSH_DELTA ||
         op == v1::COLLECTIVE_OP_PS_PULL;
}

// The agent marks the failures it will run again on a newer plan (agent/local_gather.cc,
// kRetriableMarker) at the start of the message, which the control ring never cuts.
constexpr char kRetriableMarker[] = "[retriable, plan v";

bool Retriable(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable &&
         absl::StartsWith(status.message(), kRetriableMarker);
}

}  // namespace

bool IsMembershipChanged(const absl::Status& status) {
  // agent/local_gather.h kMembershipChangedMarker, at the start of the message.
  return status.code() == absl::StatusCode::kAborted &&
         absl::StartsWith(status.message(), "[membership changed");
}

// One submission of the operation to the agent: a ring ticket or an agent handle.
struct Handle::Attempt {
  uint64_t id = 0;
  std::shared_ptr<internal::RingSlot> slot;  // set when submitted through the control ring
};

struct Handle::State {
  ~State() { ReleaseInputs(); }
  // Hands the copy of the inputs back to the pool (once the result is final). mu held, or the
  // state is being destroyed.
  void ReleaseInputs() {
    if (pool != nullptr) pool->Give(std::move(inputs));
    inputs = {};
    input_bytes = 0;
  }

  std::string name;
  // Transparent retry (ClientOptions::retry_collectives): set at the first submission.
  bool retry = false;
  uint32_t max_retries = 0;
  Request request;
  std::byte* region = nullptr;  // the region in the caller's buffer
  std::shared_ptr<internal::InputPool> pool;
  internal::InputPool::Block inputs;  // Guarded by mu: the region at the first submission,
  size_t input_bytes = 0;             // until the result is final.
  std::mutex mu;
  std::timed_mutex rpc_wait_mu;      // Held by the one thread whose Wait RPC is in flight.
  Attempt attempt;                   // Guarded by mu: the current submission.
  uint64_t attempt_number = 0;       // Guarded by mu.
  uint32_t retries = 0;              // Guarded by mu.
  bool done = false;                 // Guarded by mu.
  absl::Status result;               // Guarded by mu; meaningful when done.
  std::atomic<uint64_t> version{0};  // parameter server: from the agent's answer
};

namespace {

// Submits `r` once: through the control ring when it takes it, else the Submit RPC (waiting in
// it up to `wait`; *done then tells whether the operation finished OK within it).
absl::StatusOr<std::pair<uint64_t, std::shared_ptr<internal::RingSlot>>> SubmitOnce(
    internal::AgentSession& session, const Request& r, milliseconds wait, bool* done,
    std::atomic<uint64_t>* version = nullptr) {
  *done = false;
  if (ControlRing* ring = session.ring(); ring != nullptr && !IsParameterServerOp(r.op)) {
    internal::RingSubmission submission;
    submission.tensor_name = r.name;
    submission.buffer_id = r.buffer_id;
    submission.offset_bytes = r.offset_bytes;
    submission.count = r.count;
    submission.dtype = r.dtype;
    submission.op = r.op;
    submission.root_rank = r.root_rank;
    submission.priority = r.priority;
    // Null when the name is too long for the ring or the ring is full: Submit below.
    if (std::shared_ptr<internal::RingSlot> slot = ring->TrySubmit(submission)) {
      const uint64_t ticket = slot->ticket;
      return std::pair{ticket, std::move(slot)};
    }
  }
  v1::SubmitRequest request;
  request.set_session_id(session.session_id());
  request.set_tensor_name(r.name);
  request.set_buffer_id(r.buffer_id);
  request.set_offset_bytes(r.offset_bytes);
  request.set_count(r.count);
  request.set_dtype(r.dtype);
  request.set_op(r.op);
  request.set_root_rank(r.root_rank);
  request.set_priority(r.priority);
  request.set_delta_scale(r.delta_scale);
  // A blocking call waits in the Submit itself (one round trip to the agent instead of two),
  // for at most one wait slice; Handle::Wait covers the rest.
  const milliseconds slice = std::clamp(wait, milliseconds(0), kMaxWaitSlice);
  request.set_wait_timeout_ms(static_cast<uint32_t>(slice.count()));
  v1::SubmitResponse response;
  auto context = session.NewContext(slice + session.rpc_timeout());
  RETURN_IF_ERROR(common::FromGrpcStatus(session.stub().Submit(context.get(), request, &response)));
  *done = response.done();
  if (version != nullptr && response.done()) version->store(response.version());
  return std::pair{response.handle(), std::shared_ptr<internal::RingSlot>()};
}

}  // namespace

uint64_t Handle::id() const {
  if (state_ == nullptr) return 0;
  std::lock_guard lock(state_->mu);
  return state_->attempt.id;
}

bool Handle::via_control_ring() const {
  if (state_ == nullptr) return false;
  std::lock_guard lock(state_->mu);
  return state_->attempt.slot != nullptr;
}

uint32_t Handle::retries() const {
  if (state_ == nullptr) return 0;
  std::lock_guard lock(state_->mu);
  return state_->retries;
}

const std::string& Handle::name() const {
  static const std::string kEmpty;
  return state_ == nullptr ? kEmpty : state_->name;
}

absl::Status Handle::WaitOnce(const Attempt& attempt, uint32_t timeout_ms, bool* done,
                              bool* transient) const {
  v1::WaitRequest request;
  request.set_session_id(session_->session_id());
  request.set_handle(attempt.id);
  request.set_timeout_ms(timeout_ms);
  v1::WaitResponse response;
  // The agent answers after at most timeout_ms; leave room for the round trip and a busy agent.
  auto context = session_->NewContext(milliseconds(timeout_ms) + session_->rpc_timeout());
  grpc::Status status = session_->stub().Wait(context.get(), request, &response);
  // An error the agent did not give (no answer trailer) is the RPC's, not the operation's.
  *transient = (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) &&
               !context->GetServerTrailingMetadata().contains(common::kAgentAnswerTrailer);
  *done = !*transient && (!status.ok() || response.done());
  if (status.ok() && response.done()) state_->version.store(response.version());
  return common::FromGrpcStatus(status);
}

std::optional<absl::Status> Handle::WaitAttempt(const Attempt& attempt,
                                                Clock::time_point deadline) const {
  if (attempt.slot != nullptr) {
    // Results come through the ring, from no RPC: a frozen agent (its connection and the
    // KeepAlive stream still open) shows only as results that do not come. So after each
    // max_unanswered_wait without the result the agent is asked whether it still answers.
    const auto waiting_since = Clock::now();
    while (true) {
      const auto now = Clock::now();
      // (At least 100 ms between questions: a limit of 0 would ask in a loop.)
      const Clock::duration limit = std::max(session_->max_unanswered_wait(), milliseconds(100));
      const auto slice_end = deadline - now > limit ? now + limit : deadline;
      if (std::optional<absl::Status> result = session_->ring()->Wait(*attempt.slot, slice_end)) {
        return result;
      }
      if (Clock::now() >= deadline) return std::nullopt;
      if (absl::Status answered = session_->ProbeAgent(); !answered.ok()) {
        if (std::optional<absl::Status> ended = session_->ended()) return *ended;
        return absl::UnavailableError(absl::StrCat(
            "operation ", state_->name, ": no result on the control ring for ",
            std::chrono::duration_cast<milliseconds>(Clock::now() - waiting_since).count(),
            " ms and the agent did not answer (", answered.ToString(),
            "); the operation may go on there"));
      }
    }
  }
  milliseconds backoff = kInitialWaitBackoff;
  // Since when the Wait RPCs have failed without an answer (none failed: nullopt).
  std::optional<Clock::time_point> unanswered_since;
  while (true) {
    const auto remaining = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    const milliseconds slice = std::clamp(remaining, milliseconds(0), kMaxWaitSlice);
    bool done = false;
    bool transient = false;
    absl::Status status =
        WaitOnce(attempt, static_cast<uint32_t>(slice.count()), &done, &transient);
    if (done) {
      if (unanswered_since && absl::IsNotFound(status)) {
        // The agent reports a result once: it answered an RPC that failed on the way back
        // (past its deadline) and forgot the handle.
        return absl::UnavailableError(absl::StrCat(
            "operation ", state_->name,
            ": its result was lost (the agent answered a Wait RPC that failed on the way "
            "back, then no longer knew the handle: ",
            status.message(), ")"));
      }
      return status;
    }
    if (!transient) {
      unanswered_since.reset();
    } else {
      // The agent did not answer: the operation goes on there unless the session ended.
      if (!session_->active()) return status;  // the client left the job
      if (std::optional<absl::Status> ended = session_->ended()) {
        return absl::Status(
            ended->code(),
            absl::StrCat(ended->message(), " (the last Wait RPC: ", status.ToString(), ")"));
      }
      const auto now = Clock::now();
      if (!unanswered_since) {
        unanswered_since = now;
        Log()->warn("Wait RPC for operation {} failed ({}); asking the agent again", state_->name,
                    status);
      } else if (now - *unanswered_since >= session_->max_unanswered_wait()) {
        // A frozen agent keeps its connection (and the KeepAlive stream) open: bounded here.
        return absl::UnavailableError(
            absl::StrCat("operation ", state_->name, ": the agent has not answered Wait RPCs for ",
                         std::chrono::duration_cast<milliseconds>(now - *unanswered_since).count(),
                         " ms (the last: ", status.ToString(), "); the operation may go on there"));
      }
      if (absl::IsUnavailable(status)) {
        // Unreachable: give the channel time to reconnect (the keepalive ends the session
        // when the agent is gone for good).
        const auto pause = std::min<Clock::duration>(backoff, deadline - now);
        if (pause > Clock::duration::zero()) std::this_thread::sleep_for(pause);
        backoff = std::min(backoff * 2, kMaxWaitBackoff);
      }
    }
    if (Clock::now() >= deadline) return std::nullopt;
  }
}

bool Handle::Finish(uint64_t number, absl::Status result) const {
  std::lock_guard lock(state_->mu);
  if (state_->done) return true;
  if (state_->attempt_number != number) return false;  // another waiter submitted it again
  if (state_->retry && Retriable(result) && state_->retries < state_->max_retries &&
      session_->active()) {
    // The failed attempt may have written sums into part of the region (push/pull writes each
    // chunk's sum as it comes back; the agent completes a failure only after such writes):
    // the retry must add the original inputs.
    if (state_->input_bytes > 0) {
      std::memcpy(state_->region, state_->inputs.data.get(), state_->input_bytes);
    }
    bool done = false;
    auto next = SubmitOnce(*session_, state_->request, milliseconds(0), &done);
    if (next.ok()) {
      state_->retries++;
      state_->attempt_number++;
      state_->attempt = Attempt{next->first, std::move(next->second)};
      Log()->info("operation {} failed as retriable ({}); submitted again (retry {} of {})",
                  state_->name, result, state_->retries, state_->max_retries);
      return false;
    }
    // A membership change refuses the retry: that is the operation's result (the caller
    // resyncs), with its marker at the start.
    result = IsMembershipChanged(next.status())
                 ? next.status()
                 : Annotate(result, absl::StrCat("(submitting it again failed: ",
                                                 next.status().ToString(), ") "));
  }
  state_->done = true;
  state_->result = std::move(result);
  state_->ReleaseInputs();
  return true;
}

absl::Status Handle::Wait(milliseconds timeout) const {
  if (state_ == nullptr) return absl::FailedPreconditionError("waiting on an invalid handle");
  const auto start = Clock::now();
  // Saturated: milliseconds::max() ("no limit") overflowed in nanoseconds into a deadline in
  // the past, and the wait returned DEADLINE_EXCEEDED at once.
  const milliseconds room =
      std::chrono::duration_cast<milliseconds>(Clock::time_point::max() - start);
  const auto deadline = std::max(timeout, milliseconds(0)) >= room
                            ? Clock::time_point::max()
                            : start + std::max(timeout, milliseconds(0));
  while (true) {
    Attempt attempt;
    uint64_t number = 0;
    {
      std::lock_guard lock(state_->mu);
      if (state_->done) return state_->result;
      attempt = state_->attempt;
      number = state_->attempt_number;
    }
    auto not_done = [&] {
      return absl::DeadlineExceededError(absl::StrCat(
          "operation ", state_->name, " not done after ",
          std::chrono::duration_cast<milliseconds>(Clock::now() - start).count(), " ms"));
    };
    // One Wait RPC per handle at a time: the agent forgets a handle once it reported its result,
    // so a second thread's RPC would get "not found" and could make that the result. The other
    // threads wait here, then find the result in the state.
    std::unique_lock<std::timed_mutex> rpc_turn(state_->rpc_wait_mu, std::defer_lock);
    if (attempt.slot == nullptr) {
      if (deadline == Clock::time_point::max()) {
        rpc_turn.lock();
      } else if (!rpc_turn.try_lock_until(deadline)) {
        return not_done();
      }
      std::lock_guard lock(state_->mu);
      if (state_->done) return state_->result;
      if (state_->attempt_number != number) continue;  // submitted again meanwhile
    }
    std::optional<absl::Status> result = WaitAttempt(attempt, deadline);
    if (!result) return not_done();
    Finish(number, *std::move(result));  // the loop returns the result, or waits for the retry
  }
}

absl::StatusOr<bool> Handle::Test() const {
  if (state_ == nullptr) return absl::FailedPreconditionError("testing an invalid handle");
  Attempt attempt;
  uint64_t number = 0;
  {
    std::lock_guard lock(state_->mu);
    if (state_->done) {
      if (!state_->result.ok()) return state_->result;
      return true;
    }
    attempt = state_->attempt;
    number = state_->attempt_number;
  }
  std::optional<absl::Status> result;
  if (attempt.slot != nullptr) {
    result = session_->ring()->Wait(*attempt.slot, Clock::now());  // polls once
  } else {
    // Another thread's Wait RPC is in flight: it reports the result; still running meanwhile.
    std::unique_lock<std::timed_mutex> rpc_turn(state_->rpc_wait_mu, std::try_to_lock);
    if (!rpc_turn.owns_lock()) return false;
    {
      std::lock_guard lock(state_->mu);
      if (state_->done) {
        RETURN_IF_ERROR(state_->result);
        return true;
      }
      if (state_->attempt_number != number) return false;  // submitted again meanwhile
    }
    bool done = false;
    bool transient = false;
    absl::Status status = WaitOnce(attempt, 0, &done, &transient);
    if (done) result = std::move(status);
    if (transient) {
      if (std::optional<absl::Status> ended = session_->ended()) result = *ended;
    }
  }
  if (!result || !Finish(number, *result)) return false;  // running, or submitted again
  std::lock_guard lock(state_->mu);
  RETURN_IF_ERROR(state_->result);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Client

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options,
                                                        const std::string& job_id,
                                                        uint32_t local_rank, uint32_t local_size) {
  if (job_id.empty()) return absl::InvalidArgumentError("job id must not be empty");
  if (local_size == 0 || local_rank >= local_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("local rank ", local_rank, " is not in [0, local size ", local_size, ")"));
  }
  if (options.rpc_timeout <= milliseconds(0)) {
    return absl::InvalidArgumentError("rpc_timeout must be positive");
  }
  if (options.max_unanswered_wait < milliseconds(0)) {
    return absl::InvalidArgumentError("max_unanswered_wait must not be negative");
  }
  const uint32_t capacity = options.control_ring_capacity;
  if (options.control_ring &&
      (capacity < common::shm_ring::kMinCapacity || capacity > common::shm_ring::kMaxCapacity ||
       (capacity & (capacity - 1)) != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("control_ring_capacity ", capacity, " must be a power of two in [",
                     common::shm_ring::kMinCapacity, ", ", common::shm_ring::kMaxCapacity, "]"));
  }

  grpc::ChannelArguments args;
  // Reconnect quickly once the agent comes up, instead of gRPC's default of up to 2 minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.agent_address, grpc::InsecureChannelCredentials(), args);
  std::unique_ptr<v1::Agent::Stub> stub = v1::Agent::NewStub(channel);

  v1::JoinJobRequest request;
  request.set_job_id(job_id);
  request.set_local_rank(local_rank);
  request.set_local_size(local_size);
  v1::JoinJobResponse response;

  const std::string prefix =
      absl::StrCat("joining job '", job_id, "' through agent ", options.agent_address, ": ");
  const auto start = Clock::now();
  const auto deadline = start + options.join_timeout;
  milliseconds backoff = kInitialJoinBackoff;
  int attempts = 0;
  absl::Status last_retryable;
  auto timed_out = [&] {
    const auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
    return Annotate(last_retryable, absl::StrCat(prefix, "still failing after ", waited, " ms and ",
                                                 attempts, " attempts: "));
  };
  while (true) {
    const auto remaining = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (attempts > 0 && remaining <= milliseconds(0)) return timed_out();
    // The last attempt only gets what is left of join_timeout.
    const bool truncated = remaining < options.rpc_timeout;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::clamp(remaining, milliseconds(1), options.rpc_timeout));
    grpc::Status status = stub->JoinJob(&context, request, &response);
    ++attempts;
    if (status.ok()) break;
    absl::Status error = common::FromGrpcStatus(status);
    if (error.code() == absl::StatusCode::kDeadlineExceeded && truncated && attempts > 1) {
      return timed_out();
    }
    if (!RetryableJoinError(error.code())) return Annotate(error, prefix);
    last_retryable = std::move(error);
    common::Logger("client")->debug("{}{}; retrying in {} ms", prefix, last_retryable,
                                    backoff.count());
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    std::this_thread::sleep_for(std::min(backoff, left));
    backoff = std::min(backoff * 2, kMaxJoinBackoff);
  }

  absl::StatusOr<std::unique_ptr<internal::BufferChannel>> buffers =
      internal::BufferChannel::Connect(options.agent_address);
  if (!buffers.ok()) {
    if (buffers.status().code() == absl::StatusCode::kPermissionDenied) {
      return Annotate(buffers.status(), prefix);
    }
    Log()->warn("{}no buffer socket ({}); this client cannot allocate shared buffers", prefix,
                buffers.status());
  }
  internal::BufferChannel* channel_of_buffers = buffers.ok() ? buffers->get() : nullptr;
  std::shared_ptr<ControlRing> ring;
  if (options.control_ring) {
    ring = AttachControlRing(*stub, options, response.session_id(), channel_of_buffers);
  }
  auto session = std::make_shared<internal::AgentSession>(
      std::move(channel), std::move(stub), options.agent_address, response.session_id(),
      options.rpc_timeout, std::move(ring),
      buffers.ok() ? *std::move(buffers) : std::unique_ptr<internal::BufferChannel>());
  session->set_max_unanswered_wait(options.max_unanswered_wait);
  std::unique_ptr<Client> client(new Client(options, job_id, local_rank, local_size,
                                            response.global_rank(), response.world_size(),
                                            response.plan_version(), std::move(session)));
  client->generation_ = response.generation();
  common::Logger("client")->info(
      "joined job {} as global rank {} of {} (local {} of {}), session {}", job_id,
      client->global_rank(), client->world_size(), local_rank, local_size,
      client->session_->session_id());
  return client;
}

Client::Client(ClientOptions options, std::string job_id, uint32_t local_rank, uint32_t local_size,
               uint32_t global_rank, uint32_t world_size, uint64_t plan_version,
               std::shared_ptr<internal::AgentSession> session)
    : options_(std::move(options)),
      job_id_(std::move(job_id)),
      local_rank_(local_rank),
      local_size_(local_size),
      global_rank_(global_rank),
      world_size_(world_size),
      plan_version_(plan_version),
      session_(std::move(session)),
      input_pool_(std::make_shared<internal::InputPool>()),
      keepalive_(std::make_unique<internal::KeepAliveReactor>(session_)) {}

Client::~Client() {
  absl::Status status = Leave();
  if (!status.ok()) {
    common::Logger("client")->warn("leaving job {} failed: {}", job_id_, status);
  }
}

const std::string& Client::session_id() const { return session_->session_id(); }

bool Client::has_control_ring() const { return session_->ring() != nullptr; }

absl::Status Client::Resync() { return ResyncWithin(options_.join_timeout); }

absl::Status Client::ResyncWithin(milliseconds limit) {
  if (!session_->active()) return LeftError(job_id_);
  v1::ResyncRequest request;
  request.set_session_id(session_->session_id());
  const auto start = Clock::now();
  milliseconds backoff = kInitialJoinBackoff;
  while (true) {
    v1::ResyncResponse response;
    auto context = session_->NewContext();
    absl::Status status =
        common::FromGrpcStatus(session_->stub().Resync(context.get(), request, &response));
    if (status.ok()) {
      const uint64_t old = generation_.exchange(response.generation());
      global_rank_ = response.global_rank();
      world_size_ = response.world_size();
      plan_version_ = response.plan_version();
      if (old != response.generation()) {
        Log()->info("job {}: resynced at membership generation {} (was {}): global rank {} of {}",
                    job_id_, response.generation(), old, response.global_rank(),
                    response.world_size());
      }
      return absl::OkStatus();
    }
    const auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    if (status.code() != absl::StatusCode::kUnavailable || waited >= limit) {
      return Annotate(status, absl::StrCat("resyncing with job '", job_id_, "' after ",
                                           waited.count(), " ms: "));
    }
    std::this_thread::sleep_for(std::min(backoff, limit - waited));
    backoff = std::min(backoff * 2, kMaxJoinBackoff);
  }
}

absl::Status Client::ResyncTo(uint64_t generation, milliseconds timeout) {
  const auto start = Clock::now();
  milliseconds backoff = kInitialJoinBackoff;
  while (generation_ < generation) {
    const auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    // UNAVAILABLE past the limit: a replacement on this node still waits for the controller.
    absl::Status status = ResyncWithin(std::max(timeout - waited, milliseconds(0)));
    if (!status.ok() && !absl::IsUnavailable(status)) return status;
    if (generation_ >= generation) break;
    // The agent has not heard of the generation yet (it comes with the controller's next plan):
    // ask again.
    const auto now_waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    if (now_waited >= timeout) {
      return absl::DeadlineExceededError(absl::StrCat(
          "job '", job_id_, "': this process's agent is still at membership generation ",
          generation_.load(), " after ", now_waited.count(),
          " ms, but another process of the job joined at generation ", generation,
          status.ok() ? " (has the agent lost the controller? its log and /metrics say)"
                      : absl::StrCat(" (", status.message(), ")")));
    }
    std::this_thread::sleep_for(std::min(backoff, timeout - now_waited));
    backoff = std::min(backoff * 2, kMaxJoinBackoff);
  }
  return absl::OkStatus();
}

absl::Status Client::Leave() {
  std::lock_guard lock(leave_mu_);
  if (left_) return leave_status_;
  left_ = true;
  session_->MarkInactive();
  if (ControlRing* ring = session_->ring(); ring != nullptr) ring->Close(LeftError(job_id_));
  v1::LeaveJobRequest request;
  request.set_session_id(session_->session_id());
  v1::LeaveJobResponse response;
  auto context = session_->NewContext();
  leave_status_ =
      common::FromGrpcStatus(session_->stub().LeaveJob(context.get(), request, &response));
  if (keepalive_ != nullptr) {
    keepalive_->CancelAndWait();
    keepalive_.reset();
  }
  return leave_status_;
}

absl::StatusOr<std::shared_ptr<SharedBuffer>> Client::AllocateBuffer(size_t bytes) {
  if (!session_->active()) return LeftError(job_id_);
  internal::BufferChannel* buffers = session_->buffers();
  if (buffers == nullptr) {
    // Say why: connecting again gives the current reason (no agent, a TCP address, ...).
    absl::StatusOr<std::unique_ptr<internal::BufferChannel>> again =
        internal::BufferChannel::Connect(session_->agent_address());
    return absl::FailedPreconditionError(absl::StrCat(
        "this client has no buffer socket to agent ", session_->agent_address(), ": ",
        again.ok() ? "it was unreachable when the client joined" : again.status().message()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SharedBuffer> buffer, SharedBuffer::Create(bytes));
  ASSIGN_OR_RETURN(const uint64_t id, buffers->Register(session_->session_id(), buffer->fd(),
                                                        buffer->size(), session_->rpc_timeout()));
  buffer->SetRegistration(session_, id);
  return std::shared_ptr<SharedBuffer>(std::move(buffer));
}

absl::StatusOr<std::shared_ptr<SharedBuffer>> Client::RegisterCudaBuffer(
    void* device_allocation_base, size_t bytes, int device, void* stream) {
  if (!session_->active()) return LeftError(job_id_);
  ASSIGN_OR_RETURN(std::unique_ptr<internal::CudaExport> exported,
                   internal::ExportCudaBuffer(device_allocation_base, bytes, device));
  v1::RegisterCudaBufferRequest request;
  request.set_session_id(session_->session_id());
  request.set_record(exported->record());
  v1::RegisterCudaBufferResponse response;
  auto context = session_->NewContext();
  RETURN_IF_ERROR(common::FromGrpcStatus(
      session_->stub().RegisterCudaBuffer(context.get(), request, &response)));
  std::unique_ptr<SharedBuffer> buffer(
      new SharedBuffer(absl::StrFormat("cuda:%d:%p", device, device_allocation_base),
                       device_allocation_base, bytes, std::move(exported), device, stream));
  buffer->SetRegistration(session_, response.buffer_id());
  return std::shared_ptr<SharedBuffer>(std::move(buffer));
}

absl::StatusOr<Handle> Client::Submit(std::string_view name, const SharedBuffer& buffer,
                                      size_t offset_bytes, size_t count, common::DataType dtype,
                                      v1::CollectiveOp op, uint32_t root_rank, int32_t priority,
                                      milliseconds wait, double delta_scale) {
  if (!session_->active()) return LeftError(job_id_);
  // Only what concerns this client's own buffer is checked here; the agent validates the rest
  // of the request (name, dtype, op, count) once, naming the job and the tensor.
  const std::string tensor(name);
  if (buffer.session_ != session_ || buffer.id() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", tensor, ": buffer ", buffer.name(),
                     " was not allocated by this client (use Client::AllocateBuffer)"));
  }
  const size_t element = common::DataTypeSize(dtype);
  if (element == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", tensor, ": unknown data type ", static_cast<int>(dtype)));
  }
  if (offset_bytes % element != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor, ": offset ", offset_bytes,
                                                   " is not a multiple of the element size ",
                                                   element));
  }
  // All-gather and reduce-scatter work on world_size() blocks of `count` elements.
  size_t region = count;
  if (IsBlockwise(op)) {
    if (count == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", tensor, ": the block size (count) must be at least 1"));
    }
    if (count > SIZE_MAX / std::max<uint32_t>(world_size(), 1)) {
      return absl::OutOfRangeError(absl::StrCat("tensor ", tensor, ": ", world_size(),
                                                " blocks of ", count, " elements overflow"));
    }
    region = count * world_size();
  }
  if (offset_bytes > buffer.size() || region > (buffer.size() - offset_bytes) / element) {
    return absl::OutOfRangeError(absl::StrCat("tensor ", tensor, ": ", region, " elements of ",
                                              std::string(common::DataTypeName(dtype)),
                                              " at offset ", offset_bytes, " do not fit in buffer ",
                                              buffer.name(), " of ", buffer.size(), " bytes"));
  }
  if (op == v1::COLLECTIVE_OP_BROADCAST && root_rank >= world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor, ": root rank ", root_rank,
                                                   " is not below the world size ", world_size()));
  }

  Request r;
  r.name = tensor;
  r.buffer_id = buffer.id();
  r.offset_bytes = offset_bytes;
  r.count = count;
  r.dtype = static_cast<v1::DataType>(static_cast<int>(dtype));
  r.op = op;
  r.root_rank = root_rank;
  r.priority = priority;
  r.delta_scale = delta_scale;
  auto state = std::make_shared<Handle::State>();
  state->name = tensor;
  // A CUDA buffer's region is device memory: no host copy of the inputs, so no retry.
  state->retry = options_.retry_collectives && options_.max_retries > 0 &&
                 !IsParameterServerOp(op) && !buffer.is_cuda();
  if (state->retry) {
    state->max_retries = options_.max_retries;
    state->region = static_cast<std::byte*>(buffer.data()) + offset_bytes;
    // The inputs, for a retry after a failed attempt wrote sums into part of the region.
    state->pool = input_pool_;
    state->input_bytes = region * element;
    state->inputs = input_pool_->Take(state->input_bytes);
    std::memcpy(state->inputs.data.get(), state->region, state->input_bytes);
    // The result comes from Wait, never from a Submit that waits: a Submit error is then always
    // a refused submission, which is not retried.
    wait = milliseconds(0);
  }
  // The agent copies a CUDA buffer's region after the caller's work queued before this.
  RETURN_IF_ERROR(buffer.MarkReady());
  bool done = false;
  ASSIGN_OR_RETURN(auto attempt, SubmitOnce(*session_, r, wait, &done, &state->version));
  state->request = std::move(r);
  state->attempt = Handle::Attempt{attempt.first, std::move(attempt.second)};
  state->done = done;
  Handle handle;
  handle.session_ = session_;
  handle.state_ = std::move(state);
  return handle;
}

absl::StatusOr<Handle> Client::AllReduceAsync(std::string_view name, const SharedBuffer& buffer,
                                              size_t offset_bytes, size_t count,
                                              common::DataType dtype, ReduceOp op,
                                              int32_t priority) {
  return Submit(name, buffer, offset_bytes, count, dtype, ToCollectiveOp(op), /*root_rank=*/0,
                priority);
}

absl::StatusOr<Handle> Client::BroadcastAsync(std::string_view name, const SharedBuffer& buffer,
                                              size_t offset_bytes, size_t count,
                                              common::DataType dtype, uint32_t root_rank,
                                              int32_t priority) {
  return Submit(name, buffer, offset_bytes, count, dtype, v1::COLLECTIVE_OP_BROADCAST, root_rank,
                priority);
}

absl::StatusOr<Handle> Client::AllGatherAsync(std::string_view name, const SharedBuffer& buffer,
                                              size_t offset_bytes, size_t count,
                                              common::DataType dtype, int32_t priority) {
  return Submit(name, buffer, offset_bytes, count, dtype, v1::COLLECTIVE_OP_ALLGATHER,
                /*root_rank=*/0, priority);
}

absl::StatusOr<Handle> Client::ReduceScatterAsync(std::string_view name, const SharedBuffer& buffer,
                                                  size_t offset_bytes, size_t count,
                                                  common::DataType dtype, ReduceOp op,
                                                  int32_t priority) {
  return Submit(name, buffer, offset_bytes, count, dtype, ToReduceScatterOp(op), /*root_rank=*/0,
                priority);
}

absl::Status Client::SubmitAndWait(std::string_view name, const SharedBuffer& buffer,
                                   size_t offset_bytes, size_t count, common::DataType dtype,
                                   v1::CollectiveOp op, uint32_t root_rank, int32_t priority) {
  const auto start = Clock::now();
  ASSIGN_OR_RETURN(Handle handle, Submit(name, buffer, offset_bytes, count, dtype, op, root_rank,
                                         priority, options_.op_timeout));
  return handle.Wait(options_.op_timeout -
                     std::chrono::duration_cast<milliseconds>(Clock::now() - start));
}

absl::Status Client::AllReduce(std::string_view name, const SharedBuffer& buffer,
                               size_t offset_bytes, size_t count, common::DataType dtype,
                               ReduceOp op, int32_t priority) {
  return SubmitAndWait(name, buffer, offset_bytes, count, dtype, ToCollectiveOp(op),
                       /*root_rank=*/0, priority);
}

absl::Status Client::Broadcast(std::string_view name, const SharedBuffer& buffer,
                               size_t offset_bytes, size_t count, common::DataType dtype,
                               uint32_t root_rank, int32_t priority) {
  return SubmitAndWait(name, buffer, offset_bytes, count, dtype, v1::COLLECTIVE_OP_BROADCAST,
                       root_rank, priority);
}

absl::Status Client::AllGather(std::string_view name, const SharedBuffer& buffer,
                               size_t offset_bytes, size_t count, common::DataType dtype,
                               int32_t priority) {
  return SubmitAndWait(name, buffer, offset_bytes, count, dtype, v1::COLLECTIVE_OP_ALLGATHER,
                       /*root_rank=*/0, priority);
}

absl::Status Client::ReduceScatter(std::string_view name, const SharedBuffer& buffer,
                                   size_t offset_bytes, size_t count, common::DataType dtype,
                                   ReduceOp op, int32_t priority) {
  return SubmitAndWait(name, buffer, offset_bytes, count, dtype, ToReduceScatterOp(op),
                       /*root_rank=*/0, priority);
}

absl::StatusOr<Handle> Client::InitParamsAsync(std::string_view name, const SharedBuffer& buffer,
                                               size_t offset_bytes, size_t count,
                                               common::DataType dtype) {
  return Submit(name, buffer, offset_bytes, count, dtype, v1::COLLECTIVE_OP_PS_INIT, 0, 0);
}

absl::StatusOr<Handle> Client::PushDeltaAsync(std::string_view name, const SharedBuffer& buffer,
                                              size_t offset_bytes, size_t count,
                                              common::DataType dtype, double scale) {
  return Submit(name, buffer, offset_bytes, count, dtype, v1::COLLECTIVE_OP_PS_PUSH_DELTA, 0, 0,
                milliseconds(0), scale);
}

absl::StatusOr<Handle> Client::PullParamsAsync(std::string_view name, const SharedBuffer& buffer,
                                               size_t offset_bytes, size_t count,
                                               common::DataType dtype) {
  return Submit(name, buffer, offset_bytes, count, dtype, v1::COLLECTIVE_OP_PS_PULL, 0, 0);
}

absl::StatusOr<uint64_t> Client::ParameterServerCall(std::string_view name,
                                                     const SharedBuffer& buffer,
                                                     size_t offset_bytes, size_t count,
                                                     common::DataType dtype, v1::CollectiveOp op,
                                                     double scale) {
  const auto start = Clock::now();
  ASSIGN_OR_RETURN(Handle handle, Submit(name, buffer, offset_bytes, count, dtype, op, 0, 0,
                                         options_.op_timeout, scale));
  RETURN_IF_ERROR(handle.Wait(options_.op_timeout -
                              std::chrono::duration_cast<milliseconds>(Clock::now() - start)));
  return handle.version();
}

absl::Status Client::InitParams(std::string_view name, const SharedBuffer& buffer,
                                size_t offset_bytes, size_t count, common::DataType dtype) {
  return ParameterServerCall(name, buffer, offset_bytes, count, dtype, v1::COLLECTIVE_OP_PS_INIT, 0)
      .status();
}

absl::Status Client::PushDelta(std::string_view name, const SharedBuffer& buffer,
                               size_t offset_bytes, size_t count, common::DataType dtype,
                               double scale) {
  return ParameterServerCall(name, buffer, offset_bytes, count, dtype,
                             v1::COLLECTIVE_OP_PS_PUSH_DELTA, scale)
      .status();
}

absl::StatusOr<uint64_t> Client::PullParams(std::string_view name, const SharedBuffer& buffer,
                                            size_t offset_bytes, size_t count,
                                            common::DataType dtype) {
  return ParameterServerCall(name, buffer, offset_bytes, count, dtype, v1::COLLECTIVE_OP_PS_PULL,
                             0);
}

uint64_t Handle::version() const { return state_ == nullptr ? 0 : state_->version.load(); }

}  // namespace tributary::client
