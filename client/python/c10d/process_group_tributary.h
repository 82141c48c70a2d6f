// The torch.distributed backend "tributary": a c10d::ProcessGroup of torch 1.13 over the C++
// client (client/client.h). CPU tensors are staged through pooled SharedBuffers (one copy in, one
// copy out); every call returns at once with a Work that a completion thread finishes when the
// client's Handle is done.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "client/client.h"
#include "client/python/c10d/staging_pool.h"

namespace tributary::client::c10d {

// One process's session with its agent, shared by every process group of the process (the agent
// knows a process by its local rank; one session per process).
struct Connection {
  std::shared_ptr<Client> client;
  std::shared_ptr<StagingPool> pool;
  std::string agent_address;
};

// A collective in flight. Finished (once) by the process group's completion thread, and its
// future completed right after on a callback thread (whose callbacks may block on other
// collectives): wait() returns once both are; the output tensors hold the result before either.
// Threading: thread-safe (c10d::Work's mutex).
class WorkTributary : public ::c10d::Work {
 public:
  // `what` names the call in messages ("allreduce of c10d.0.allreduce.float32.10").
  WorkTributary(int rank, ::c10d::OpType type, std::string what, std::vector<at::Tensor> outputs);

  // Waits until finished and the future completed, or `timeout` passes for both together
  // (kNoTimeout: no limit; the operation itself is bounded by the process group's timeout from
  // its submission). Throws the operation's error, or a timeout error naming the call.
  bool wait(std::chrono::milliseconds timeout) override;
  // Completed with the output tensors (a list), or with the operation's error.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;

  // Finishes the work: `error` null for success.
  void Finish(std::exception_ptr error);
  const std::string& what() const { return what_; }

 private:
  // Set by the future's first callback, which runs when it is marked completed and before any
  // callback added later (a callback that waits on its own work then returns at once). Shared
  // with the callback: the future may outlive the work.
  struct FutureDone {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;  // Guarded by mu.
  };

  const std::string what_;
  const std::vector<at::Tensor> outputs_;
  const c10::intrusive_ptr<c10::ivalue::Future> future_;
  const std::shared_ptr<FutureDone> future_done_ = std::make_shared<FutureDone>();
};

// Every process group of a job has the job's whole world: rank == the client's global rank,
// size == the job's world size (subgroups are refused at creation).
//
// Tensor names: c10d calls carry none, so each call is named from its process group and its
// signature, "c10d.<group>.<op>.<dtype>.<count>[.root<r>]" (<group>: the process-wide index of
// the group, the same on every rank since every rank creates its groups in the same order).
// Repeated calls with one signature are that name's successive iterations, which the agent
// matches across ranks in order; so every rank must issue the same sequence of collectives, as
// c10d requires anyway.
//
// Threading: collectives may be called from several threads (c10d's callers serialise them per
// group in practice; the agent matches a name's iterations in submission order). One
// completion thread per group waits on the handles in submission order (blocking waits, no
// polling), copies results out and finishes the works; future callbacks run on it.
class ProcessGroupTributary : public ::c10d::ProcessGroup {
 public:
  struct Options {
    std::string agent_address;  // gRPC target of the local agent
    std::string job;
    uint32_t local_rank = 0;
    uint32_t local_size = 1;
    // Bound on each operation, from init_process_group's timeout.
    std::chrono::milliseconds timeout{std::chrono::minutes(30)};
    // How long joining the job may retry while the agent or its plan is not there yet.
    std::chrono::milliseconds join_timeout{std::chrono::seconds(60)};
  };

  // Connects (or reuses this process's connection) and checks that (rank, size) is where the
  // job puts this process. Throws c10::Error with a message naming what to fix.
  static c10::intrusive_ptr<ProcessGroupTributary> Create(int rank, int size,
                                                          const Options& options);

  ProcessGroupTributary(int rank, int size, std::shared_ptr<Connection> connection,
                        std::chrono::milliseconds timeout, int group_index);
  // Finishes the works still in flight (each bounded by the timeout) and stops the completion
  // thread.
  ~ProcessGroupTributary() override;

  const std::string getBackendName() const override { return "tributary"; }

