// All-reduce of CUDA tensors end to end: a local cluster (controller and agents as processes on
// loopback), 2 worker nodes x 2 training processes and one spare summation host, push/pull,
// float32 sums. Each process's tensor lives in GPU memory (Client::RegisterCudaBuffer): the
// agent copies it to host memory and back. Three ways, side by side in one run:
//   shm       the same collectives on shared-memory tensors: no GPU copies at all (the ceiling)
//   whole     the agent copies each tensor in whole before the collective and back after it
//             (agent --staging-chunk-kib 0)
//   streamed  the agent copies it a chunk at a time while the collective runs: push/pull sends
//             each chunk as soon as it is in host memory, and each chunk's sum goes back to the
//             GPU as soon as it is there (agent/mirror_stager.h; --chunk-kib)
// Time = rank 0's mean per all-reduce (submit to result) over --iters after one warm-up; every
// element of every rank checked after every iteration. Exits 77 without a GPU.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "client/cli/bench_data.h"
#include "client/client.h"
#include "client/cluster/local_cluster.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "dataplane/cuda/cuda_status.h"
#include "grpcpp/grpcpp.h"

namespace tributary {
namespace {

using namespace std::chrono_literals;
constexpr uint32_t kProcsPerNode = 2;
constexpr uint32_t kWorld = 2 * kProcsPerNode;

struct Flags {
  std::vector<size_t> sizes_mib = {16, 64, 256};
  int iters = 5;
  uint64_t chunk_kib = 4096;
  std::string bin_dir = TRIBUTARY_BIN_DIR;
  std::string transport;  // the agents' --transport; empty: their default
};

enum class Mode { kShm, kWhole, kStreamed };
const char* ModeName(Mode m) {
  return m == Mode::kShm ? "shm" : m == Mode::kWhole ? "whole" : "streamed";
}

// One process: every size in turn; returns rank 0's mean seconds per size (others: empty), or
// an error.
absl::StatusOr<std::vector<double>> RunRank(const client::LocalCluster& cluster, int node,
                                            uint32_t local, Mode mode, const Flags& flags) {
  client::ClientOptions options;
  options.agent_address = cluster.agent_address(node);
  options.join_timeout = 30000ms;
  ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c,
                   client::Client::Connect(options, "bench", local, kProcsPerNode));
  const uint32_t rank = c->global_rank();
  size_t max_bytes = 0;
  for (size_t mib : flags.sizes_mib) max_bytes = std::max(max_bytes, mib << 20);
  void* device = nullptr;
  cudaStream_t stream = nullptr;
  std::shared_ptr<client::SharedBuffer> buffer;
  if (mode == Mode::kShm) {
    ASSIGN_OR_RETURN(buffer, c->AllocateBuffer(max_bytes));
  } else {
    if (cudaSetDevice(0) != cudaSuccess || cudaMalloc(&device, max_bytes) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
      return absl::InternalError("cudaMalloc / cudaStreamCreate failed");
    }
    ASSIGN_OR_RETURN(buffer, c->RegisterCudaBuffer(device, max_bytes, 0, stream));
  }
  std::vector<double> means;
  std::vector<unsigned char> host(max_bytes);
  for (size_t mib : flags.sizes_mib) {
    const size_t count = (mib << 20) / sizeof(float);
    const size_t bytes = count * sizeof(float);
    double total = 0;
    for (int it = -1; it < flags.iters; ++it) {
      client::cli::FillInput(common::DataType::kFloat32, rank, host.data(), count);
      if (mode == Mode::kShm) {
        std::memcpy(buffer->data(), host.data(), bytes);
      } else if (cudaMemcpyAsync(device, host.data(), bytes, cudaMemcpyHostToDevice, stream) !=
                     cudaSuccess ||
                 cudaStreamSynchronize(stream) != cudaSuccess) {
        return absl::InternalError("copy to the device failed");
      }
      const auto start = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(c->AllReduce(absl::StrCat("grad", mib), *buffer, 0, count,
                                   common::DataType::kFloat32, client::ReduceOp::kSum));
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (it >= 0) total += seconds;
      if (mode == Mode::kShm) {
        std::memcpy(host.data(), buffer->data(), bytes);
      } else if (cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        return absl::InternalError("copy from the device failed");
      }
      const size_t wrong = client::cli::CountWrong(
          common::DataType::kFloat32, client::cli::BenchOp::kSum, kWorld, 0, host.data(), count);
      if (wrong != 0) {
        return absl::DataLossError(
            absl::StrCat("rank ", rank, " ", mib, " MiB: ", wrong, " wrong elements"));
      }
    }
    means.push_back(total / flags.iters);
  }
  buffer.reset();
  if (device != nullptr) {
    cudaStreamDestroy(stream);
    cudaFree(device);
  }
  if (rank != 0) means.clear();
  return means;
}

absl::StatusOr<std::vector<double>> RunMode(Mode mode, const Flags& flags) {
  client::LocalClusterOptions o;
  o.bin_dir = flags.bin_dir;
  o.workers = 2;
  o.spares = 1;
  o.heartbeat_timeout = 30s;
  o.transport = flags.transport;
  o.agent_args = {"--staging-chunk-kib",
                  mode == Mode::kStreamed ? std::to_string(flags.chunk_kib) : "0"};
  ASSIGN_OR_RETURN(std::unique_ptr<client::LocalCluster> cluster, client::LocalCluster::Start(o));
  tributary::v1::CreateJobRequest req;
  req.set_job_id("bench");
  for (const std::string& node : cluster->worker_node_ids()) {
    req.mutable_spec()->add_worker_nodes(node);
  }
  req.mutable_spec()->set_procs_per_node(kProcsPerNode);
  req.mutable_spec()->set_algorithm(tributary::v1::ALGORITHM_PUSH_PULL);
  req.mutable_spec()->set_op_timeout_ms(60000);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  tributary::v1::Job job;
  if (grpc::Status s = cluster->controller().CreateJob(&ctx, req, &job); !s.ok()) {
    return absl::InternalError(absl::StrCat("CreateJob: ", s.error_message()));
  }
  std::mutex mu;
  absl::Status error;
  std::vector<double> means;
  std::vector<std::thread> ranks;
  for (int node = 0; node < 2; ++node) {
    for (uint32_t local = 0; local < kProcsPerNode; ++local) {
      ranks.emplace_back([&, node, local] {
        absl::StatusOr<std::vector<double>> r = RunRank(*cluster, node, local, mode, flags);
        std::lock_guard lock(mu);
        if (!r.ok()) {
          if (error.ok()) error = r.status();
        } else if (!r->empty()) {
          means = *r;
        }
      });
    }
  }
  for (auto& t : ranks) t.join();
  if (!error.ok()) return error;
  return means;
}

int Main(int argc, char** argv) {
  Flags flags;
  if (const char* dir = std::getenv("TRIBUTARY_BIN_DIR"); dir != nullptr && *dir != '\0') {
    flags.bin_dir = dir;
  }
  CLI::App app{"All-reduce of CUDA tensors through agents: whole copies vs streamed staging"};
  app.add_option("--sizes-mib", flags.sizes_mib, "tensor sizes, MiB (comma list)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--iters", flags.iters, "timed all-reduces per size (after one warm-up)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--chunk-kib", flags.chunk_kib, "the streamed agents' --staging-chunk-kib")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  app.add_option("--bin-dir", flags.bin_dir, "folder of tributary-controller and tributary-agent")
      ->capture_default_str();
  app.add_option("--transport", flags.transport, "the agents' --transport (tcp, ucx, auto)");
  CLI11_PARSE(app, argc, argv);
  absl::StatusOr<int> devices = dataplane::cuda::CudaDeviceCount();
  if (!devices.ok()) {
    std::fprintf(stderr, "cuda_collective_bench: %s; nothing run\n",
                 std::string(devices.status().message()).c_str());
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::map<Mode, std::vector<double>> results;
  for (Mode mode : {Mode::kShm, Mode::kWhole, Mode::kStreamed}) {
    absl::StatusOr<std::vector<double>> r = RunMode(mode, flags);
    if (!r.ok()) {
      std::fprintf(stderr, "cuda_collective_bench: %s: %s\n", ModeName(mode),
                   r.status().ToString().c_str());
      return 1;
    }
    results[mode] = *r;
  }
  std::printf(
      "device 0: %s; 2 worker nodes x %u processes + 1 spare, push/pull, float32 sum, "
      "loopback; mean of %d after one warm-up; streamed chunks %llu KiB\n",
      prop.name, kProcsPerNode, flags.iters, static_cast<unsigned long long>(flags.chunk_kib));
  std::printf("%8s %10s %10s %10s %12s %12s %12s\n", "size", "shm_ms", "whole_ms", "stream_ms",
              "whole/shm", "stream/shm", "whole/stream");
  for (size_t i = 0; i < flags.sizes_mib.size(); ++i) {
    const double shm = results[Mode::kShm][i] * 1e3, whole = results[Mode::kWhole][i] * 1e3,
                 streamed = results[Mode::kStreamed][i] * 1e3;
    std::printf("%5zu MiB %10.2f %10.2f %10.2f %12.3f %12.3f %12.3f\n", flags.sizes_mib[i], shm,
                whole, streamed, whole / shm, streamed / shm, whole / streamed);
  }
  std::printf("every element of every rank checked after every all-reduce: exact\n");
  return 0;
}

}  // namespace
}  // namespace tributary

int main(int argc, char** argv) { return tributary::Main(argc, argv); }
