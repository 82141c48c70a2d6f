// The intra-node executors on CUDA devices: the all-reduce of a node's GPUs as the topology
// planner's strategies prescribe, against the device's own copy bandwidth.
//
// GPUs: --gpus N "GPUs" over the devices present (GPU g = device g % devices; default every
// device, or 4 "GPUs" on the one device there is). Each holds a float32 tensor of --mib MiB.
// Rows (each exact-checked once before it is timed):
//  * ceiling: one device-to-device cudaMemcpyAsync of the tensor (on one device, what its
//    memory moves: every copy and sum below shares it);
//  * cpu-assisted: CpuAssistedAllReduce with two groups (halves of the GPUs), through pinned
//    host memory and the CPU (BytePS's strategy for PCIe machines);
//  * nvlink-rooted: TreeAllReduce over the ring 0..n-1 cut at GPU 0 (two chains);
//  * two-trees: two opposite chains, half the tensor each (a packing of two trees);
//  * star: GPU 0 the parent of all;
//  the tree rows at fixed chunk sizes 256 KiB .. 16 MiB, each "enqueued" (a host call per copy,
//  sum and fence) and "graph" (recorded once, replayed as one CUDA graph launch), and "miad"
//  (the online tuner from 1 MiB, --reps * 3 calls: its trajectory and the best of the last
//  --reps), and nvlink-rooted with an inter-node step that does nothing (the host round trip per
//  chunk; never recorded).
// algbw = tensor bytes / time (nccl-tests' algorithm bandwidth). "memory" = the bytes the row's
// copies and sums read and write in device memory per second, over the ceiling's (2 x bytes /
// copy time): on one device, the fraction of its memory bandwidth the executor keeps busy; on
// several devices the links, not memory, bound it and the column means less.
// Time: wall clock around each call (which synchronizes), best of --reps after one warm-up.
//
// Flags (bench/cuda_bench_flags.h): --mib N (default 64), --reps N (default 5), --gpus N.
// Without a CUDA device it prints why and exits 77.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/cuda_bench_flags.h"
#include "common/dtype.h"
#include "dataplane/cuda/cuda_status.h"
#include "dataplane/intranode/cpu_assisted_allreduce.h"
#include "dataplane/intranode/cuda_gpu_ops.h"
#include "dataplane/intranode/tree_allreduce.h"
#include "dataplane/reduce/cpu/cpu_reducer.h"

