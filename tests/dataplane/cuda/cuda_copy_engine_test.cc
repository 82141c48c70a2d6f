// CudaCopyEngine under StagingPipeline on a device: device memory out through pinned chunks and
// back in, exact bytes, and the copy stream ordered after a kernel on a compute stream (skipped,
// "no CUDA device", without a GPU). The pipeline's ordering logic is tested on the host engine
// in tests/dataplane/staging.
#include "dataplane/staging/cuda_copy_engine.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "dataplane/reduce/cuda/cuda_reducer.h"
#include "dataplane/staging/staging_pipeline.h"
#include "gtest/gtest.h"

namespace tributary::dataplane {
namespace {

constexpr auto kTimeout = std::chrono::seconds(30);

class CudaCopyEngineTest : public testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<CudaCopyEngine>> e = CudaCopyEngine::Create(0);
    if (!e.ok() && e.status().code() == absl::StatusCode::kFailedPrecondition) {
      GTEST_SKIP() << e.status().message();
    }
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }
  std::unique_ptr<CudaCopyEngine> engine_;
};

TEST_F(CudaCopyEngineTest, StagingMemoryIsPinned) {
  absl::StatusOr<StagingMemory> m = engine_->AllocateStaging(1 << 20);
  ASSERT_TRUE(m.ok()) << m.status();
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, m->data()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
}

TEST_F(CudaCopyEngineTest, SendAndReceiveDeviceMemoryThroughPinnedChunks) {
  auto p = StagingPipeline::Create(*engine_, {.chunk_bytes = 1 << 20, .slots = 3});
  ASSERT_TRUE(p.ok()) << p.status();
  for (size_t bytes : {size_t{1}, size_t{(1 << 20) + 3}, size_t{(10 << 20) + 4097}}) {
    SCOPED_TRACE(bytes);
    std::vector<uint8_t> host(bytes);
    for (size_t i = 0; i < bytes; ++i) host[i] = static_cast<uint8_t>(i * 131 + 7);
    void* device = nullptr;
    ASSERT_EQ(cudaMalloc(&device, bytes), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(device, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    std::vector<uint8_t> sent(bytes);
    absl::Status s = (*p)->Send(
        device, bytes,
        [&](const StagingPipeline::Chunk& c, absl::AnyInvocable<void()> release) {
          std::memcpy(sent.data() + c.offset, c.host, c.bytes);
          release();
        },
        kTimeout);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(sent == host);
    ASSERT_EQ(cudaMemset(device, 0, bytes), cudaSuccess);
    s = (*p)->Receive(
        device, bytes,
        [&](const StagingPipeline::Chunk& c, absl::AnyInvocable<void(absl::Status)> filled) {
          std::memcpy(c.host, host.data() + c.offset, c.bytes);
          filled(absl::OkStatus());
        },
        kTimeout);
    ASSERT_TRUE(s.ok()) << s;
    std::vector<uint8_t> back(bytes);
    ASSERT_EQ(cudaMemcpy(back.data(), device, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(back == host);
    cudaFree(device);
  }
}

// A reduction kernel on a compute stream writes the tensor; WaitFor orders the copies after it
// without blocking the host: the staged bytes are the sum.
TEST_F(CudaCopyEngineTest, CopiesWaitForTheComputeStream) {
  absl::StatusOr<std::unique_ptr<CudaReducer>> reducer = CudaReducer::Create(0);
  ASSERT_TRUE(reducer.ok()) << reducer.status();
  constexpr size_t kCount = 1 << 22;
  std::vector<int32_t> a(kCount), b(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    a[i] = static_cast<int32_t>(i);
    b[i] = static_cast<int32_t>(3 * i + 1);
  }
  int32_t *da = nullptr, *db = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&da), kCount * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&db), kCount * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(da, a.data(), kCount * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(db, b.data(), kCount * 4, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  const void* srcs[] = {da, db};
  ASSERT_TRUE(
      (*reducer)->ReduceAsync(common::DataType::kInt32, da, srcs, kCount, false, compute).ok());
  ASSERT_TRUE(engine_->WaitFor(compute).ok());
  auto p = StagingPipeline::Create(*engine_, {.chunk_bytes = 1 << 20, .slots = 2});
  ASSERT_TRUE(p.ok());
  std::vector<int32_t> sent(kCount);
  absl::Status s = (*p)->Send(
      da, kCount * 4,
      [&](const StagingPipeline::Chunk& c, absl::AnyInvocable<void()> release) {
        std::memcpy(reinterpret_cast<uint8_t*>(sent.data()) + c.offset, c.host, c.bytes);
        release();
      },
      kTimeout);
  ASSERT_TRUE(s.ok()) << s;
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(sent[i], static_cast<int32_t>(4 * i + 1)) << i;
  }
  cudaStreamDestroy(compute);
  cudaFree(da);
  cudaFree(db);
}

TEST_F(CudaCopyEngineTest, NotificationsRunInStreamOrderAndSynchronizeWaitsForThem) {
  constexpr size_t kBytes = 64 << 10;
  absl::StatusOr<StagingMemory> host = engine_->AllocateStaging(kBytes);
  ASSERT_TRUE(host.ok()) << host.status();
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, kBytes), cudaSuccess);
  std::vector<int> order;  // Written by the completion thread; read after Synchronize.
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(engine_->CopyAsync(host->data(), device, kBytes).ok());
    ASSERT_TRUE(engine_
                    ->NotifyAsync([&order, i](absl::Status s) {
                      EXPECT_TRUE(s.ok()) << s;
                      order.push_back(i);
                    })
                    .ok());
  }
  ASSERT_TRUE(engine_->Synchronize().ok());
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
  cudaFree(device);
}

// A notification's `done` still running (here: blocked) does not hold back the copies enqueued
// after it, as a stream callback (cudaStreamAddCallback) would.
TEST_F(CudaCopyEngineTest, ABusyNotificationDoesNotStallLaterCopies) {
  constexpr size_t kBytes = 1 << 20;
  absl::StatusOr<StagingMemory> host = engine_->AllocateStaging(kBytes);
  ASSERT_TRUE(host.ok()) << host.status();
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, kBytes), cudaSuccess);
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  ASSERT_TRUE(engine_->CopyAsync(host->data(), device, kBytes).ok());
  ASSERT_TRUE(engine_
                  ->NotifyAsync([&](absl::Status) {
                    std::unique_lock lock(mu);
                    cv.wait_for(lock, std::chrono::seconds(30), [&] { return go; });
                  })
                  .ok());
  ASSERT_TRUE(engine_->CopyAsync(device, host->data(), kBytes).ok());
  cudaEvent_t after = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&after, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(after, engine_->stream()), cudaSuccess);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  cudaError_t e = cudaEventQuery(after);
  while (e == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
    e = cudaEventQuery(after);
  }
  EXPECT_EQ(e, cudaSuccess) << "the copy after a notification waited for its callback";
  {
    std::lock_guard lock(mu);
    go = true;
  }
  cv.notify_all();
  ASSERT_TRUE(engine_->Synchronize().ok());
  cudaEventDestroy(after);
  cudaFree(device);
}

TEST(CudaCopyEngineCreate, ReportsNoDeviceCleanly) {
  absl::StatusOr<std::unique_ptr<CudaCopyEngine>> e = CudaCopyEngine::Create(0);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(e.status().message().rfind("no CUDA device", 0), 0u) << e.status();
  } else {
    EXPECT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(CudaCopyEngine::Create(count).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace tributary::dataplane
