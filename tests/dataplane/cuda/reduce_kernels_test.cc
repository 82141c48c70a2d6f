// The CUDA reduction kernels against ScalarReducer, bit for bit: every dtype, sum and average,
// k = 1..8 sources (and chained passes beyond), sizes 1, 3, 4097 and large, aligned, same-phase
// unaligned, mixed-phase and not element-aligned buffers, dst aliasing a source.
//
// Two executors run the same cases: ReduceOnHost (the kernels' per-thread code compiled for the
// host, every thread of a grid in turn: runs without a GPU) and CudaReducer on a device (skipped,
// "no CUDA device", where there is none).
#include "dataplane/reduce/cuda/reduce_kernels.h"

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "dataplane/cuda/cuda_status.h"
#include "dataplane/reduce/cpu/scalar_reducer.h"
#include "dataplane/reduce/cuda/cuda_reducer.h"
#include "gtest/gtest.h"

namespace tributary::dataplane {
namespace {

using common::DataType;
using common::DataTypeName;
using common::DataTypeSize;

constexpr size_t kMaxBuffers = 1 + 12;  // dst and up to 12 sources (chained passes).
constexpr size_t kGuard = 256;
constexpr uint8_t kFill = 0xA5;

cuda_reduce::ElementType ToElementType(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return cuda_reduce::ElementType::kF32;
    case DataType::kFloat64:
      return cuda_reduce::ElementType::kF64;
    case DataType::kFloat16:
      return cuda_reduce::ElementType::kF16;
    case DataType::kBFloat16:
      return cuda_reduce::ElementType::kBf16;
    case DataType::kInt32:
      return cuda_reduce::ElementType::kI32;
    case DataType::kInt64:
      return cuda_reduce::ElementType::kI64;
  }
  return cuda_reduce::ElementType::kF32;
}

// One random element: a quarter arbitrary bit patterns (NaNs with payloads, Infs, subnormals),
// the rest values of similar magnitude so that sums round (and 16-bit sums overflow) often.
uint64_t RandomElement(DataType t, std::mt19937_64& rng) {
  const uint64_t r = rng();
  const uint64_t sign = (r >> 63) & 1;
  const bool raw = ((r >> 56) & 3) == 0;
  switch (t) {
    case DataType::kFloat32:
      return raw ? (r & 0xFFFFFFFF) : (sign << 31) | ((120 + r % 16) << 23) | ((r >> 8) & 0x7FFFFF);
    case DataType::kFloat64:
      return raw ? r : (sign << 63) | ((1015 + r % 16) << 52) | ((r >> 4) & 0xFFFFFFFFFFFFF);
    case DataType::kFloat16:
      return raw ? (r & 0xFFFF) : (sign << 15) | ((20 + r % 10) << 10) | ((r >> 8) & 0x3FF);
    case DataType::kBFloat16:
      return raw ? (r & 0xFFFF) : (sign << 15) | ((120 + r % 16) << 7) | ((r >> 8) & 0x7F);
    case DataType::kInt32:
      return raw ? (r & 0xFFFFFFFF) : static_cast<uint32_t>(static_cast<int32_t>(r % 2001) - 1000);
    case DataType::kInt64:
      return raw ? r : static_cast<uint64_t>(static_cast<int64_t>(r % 2001) - 1000);
  }
  return 0;
}

// Where dst and each source start, in bytes past a 256-byte boundary, and which buffer dst is.
struct Layout {
  const char* name;
  std::array<size_t, kMaxBuffers> offset;  // [0] dst, [1 + s] source s.
};

constexpr Layout kAligned{"aligned", {}};
constexpr Layout kSamePhase{"same phase 8", {8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8}};
constexpr Layout kSamePhase6{"same phase 6", {6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6}};
constexpr Layout kMixed{"mixed phases", {0, 8, 16, 24, 32, 40, 48, 56, 8, 0, 24, 16, 40}};
constexpr Layout kUnaligned{"not element-aligned", {1, 3, 5, 7, 2, 9, 11, 13, 15, 1, 3, 5, 7}};
constexpr Layout kLayouts[] = {kAligned, kSamePhase, kSamePhase6, kMixed, kUnaligned};

enum class Alias { kNone, kDstIsFirst, kDstIsLast };

struct Case {
  DataType dtype;
  size_t count;
  int sources;
  bool average;
  Layout layout;
  Alias alias;
};

std::string Describe(const Case& c) {
  char text[200];
  std::snprintf(text, sizeof(text), "%s count %zu k %d %s, %s, alias %d",
                std::string(DataTypeName(c.dtype)).c_str(), c.count, c.sources,
                c.average ? "average" : "sum", c.layout.name, static_cast<int>(c.alias));
  return text;
}

// Guarded host buffers of one case: storage_[b] holds buffer b at its offset past a 256-byte
// boundary, between guard bytes of kFill.
class CaseBuffers {
 public:
  explicit CaseBuffers(const Case& c) : c_(c), bytes_(c.count * DataTypeSize(c.dtype)) {
    std::mt19937_64 rng(c.count * 131 + static_cast<uint64_t>(c.dtype) * 7 + c.sources);
    const size_t size = DataTypeSize(c.dtype);
    for (int b = 0; b <= c.sources; ++b) {
      storage_.emplace_back(StorageBytes(), kFill);
      uint8_t* p = data(b);
      for (size_t i = 0; i < c.count; ++i) {
        const uint64_t v = RandomElement(c.dtype, rng);
        std::memcpy(p + i * size, &v, size);
      }
    }
  }

