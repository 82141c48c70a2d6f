// The C++ client library of Tributary: what a training process links to run collectives
// through the agent on its node.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/shm_buffer.h"
#include "common/dtype.h"
#include "common/shm_ring.h"
#include "tributary/v1/agent.pb.h"

namespace tributary::client {

namespace internal {
class AgentSession;
class InputPool;
class KeepAliveReactor;
}  // namespace internal

struct ClientOptions {
  // gRPC target of the local agent, usually a unix socket ("unix:/path").
  std::string agent_address = "unix:/tmp/tributary-agent.sock";
  // Deadline of every control RPC (join, register, submit, leave...).
  std::chrono::milliseconds rpc_timeout{10000};
  // How long Connect retries JoinJob while the agent is unreachable or has no plan yet.
  std::chrono::milliseconds join_timeout{30000};
  // How long the blocking AllReduce/Broadcast wait for the operation. Keep it above the job's
  // op_timeout_ms (default 30 s) so that the agent's own error, which says what went wrong,
  // arrives before this client-side deadline.
  std::chrono::milliseconds op_timeout{120000};
  // A Wait RPC that fails before the agent answers (UNAVAILABLE or past its deadline, from gRPC
  // itself) is asked again, until the wait's deadline or the end of the session; Wait RPCs
  // failing without an answer for this long end the wait with UNAVAILABLE (a frozen agent keeps
  // the session open). A wait on the control ring asks the agent whether it answers after each
  // max_unanswered_wait without the result, and ends the same way when it does not.
  std::chrono::milliseconds max_unanswered_wait{30000};
  // Submit collectives through the session's control ring (shared memory, no RPC per
  // operation; see control_ring.h) when the agent serves one. Submissions still use the Submit
  // RPC when the agent has no ring (UNIMPLEMENTED), for tensor names over 200 bytes, and while
  // the ring already holds control_ring_capacity operations in flight.
  bool control_ring = true;
  // Entries per direction of the ring: a power of two in [2, 4096].
  uint32_t control_ring_capacity = 256;
  // A waiter whose recent waits on the ring were shorter than this polls it for up to this long
  // before sleeping on its doorbell (a futex wake-up costs tens of microseconds on a VM; see
  // common/shm_ring.h SpinPolicy). Zero: sleep at once.
  std::chrono::microseconds control_ring_spin = common::shm_ring::kDefaultSpin;
  // Transparent retry. A collective that fails as retriable -- its job's plan changed under it,
  // or a summation server was lost (UNAVAILABLE, marked retriable by the agent) -- is submitted
  // again by Handle::Wait / Test, up to max_retries times, with the region's original inputs:
  // the agent runs the same iteration again once it has the new plan, so every process agrees
  // on it. Costs one copy of the region per submission (taken before it is sent; see
  // client/README.md for figures). false: such failures are returned as they are.
  bool retry_collectives = true;
  uint32_t max_retries = 3;
};

enum class ReduceOp { kSum, kAverage };

// True for the error of a collective refused or failed because the job's membership changed
// (ABORTED, "[membership changed, generation G] ..."): a process of the job was replaced (it
// died and a new one joined in its place), an agent of a worker node restarted, or an elastic
// job's worker nodes changed. Every process of the job gets it once per change. Call
// Client::Resync, then restart the training step from a sync point.
bool IsMembershipChanged(const absl::Status& status);

// A submitted collective. Cheap to copy; copies share the result. Valid after the Client is
// gone, but then Wait fails (the session has ended). With ClientOptions::retry_collectives,
// Wait and Test resubmit a retriable failure themselves (see there): the buffer must then stay
// alive, and its region untouched, until Wait or Test has reported the result.
// Threading: thread-safe.
class Handle {
 public:
  Handle() = default;  // Not valid; Wait/Test fail with FAILED_PRECONDITION.

  // Waits up to `timeout` for the operation. OK when it completed successfully; its error
  // (same code and message as the agent reported) when it failed; DEADLINE_EXCEEDED
  // "operation <name> not done after N ms" when `timeout` passed first (the operation goes on;
  // Wait again). Once done, the result is remembered and later calls return it at once.
  absl::Status Wait(std::chrono::milliseconds timeout) const;
  // Polls once: true when done (successfully), false when still running, the error if the
  // operation failed.
  absl::StatusOr<bool> Test() const;

