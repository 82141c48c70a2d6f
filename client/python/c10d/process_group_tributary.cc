#include "client/python/c10d/process_group_tributary.h"

#include <ATen/ATen.h>
#include <Python.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/python/c10d/callback_threads.h"
#include "common/hash.h"
#include "common/thread_name.h"

namespace tributary::client::c10d {
namespace {

// `timeout` from now, saturated: a timeout meant as "no limit" (a huge timedelta) overflowed in
// nanoseconds into a deadline in the past.
std::chrono::steady_clock::time_point DeadlineAfter(std::chrono::milliseconds timeout) {
  const auto now = std::chrono::steady_clock::now();
  if (timeout >= std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::steady_clock::time_point::max() - now)) {
    return std::chrono::steady_clock::time_point::max();
  }
  return now + std::max(timeout, std::chrono::milliseconds(0));
}

using ::c10d::OpType;

constexpr const char* kSupported =
    "supported: allreduce and allreduce_coalesced (SUM, AVG), broadcast, allgather, "
    "_allgather_base, reduce_scatter, "
    "_reduce_scatter_base (SUM, AVG), barrier";

std::string StatusText(const absl::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
}

common::DataType ToDataType(const char* call, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return common::DataType::kFloat32;
    case at::kDouble:
      return common::DataType::kFloat64;
    case at::kHalf:
      return common::DataType::kFloat16;
    case at::kBFloat16:
      return common::DataType::kBFloat16;
    case at::kInt:
      return common::DataType::kInt32;
    case at::kLong:
      return common::DataType::kInt64;
    default:
      TORCH_CHECK(false, "tributary ", call, ": dtype ", t.scalar_type(),
                  " is not supported (float32, float64, float16, bfloat16, int32, int64 are)");
  }
}

// A tensor the backend can stage: a dense CPU tensor of a supported dtype. Non-contiguous
// tensors are fine (the staging copy gathers and scatters them).
common::DataType CheckTensor(const char* call, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), "tributary ", call, ": got an undefined tensor");
  TORCH_CHECK(!t.is_cuda(), "tributary ", call, ": CUDA tensors are not supported yet (",
              t.device(), "); move the tensor to the CPU, or use the nccl backend for GPU tensors");
  TORCH_CHECK(t.device().is_cpu(), "tributary ", call,
              ": only CPU tensors are supported, got one on ", t.device());
  TORCH_CHECK(t.layout() == at::kStrided, "tributary ", call,
              ": only dense (strided) tensors are "
              "supported, got layout ",
              t.layout());
  return ToDataType(call, t);
}

// Exactly one tensor per call: c10d's list form is one tensor per device, and this backend serves
// one CPU tensor per process.
const at::Tensor& Single(const char* call, const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK(tensors.size() == 1, "tributary ", call,
              ": expects exactly one tensor per call (one CPU tensor per process), got ",
              tensors.size());
  return tensors[0];
}

ReduceOp ToReduceOp(const char* call, const ::c10d::ReduceOp& op, common::DataType dtype) {
  switch (op.op_) {
    case ::c10d::ReduceOp::SUM:
      return ReduceOp::kSum;
    case ::c10d::ReduceOp::AVG:
      // The agents' average of integers truncates (1, 2, 2, 2 would give 1); Gloo refuses it.
      TORCH_CHECK(dtype != common::DataType::kInt32 && dtype != common::DataType::kInt64,
                  "tributary ", call,
                  ": ReduceOp.AVG of an integer tensor is not supported (its average would be "
                  "truncated); use a floating-point tensor, or SUM and divide");
      return ReduceOp::kAverage;
    default:
      break;
  }
  const char* name = "UNKNOWN";
  switch (op.op_) {
    case ::c10d::ReduceOp::PRODUCT:
      name = "PRODUCT";
      break;
    case ::c10d::ReduceOp::MIN:
      name = "MIN";
      break;
    case ::c10d::ReduceOp::MAX:
      name = "MAX";
      break;
    case ::c10d::ReduceOp::BAND:
      name = "BAND";
      break;
    case ::c10d::ReduceOp::BOR:
      name = "BOR";
      break;
    case ::c10d::ReduceOp::BXOR:
      name = "BXOR";
      break;
    case ::c10d::ReduceOp::PREMUL_SUM:
      name = "PREMUL_SUM";
      break;
    default:
      break;
  }
  TORCH_CHECK(false, "tributary ", call, ": reduce op ", name,
              " is not supported (ReduceOp.SUM and ReduceOp.AVG are)");
}

