// tributary._tributary: the C++ client library (client/client.h) for Python, through pybind11.
// It does not link libtorch: tributary.torch makes tensors from SharedBuffers through the buffer
// protocol (torch.frombuffer).
//
// Every call that may block (connect, RPCs, submissions, waits) releases the GIL. Waits run in
// slices of at most 100 ms and check for signals in between, so Ctrl-C interrupts them with
// KeyboardInterrupt (the operation goes on). Errors are absl::Status values raised as
// tributary.TributaryError(message, code) with `code` the status code's name.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "common/rpc/grpc_status.h"

namespace py = pybind11;

namespace tributary::client::python {
namespace {

using std::chrono::milliseconds;

// An absl::Status on its way to Python (translated into tributary.TributaryError).
struct StatusError : std::exception {
  explicit StatusError(absl::Status s) : status(std::move(s)) {}
  const char* what() const noexcept override { return "tributary status error"; }
  absl::Status status;
};

void ThrowIfError(absl::Status status) {
  if (!status.ok()) throw StatusError(std::move(status));
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) throw StatusError(value.status());
  return *std::move(value);
}

void TranslateStatusError(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const StatusError& e) {
    const std::string message(e.status.message());
    const std::string code = absl::StatusCodeToString(e.status.code());
    py::object error_type;
    try {
      // tributary.MembershipChanged is a TributaryError: the training loop catches it, resyncs
      // and restarts its step from a sync point.
      error_type =
          py::module_::import("tributary")
              .attr(IsMembershipChanged(e.status) ? "MembershipChanged" : "TributaryError");
    } catch (py::error_already_set&) {
      // The package is not importable (the module used on its own): a RuntimeError then.
      PyErr_SetString(PyExc_RuntimeError, absl::StrCat(code, ": ", message).c_str());
      return;
    }
    py::object error = error_type(message, code);
    PyErr_SetObject(error_type.ptr(), error.ptr());
  }
}

common::DataType ParseDtype(const std::string& name) {
  absl::StatusOr<common::DataType> dtype = common::ParseDataType(name);
  if (!dtype.ok()) {
    throw StatusError(absl::InvalidArgumentError(absl::StrCat(
        "unknown dtype \"", name, "\": use float32, float64, float16, bfloat16, int32 or int64")));
  }
  return *dtype;
}

ReduceOp ParseOp(const std::string& op) {
  if (op == "sum") return ReduceOp::kSum;
  if (op == "average") return ReduceOp::kAverage;
  throw StatusError(
      absl::InvalidArgumentError(absl::StrCat("unknown op \"", op, "\": use sum or average")));
}

// Environment variable `name`, or nullopt when unset or empty.
std::optional<std::string> Env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

uint32_t EnvUint(const char* name) {
  const std::optional<std::string> v = Env(name);
  uint32_t out = 0;
  if (!v || !absl::SimpleAtoi(*v, &out)) {
    throw StatusError(absl::FailedPreconditionError(absl::StrCat(
        name, " is ", v ? absl::StrCat("\"", *v, "\", not a number") : std::string("not set"),
        ": start the process with tributary-run, or pass local_rank and local_size")));
  }
  return out;
}

// A SharedBuffer for Python: one-dimensional, writable bytes through the buffer protocol.
struct PyBuffer {
  std::shared_ptr<SharedBuffer> buffer;
};

// A submitted collective. Holds the buffer so that its memory outlives the operation.
struct PyHandle {
  Handle handle;
  std::shared_ptr<SharedBuffer> buffer;
  bool done = false;

  // True when done; raises the operation's error.
  bool Poll() {
    if (done) return true;
    absl::StatusOr<bool> r;
    {
      py::gil_scoped_release release;
      r = handle.Test();
    }
    done = ValueOrThrow(std::move(r));
    return done;
  }

