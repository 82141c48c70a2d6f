// CUDA IPC: the buffer record's format (runs everywhere), and a buffer exported here, opened,
// checked and negated in place by another process (tests/tools/cuda_ipc_peer.cc), ordered by the
// interprocess event (skipped, "no CUDA device", without a GPU).
#include "dataplane/cuda/cuda_ipc.h"

#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dataplane/cuda/cuda_status.h"
#include "gtest/gtest.h"

namespace tributary::dataplane::cuda {
namespace {

CudaIpcBuffer Sample() {
  CudaIpcBuffer b;
  for (int i = 0; i < 64; ++i) {
    b.memory.reserved[i] = static_cast<char>(i * 7);
    b.ready.reserved[i] = static_cast<char>(255 - i);
  }
  b.offset = 4096;
  b.bytes = (uint64_t{1} << 33) + 5;
  b.device = 3;
  return b;
}

TEST(CudaIpcRecord, RoundTrips) {
  const CudaIpcBuffer b = Sample();
  const std::string record = SerializeCudaIpcBuffer(b);
  EXPECT_EQ(record.size(), 160u);
  absl::StatusOr<CudaIpcBuffer> back = ParseCudaIpcBuffer(record);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(std::memcmp(&back->memory, &b.memory, 64), 0);
  EXPECT_EQ(std::memcmp(&back->ready, &b.ready, 64), 0);
  EXPECT_EQ(back->offset, b.offset);
  EXPECT_EQ(back->bytes, b.bytes);
  EXPECT_EQ(back->device, b.device);
}

TEST(CudaIpcRecord, RejectsAnythingElse) {
  const std::string good = SerializeCudaIpcBuffer(Sample());
  auto code = [](const std::string& r) { return ParseCudaIpcBuffer(r).status().code(); };
  EXPECT_EQ(code(""), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(good.substr(0, 159)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(good + "x"), absl::StatusCode::kInvalidArgument);
  std::string bad = good;
  bad[0] = 'X';  // Magic.
  EXPECT_EQ(code(bad), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad[8] = 2;  // Version.
  EXPECT_NE(ParseCudaIpcBuffer(bad).status().message().find("version 2"), std::string::npos);
  CudaIpcBuffer b = Sample();
  b.device = -1;
  EXPECT_EQ(code(SerializeCudaIpcBuffer(b)), absl::StatusCode::kInvalidArgument);
  b = Sample();
  b.offset = ~uint64_t{0} - 2;
  EXPECT_EQ(code(SerializeCudaIpcBuffer(b)), absl::StatusCode::kInvalidArgument);
}

TEST(CudaIpc, AnotherProcessReadsAndWritesTheBufferInPlace) {
  absl::StatusOr<int> devices = CudaDeviceCount();
  if (!devices.ok()) GTEST_SKIP() << devices.status().message();
  constexpr size_t kOffset = 4096, kCount = 1 << 18;
  char* base = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&base), kOffset + kCount * 4), cudaSuccess);
  std::vector<int32_t> v(kCount);
  for (size_t i = 0; i < kCount; ++i) v[i] = static_cast<int32_t>(i * 3 + 1);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(base + kOffset, v.data(), kCount * 4, cudaMemcpyHostToDevice, stream),
            cudaSuccess);
  absl::StatusOr<std::unique_ptr<CudaIpcExport>> out =
      CudaIpcExport::Create(base, kOffset, kCount * 4, 0);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE((*out)->MarkReady(stream).ok());  // After the fill, without waiting for it here.
  std::string hex;
  for (unsigned char c : SerializeCudaIpcBuffer((*out)->buffer())) {
    char two[3];
    std::snprintf(two, sizeof(two), "%02x", c);
    hex += two;
  }
  // The build's peer, or the one named by the environment (binaries run away from their build
  // tree: scripts/gpu_check.sh with PREBUILT).
  const char* peer = std::getenv("TRIBUTARY_CUDA_IPC_PEER");
  const std::string command =
      std::string(peer != nullptr ? peer : TRIBUTARY_CUDA_IPC_PEER) + " " + hex;
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command << " -> " << status;
  std::vector<int32_t> back(kCount);
  ASSERT_EQ(cudaMemcpy(back.data(), base + kOffset, kCount * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(back[i], -static_cast<int32_t>(i * 3 + 1)) << i;
  }
  out->reset();
  cudaStreamDestroy(stream);
  cudaFree(base);
}

// Runs everywhere: no device is FAILED_PRECONDITION; with one, a null allocation is rejected.
TEST(CudaIpc, BadExportsAreClearErrors) {
  if (!CudaDeviceCount().ok()) {
    EXPECT_EQ(CudaIpcExport::Create(reinterpret_cast<void*>(0x1000), 0, 16, 0).status().code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(CudaIpcImport::Open(CudaIpcBuffer{}).status().code(),
              absl::StatusCode::kFailedPrecondition);
    return;
  }
  EXPECT_EQ(CudaIpcExport::Create(nullptr, 0, 16, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(CudaIpcImport::Open(CudaIpcBuffer{}).ok());  // An all-zero handle.
}

}  // namespace
}  // namespace tributary::dataplane::cuda
