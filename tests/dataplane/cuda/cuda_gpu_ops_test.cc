// CpuAssistedAllReduce and TreeAllReduce on CudaGpuOps, and CudaGpuOps' queue waits: exact sums
// on real devices (skipped, "no CUDA device", without a GPU). With one GPU, several "GPUs" share it
// (same code path: streams, peer-style copies, kernels, fences); with several, every device is
// used. The orchestration itself is tested on HostGpuOps in tests/dataplane/intranode.
#include "dataplane/intranode/cuda_gpu_ops.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "dataplane/cuda/cuda_status.h"
#include "dataplane/intranode/cpu_assisted_allreduce.h"
#include "dataplane/intranode/intra_node_execution.h"
#include "dataplane/intranode/tree_allreduce.h"
#include "dataplane/reduce/cpu/scalar_reducer.h"
#include "gtest/gtest.h"
#include "tests/util/typed_values.h"
#include "topology/intra_node_planner.h"
#include "topology/topology_file.h"

namespace tributary::dataplane {
namespace {

using common::DataType;

TEST(CudaGpuOps, CpuAssistedAllReduceIsExactOnDevices) {
  absl::StatusOr<int> devices = cuda::CudaDeviceCount();
  if (!devices.ok()) GTEST_SKIP() << devices.status().message();
  // Six "GPUs" in three groups, spread over the real devices.
  std::vector<int> ordinals;
  for (int g = 0; g < 6; ++g) ordinals.push_back(g % *devices);
  auto ops = CudaGpuOps::Create(ordinals);
  ASSERT_TRUE(ops.ok()) << ops.status();
  ScalarReducer host;
  const std::vector<std::vector<int>> groups{{0, 1}, {2, 3, 4}, {5}};
  for (DataType dtype : common::kAllDataTypes) {
    SCOPED_TRACE(common::DataTypeName(dtype));
    constexpr size_t kCount = (1 << 20) + 3;
    const size_t bytes = kCount * common::DataTypeSize(dtype);
    std::vector<std::vector<uint8_t>> inputs(6, std::vector<uint8_t>(bytes));
    std::vector<void*> device(6);
    for (int g = 0; g < 6; ++g) {
      for (size_t i = 0; i < kCount; ++i) {
        testing::PutValue(dtype, inputs[g].data(), i, static_cast<double>((i + g) % 9) - 4);
      }
      absl::StatusOr<void*> p = (*ops)->AllocateDevice(g, bytes);
      ASSERT_TRUE(p.ok()) << p.status();
      device[g] = *p;
      ASSERT_EQ(cudaMemcpy(device[g], inputs[g].data(), bytes, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    auto ar = CpuAssistedAllReduce::Create(**ops, host, groups, {.chunk_bytes = 1 << 20});
    ASSERT_TRUE(ar.ok()) << ar.status();
    absl::Status s = (*ar)->AllReduce(dtype, device, kCount, false);
    ASSERT_TRUE(s.ok()) << s;
    std::vector<uint8_t> out(bytes);
    for (int g = 0; g < 6; ++g) {
      ASSERT_EQ(cudaMemcpy(out.data(), device[g], bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < kCount; ++i) {
        double want = 0;
        for (int h = 0; h < 6; ++h) want += static_cast<double>((i + h) % 9) - 4;
        ASSERT_EQ(testing::GetValue(dtype, out.data(), i), want) << "GPU " << g << " element " << i;
      }
    }
  }
}

// A queue that waits for another queue's fence sees that queue's work done: B copies the sum A
// computes over 64 MiB (long enough that an unordered copy would read the old values).
TEST(CudaGpuOps, AQueueWaitOrdersWorkAcrossStreams) {
  absl::StatusOr<int> devices = cuda::CudaDeviceCount();
  if (!devices.ok()) GTEST_SKIP() << devices.status().message();
  auto ops = CudaGpuOps::Create({0, 0});
  ASSERT_TRUE(ops.ok()) << ops.status();
  absl::StatusOr<int> a = (*ops)->AddQueue(0);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*ops)->QueueGpu(*a), 0);
  constexpr size_t kCount = 16 << 20;
  std::vector<float> ones(kCount, 1.0f);
  void* x = *(*ops)->AllocateDevice(0, kCount * 4);
  void* y = *(*ops)->AllocateDevice(1, kCount * 4);
  ASSERT_EQ(cudaMemcpy(x, ones.data(), kCount * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(y, 0, kCount * 4), cudaSuccess);
  for (int round = 1; round <= 3; ++round) {
    // x = x + x + x + x on queue a (x becomes 4^round), then y <- x on GPU 1's queue.
    std::vector<const void*> srcs{x, x, x, x};
    ASSERT_TRUE((*ops)->ReduceAsync(*a, DataType::kFloat32, x, srcs, kCount).ok());
    absl::StatusOr<uint64_t> done = (*ops)->Fence(*a);
    ASSERT_TRUE(done.ok());
    ASSERT_TRUE((*ops)->QueueWaitFence(1, *done).ok());
    ASSERT_TRUE((*ops)->ReleaseFence(*done).ok());  // The wait is enqueued; the event is reused.
    ASSERT_TRUE((*ops)->CopyAsync(1, y, x, kCount * 4).ok());
    ASSERT_TRUE((*ops)->Synchronize(1).ok());
    std::vector<float> out(kCount);
    ASSERT_EQ(cudaMemcpy(out.data(), y, kCount * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    const float want = std::pow(4.0f, static_cast<float>(round));
    for (size_t i = 0; i < kCount; i += 4093) ASSERT_EQ(out[i], want) << "round " << round;
    ASSERT_EQ(out[kCount - 1], want);
  }
  EXPECT_EQ((*ops)->QueueWaitFence(1, 999999).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*ops)->AddQueue(2).status().code(), absl::StatusCode::kInvalidArgument);
}

// The tree executor on devices: eight "GPUs" over the real devices, the NVLink ring cut at a
// root and a weighted two-tree packing, every dtype exact, alone and with an inter-node step (it
// doubles the node's sum) and an average; then the tuner over repeated 64 MiB all-reduces.
TEST(CudaGpuOps, TreeAllReduceIsExactOnDevices) {
  absl::StatusOr<int> devices = cuda::CudaDeviceCount();
  if (!devices.ok()) GTEST_SKIP() << devices.status().message();
  constexpr int kGpus = 8;
  std::vector<int> ordinals;
  for (int g = 0; g < kGpus; ++g) ordinals.push_back(g % *devices);
  ScalarReducer host;
  const std::vector<int> ring{0, 3, 2, 1, 5, 6, 7, 4};
  absl::StatusOr<GpuTree> rooted = RingRootedTree(ring, 6);
  ASSERT_TRUE(rooted.ok());
  const std::vector<std::vector<GpuTree>> layouts{
      {*rooted}, {{{-1, 0, 1, 2, 3, 4, 5, 6}, 2.0}, {{7, 7, 7, 7, 7, 7, 7, -1}, 1.0}}};
  for (size_t l = 0; l < layouts.size(); ++l) {
    auto ops = CudaGpuOps::Create(ordinals);
    ASSERT_TRUE(ops.ok()) << ops.status();
    // Enqueued piece by piece, recorded as a CUDA graph and replayed, with an inter-node step.
    for (int mode : {0, 1, 2}) {
      const bool inter_node = mode == 2;
      auto ar = TreeAllReduce::Create(
          **ops, host, layouts[l],
          {.chunk_bytes = 256 << 10, .tune = false, .window = 3, .record = mode == 1});
      ASSERT_TRUE(ar.ok()) << ar.status();
      for (DataType dtype : common::kAllDataTypes) {
        SCOPED_TRACE(::testing::Message()
                     << "layout " << l << ", mode " << mode << ", " << common::DataTypeName(dtype));
        constexpr size_t kCount = (1 << 20) + 3;
        const size_t bytes = kCount * common::DataTypeSize(dtype);
        const int contributors = inter_node ? 2 * kGpus : kGpus;
        std::vector<uint8_t> input(bytes);
        std::vector<void*> device(kGpus);
        for (int g = 0; g < kGpus; ++g) {
          for (size_t i = 0; i < kCount; ++i) {
            testing::PutValue(dtype, input.data(), i,
                              contributors * (static_cast<double>((i + g) % 9) - 4));
          }
          absl::StatusOr<void*> p = (*ops)->AllocateDevice(g, bytes);
          ASSERT_TRUE(p.ok()) << p.status();
          device[g] = *p;
          ASSERT_EQ(cudaMemcpy(device[g], input.data(), bytes, cudaMemcpyHostToDevice),
                    cudaSuccess);
        }
        absl::Status s;
        if (inter_node) {
          ScalarReducer doubling;
          s = (*ar)->AllReduce(dtype, device, kCount, true, contributors,
                               [&](DataType t, void* data, size_t n, size_t) {
                                 doubling.Sum(t, data, data, n);
                                 return absl::OkStatus();
                               });
        } else {
          s = (*ar)->AllReduce(dtype, device, kCount, true);
        }
        ASSERT_TRUE(s.ok()) << s;
        // The result depends on i % 9 only.
        double want[9];
        for (size_t r = 0; r < 9; ++r) {
          double sum = 0;
          for (int h = 0; h < kGpus; ++h)
            sum += contributors * (static_cast<double>((r + h) % 9) - 4);
          want[r] = (inter_node ? 2 * sum : sum) / contributors;
        }
        std::vector<uint8_t> out(bytes);
        for (int g = 0; g < kGpus; ++g) {
          ASSERT_EQ(cudaMemcpy(out.data(), device[g], bytes, cudaMemcpyDeviceToHost), cudaSuccess);
          for (size_t i = 0; i < kCount; ++i) {
            ASSERT_EQ(testing::GetValue(dtype, out.data(), i), want[i % 9])
                << "GPU " << g << " element " << i;
          }
        }
      }
    }
  }
  // The tuner moves the chunk size while every result stays exact.
  auto ops = CudaGpuOps::Create(ordinals);
  ASSERT_TRUE(ops.ok()) << ops.status();
  auto ar = TreeAllReduce::Create(**ops, host, {*rooted}, {.chunk_bytes = 1 << 20, .tune = true});
  ASSERT_TRUE(ar.ok());
  constexpr size_t kCount = 16 << 20;
  std::vector<void*> device(kGpus);
  for (int g = 0; g < kGpus; ++g) {
    device[g] = *(*ops)->AllocateDevice(g, kCount * 4);
    std::vector<float> zeros(kCount, 0.0f);
    ASSERT_EQ(cudaMemcpy(device[g], zeros.data(), kCount * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE((*ar)->AllReduce(DataType::kFloat32, device, kCount, false).ok());
  }
  EXPECT_GE((*ar)->chunk_trajectory().size(), 2u) << "the tuner never moved";
  EXPECT_EQ((*ar)->replays(), 12);
  // Graph replays on fresh inputs: GPU g holds g + round at every element.
  for (int round = 0; round < 3; ++round) {
    for (int g = 0; g < kGpus; ++g) {
      std::vector<float> values(kCount, static_cast<float>(g + round));
      ASSERT_EQ(cudaMemcpy(device[g], values.data(), kCount * 4, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    ASSERT_TRUE((*ar)->AllReduce(DataType::kFloat32, device, kCount, false).ok());
    std::vector<float> out(kCount);
    for (int g = 0; g < kGpus; ++g) {
      ASSERT_EQ(cudaMemcpy(out.data(), device[g], kCount * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      const float want = static_cast<float>(kGpus * (kGpus - 1) / 2 + kGpus * round);
      for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(out[i], want) << "GPU " << g << " at " << i;
    }
  }
}

// The planner's plans for a DGX-1V (all eight GPUs: the NVLink ring cut at the root; GPUs
// 0, 1, 2, 5: packed trees) and a BytePS PCIe server (CPU-assisted groups) run on "GPUs" over
// the real devices, as graphs and enqueued, exact.
TEST(CudaGpuOps, ThePlannersPlansRunExactlyOnDevices) {
  absl::StatusOr<int> devices = cuda::CudaDeviceCount();
  if (!devices.ok()) GTEST_SKIP() << devices.status().message();
  // The fixtures where this build put them, or under the working directory (a packed build run
  // from the repository's root on another machine).
  std::string fixtures = TRIBUTARY_TOPOLOGY_FIXTURES;
  if (!std::filesystem::exists(fixtures)) fixtures = "tests/topology/fixtures";
  struct Case {
    std::string file;
    std::vector<int> gpus;
  };
  for (const Case& c : std::vector<Case>{{"dgx1v_nccl_topo.xml", {}},
                                         {"dgx1v_nccl_topo.xml", {0, 1, 2, 5}},
                                         {"byteps_pcie_server.yaml", {}}}) {
    absl::StatusOr<tributary::v1::Topology> t = topology::LoadTopologyFile(fixtures + "/" + c.file);
    ASSERT_TRUE(t.ok()) << t.status();
    auto r = topology::PlanIntraNode(*t, c.gpus, topology::LinkMode::kAll);
    ASSERT_TRUE(r.ok()) << r.status();
    const tributary::v1::IntraNodePlan plan = topology::ToProto(*r);
    absl::StatusOr<IntraNodeExecution> e = ExecutionFromPlan(plan);
    ASSERT_TRUE(e.ok()) << e.status();
    SCOPED_TRACE(e->description);
    const int n = plan.gpus_size();
    std::vector<int> ordinals;
    for (int g = 0; g < n; ++g) ordinals.push_back(g % *devices);
    auto ops = CudaGpuOps::Create(ordinals);
    ASSERT_TRUE(ops.ok()) << ops.status();
    ScalarReducer host;
    constexpr size_t kCount = (4 << 20) + 5;
    std::vector<void*> device(n);
    for (bool record : {false, true}) {
      for (int g = 0; g < n; ++g) {
        std::vector<int32_t> values(kCount, g + 1);
        if (device[g] == nullptr) device[g] = *(*ops)->AllocateDevice(g, kCount * 4);
        ASSERT_EQ(cudaMemcpy(device[g], values.data(), kCount * 4, cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
      absl::Status s;
      if (e->kind == IntraNodeExecution::kTrees) {
        auto ar = TreeAllReduce::Create(**ops, host, e->trees,
                                        {.chunk_bytes = 1 << 20, .tune = false, .record = record});
        ASSERT_TRUE(ar.ok()) << ar.status();
        s = (*ar)->AllReduce(DataType::kInt32, device, kCount, false);
      } else {
        ASSERT_EQ(e->kind, IntraNodeExecution::kCpuAssisted);
        auto ar = CpuAssistedAllReduce::Create(**ops, host, e->groups, {.chunk_bytes = 1 << 20});
        ASSERT_TRUE(ar.ok()) << ar.status();
        s = (*ar)->AllReduce(DataType::kInt32, device, kCount, false);
      }
      ASSERT_TRUE(s.ok()) << s;
      std::vector<int32_t> out(kCount);
      for (int g = 0; g < n; ++g) {
        ASSERT_EQ(cudaMemcpy(out.data(), device[g], kCount * 4, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        for (size_t i = 0; i < kCount; ++i) {
          ASSERT_EQ(out[i], n * (n + 1) / 2) << "GPU " << plan.gpus(g) << " element " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tributary::dataplane