// Copies between a tensor and staged bytes, outside autograd (the backend writes tensors as
// data, as other backends do) and without a version bump for contiguous tensors.
void CopyIn(const at::Tensor& t, char* staged) {
  const size_t bytes = t.numel() * t.element_size();
  if (t.is_contiguous()) {
    std::memcpy(staged, t.data_ptr(), bytes);
    return;
  }
  at::NoGradGuard no_grad;
  at::from_blob(staged, t.sizes(), t.options().requires_grad(false)).copy_(t);
}

void CopyOut(const char* staged, const at::Tensor& t) {
  const size_t bytes = t.numel() * t.element_size();
  if (t.is_contiguous()) {
    std::memcpy(t.data_ptr(), staged, bytes);
    return;
  }
  at::NoGradGuard no_grad;
  // The copy runs on the completion thread, outside the caller's inference mode: an inference
  // tensor may be written in place only inside one.
  c10::InferenceMode inference(t.is_inference());
  t.copy_(at::from_blob(const_cast<char*>(staged), t.sizes(), t.options().requires_grad(false)));
}

// The process's one connection, shared by its groups while any holds it.
std::mutex g_connection_mu;
std::weak_ptr<Connection> g_connection;  // Guarded by g_connection_mu.
std::atomic<int> g_next_group{0};

}  // namespace

WorkTributary::WorkTributary(int rank, OpType type, std::string what,
                             std::vector<at::Tensor> outputs)
    : ::c10d::Work(rank, type),
      what_(std::move(what)),
      outputs_(std::move(outputs)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
  future_->addCallback([done = future_done_](c10::ivalue::Future&) {
    {
      std::lock_guard<std::mutex> lock(done->mu);
      done->done = true;
    }
    done->cv.notify_all();
  });
}