namespace tributary::dataplane {
namespace {

using Clock = std::chrono::steady_clock;
using common::DataType;

[[noreturn]] void Die(const absl::Status& s) {
  std::fprintf(stderr, "cuda_intranode_bench: %s\n", s.ToString().c_str());
  std::exit(1);
}
void Check(const absl::Status& s) {
  if (!s.ok()) Die(s);
}
void Check(cudaError_t e, const char* call) { Check(cuda::CudaStatus(e, call)); }

struct Node {
  std::unique_ptr<CudaGpuOps> ops;
  std::vector<void*> buffers;
  size_t count = 0;
  int gpus = 0;
  // Inputs: GPU g holds g + 1 at every element (sums exact in float32).
  void Fill() {
    std::vector<float> host(count);
    for (int g = 0; g < gpus; ++g) {
      std::fill(host.begin(), host.end(), static_cast<float>(g + 1));
      Check(cudaMemcpy(buffers[g], host.data(), count * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
  }
  bool Exact(double factor) {
    const float want = static_cast<float>(factor * gpus * (gpus + 1) / 2);
    std::vector<float> host(count);
    for (int g = 0; g < gpus; ++g) {
      Check(cudaMemcpy(host.data(), buffers[g], count * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
      for (float v : host) {
        if (v != want) return false;
      }
    }
    return true;
  }
};

template <typename F>
double BestSeconds(int reps, F&& run) {
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {  // r = 0: warm-up.
    const auto start = Clock::now();
    Check(run());
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    if (r > 0) best = std::min(best, s);
  }
  return best;
}

// Bytes a tree all-reduce moves in device memory per tensor byte: per edge a push (read +
// write) and a broadcast copy (read + write); per parent with k children a sum reading k + 1
// chunks and writing one.
double TreeTraffic(const std::vector<GpuTree>& trees) {
  double total = 0, weights = 0;
  for (const GpuTree& t : trees) weights += t.weight;
  for (const GpuTree& t : trees) {
    const int n = static_cast<int>(t.parent.size());
    std::vector<int> kids(n, 0);
    for (int g = 0; g < n; ++g) {
      if (t.parent[g] >= 0) ++kids[t.parent[g]];
    }
    double per = 0;
    for (int g = 0; g < n; ++g) {
      if (t.parent[g] >= 0) per += 4;
      if (kids[g] > 0) per += kids[g] + 2;
    }
    total += per * t.weight / weights;
  }
  return total;
}

void Row(const std::string& name, const std::string& chunk, double seconds, double bytes,
         double traffic, double ceiling_traffic_per_s, bool exact) {
  std::printf("| %-38s | %-9s | %9.3f | %8.1f | %7.2f | %s\n", name.c_str(), chunk.c_str(),
              seconds * 1e3, bytes / seconds / 1e9,
              traffic * bytes / seconds / ceiling_traffic_per_s, exact ? "exact" : "WRONG");
}

std::string Mib(size_t bytes) {
  return bytes >= (size_t{1} << 20) ? absl::StrCat(bytes >> 20, " MiB")
                                    : absl::StrCat(bytes >> 10, " KiB");
}

int Main(int argc, char** argv) {
  bench::CudaBenchFlags flags{.mib = 64, .reps = 5};
  if (std::optional<int> exit = bench::ParseCudaBenchFlags(
          argc, argv, "The intra-node executors against the device's copy bandwidth", flags,
          /*with_gpus=*/true)) {
    return *exit;
  }
  absl::StatusOr<int> devices = cuda::CudaDeviceCount();
  if (!devices.ok()) {
    std::printf("cuda_intranode_bench: %s; nothing measured\n",
                std::string(devices.status().message()).c_str());
    return 77;
  }
  Node node;
  node.gpus = flags.gpus > 0 ? flags.gpus : (*devices > 1 ? *devices : 4);
  std::vector<int> ordinals;
  for (int g = 0; g < node.gpus; ++g) ordinals.push_back(g % *devices);
  absl::StatusOr<std::unique_ptr<CudaGpuOps>> ops = CudaGpuOps::Create(ordinals);
  Check(ops.status());
  node.ops = std::move(*ops);
  const size_t bytes = flags.mib << 20;
  node.count = bytes / 4;
  for (int g = 0; g < node.gpus; ++g) {
    absl::StatusOr<void*> p = node.ops->AllocateDevice(g, bytes);
    Check(p.status());
    node.buffers.push_back(*p);
  }
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf(
      "cuda_intranode_bench: %s x %d device(s), %d \"GPUs\" (GPU g = device g %% %d), "
      "float32, %zu MiB per GPU, best of %d\n",
      prop.name, *devices, node.gpus, *devices, flags.mib, flags.reps);

  // The ceiling: one D2D copy on GPU 0's device.
  void* scratch = nullptr;
  Check(cudaMalloc(&scratch, bytes), "cudaMalloc");
  const double copy = BestSeconds(flags.reps, [&] {
    Check(cudaMemcpy(scratch, node.buffers[0], bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
    return cuda::CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  });
  const double ceiling = 2.0 * bytes / copy;
  std::printf("\n| %-38s | %-9s | %9s | %8s | %7s |\n", "executor", "chunk", "ms", "algbw GB/s",
              "memory");
  std::printf(
      "|----------------------------------------|-----------|-----------|----------|---------|\n");
  std::printf("| %-38s | %-9s | %9.3f | %8.1f | %7.2f |\n", "ceiling: D2D copy", "-", copy * 1e3,
              bytes / copy / 1e9, 1.0);
  cudaFree(scratch);

  const int n = node.gpus;
  std::vector<int> ring(n);
  for (int g = 0; g < n; ++g) ring[g] = g;
  absl::StatusOr<GpuTree> rooted = RingRootedTree(ring, 0);
  Check(rooted.status());
  GpuTree forward{std::vector<int>(n), 1}, backward{std::vector<int>(n), 1},
      star{std::vector<int>(n), 1};
  for (int g = 0; g < n; ++g) {
    forward.parent[g] = g + 1 < n ? g + 1 : -1;  // Chain toward GPU n-1.
    backward.parent[g] = g - 1;                  // Chain toward GPU 0.
    star.parent[g] = g == 0 ? -1 : 0;
  }
  struct Layout {
    std::string name;
    std::vector<GpuTree> trees;
  };
  const std::vector<Layout> layouts{{"nvlink-rooted (ring at 0)", {*rooted}},
                                    {"two-trees (opposite chains)", {forward, backward}},
                                    {"star at 0", {star}}};
  CpuReducer host_reducer;
  // One row: fresh inputs, one call checked exact, then the best of --reps calls.
  auto measure = [&](const std::string& name, const std::string& chunk, double traffic,
                     const std::function<absl::Status()>& run) {
    node.Fill();
    Check(run());
    const bool exact = node.Exact(1);
    Row(name, chunk, BestSeconds(flags.reps, run), bytes, traffic, ceiling, exact);
  };
  for (const Layout& layout : layouts) {
    const double traffic = TreeTraffic(layout.trees);
    for (size_t chunk : {size_t{256} << 10, size_t{1} << 20, size_t{4} << 20, size_t{16} << 20}) {
      for (bool record : {false, true}) {
        auto ar = TreeAllReduce::Create(*node.ops, host_reducer, layout.trees,
                                        {.chunk_bytes = chunk, .tune = false, .record = record});
        Check(ar.status());
        measure(layout.name + (record ? ", graph" : ", enqueued"), Mib(chunk), traffic, [&] {
          return (*ar)->AllReduce(DataType::kFloat32, node.buffers, node.count, false);
        });
      }
    }
    // The tuner from 1 MiB.
    auto ar = TreeAllReduce::Create(*node.ops, host_reducer, layout.trees,
                                    {.chunk_bytes = size_t{1} << 20, .tune = true});
    Check(ar.status());
    node.Fill();
    Check((*ar)->AllReduce(DataType::kFloat32, node.buffers, node.count, false));
    const bool exact = node.Exact(1);
    for (int r = 0; r < 2 * flags.reps; ++r) {
      Check((*ar)->AllReduce(DataType::kFloat32, node.buffers, node.count, false));
    }
    const double s = BestSeconds(flags.reps - 1, [&] {
      return (*ar)->AllReduce(DataType::kFloat32, node.buffers, node.count, false);
    });
    std::vector<std::string> path;
    for (size_t b : (*ar)->chunk_trajectory()) path.push_back(Mib(b));
    Row(layout.name + ", graph", "miad", s, bytes, traffic, ceiling, exact);
    std::printf("|   miad trajectory: %s\n", absl::StrJoin(path, " -> ").c_str());
  }
  // NVLink-rooted with a host step that does nothing: D2H + H2D at the root per chunk.
  for (size_t chunk : {size_t{1} << 20, size_t{4} << 20}) {
    auto ar = TreeAllReduce::Create(*node.ops, host_reducer, {*rooted},
                                    {.chunk_bytes = chunk, .tune = false});
    Check(ar.status());
    auto noop = [](DataType, void*, size_t, size_t) { return absl::OkStatus(); };
    measure("nvlink-rooted + host step", Mib(chunk), TreeTraffic({*rooted}) + 2, [&] {
      return (*ar)->AllReduce(DataType::kFloat32, node.buffers, node.count, false, 1, noop);
    });
  }
  // CPU-assisted: two groups, the CPU sums their partials.
  std::vector<std::vector<int>> groups(2);
  for (int g = 0; g < n; ++g) groups[g < (n + 1) / 2 ? 0 : 1].push_back(g);
  if (groups[1].empty()) groups.pop_back();
  for (size_t chunk : {size_t{1} << 20, size_t{4} << 20}) {
    auto ar = CpuAssistedAllReduce::Create(*node.ops, host_reducer, groups, {.chunk_bytes = chunk});
    Check(ar.status());
    // Per group of m: m - 1 copies to the leader and m - 1 back (read + write each), a sum
    // (reads m, writes 1), a D2H (reads 1) and an H2D (writes 1): 5m - 1.
    double traffic = 0;
    for (const std::vector<int>& g : groups) traffic += 5.0 * static_cast<double>(g.size()) - 1;
    measure("cpu-assisted (2 groups)", Mib(chunk), traffic,
            [&] { return (*ar)->AllReduce(DataType::kFloat32, node.buffers, node.count, false); });
  }
  std::printf(
      "\nmemory: bytes read and written in device memory per second / the copy's; the "
      "host-step rows count the D2H and H2D as 2 more.\n");
  return 0;
}

}  // namespace
}  // namespace tributary::dataplane

int main(int argc, char** argv) { return tributary::dataplane::Main(argc, argv); }