  size_t StorageBytes() const { return 256 + kGuard + 64 + bytes_ + kGuard; }
  // The storage as allocated (its own alignment is the caller's business).
  std::vector<uint8_t>& storage(int b) { return storage_[b]; }
  // Offset of buffer b within a 256-aligned copy of its storage.
  size_t Offset(int b) const { return kGuard + c_.layout.offset[b]; }
  uint8_t* data(int b) { return storage_[b].data() + Offset(b); }

  // The buffer dst actually is (dst itself or the aliased source).
  int DstBuffer() const {
    switch (c_.alias) {
      case Alias::kNone:
        return 0;
      case Alias::kDstIsFirst:
        return 1;
      case Alias::kDstIsLast:
        return c_.sources;
    }
    return 0;
  }

  // ScalarReducer's result for the case: sources folded left to right, then divided.
  std::vector<uint8_t> Reference() {
    std::vector<uint8_t> want(data(1), data(1) + bytes_);
    ScalarReducer ref;
    for (int s = 2; s <= c_.sources; ++s) ref.Sum(c_.dtype, want.data(), data(s), c_.count);
    if (c_.average) ref.Divide(c_.dtype, want.data(), c_.count, c_.sources);
    return want;
  }

  bool GuardsIntact(int b) const {
    const std::vector<uint8_t>& s = storage_[b];
    for (size_t i = 0; i < Offset(b); ++i) {
      if (s[i] != kFill) return false;
    }
    for (size_t i = Offset(b) + bytes_; i < s.size(); ++i) {
      if (s[i] != kFill) return false;
    }
    return true;
  }

 private:
  Case c_;
  size_t bytes_;
  std::vector<std::vector<uint8_t>> storage_;
};

// Empty when equal; otherwise the first differing element.
std::string Diff(DataType dtype, const uint8_t* want, const uint8_t* got, size_t count) {
  const size_t size = DataTypeSize(dtype);
  if (count == 0 || std::memcmp(want, got, count * size) == 0) return "";
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(want + i * size, got + i * size, size) != 0) {
      uint64_t w = 0, g = 0;
      std::memcpy(&w, want + i * size, size);
      std::memcpy(&g, got + i * size, size);
      char text[120];
      std::snprintf(text, sizeof(text), "element %zu of %zu: want 0x%llx got 0x%llx", i, count,
                    static_cast<unsigned long long>(w), static_cast<unsigned long long>(g));
      return text;
    }
  }
  return "";
}