bool WorkTributary::wait(std::chrono::milliseconds timeout) {
  const auto deadline =
      timeout == kNoTimeout ? std::chrono::steady_clock::time_point::max() : DeadlineAfter(timeout);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout == kNoTimeout) {
      cv_.wait(lock, [&] { return completed_; });
    } else if (!cv_.wait_until(lock, deadline, [&] { return completed_; })) {
      TORCH_CHECK(false, "tributary: ", what_, " not done after ", timeout.count(),
                  " ms (the wait timed out; the operation goes on)");
    }
  }
  // The future is completed just after the work, on a callback thread (Finish): once wait()
  // returns, getFuture() is complete too. (A callback of this future that waits on its own work
  // returns at once: future_done_ is set by the future's first callback.) The same timeout
  // bounds this wait: every callback thread can be busy (callback_threads.h).
  {
    std::unique_lock<std::mutex> lock(future_done_->mu);
    if (timeout == kNoTimeout) {
      future_done_->cv.wait(lock, [&] { return future_done_->done; });
    } else if (!future_done_->cv.wait_until(lock, deadline, [&] { return future_done_->done; })) {
      TORCH_CHECK(false, "tributary: ", what_,
                  " finished, but its future was not completed within ", timeout.count(),
                  " ms (every future-callback thread is busy: callbacks blocked on other "
                  "collectives?)");
    }
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkTributary::getFuture() { return future_; }

std::vector<at::Tensor> WorkTributary::result() { return outputs_; }

void WorkTributary::Finish(std::exception_ptr error) {
  // The work first, so that a future callback that looks at the work sees it finished.
  finish(error);
  // The future's callbacks run where it is completed, and one may block on a later collective's
  // future (torch's PowerSGD hook starts an all-reduce in a `then` callback and waits for it).
  // On the completion thread, which finishes that collective too, it would wait forever: the
  // future is completed on a callback thread instead, a new one whenever all are busy.
  CallbackThreads::Process().Run([future = future_, outputs = outputs_, error] {
    if (error) {
      future->setError(error);
    } else {
      future->markCompleted(c10::IValue(outputs));
    }
  });
}

c10::intrusive_ptr<ProcessGroupTributary> ProcessGroupTributary::Create(int rank, int size,
                                                                        const Options& options) {
  std::shared_ptr<Connection> connection;
  {
    std::lock_guard<std::mutex> lock(g_connection_mu);
    connection = g_connection.lock();
    if (connection != nullptr) {
      const Client& c = *connection->client;
      TORCH_CHECK(connection->agent_address == options.agent_address && c.job_id() == options.job &&
                      c.local_rank() == options.local_rank && c.local_size() == options.local_size,
                  "tributary: this process is already in job ", c.job_id(), " as local rank ",
                  c.local_rank(), " of ", c.local_size(), " through ", connection->agent_address,
                  "; a new process group asks for job ", options.job, ", local rank ",
                  options.local_rank, " of ", options.local_size, " through ",
                  options.agent_address, " (one process is one rank of one job)");
    } else {
      ClientOptions client_options;
      client_options.agent_address = options.agent_address;
      client_options.join_timeout = options.join_timeout;
      client_options.op_timeout = options.timeout;
      absl::StatusOr<std::unique_ptr<Client>> client =
          Client::Connect(client_options, options.job, options.local_rank, options.local_size);
      TORCH_CHECK(client.ok(), "tributary: cannot join job ", options.job, " as local rank ",
                  options.local_rank, " of ", options.local_size, " through the agent at ",
                  options.agent_address, ": ", StatusText(client.status()));
      connection = std::make_shared<Connection>();
      connection->client = std::shared_ptr<Client>(*std::move(client));
      connection->pool = std::make_shared<StagingPool>(connection->client);
      connection->agent_address = options.agent_address;
      g_connection = connection;
    }
  }
  const Client& c = *connection->client;
  TORCH_CHECK(size == static_cast<int>(c.world_size()),
              "tributary: a process group must hold the whole job: job ", c.job_id(), " has ",
              c.world_size(), " processes but the group asks for ", size,
              " (subgroups are not supported; the world size must equal the job's, as "
              "TRIBUTARY_WORLD_SIZE says)");
  TORCH_CHECK(rank == static_cast<int>(c.global_rank()),
              "tributary: the group gives this process rank ", rank, " but job ", c.job_id(),
              " has it at global rank ", c.global_rank(), " (node rank * ", c.local_size(),
              " + local rank ", c.local_rank(), "); set RANK to TRIBUTARY_RANK");
  return c10::make_intrusive<ProcessGroupTributary>(rank, size, std::move(connection),
                                                    options.timeout, g_next_group++);
}

ProcessGroupTributary::ProcessGroupTributary(int rank, int size,
                                             std::shared_ptr<Connection> connection,
                                             std::chrono::milliseconds timeout, int group_index)
    : ::c10d::ProcessGroup(rank, size),
      connection_(std::move(connection)),
      timeout_(timeout),
      group_index_(group_index) {
  completer_ = std::thread([this] { CompletionLoop(); });
}

ProcessGroupTributary::~ProcessGroupTributary() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  // The completion thread may be running a Python future callback that needs the GIL: do not
  // hold it while joining (the last reference may be dropped from Python).
  PyThreadState* saved = nullptr;
  if (Py_IsInitialized() && PyGILState_Check()) saved = PyEval_SaveThread();
  completer_.join();
  if (saved != nullptr) PyEval_RestoreThread(saved);
}

void ProcessGroupTributary::ResyncTo(uint64_t generation) {
  Client& c = *connection_->client;
  const absl::Status status = c.ResyncTo(generation, timeout_);
  TORCH_CHECK(status.ok(), "tributary: job ", c.job_id(), ": cannot move this process (rank ",
              rank_, ") to membership generation ", generation,
              ", where another process of the group joined: ", StatusText(status));
  TORCH_CHECK(
      static_cast<int>(c.global_rank()) == rank_ && static_cast<int>(c.world_size()) == size_,
      "tributary: job ", c.job_id(), " now has this process at global rank ", c.global_rank(),
      " of ", c.world_size(), " (membership generation ", c.generation(),
      "), but the group has it at rank ", rank_, " of ", size_, "; create the process group again");
}