  // Waits up to `timeout_s` seconds (None: without a bound).
  void Wait(std::optional<double> timeout_s) {
    if (done) return;
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const bool bounded = timeout_s.has_value();
    const Clock::time_point deadline =
        bounded ? start + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(std::max(0.0, *timeout_s)))
                : Clock::time_point::max();
    while (true) {
      milliseconds slice(100);
      if (bounded) {
        slice = std::clamp(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()),
                           milliseconds(0), slice);
      }
      absl::Status status;
      bool pending = false;
      {
        py::gil_scoped_release release;
        status = handle.Wait(slice);
        if (status.code() == absl::StatusCode::kDeadlineExceeded) {
          // This slice's deadline, or the operation's own error? Test says which.
          absl::StatusOr<bool> test = handle.Test();
          if (!test.ok()) {
            status = test.status();
          } else if (*test) {
            status = absl::OkStatus();
          } else {
            pending = true;
          }
        }
      }
      if (!pending) {
        ThrowIfError(status);
        done = true;
        return;
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (bounded && Clock::now() >= deadline) {
        throw StatusError(absl::DeadlineExceededError(absl::StrCat(
            "operation ", handle.name(), " not done after ",
            std::chrono::duration_cast<milliseconds>(Clock::now() - start).count(), " ms")));
      }
    }
  }
};

// A session with the local agent. Arguments left as None come from the launcher's environment.
class PyClient {
 public:
  PyClient(std::optional<std::string> agent_address, std::optional<std::string> job,
           std::optional<uint32_t> local_rank, std::optional<uint32_t> local_size,
           double join_timeout_s, double op_timeout_s, double rpc_timeout_s, bool control_ring) {
    ClientOptions options;
    if (!agent_address) agent_address = Env("TRIBUTARY_AGENT_ADDRESS");
    if (!agent_address) {
      throw StatusError(absl::FailedPreconditionError(
          "TRIBUTARY_AGENT_ADDRESS is not set: start the process with tributary-run, or pass "
          "agent_address"));
    }
    if (!job) job = Env("TRIBUTARY_JOB");
    if (!job) {
      throw StatusError(absl::FailedPreconditionError(
          "TRIBUTARY_JOB is not set: start the process with tributary-run, or pass job"));
    }
    if (!local_rank) local_rank = EnvUint("TRIBUTARY_LOCAL_RANK");
    if (!local_size) local_size = EnvUint("TRIBUTARY_LOCAL_SIZE");
    auto ms = [](double s) { return milliseconds(static_cast<int64_t>(s * 1000)); };
    options.agent_address = *agent_address;
    options.join_timeout = ms(join_timeout_s);
    options.op_timeout = ms(op_timeout_s);
    options.rpc_timeout = ms(rpc_timeout_s);
    options.control_ring = control_ring;
    absl::StatusOr<std::unique_ptr<Client>> client;
    {
      py::gil_scoped_release release;
      client = Client::Connect(options, *job, *local_rank, *local_size);
    }
    client_ = ValueOrThrow(std::move(client));
    // The launcher's view of this process must match the job's.
    for (auto [var, actual] : {std::pair{"TRIBUTARY_RANK", client_->global_rank()},
                               std::pair{"TRIBUTARY_WORLD_SIZE", client_->world_size()}}) {
      const std::optional<std::string> expected = Env(var);
      uint32_t value = 0;
      if (expected && (!absl::SimpleAtoi(*expected, &value) || value != actual)) {
        const std::string what =
            absl::StrCat(var, "=", *expected, " but the job says ", actual, " (job ", *job,
                         ", local rank ", *local_rank, " of ", *local_size, ")");
        Leave();
        throw StatusError(absl::FailedPreconditionError(what));
      }
    }
  }

  // The Client's destructor leaves the job (an RPC, up to rpc_timeout): not under the GIL.
  ~PyClient() {
    if (client_ != nullptr && Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release release;
      client_.reset();
    }
  }
  PyClient(const PyClient&) = delete;
  PyClient& operator=(const PyClient&) = delete;