  bool valid() const { return state_ != nullptr; }
  // The agent's handle number, or for an operation submitted through the control ring its
  // ticket in the ring.
  uint64_t id() const;
  // True when the operation went through the control ring (false: the Submit RPC).
  bool via_control_ring() const;
  // The tensor name it was submitted with.
  const std::string& name() const;
  // Times the operation was submitted again after a retriable failure (0 without one).
  uint32_t retries() const;
  // PullParamsAsync / InitParamsAsync, once Wait returned OK: the version of the parameters
  // received (deltas applied; 0 otherwise).
  uint64_t version() const;

 private:
  friend class Client;
  struct State;
  struct Attempt;

  // One Wait RPC on `attempt` with `timeout_ms`; sets *done (the agent answered done, or with
  // the operation's error) and *transient (the RPC failed in transport, before the agent
  // answered: unavailable or past its deadline; the operation may go on).
  absl::Status WaitOnce(const Attempt& attempt, uint32_t timeout_ms, bool* done,
                        bool* transient) const;
  // Waits for `attempt` until `deadline`; nullopt when it passed first.
  std::optional<absl::Status> WaitAttempt(const Attempt& attempt,
                                          std::chrono::steady_clock::time_point deadline) const;
  // `result` ended attempt number `number`: true when it is the operation's result (now
  // remembered); false when the operation was submitted again (or another thread did so).
  bool Finish(uint64_t number, absl::Status result) const;

  std::shared_ptr<internal::AgentSession> session_;
  std::shared_ptr<State> state_;
};

// A training process's session with its local agent in one job.
//
// Connect joins the job as local worker `local_rank` of `local_size` and holds a KeepAlive
// stream open, so the agent ends the session (and fails its pending operations) when the
// process dies. Collectives run on regions of SharedBuffers that this client allocated
// (AllocateBuffer) or registered (RegisterCudaBuffer).
// Every process of the job must submit the same tensor names, in any order, with the same
// count, dtype and op; each submission of a name is that tensor's next iteration.
//
// Threading: every method may be called from several threads at once, Leave() included (calls
// racing with it may fail with FAILED_PRECONDITION or the agent's error). Only the destructor
// must not race with other calls on the same Client.
class Client {
 public:
  // Joins `job_id` through the agent at options.agent_address. Retries JoinJob with a backoff
  // (50 ms doubling to 500 ms) while it fails with UNAVAILABLE (no agent yet) or
  // FAILED_PRECONDITION (the agent has no plan for the job yet), for up to
  // options.join_timeout; then returns the last error, naming the job. Other errors
  // (NOT_FOUND: this node does not work for the job, INVALID_ARGUMENT...) return at once.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options,
                                                         const std::string& job_id,
                                                         uint32_t local_rank, uint32_t local_size);

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  // Leaves the job (best effort) and closes the KeepAlive stream.
  ~Client();

  const std::string& job_id() const { return job_id_; }
  const std::string& session_id() const;
  // Rank among all processes of the job (node_rank * procs_per_node + local_rank). An elastic
  // job's may change at a Resync.
  uint32_t global_rank() const { return global_rank_; }
  // Number of processes in the job (an elastic job's may change at a Resync).
  uint32_t world_size() const { return world_size_; }
  uint32_t local_rank() const { return local_rank_; }
  uint32_t local_size() const { return local_size_; }
  // Version of the job's plan when the session joined (or last resynced).
  uint64_t plan_version() const { return plan_version_; }
  // The job's membership generation the session is bound to (moves with Resync).
  uint64_t generation() const { return generation_; }
  // True when the agent attached this session's control ring (the fast path).
  bool has_control_ring() const;

  // Creates a shared-memory buffer of `bytes` bytes and registers it with the agent.
  absl::StatusOr<std::shared_ptr<SharedBuffer>> AllocateBuffer(size_t bytes);

  // Registers the caller's CUDA device allocation with the agent by CUDA IPC (the agent keeps a
  // pinned host mirror and copies each collective's region in and the result back; see
  // SharedBuffer). `device_allocation_base` must be the base pointer cudaMalloc returned on
  // `device` (IPC handles name whole allocations), `bytes` at most its size; the allocation
  // must outlive the returned buffer (destroy the buffer, which unregisters it, before
  // cudaFree). `stream` (a cudaStream_t; null: the legacy default stream) is where the caller's
  // kernels write the buffer: each submission on the buffer records its ready event there, so
  // the agent's copy waits for them. The result returned by the collectives' Async forms is
  // usable as for shared memory, except that a collective on a CUDA buffer is never retried
  // transparently (ClientOptions::retry_collectives: its retriable failure is returned).
  // Errors: FAILED_PRECONDITION when this client or the agent was built without CUDA, or a
  // machine has no CUDA device; INVALID_ARGUMENT for memory that cannot be exported.
  absl::StatusOr<std::shared_ptr<SharedBuffer>> RegisterCudaBuffer(void* device_allocation_base,
                                                                   size_t bytes, int device,
                                                                   void* stream = nullptr);

