// tributary._c10d: the Python binding of the "tributary" torch.distributed backend.
// tributary/distributed.py registers ProcessGroupTributary.create with
// torch.distributed.Backend.register_backend; import torch.distributed before this module (the
// class derives from torch's binding of c10d::ProcessGroup).
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include "client/python/c10d/process_group_tributary.h"

namespace py = pybind11;

namespace tributary::client::c10d {
namespace {

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

}  // namespace
}  // namespace tributary::client::c10d

using tributary::client::c10d::Millis;
using tributary::client::c10d::ProcessGroupTributary;

PYBIND11_MODULE(_c10d, m) {
  m.doc() = "The torch.distributed backend \"tributary\" (see client/python/c10d/README.md)";
  // Registers torch's c10d classes (ProcessGroup, Work...) that ours derive from.
  py::module::import("torch.distributed");

  py::class_<ProcessGroupTributary, ::c10d::ProcessGroup,
             c10::intrusive_ptr<ProcessGroupTributary>>(m, "ProcessGroupTributary")
      .def_static(
          "create",
          [](int rank, int size, const std::string& agent_address, const std::string& job,
             uint32_t local_rank, uint32_t local_size, double timeout_s, double join_timeout_s) {
            ProcessGroupTributary::Options options;
            options.agent_address = agent_address;
            options.job = job;
            options.local_rank = local_rank;
            options.local_size = local_size;
            options.timeout = Millis(timeout_s);
            options.join_timeout = Millis(join_timeout_s);
            return ProcessGroupTributary::Create(rank, size, options);
          },
          py::arg("rank"), py::arg("size"), py::arg("agent_address"), py::arg("job"),
          py::arg("local_rank"), py::arg("local_size"), py::arg("timeout_s"),
          py::arg("join_timeout_s") = 60.0, py::call_guard<py::gil_scoped_release>(),
          "Joins the job through the local agent (or reuses this process's session) and "
          "returns the process group; raises RuntimeError when (rank, size) is not where the "
          "job puts this process.")
      .def_property_readonly(
          "job", [](const ProcessGroupTributary& pg) { return pg.connection().client->job_id(); })
      .def_property_readonly(
          "local_rank",
          [](const ProcessGroupTributary& pg) { return pg.connection().client->local_rank(); })
      .def_property_readonly(
          "local_size",
          [](const ProcessGroupTributary& pg) { return pg.connection().client->local_size(); })
      .def_property_readonly("group_index", &ProcessGroupTributary::group_index)
      .def_property_readonly("generation", &ProcessGroupTributary::generation,
                             "The job's membership generation this process's session is bound "
                             "to.")
      .def("resync_to", &ProcessGroupTributary::ResyncTo, py::arg("generation"),
           py::call_guard<py::gil_scoped_release>(),
           "Moves this process's session to membership generation `generation` (or newer), "
           "waiting up to the group's timeout for the agent to have it; raises RuntimeError "
           "otherwise. Called by tributary.distributed when the group is created.")
      .def_property_readonly("staging_allocations", &ProcessGroupTributary::staging_allocations,
                             "Staging buffers this process has allocated (all groups).");
}