  Client& client() { return *client_; }

  std::shared_ptr<SharedBuffer> Allocate(size_t bytes) {
    absl::StatusOr<std::shared_ptr<SharedBuffer>> buffer;
    {
      py::gil_scoped_release release;
      buffer = client_->AllocateBuffer(bytes);
    }
    return ValueOrThrow(std::move(buffer));
  }

  // Submits through `submit` with the GIL released; keeps `buffer` with the handle.
  template <typename F>
  PyHandle Submit(const PyBuffer& buffer, F&& submit) {
    absl::StatusOr<Handle> handle;
    {
      py::gil_scoped_release release;
      handle = submit(*buffer.buffer);
    }
    return PyHandle{ValueOrThrow(std::move(handle)), buffer.buffer};
  }

  void Resync() {
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = client_->Resync();
    }
    ThrowIfError(status);
  }

  void Leave() {
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = client_->Leave();
    }
    ThrowIfError(status);
  }

 private:
  std::unique_ptr<Client> client_;
};

}  // namespace
}  // namespace tributary::client::python

PYBIND11_MODULE(_tributary, m) {
  using namespace tributary::client;          // NOLINT: the client library
  using namespace tributary::client::python;  // NOLINT: the module's own helpers
  namespace common = tributary::common;
  m.doc() =
      "Tributary's C++ client for Python: sessions with the local agent, shared-memory buffers "
      "and asynchronous collectives on them.";
  py::register_exception_translator(&TranslateStatusError);
  // Abseil's mutex deadlock detection (on in Debian's build) costs every gRPC call
  // (common/rpc/grpc_status.h).
  common::DisableMutexDeadlockDetection();
  // The client library logs to stderr; a training script wants its warnings, not its info lines,
  // unless TRIBUTARY_LOG_LEVEL says otherwise.
  common::InitLogging(std::getenv("TRIBUTARY_LOG_LEVEL") != nullptr ? "" : "warn");
  m.def(
      "set_log_level", [](const std::string& level) { common::InitLogging(level); },
      py::arg("level"),
      "Level of the client library's log lines on stderr: trace, debug, info, warn, error, "
      "critical or off.");
  m.attr("DTYPES") = py::make_tuple("float32", "float64", "float16", "bfloat16", "int32", "int64");
  m.def(
      "dtype_size",
      [](const std::string& dtype) { return common::DataTypeSize(ParseDtype(dtype)); },
      py::arg("dtype"), "Bytes per element of `dtype`.");

  py::class_<PyBuffer>(m, "SharedBuffer", py::buffer_protocol(),
                       "Shared memory registered with the agent; a writable bytes buffer "
                       "(memoryview, numpy, torch.frombuffer). Collectives run on its regions.")
      .def_buffer([](PyBuffer& b) {
        return py::buffer_info(b.buffer->data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.buffer->size())}, {1},
                               /*readonly=*/false);
      })
      .def_property_readonly("nbytes", [](const PyBuffer& b) { return b.buffer->size(); })
      .def("__len__", [](const PyBuffer& b) { return b.buffer->size(); })
      .def_property_readonly(
          "address",
          [](const PyBuffer& b) { return reinterpret_cast<uintptr_t>(b.buffer->data()); },
          "Address of the first byte in this process.")
      .def_property_readonly("name", [](const PyBuffer& b) { return b.buffer->name(); })
      .def("__repr__", [](const PyBuffer& b) {
        return absl::StrCat("<tributary SharedBuffer ", b.buffer->name(), " ", b.buffer->size(),
                            " bytes>");
      });

  py::class_<PyHandle>(m, "Handle", "A submitted collective.")
      .def("poll", &PyHandle::Poll,
           "True when the operation is done, False while it runs; raises its error.")
      .def("wait", &PyHandle::Wait, py::arg("timeout") = py::none(),
           "Waits up to `timeout` seconds (None: no bound; Ctrl-C interrupts). Raises the "
           "operation's error, or TributaryError DEADLINE_EXCEEDED when the timeout passes "
           "first (the operation goes on).")
      .def_property_readonly("name", [](const PyHandle& h) { return h.handle.name(); })
      .def_property_readonly("done", [](const PyHandle& h) { return h.done; })
      .def_property_readonly(
          "version", [](const PyHandle& h) { return h.handle.version(); },
          "pull_params_async / init_params_async, once done: the parameters' version (deltas "
          "applied).");

  py::class_<PyClient>(m, "Client", "A training process's session with its local agent in one job.")
      .def(py::init<std::optional<std::string>, std::optional<std::string>, std::optional<uint32_t>,
                    std::optional<uint32_t>, double, double, double, bool>(),
           py::arg("agent_address") = py::none(), py::arg("job") = py::none(),
           py::arg("local_rank") = py::none(), py::arg("local_size") = py::none(), py::kw_only(),
           py::arg("join_timeout") = 30.0, py::arg("op_timeout") = 120.0,
           py::arg("rpc_timeout") = 10.0, py::arg("control_ring") = true,
           "Joins the job. Arguments left as None come from TRIBUTARY_AGENT_ADDRESS, "
           "TRIBUTARY_JOB, TRIBUTARY_LOCAL_RANK and TRIBUTARY_LOCAL_SIZE (set by tributary-run); "
           "TRIBUTARY_RANK and TRIBUTARY_WORLD_SIZE, when set, must match the job. Timeouts in "
           "seconds.")
      .def_property_readonly("rank", [](PyClient& c) { return c.client().global_rank(); })
      .def_property_readonly("size", [](PyClient& c) { return c.client().world_size(); })
      .def_property_readonly("local_rank", [](PyClient& c) { return c.client().local_rank(); })
      .def_property_readonly("local_size", [](PyClient& c) { return c.client().local_size(); })
      .def_property_readonly("job", [](PyClient& c) { return c.client().job_id(); })
      .def_property_readonly("has_control_ring",
                             [](PyClient& c) { return c.client().has_control_ring(); })
      .def(
          "allocate",
          [](PyClient& c, size_t nbytes) {
            if (nbytes == 0) {
              throw StatusError(absl::InvalidArgumentError("allocate: nbytes must be > 0"));
            }
            return PyBuffer{c.Allocate(nbytes)};
          },
          py::arg("nbytes"), "A new SharedBuffer of `nbytes` bytes, zero-filled.")
      .def(
          "all_reduce_async",
          [](PyClient& c, const std::string& name, const PyBuffer& buffer, size_t offset,
             size_t count, const std::string& dtype, const std::string& op, int32_t priority) {
            const common::DataType t = ParseDtype(dtype);
            const ReduceOp o = ParseOp(op);
            return c.Submit(buffer, [&](const SharedBuffer& b) {
              return c.client().AllReduceAsync(name, b, offset, count, t, o, priority);
            });
          },
          py::arg("name"), py::arg("buffer"), py::arg("offset"), py::arg("count"), py::arg("dtype"),
          py::arg("op") = "sum", py::arg("priority") = 0,
          "All-reduce (op sum or average) of `count` elements at byte `offset`, in place. Lower "
          "priority goes first.")
      .def(
          "broadcast_async",
          [](PyClient& c, const std::string& name, const PyBuffer& buffer, size_t offset,
             size_t count, const std::string& dtype, uint32_t root, int32_t priority) {
            const common::DataType t = ParseDtype(dtype);
            return c.Submit(buffer, [&](const SharedBuffer& b) {
              return c.client().BroadcastAsync(name, b, offset, count, t, root, priority);
            });
          },
          py::arg("name"), py::arg("buffer"), py::arg("offset"), py::arg("count"), py::arg("dtype"),
          py::arg("root"), py::arg("priority") = 0,
          "Broadcast of the region from global rank `root` to every process.")
      .def(
          "all_gather_async",
          [](PyClient& c, const std::string& name, const PyBuffer& buffer, size_t offset,
             size_t count, const std::string& dtype, int32_t priority) {
            const common::DataType t = ParseDtype(dtype);
            return c.Submit(buffer, [&](const SharedBuffer& b) {
              return c.client().AllGatherAsync(name, b, offset, count, t, priority);
            });
          },
          py::arg("name"), py::arg("buffer"), py::arg("offset"), py::arg("count"), py::arg("dtype"),
          py::arg("priority") = 0,
          "All-gather in place: the region holds size * count elements; block `rank` is this "
          "process's input; at the end the region holds every block in rank order.")
      .def(
          "reduce_scatter_async",
          [](PyClient& c, const std::string& name, const PyBuffer& buffer, size_t offset,
             size_t count, const std::string& dtype, const std::string& op, int32_t priority) {
            const common::DataType t = ParseDtype(dtype);
            const ReduceOp o = ParseOp(op);
            return c.Submit(buffer, [&](const SharedBuffer& b) {
              return c.client().ReduceScatterAsync(name, b, offset, count, t, o, priority);
            });
          },
          py::arg("name"), py::arg("buffer"), py::arg("offset"), py::arg("count"), py::arg("dtype"),
          py::arg("op") = "sum", py::arg("priority") = 0,
          "Reduce-scatter in place: the region holds size * count elements; at the end block "
          "`rank` holds that block's sum (or average) over the processes.")
      .def(
          "init_params_async",
          [](PyClient& c, const std::string& name, const PyBuffer& buffer, size_t offset,
             size_t count, const std::string& dtype) {
            const common::DataType t = ParseDtype(dtype);
            return c.Submit(buffer, [&](const SharedBuffer& b) {
              return c.client().InitParamsAsync(name, b, offset, count, t);
            });
          },
          py::arg("name"), py::arg("buffer"), py::arg("offset"), py::arg("count"), py::arg("dtype"),
          "Async jobs: rank 0 pushes the region as the initial parameters of `name`; every other "
          "rank waits for them and receives them into its region.")
      .def(
          "push_delta_async",
          [](PyClient& c, const std::string& name, const PyBuffer& buffer, size_t offset,
             size_t count, const std::string& dtype, double scale) {
            const common::DataType t = ParseDtype(dtype);
            return c.Submit(buffer, [&](const SharedBuffer& b) {
              return c.client().PushDeltaAsync(name, b, offset, count, t, scale);
            });
          },
          py::arg("name"), py::arg("buffer"), py::arg("offset"), py::arg("count"), py::arg("dtype"),
          py::arg("scale") = 0.0,
          "Async jobs: the servers apply params += scale * region, exactly once (scale 0: the "
          "job's --delta-scale).")
      .def(
          "pull_params_async",
          [](PyClient& c, const std::string& name, const PyBuffer& buffer, size_t offset,
             size_t count, const std::string& dtype) {
            const common::DataType t = ParseDtype(dtype);
            return c.Submit(buffer, [&](const SharedBuffer& b) {
              return c.client().PullParamsAsync(name, b, offset, count, t);
            });
          },
          py::arg("name"), py::arg("buffer"), py::arg("offset"), py::arg("count"), py::arg("dtype"),
          "Async jobs: the current parameters into the region (Handle.version: their version); "
          "waits while this rank is more than the job's staleness ahead of the slowest.")
      .def_property_readonly("generation", [](PyClient& c) { return c.client().generation(); })
      .def("resync", &PyClient::Resync,
           "After a MembershipChanged error: binds the session to the job's new membership "
           "generation (waiting for it up to the join timeout); every tensor name's iterations "
           "start again at 0 on every process. rank and size may change (elastic jobs).")
      .def("leave", &PyClient::Leave,
           "Leaves the job (idempotent); later calls fail with FAILED_PRECONDITION.");
}