// Runs the case on `execute(dst, sources)` (pointers into `buffers`, already laid out) and
// checks every element against the reference, the sources untouched and every guard intact.
void Check(
    const Case& c,
    const std::function<void(CaseBuffers&, uint8_t* dst, std::vector<const void*>&)>& execute) {
  SCOPED_TRACE(Describe(c));
  CaseBuffers buffers(c);
  const std::vector<uint8_t> want = buffers.Reference();
  std::vector<std::vector<uint8_t>> sources_before;
  for (int s = 1; s <= c.sources; ++s) sources_before.push_back(buffers.storage(s));
  std::vector<const void*> srcs;
  for (int s = 1; s <= c.sources; ++s) srcs.push_back(buffers.data(s));
  const int dst_buffer = buffers.DstBuffer();
  execute(buffers, buffers.data(dst_buffer), srcs);
  EXPECT_EQ(Diff(c.dtype, want.data(), buffers.data(dst_buffer), c.count), "");
  for (int s = 1; s <= c.sources; ++s) {
    if (s == dst_buffer) continue;
    EXPECT_TRUE(buffers.storage(s) == sources_before[s - 1]) << "source " << s - 1 << " written";
  }
  for (int b = 0; b <= c.sources; ++b) EXPECT_TRUE(buffers.GuardsIntact(b)) << "buffer " << b;
}

std::vector<Case> Cases(std::initializer_list<size_t> counts, size_t large, int max_sources) {
  std::vector<Case> out;
  for (DataType dtype : common::kAllDataTypes) {
    for (size_t count : counts) {
      for (const Layout& layout : kLayouts) {
        for (int k = 1; k <= max_sources; ++k) {
          for (bool average : {false, true}) {
            out.push_back({dtype, count, k, average, layout, Alias::kNone});
          }
        }
        out.push_back({dtype, count, 2, false, layout, Alias::kDstIsFirst});
        out.push_back({dtype, count, 5, true, layout, Alias::kDstIsLast});
      }
    }
    for (const Layout& layout : {kAligned, kSamePhase6, kUnaligned}) {
      for (int k : {1, 2, 3, 8}) out.push_back({dtype, large, k, k == 3, layout, Alias::kNone});
    }
  }
  return out;
}

// ---- The kernels' code on the host: runs everywhere.

// Grid strides the host runs the per-thread code with: one thread, an odd one, three blocks.
constexpr size_t kHostThreads[] = {1, 37, 768};

TEST(ReduceKernelsOnHost, MatchScalarReducerForEveryCase) {
  size_t n = 0;
  for (const Case& c : Cases({1, 3, 17, 4097}, 100003, cuda_reduce::kMaxSources)) {
    const size_t threads = kHostThreads[n++ % std::size(kHostThreads)];
    Check(c, [&](CaseBuffers& buffers, uint8_t* dst, std::vector<const void*>& srcs) {
      // Host vectors are not 256-aligned: realign every buffer's storage copy so that the
      // layout's offsets modulo 16 are the ones the kernels see.
      std::vector<std::unique_ptr<uint8_t[]>> aligned;
      std::vector<uint8_t*> base;
      for (int b = 0; b <= c.sources; ++b) {
        std::vector<uint8_t>& s = buffers.storage(b);
        aligned.emplace_back(new uint8_t[s.size() + 256]);
        uint8_t* p = aligned.back().get();
        p += (256 - reinterpret_cast<uintptr_t>(p) % 256) % 256;
        std::memcpy(p, s.data(), s.size());
        base.push_back(p);
      }
      const int dst_buffer = buffers.DstBuffer();
      cuda_reduce::ReduceArgs args;
      args.dst = base[dst_buffer] + buffers.Offset(dst_buffer);
      args.num_sources = c.sources;
      for (int s = 0; s < c.sources; ++s) args.src[s] = base[s + 1] + buffers.Offset(s + 1);
      args.divide = c.average;
      args.divisor = c.sources;
      args.count = c.count;
      cuda_reduce::ReduceOnHost(ToElementType(c.dtype), args, threads);
      for (int b = 0; b <= c.sources; ++b) {
        std::memcpy(buffers.storage(b).data(), base[b], buffers.storage(b).size());
      }
    });
    if (testing::Test::HasFailure()) return;
  }
}