  // Starts an all-reduce of `count` elements of `dtype` at byte `offset_bytes` of `buffer`
  // (in place: the result replaces the input) under the tensor name `name`. Lower `priority`
  // goes first. Returns as soon as the agent accepted it.
  absl::StatusOr<Handle> AllReduceAsync(std::string_view name, const SharedBuffer& buffer,
                                        size_t offset_bytes, size_t count, common::DataType dtype,
                                        ReduceOp op, int32_t priority = 0);
  // Starts a broadcast of the region from the process with global rank `root_rank` to all.
  absl::StatusOr<Handle> BroadcastAsync(std::string_view name, const SharedBuffer& buffer,
                                        size_t offset_bytes, size_t count, common::DataType dtype,
                                        uint32_t root_rank, int32_t priority = 0);

  // All-gather, in place (NCCL's in-place convention): the region at `offset_bytes` holds
  // world_size() * count elements; this process's input is block global_rank() (elements
  // [global_rank()*count, (global_rank()+1)*count)); when done the whole region holds every
  // process's block in global-rank order. `count` is the per-process block size in elements.
  // INVALID_ARGUMENT / OUT_OF_RANGE (region does not fit the buffer, world_size() * count
  // overflows) before anything is sent.
  absl::StatusOr<Handle> AllGatherAsync(std::string_view name, const SharedBuffer& buffer,
                                        size_t offset_bytes, size_t count, common::DataType dtype,
                                        int32_t priority = 0);
  // Reduce-scatter, in place: the region holds world_size() * count elements of input; when
  // done block global_rank() holds the sum (or average over world_size()) of that block over all
  // processes; the rest of the region is unspecified. `count` is the per-process block size.
  absl::StatusOr<Handle> ReduceScatterAsync(std::string_view name, const SharedBuffer& buffer,
                                            size_t offset_bytes, size_t count,
                                            common::DataType dtype, ReduceOp op,
                                            int32_t priority = 0);

  // Blocking forms: submit, then wait up to options.op_timeout.
  absl::Status AllReduce(std::string_view name, const SharedBuffer& buffer, size_t offset_bytes,
                         size_t count, common::DataType dtype, ReduceOp op, int32_t priority = 0);
  absl::Status Broadcast(std::string_view name, const SharedBuffer& buffer, size_t offset_bytes,
                         size_t count, common::DataType dtype, uint32_t root_rank,
                         int32_t priority = 0);
  absl::Status AllGather(std::string_view name, const SharedBuffer& buffer, size_t offset_bytes,
                         size_t count, common::DataType dtype, int32_t priority = 0);
  absl::Status ReduceScatter(std::string_view name, const SharedBuffer& buffer, size_t offset_bytes,
                             size_t count, common::DataType dtype, ReduceOp op,
                             int32_t priority = 0);

  // Asynchronous parameter-server training (jobs created with `--mode async`; see
  // dataplane/collectives/parameter_server.h). Each process is a worker of its own: nothing is
  // gathered across the node's processes and nothing waits for the other workers, except a pull
  // under the job's staleness bound. The region is `count` elements of `dtype` at
  // `offset_bytes` of `buffer`, the same shape on every process for one name. Errors:
  // FAILED_PRECONDITION on a synchronous job or a push before init; INVALID_ARGUMENT when the
  // shape differs from the initialised one; DEADLINE_EXCEEDED (the job's op_timeout_ms) for a
  // pull before init or one held by a worker that stopped pushing (the message names it);
  // UNAVAILABLE after a re-plan: the servers' parameters are gone, every process calls
  // InitParams again (rank 0's values win) and continues.
  //
  // InitParams: global rank 0 pushes the region as the initial parameters; every other rank
  // waits for them and receives them into its region. Call it on every rank before the rest.
  absl::StatusOr<Handle> InitParamsAsync(std::string_view name, const SharedBuffer& buffer,
                                         size_t offset_bytes, size_t count, common::DataType dtype);
  absl::Status InitParams(std::string_view name, const SharedBuffer& buffer, size_t offset_bytes,
                          size_t count, common::DataType dtype);
  // PushDelta: the servers apply params += scale * region as each chunk arrives, exactly once
  // (scale 0: the job's --delta-scale, default 1). One push of a name at a time per process;
  // after a failure, push the same delta again (chunks applied already are not applied twice).
  absl::StatusOr<Handle> PushDeltaAsync(std::string_view name, const SharedBuffer& buffer,
                                        size_t offset_bytes, size_t count, common::DataType dtype,
                                        double scale = 0);
  absl::Status PushDelta(std::string_view name, const SharedBuffer& buffer, size_t offset_bytes,
                         size_t count, common::DataType dtype, double scale = 0);
  // PullParams: the current parameters into the region; returns their version (deltas applied,
  // never older than a version this process has seen in this plan epoch). Waits while this
  // process has pushed more than the job's staleness deltas beyond the slowest process.
  absl::StatusOr<Handle> PullParamsAsync(std::string_view name, const SharedBuffer& buffer,
                                         size_t offset_bytes, size_t count, common::DataType dtype);
  absl::StatusOr<uint64_t> PullParams(std::string_view name, const SharedBuffer& buffer,
                                      size_t offset_bytes, size_t count, common::DataType dtype);

