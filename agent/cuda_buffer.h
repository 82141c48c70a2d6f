// A training process's CUDA device buffer as an agent buffer: opened by CUDA IPC, seen by the
// data plane through a pinned host mirror (shm_mapping.h MirroredMemory).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/shm_mapping.h"
#include "dataplane/intranode/gpu_ops.h"

namespace tributary::agent {

// True when this agent was built with CUDA (CMake's TRIBUTARY_HAVE_CUDA).
bool AgentHasCuda();

// The intra-node executors' GPUs: GPU g = CUDA device devices[g] (CudaGpuOps). Without CUDA,
// FAILED_PRECONDITION "this agent was built without CUDA". Blocking CUDA calls: no lock held.
absl::StatusOr<std::unique_ptr<dataplane::GpuOps>> MakeDeviceGpuOps(
    const std::vector<int>& devices);

// Opens the buffer that `record` (dataplane/cuda/cuda_ipc.h SerializeCudaIpcBuffer) names on
// the exporter's device and allocates its pinned host mirror (cudaHostAlloc); its CopyIn waits
// for the exporter's ready event on a stream of its own, copies device to mirror and
// synchronizes; CopyOut copies mirror to device and synchronizes. `what` names it in messages.
// Errors: FAILED_PRECONDITION "this agent was built without CUDA" (such a build), or "no CUDA
// device (...)" (no driver or GPU); INVALID_ARGUMENT for a malformed record, a size outside
// [1, 1 TiB] or a device ordinal this machine lacks; the runtime's error (INTERNAL, naming the
// call) when the handle cannot be opened or the mirror allocated. Blocking CUDA calls: call it
// with no lock held.
absl::StatusOr<std::shared_ptr<SharedMemoryMapping>> ImportCudaBuffer(const std::string& record,
                                                                      const std::string& what);

}  // namespace tributary::agent