  c10::intrusive_ptr<::c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const ::c10d::AllreduceOptions& opts = ::c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<::c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const ::c10d::BroadcastOptions& opts = ::c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<::c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& output_tensors, std::vector<at::Tensor>& input_tensors,
      const ::c10d::AllgatherOptions& opts = ::c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<::c10d::Work> _allgather_base(
      at::Tensor& output_buffer, at::Tensor& input_buffer,
      const ::c10d::AllgatherOptions& opts = ::c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& output_tensors, std::vector<std::vector<at::Tensor>>& input_tensors,
      const ::c10d::ReduceScatterOptions& opts = ::c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<::c10d::Work> _reduce_scatter_base(
      at::Tensor& output_tensor, at::Tensor& input_tensor,
      const ::c10d::ReduceScatterOptions& opts = ::c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<::c10d::Work> barrier(
      const ::c10d::BarrierOptions& opts = ::c10d::BarrierOptions()) override;

  // One all-reduce over the tensors packed in one staging buffer (its name carries the layout).
  c10::intrusive_ptr<::c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const ::c10d::AllreduceCoalescedOptions& opts = ::c10d::AllreduceCoalescedOptions()) override;

  // Not supported: each throws an error naming the call and the supported ones.
  c10::intrusive_ptr<::c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const ::c10d::ReduceOptions& opts = ::c10d::ReduceOptions()) override;
  c10::intrusive_ptr<::c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& input_list,
      const ::c10d::AllgatherOptions& opts = ::c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<::c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& output_tensors, std::vector<at::Tensor>& input_tensors,
      const ::c10d::GatherOptions& opts = ::c10d::GatherOptions()) override;
  c10::intrusive_ptr<::c10d::Work> scatter(
      std::vector<at::Tensor>& output_tensors, std::vector<std::vector<at::Tensor>>& input_tensors,
      const ::c10d::ScatterOptions& opts = ::c10d::ScatterOptions()) override;
  c10::intrusive_ptr<::c10d::Work> alltoall_base(
      at::Tensor& output_tensor, at::Tensor& input_tensor, std::vector<int64_t>& output_split_sizes,
      std::vector<int64_t>& input_split_sizes,
      const ::c10d::AllToAllOptions& opts = ::c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<::c10d::Work> alltoall(
      std::vector<at::Tensor>& output_tensors, std::vector<at::Tensor>& input_tensors,
      const ::c10d::AllToAllOptions& opts = ::c10d::AllToAllOptions()) override;
  void monitoredBarrier(const ::c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  c10::intrusive_ptr<::c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                        int tag) override;
  c10::intrusive_ptr<::c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                        int tag) override;
  c10::intrusive_ptr<::c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                                 int tag) override;

  // The job's membership generation this process's session is bound to.
  uint64_t generation() const { return connection_->client->generation(); }
  // Moves the session to membership generation `generation` (or newer), the newest one a
  // process of the group joined at, for up to the group's timeout (Client::ResyncTo); raises
  // when the agent does not get there or the job no longer has this process at the group's
  // rank. tributary/distributed.py calls it when the group is created, before any collective.
  void ResyncTo(uint64_t generation);

  // The client's session, for tests and the Python side.
  const Connection& connection() const { return *connection_; }
  int group_index() const { return group_index_; }
  // Staging buffers allocated by this process so far (all groups).
  size_t staging_allocations() const { return connection_->pool->allocations(); }

 private:
  // A submitted operation: the completion thread waits on `handle`, then runs `copy_out`
  // (result from the staging buffer into the caller's tensors), frees the lease and finishes
  // `work`.
  struct Pending {
    Handle handle;
    c10::intrusive_ptr<WorkTributary> work;
    std::unique_ptr<StagingPool::Lease> lease;
    std::function<void(const char* staged)> copy_out;
    // Submission + the group's timeout: works queued behind a slow one do not get a timeout of
    // their own each.
    std::chrono::steady_clock::time_point deadline;
  };

  // Stages `bytes` (copy_in fills the buffer), submits with `submit`, queues the rest.
  c10::intrusive_ptr<::c10d::Work> Start(
      ::c10d::OpType type, const std::string& call, const std::string& name, size_t bytes,
      std::vector<at::Tensor> outputs, const std::function<void(char* staged)>& copy_in,
      const std::function<absl::StatusOr<Handle>(const SharedBuffer&)>& submit,
      std::function<void(const char* staged)> copy_out);
  // "c10d.<group>.<op>.<dtype>.<count>"
  std::string TensorName(const char* op, common::DataType dtype, size_t count) const;
  [[noreturn]] void Unsupported(const char* call) const;
  void CompletionLoop();

  const std::shared_ptr<Connection> connection_;
  const std::chrono::milliseconds timeout_;
  const int group_index_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;  // Guarded by mu_.
  bool stopping_ = false;        // Guarded by mu_.
  std::thread completer_;
};

}  // namespace tributary::client::c10d
