// CpuAssistedAllReduce on CudaGpuOps: exact sums on real devices (skipped, "no CUDA device",
// without a GPU). With one GPU, several "GPUs" share it (same code path: streams, peer-style
// copies, kernels, fences); with several, every device is used. The orchestration itself is
// tested on HostGpuOps in tests/dataplane/intranode.
#include "dataplane/intranode/cuda_gpu_ops.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "dataplane/cuda/cuda_status.h"
#include "dataplane/intranode/cpu_assisted_allreduce.h"
#include "dataplane/reduce/cpu/scalar_reducer.h"
#include "gtest/gtest.h"
#include "tests/util/typed_values.h"

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

}  // namespace
}  // namespace tributary::dataplane