TEST(ReduceKernelsOnHost, SelectsTheLoadModeFromEveryPointer) {
  alignas(16) static uint8_t memory[256];
  cuda_reduce::ReduceArgs a;
  a.num_sources = 2;
  a.dst = memory + 16;
  a.src[0] = memory + 32;
  a.src[1] = memory + 64;
  EXPECT_EQ(cuda_reduce::SelectLoadMode(a, 4), cuda_reduce::LoadMode::kVector16);
  a.dst = memory + 20;
  a.src[0] = memory + 36;
  a.src[1] = memory + 68;
  EXPECT_EQ(cuda_reduce::SelectLoadMode(a, 4), cuda_reduce::LoadMode::kVector16);
  EXPECT_EQ(cuda_reduce::SelectLoadMode(a, 8), cuda_reduce::LoadMode::kBytes);
  a.src[1] = memory + 72;  // A different phase in the last source only.
  EXPECT_EQ(cuda_reduce::SelectLoadMode(a, 4), cuda_reduce::LoadMode::kElement);
  a.src[1] = memory + 73;
  EXPECT_EQ(cuda_reduce::SelectLoadMode(a, 2), cuda_reduce::LoadMode::kBytes);
  EXPECT_EQ(cuda_reduce::SelectLoadMode(a, 1), cuda_reduce::LoadMode::kElement);
}

// ---- On a device: skipped without one.

class CudaReducerTest : public testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<CudaReducer>> r = CudaReducer::Create(0);
    if (!r.ok() && r.status().code() == absl::StatusCode::kFailedPrecondition) {
      GTEST_SKIP() << r.status().message();
    }
    ASSERT_TRUE(r.ok()) << r.status();
    reducer_ = std::move(*r);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Copies the case's buffers (storage and offsets as on the host) to the device, runs `run`,
  // copies everything back.
  void OnDevice(const Case& c,
                const std::function<absl::Status(void* dst, std::vector<const void*>& srcs)>& run) {
    Check(c, [&](CaseBuffers& buffers, uint8_t*, std::vector<const void*>&) {
      std::vector<uint8_t*> device(c.sources + 1, nullptr);
      for (int b = 0; b <= c.sources; ++b) {
        std::vector<uint8_t>& s = buffers.storage(b);
        ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device[b]), s.size()),
                  cudaSuccess);  // 256-byte aligned.
        ASSERT_EQ(cudaMemcpy(device[b], s.data(), s.size(), cudaMemcpyHostToDevice), cudaSuccess);
      }
      std::vector<const void*> srcs;
      for (int s = 1; s <= c.sources; ++s) srcs.push_back(device[s] + buffers.Offset(s));
      const int dst_buffer = buffers.DstBuffer();
      absl::Status status = run(device[dst_buffer] + buffers.Offset(dst_buffer), srcs);
      EXPECT_TRUE(status.ok()) << status;
      EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      for (int b = 0; b <= c.sources; ++b) {
        std::vector<uint8_t>& s = buffers.storage(b);
        EXPECT_EQ(cudaMemcpy(s.data(), device[b], s.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        cudaFree(device[b]);
      }
    });
  }

  std::unique_ptr<CudaReducer> reducer_;
  cudaStream_t stream_ = nullptr;
};