std::string ProcessGroupTributary::TensorName(const char* op, common::DataType dtype,
                                              size_t count) const {
  return absl::StrCat("c10d.", group_index_, ".", op, ".", std::string(common::DataTypeName(dtype)),
                      ".", count);
}

void ProcessGroupTributary::Unsupported(const char* call) const {
  TORCH_CHECK(false, "the tributary backend does not support ", call, " (", kSupported, ")");
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::Start(
    OpType type, const std::string& call, const std::string& name, size_t bytes,
    std::vector<at::Tensor> outputs, const std::function<void(char* staged)>& copy_in,
    const std::function<absl::StatusOr<Handle>(const SharedBuffer&)>& submit,
    std::function<void(const char* staged)> copy_out) {
  auto work = c10::make_intrusive<WorkTributary>(rank_, type, absl::StrCat(call, " of ", name),
                                                 std::move(outputs));
  if (bytes == 0) {
    // Nothing to move (empty tensors on every rank, as c10d requires equal shapes).
    work->Finish(nullptr);
    return work;
  }
  absl::StatusOr<std::unique_ptr<StagingPool::Lease>> lease = connection_->pool->Acquire(bytes);
  TORCH_CHECK(lease.ok(), "tributary ", call, ": cannot get a staging buffer of ", bytes,
              " bytes: ", StatusText(lease.status()));
  copy_in((*lease)->data());
  absl::StatusOr<Handle> handle = submit((*lease)->buffer());
  TORCH_CHECK(handle.ok(), "tributary ", work->what(), " failed: ", StatusText(handle.status()));
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(Pending{*std::move(handle), work, *std::move(lease), std::move(copy_out),
                               DeadlineAfter(timeout_)});
  }
  cv_.notify_one();
  return work;
}