  // After a membership change (IsMembershipChanged): binds the session to the job's new
  // membership generation, retrying while the agent still waits for it (up to
  // options.join_timeout; then UNAVAILABLE). This process's iterations of every tensor name
  // start again at 0, as every other process's do: restart the training step from a sync
  // point (agree on the step, broadcast the parameters from rank 0). Updates global_rank(),
  // world_size(), plan_version() and generation(). Idempotent within a generation. Do not call
  // it while collectives of this client are in flight.
  absl::Status Resync();

  // Binds the session to membership generation `generation` or a newer one: calls Resync until
  // the agent has it, for up to `timeout` (a Resync held back by a replacement on this node is
  // retried within it too). For processes that agree on a generation out of band after some of
  // them joined as replacements (tributary/distributed.py does it on torch's rendezvous store
  // when a process group is created): a process that joined before the last replacement, or
  // whose agent has not yet heard of the generation another process joined at, is otherwise
  // behind, and its first collective fails with a membership change. DEADLINE_EXCEEDED, naming
  // both generations, when the agent does not reach it in time. Same caveats as Resync.
  absl::Status ResyncTo(uint64_t generation, std::chrono::milliseconds timeout);

  // Leaves the job: LeaveJob (its error is returned, but the session is closed locally
  // regardless), then closes the KeepAlive stream. Idempotent; later calls on this client fail
  // with FAILED_PRECONDITION.
  absl::Status Leave();

 private:
  // Resync, retrying UNAVAILABLE for up to `limit`.
  absl::Status ResyncWithin(std::chrono::milliseconds limit);

  Client(ClientOptions options, std::string job_id, uint32_t local_rank, uint32_t local_size,
         uint32_t global_rank, uint32_t world_size, uint64_t plan_version,
         std::shared_ptr<internal::AgentSession> session);

  absl::StatusOr<Handle> Submit(std::string_view name, const SharedBuffer& buffer,
                                size_t offset_bytes, size_t count, common::DataType dtype,
                                v1::CollectiveOp op, uint32_t root_rank, int32_t priority,
                                std::chrono::milliseconds wait = std::chrono::milliseconds(0),
                                double delta_scale = 0);
  // A blocking parameter-server call; returns the handle's version.
  absl::StatusOr<uint64_t> ParameterServerCall(std::string_view name, const SharedBuffer& buffer,
                                               size_t offset_bytes, size_t count,
                                               common::DataType dtype, v1::CollectiveOp op,
                                               double scale);
  // A blocking collective: Submit waiting in the same call, then Wait for the rest of the
  // operation timeout.
  absl::Status SubmitAndWait(std::string_view name, const SharedBuffer& buffer, size_t offset_bytes,
                             size_t count, common::DataType dtype, v1::CollectiveOp op,
                             uint32_t root_rank, int32_t priority);

  const ClientOptions options_;
  const std::string job_id_;
  const uint32_t local_rank_;
  const uint32_t local_size_;
  std::atomic<uint32_t> global_rank_;
  std::atomic<uint32_t> world_size_;
  std::atomic<uint64_t> plan_version_;
  std::atomic<uint64_t> generation_{0};
  const std::shared_ptr<internal::AgentSession> session_;
  // Copies of submitted regions for retries, reused across submissions.
  const std::shared_ptr<internal::InputPool> input_pool_;

  std::mutex leave_mu_;
  bool left_ = false;          // Guarded by leave_mu_.
  absl::Status leave_status_;  // Guarded by leave_mu_.
  std::unique_ptr<internal::KeepAliveReactor> keepalive_;
};

}  // namespace tributary::client