TEST_F(CudaReducerTest, ReduceAsyncMatchesScalarReducerForEveryCase) {
  for (const Case& c : Cases({1, 3, 4097}, (size_t{1} << 22) + 3, cuda_reduce::kMaxSources)) {
    OnDevice(c, [&](void* dst, std::vector<const void*>& srcs) {
      return reducer_->ReduceAsync(c.dtype, dst, srcs, c.count, c.average, stream_);
    });
    if (HasFailure()) return;
  }
}

TEST_F(CudaReducerTest, MoreThanEightSourcesChainPassesWithTheSameBits) {
  for (DataType dtype : common::kAllDataTypes) {
    for (int k : {9, 12}) {
      for (bool average : {false, true}) {
        const Case c{dtype, 4097, k, average, kSamePhase6, Alias::kDstIsFirst};
        OnDevice(c, [&](void* dst, std::vector<const void*>& srcs) {
          return reducer_->ReduceAsync(c.dtype, dst, srcs, c.count, c.average, stream_);
        });
      }
    }
  }
}

TEST_F(CudaReducerTest, ReducerInterfaceMatchesScalarReducer) {
  for (DataType dtype : common::kAllDataTypes) {
    for (const Layout& layout : kLayouts) {
      // Sum: dst += src.
      OnDevice({dtype, 4097, 2, false, layout, Alias::kDstIsFirst},
               [&](void* dst, std::vector<const void*>& srcs) {
                 reducer_->Sum(dtype, dst, srcs[1], 4097);
                 return absl::OkStatus();
               });
      // Sum2: dst = a + b.
      OnDevice({dtype, 4097, 2, false, layout, Alias::kNone},
               [&](void* dst, std::vector<const void*>& srcs) {
                 reducer_->Sum2(dtype, dst, srcs[0], srcs[1], 4097);
                 return absl::OkStatus();
               });
      // Divide by 1 (the k = 1 average): canonical NaNs, the values otherwise.
      OnDevice({dtype, 4097, 1, true, layout, Alias::kDstIsFirst},
               [&](void* dst, std::vector<const void*>&) {
                 reducer_->Divide(dtype, dst, 4097, 1);
                 return absl::OkStatus();
               });
    }
  }
}

TEST_F(CudaReducerTest, BadInputIsAnErrorNotACrash) {
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), 1024), cudaSuccess);
  std::vector<float> pageable(256);
  const void* one[] = {device};
  const void* host[] = {pageable.data()};
  absl::Status s = reducer_->ReduceAsync(DataType::kFloat32, device, {}, 256, false, stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = reducer_->ReduceAsync(DataType::kFloat32, nullptr, one, 256, false, stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = reducer_->ReduceAsync(static_cast<DataType>(99), device, one, 256, false, stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = reducer_->DivideAsync(DataType::kFloat32, device, 256, 0, stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  int pageable_access = 0;
  cudaDeviceGetAttribute(&pageable_access, cudaDevAttrPageableMemoryAccess, 0);
  if (!pageable_access) {
    s = reducer_->ReduceAsync(DataType::kFloat32, device, host, 256, false, stream_);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("pageable host memory"), std::string::npos) << s;
  }
  std::vector<const void*> many(10, device);
  s = reducer_->ReduceAsync(DataType::kFloat32, device, many, 256, false, stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;  // dst is source 9.
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  cudaFree(device);
}

// Runs everywhere: without a device, Create says so; with one, a missing ordinal is rejected.
TEST(CudaReducerCreate, ReportsNoDeviceOrABadOrdinalCleanly) {
  absl::StatusOr<int> count = cuda::CudaDeviceCount();
  if (!count.ok()) {
    EXPECT_EQ(count.status().code(), absl::StatusCode::kFailedPrecondition);
    absl::StatusOr<std::unique_ptr<CudaReducer>> r = CudaReducer::Create(0);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(r.status().message().rfind("no CUDA device", 0), 0u) << r.status();
    return;
  }
  absl::StatusOr<std::unique_ptr<CudaReducer>> r = CudaReducer::Create(*count);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(CudaReducer::Create(0).ok());
}

}  // namespace
}  // namespace tributary::dataplane