void ProcessGroupTributary::CompletionLoop() {
  common::SetCurrentThreadName("trib-c10d-done");
  for (;;) {
    Pending p;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping, and every work is finished
      p = std::move(pending_.front());
      pending_.pop_front();
    }
    // A blocking wait (on the control ring's doorbell or Wait RPCs), until the group's timeout
    // from the submission.
    // Rounded up: the wait's own deadline is then never before p.deadline.
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(p.deadline - std::chrono::steady_clock::now());
    absl::Status status = p.handle.Wait(std::max(left, std::chrono::milliseconds(0)));
    // The wait's own "not done" (Handle::Wait), not the agent's deadline for the operation.
    if (absl::IsDeadlineExceeded(status) && std::chrono::steady_clock::now() >= p.deadline &&
        absl::StartsWith(status.message(), "operation ") &&
        absl::StrContains(status.message(), " not done after ")) {
      status = absl::DeadlineExceededError(
          absl::StrCat("not done within the process group's timeout of ", timeout_.count(),
                       " ms from its submission (", status.message(), ")"));
    }
    std::exception_ptr error;
    if (status.ok()) {
      try {
        p.copy_out(p.lease->data());
      } catch (...) {
        error = std::current_exception();
      }
    } else {
      error = std::make_exception_ptr(std::runtime_error(
          absl::StrCat("tributary ", p.work->what(), " failed: ", StatusText(status))));
      // A wait that gave up (DEADLINE_EXCEEDED at the group's timeout) leaves the operation
      // running in the agent on this buffer: it must not serve the next collective.
      p.lease->Discard();
    }
    p.lease.reset();  // back to the pool before anyone sees the work finished
    p.work->Finish(error);
  }
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::allreduce(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceOptions& opts) {
  const at::Tensor& t = Single("allreduce", tensors);
  const common::DataType dtype = CheckTensor("allreduce", t);
  const ReduceOp op = ToReduceOp("allreduce", opts.reduceOp, dtype);
  const size_t count = t.numel();
  const std::string name =
      TensorName(op == ReduceOp::kSum ? "allreduce" : "allreduce_avg", dtype, count);
  Client* client = connection_->client.get();
  return Start(
      OpType::ALLREDUCE, "allreduce", name, count * t.element_size(), {t},
      [&](char* staged) { CopyIn(t, staged); },
      [&](const SharedBuffer& buffer) {
        return client->AllReduceAsync(name, buffer, 0, count, dtype, op);
      },
      [t](const char* staged) { CopyOut(staged, t); });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::broadcast(
    std::vector<at::Tensor>& tensors, const ::c10d::BroadcastOptions& opts) {
  const at::Tensor& t = Single("broadcast", tensors);
  const common::DataType dtype = CheckTensor("broadcast", t);
  TORCH_CHECK(opts.rootTensor == 0,
              "tributary broadcast: rootTensor must be 0 (one tensor per "
              "process), got ",
              opts.rootTensor);
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "tributary broadcast: root rank ",
              opts.rootRank, " is outside the group of ", size_, " processes");
  const size_t count = t.numel();
  const uint32_t root = static_cast<uint32_t>(opts.rootRank);
  const std::string name = absl::StrCat(TensorName("broadcast", dtype, count), ".root", root);
  Client* client = connection_->client.get();
  const bool is_root = rank_ == opts.rootRank;
  return Start(
      OpType::BROADCAST, "broadcast", name, count * t.element_size(), {t},
      [&](char* staged) {
        if (is_root) CopyIn(t, staged);
      },
      [&](const SharedBuffer& buffer) {
        return client->BroadcastAsync(name, buffer, 0, count, dtype, root);
      },
      [t, is_root](const char* staged) {
        if (!is_root) CopyOut(staged, t);
      });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::allgather(
    std::vector<std::vector<at::Tensor>>& output_tensors, std::vector<at::Tensor>& input_tensors,
    const ::c10d::AllgatherOptions& opts) {
  const at::Tensor& in = Single("allgather", input_tensors);
  const common::DataType dtype = CheckTensor("allgather", in);
  TORCH_CHECK(output_tensors.size() == 1,
              "tributary allgather: expects one output list (one "
              "per input tensor), got ",
              output_tensors.size());
  const std::vector<at::Tensor>& outs = output_tensors[0];
  TORCH_CHECK(static_cast<int>(outs.size()) == size_,
              "tributary allgather: the output list must "
              "hold one tensor per rank (",
              size_, "), got ", outs.size());
  for (const at::Tensor& o : outs) {
    CheckTensor("allgather", o);
    TORCH_CHECK(o.scalar_type() == in.scalar_type() && o.numel() == in.numel(),
                "tributary allgather: every output tensor must have the input's dtype and number "
                "of elements (",
                in.scalar_type(), ", ", in.numel(), "), got ", o.scalar_type(), ", ", o.numel());
  }
  const size_t count = in.numel();
  const size_t block = count * in.element_size();
  const std::string name = TensorName("allgather", dtype, count);
  Client* client = connection_->client.get();
  const size_t me = rank_;
  return Start(
      OpType::ALLGATHER, "allgather", name, block * size_, outs,
      [&](char* staged) { CopyIn(in, staged + me * block); },
      [&](const SharedBuffer& buffer) {
        return client->AllGatherAsync(name, buffer, 0, count, dtype);
      },
      [outs, block](const char* staged) {
        for (size_t i = 0; i < outs.size(); ++i) CopyOut(staged + i * block, outs[i]);
      });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::_allgather_base(
    at::Tensor& output_buffer, at::Tensor& input_buffer, const ::c10d::AllgatherOptions& opts) {
  const common::DataType dtype = CheckTensor("_allgather_base", input_buffer);
  CheckTensor("_allgather_base", output_buffer);
  TORCH_CHECK(output_buffer.scalar_type() == input_buffer.scalar_type() &&
                  output_buffer.numel() == input_buffer.numel() * size_,
              "tributary _allgather_base: the output must have the input's dtype and world size (",
              size_, ") times its elements (", input_buffer.scalar_type(), ", ",
              input_buffer.numel() * size_, "), got ", output_buffer.scalar_type(), ", ",
              output_buffer.numel());
  const size_t count = input_buffer.numel();
  const size_t block = count * input_buffer.element_size();
  const std::string name = TensorName("allgather", dtype, count);
  Client* client = connection_->client.get();
  const size_t me = rank_;
  at::Tensor in = input_buffer;
  at::Tensor out = output_buffer;
  return Start(
      OpType::_ALLGATHER_BASE, "_allgather_base", name, block * size_, {out},
      [&](char* staged) { CopyIn(in, staged + me * block); },
      [&](const SharedBuffer& buffer) {
        return client->AllGatherAsync(name, buffer, 0, count, dtype);
      },
      [out](const char* staged) { CopyOut(staged, out); });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::reduce_scatter(
    std::vector<at::Tensor>& output_tensors, std::vector<std::vector<at::Tensor>>& input_tensors,
    const ::c10d::ReduceScatterOptions& opts) {
  const at::Tensor& out = Single("reduce_scatter", output_tensors);
  const common::DataType dtype = CheckTensor("reduce_scatter", out);
  const ReduceOp op = ToReduceOp("reduce_scatter", opts.reduceOp, dtype);
  TORCH_CHECK(input_tensors.size() == 1,
              "tributary reduce_scatter: expects one input list (one "
              "per output tensor), got ",
              input_tensors.size());
  const std::vector<at::Tensor>& ins = input_tensors[0];
  TORCH_CHECK(static_cast<int>(ins.size()) == size_,
              "tributary reduce_scatter: the input list "
              "must hold one tensor per rank (",
              size_, "), got ", ins.size());
  for (const at::Tensor& i : ins) {
    CheckTensor("reduce_scatter", i);
    TORCH_CHECK(i.scalar_type() == out.scalar_type() && i.numel() == out.numel(),
                "tributary reduce_scatter: every input tensor must have the output's dtype and "
                "number of elements (",
                out.scalar_type(), ", ", out.numel(), "), got ", i.scalar_type(), ", ", i.numel());
  }
  const size_t count = out.numel();
  const size_t block = count * out.element_size();
  const std::string name =
      TensorName(op == ReduceOp::kSum ? "reduce_scatter" : "reduce_scatter_avg", dtype, count);
  Client* client = connection_->client.get();
  const size_t me = rank_;
  at::Tensor result = out;
  return Start(
      OpType::REDUCE_SCATTER, "reduce_scatter", name, block * size_, {result},
      [&](char* staged) {
        for (size_t i = 0; i < ins.size(); ++i) CopyIn(ins[i], staged + i * block);
      },
      [&](const SharedBuffer& buffer) {
        return client->ReduceScatterAsync(name, buffer, 0, count, dtype, op);
      },
      [result, me, block](const char* staged) { CopyOut(staged + me * block, result); });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::_reduce_scatter_base(
    at::Tensor& output_tensor, at::Tensor& input_tensor, const ::c10d::ReduceScatterOptions& opts) {
  const common::DataType dtype = CheckTensor("_reduce_scatter_base", output_tensor);
  CheckTensor("_reduce_scatter_base", input_tensor);
  const ReduceOp op = ToReduceOp("_reduce_scatter_base", opts.reduceOp, dtype);
  TORCH_CHECK(input_tensor.scalar_type() == output_tensor.scalar_type() &&
                  input_tensor.numel() == output_tensor.numel() * size_,
              "tributary _reduce_scatter_base: the input must have the output's dtype and world "
              "size (",
              size_, ") times its elements (", output_tensor.scalar_type(), ", ",
              output_tensor.numel() * size_, "), got ", input_tensor.scalar_type(), ", ",
              input_tensor.numel());
  const size_t count = output_tensor.numel();
  const size_t block = count * output_tensor.element_size();
  const std::string name =
      TensorName(op == ReduceOp::kSum ? "reduce_scatter" : "reduce_scatter_avg", dtype, count);
  Client* client = connection_->client.get();
  const size_t me = rank_;
  at::Tensor in = input_tensor;
  at::Tensor out = output_tensor;
  return Start(
      OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base", name, block * size_, {out},
      [&](char* staged) { CopyIn(in, staged); },
      [&](const SharedBuffer& buffer) {
        return client->ReduceScatterAsync(name, buffer, 0, count, dtype, op);
      },
      [out, me, block](const char* staged) { CopyOut(staged + me * block, out); });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::barrier(
    const ::c10d::BarrierOptions& opts) {
  // An all-reduce of one element: no rank's work finishes before every rank has submitted it.
  const std::string name = absl::StrCat("c10d.", group_index_, ".barrier");
  Client* client = connection_->client.get();
  return Start(
      OpType::BARRIER, "barrier", name, sizeof(float), {},
      [](char* staged) {
        const float one = 1;
        std::memcpy(staged, &one, sizeof(one));
      },
      [&](const SharedBuffer& buffer) {
        return client->AllReduceAsync(name, buffer, 0, 1, common::DataType::kFloat32,
                                      ReduceOp::kSum);
      },
      [](const char*) {});
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) {
  constexpr const char* kCall = "allreduce_coalesced";
  TORCH_CHECK(!tensors.empty(), "tributary ", kCall, ": got no tensors");
  const common::DataType dtype = CheckTensor(kCall, tensors[0]);
  const ReduceOp op = ToReduceOp(kCall, opts.reduceOp, dtype);
  // One all-reduce over the tensors packed one after another in one staging buffer. Its name
  // carries the layout (every tensor's element count): ranks that pass different lists submit
  // different names, so each fails at the group's timeout instead of summing misaligned data.
  std::vector<size_t> offsets;
  std::string layout;
  size_t count = 0;
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(CheckTensor(kCall, t) == dtype, "tributary ", kCall,
                ": every tensor must have the same dtype; got ", tensors[0].scalar_type(), " and ",
                t.scalar_type());
    offsets.push_back(count * tensors[0].element_size());
    count += t.numel();
    absl::StrAppend(&layout, t.numel(), ",");
  }
  const std::string name = absl::StrCat(
      TensorName(op == ReduceOp::kSum ? "allreduce_coalesced" : "allreduce_coalesced_avg", dtype,
                 count),
      ".", tensors.size(), ".", absl::Hex(common::StableHash64(layout)));
  Client* client = connection_->client.get();
  return Start(
      OpType::ALLREDUCE_COALESCED, kCall, name, count * tensors[0].element_size(), tensors,
      [&](char* staged) {
        for (size_t i = 0; i < tensors.size(); ++i) CopyIn(tensors[i], staged + offsets[i]);
      },
      [&](const SharedBuffer& buffer) {
        return client->AllReduceAsync(name, buffer, 0, count, dtype, op);
      },
      [tensors, offsets](const char* staged) {
        for (size_t i = 0; i < tensors.size(); ++i) CopyOut(staged + offsets[i], tensors[i]);
      });
}
c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::reduce(std::vector<at::Tensor>&,
                                                               const ::c10d::ReduceOptions&) {
  Unsupported("reduce");
}
c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&,
    const ::c10d::AllgatherOptions&) {
  Unsupported("allgather_coalesced");
}
c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::gather(
    std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&, const ::c10d::GatherOptions&) {
  Unsupported("gather");
}
c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::scatter(
    std::vector<at::Tensor>&, std::vector<std::vector<at::Tensor>>&,
    const ::c10d::ScatterOptions&) {
  Unsupported("scatter");
}
c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::alltoall_base(
    at::Tensor&, at::Tensor&, std::vector<int64_t>&, std::vector<int64_t>&,
    const ::c10d::AllToAllOptions&) {
  Unsupported("alltoall_base (all_to_all_single)");
}
c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::alltoall(std::vector<at::Tensor>&,
                                                                 std::vector<at::Tensor>&,
                                                                 const ::c10d::AllToAllOptions&) {
  Unsupported("alltoall");
}
void ProcessGroupTributary::monitoredBarrier(const ::c10d::BarrierOptions&, bool) {
  Unsupported("monitored_barrier");
}
c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::send(std::vector<at::Tensor>&, int, int) {
  Unsupported("send");
}
c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::recv(std::vector<at::Tensor>&, int, int) {
  Unsupported("recv");
}
c10::intrusive_ptr<::c10d::Work> ProcessGroupTributary::recvAnysource(std::vector<at::Tensor>&,
                                                                      int) {
  Unsupported("recv (from any source)");
}

}  // namespace tributary::client::c10d
