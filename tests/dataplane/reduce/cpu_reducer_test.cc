// CpuReducer against ScalarReducer, bit for bit: every dtype, ISA level, length, alignment,
// aliasing pattern and thread count, on random data that mixes typical values with specials.
#include "dataplane/reduce/cpu/cpu_reducer.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "dataplane/reduce/cpu/scalar_reducer.h"
#include "gtest/gtest.h"

namespace tributary::dataplane {
namespace {

using common::DataType;
using common::DataTypeName;
using common::DataTypeSize;

constexpr size_t kLengths[] = {0, 1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 65, 127, 1000003};
constexpr size_t kLargest = 1000003;
constexpr size_t kMaxSmall = 127;

// One random element. A quarter are arbitrary bit patterns (NaNs, Infs, subnormals, huge and
// tiny values); one in 16 is a listed special; the rest are typical values of similar
// magnitude so that sums round in interesting ways.
uint64_t RandomElement(DataType t, std::mt19937_64& rng) {
  const uint64_t r = rng();
  const uint64_t sign = (r >> 63) & 1;
  const uint64_t pick = (r >> 56) & 0xF;
  switch (t) {
    case DataType::kFloat32: {
      static constexpr uint32_t kSpecial[] = {0x0,        0x80000000, 0x7F800000, 0xFF800000,
                                              0x7FC00000, 0x7F800001, 0xFFC01234, 0x1,
                                              0x807FFFFF, 0x7F7FFFFF, 0x00800000, 0x3F800000};
      if (pick == 0) return kSpecial[r % std::size(kSpecial)];
      if (pick < 4) return r & 0xFFFFFFFF;
      return (sign << 31) | ((120 + r % 16) << 23) | ((r >> 8) & 0x7FFFFF);
    }
    case DataType::kFloat64: {
      static constexpr uint64_t kSpecial[] = {0x0,
                                              0x8000000000000000,
                                              0x7FF0000000000000,
                                              0xFFF0000000000000,
                                              0x7FF8000000000000,
                                              0x7FF0000000000001,
                                              0x1,
                                              0x7FEFFFFFFFFFFFFF};
      if (pick == 0) return kSpecial[r % std::size(kSpecial)];
      if (pick < 4) return r;
      return (sign << 63) | ((1015 + r % 16) << 52) | ((r >> 4) & 0xFFFFFFFFFFFFF);
    }
    case DataType::kFloat16: {
      static constexpr uint16_t kSpecial[] = {0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01,
                                              0xFE77, 0x0001, 0x83FF, 0x7BFF, 0xFBFF, 0x0400};
      if (pick == 0) return kSpecial[r % std::size(kSpecial)];
      if (pick < 4) return r & 0xFFFF;
      return (sign << 15) | ((8 + r % 16) << 10) | ((r >> 8) & 0x3FF);
    }
    case DataType::kBFloat16: {
      static constexpr uint16_t kSpecial[] = {0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81,
                                              0xFFC5, 0x0001, 0x807F, 0x7F7F, 0xFF7F, 0x0080};
      if (pick == 0) return kSpecial[r % std::size(kSpecial)];
      if (pick < 4) return r & 0xFFFF;
      return (sign << 15) | ((120 + r % 16) << 7) | ((r >> 8) & 0x7F);
    }
    case DataType::kInt32:
      return pick < 8 ? (r & 0xFFFFFFFF)
                      : static_cast<uint32_t>(static_cast<int32_t>(r % 2001) - 1000);
    case DataType::kInt64:
      return pick < 8 ? r : static_cast<uint64_t>(static_cast<int64_t>(r % 2001) - 1000);
  }
  return 0;
}

// Random contents for `dtype`, cached: the same kLargest + 64 elements per (dtype, stream).
const std::vector<uint8_t>& RandomPool(DataType dtype, int stream) {
  static auto* pools = new std::map<std::pair<DataType, int>, std::vector<uint8_t>>();
  std::vector<uint8_t>& pool = (*pools)[{dtype, stream}];
  if (pool.empty()) {
    const size_t size = DataTypeSize(dtype);
    pool.resize((kLargest + 64) * size);
    std::mt19937_64 rng(static_cast<uint64_t>(dtype) * 1000 + stream);
    for (size_t i = 0; i < kLargest + 64; ++i) {
      const uint64_t v = RandomElement(dtype, rng);
      std::memcpy(pool.data() + i * size, &v, size);  // Little-endian: the low bytes.
    }
  }
  return pool;
}

// `bytes` of data starting `offset` bytes past a 64-byte boundary, between guard bytes that
// must never be written.
class GuardedBuffer {
 public:
  static constexpr size_t kGuard = 128;
  static constexpr uint8_t kFill = 0xA5;

  GuardedBuffer(size_t bytes, size_t offset)
      : storage_(63 + kGuard + offset + bytes + kGuard, kFill), bytes_(bytes) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(storage_.data());
    const uintptr_t aligned = (base + 63) / 64 * 64;
    data_ = storage_.data() + (aligned - base) + kGuard + offset;
  }

  // Copies `bytes` from a random pool, starting at element `start`.
  void Fill(DataType dtype, int stream, size_t start) {
    if (bytes_ == 0) return;
    std::memcpy(data_, RandomPool(dtype, stream).data() + start * DataTypeSize(dtype), bytes_);
  }

  uint8_t* data() { return data_; }
  size_t bytes() const { return bytes_; }

  bool GuardsIntact() const {
    for (const uint8_t* p = storage_.data(); p < data_; ++p) {
      if (*p != kFill) return false;
    }
    for (const uint8_t* p = data_ + bytes_; p < storage_.data() + storage_.size(); ++p) {
      if (*p != kFill) return false;
    }
    return true;
  }

 private:
  std::vector<uint8_t> storage_;
  size_t bytes_;
  uint8_t* data_;
};

// Empty when equal; otherwise names the first differing element.
std::string Diff(DataType dtype, const uint8_t* want, const uint8_t* got, size_t count) {
  const size_t size = DataTypeSize(dtype);
  if (count == 0 || std::memcmp(want, got, count * size) == 0) return "";
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(want + i * size, got + i * size, size) != 0) {
      uint64_t w = 0, g = 0;
      std::memcpy(&w, want + i * size, size);
      std::memcpy(&g, got + i * size, size);
      char text[160];
      std::snprintf(text, sizeof(text), "%s element %zu of %zu: want 0x%llx got 0x%llx",
                    std::string(DataTypeName(dtype)).c_str(), i, count,
                    static_cast<unsigned long long>(w), static_cast<unsigned long long>(g));
      return text;
    }
  }
  return "";
}

// Byte offsets (dst, a, b) from a 64-byte boundary: all of 0..7 for short buffers (most of them
// not element-aligned), one combination for the long one (dst 4-byte aligned, sources not).
std::vector<std::array<size_t, 3>> Offsets(size_t count) {
  std::vector<std::array<size_t, 3>> out;
  if (count > kMaxSmall) return {{4, 6, 1}};
  for (size_t d = 0; d < 8; ++d) out.push_back({d, (d * 3 + 1) % 8, (d * 5 + 2) % 8});
  out.push_back({16, 4, 32});  // Element-aligned but not vector-aligned.
  return out;
}

// Which buffers Sum2 reads: distinct ones or the destination itself.
enum class Alias { kNone, kDstIsA, kDstIsB, kAIsB };

class CpuReducerIsaTest : public testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (GetParam() > DetectCpuIsa()) {
      GTEST_SKIP() << CpuIsaName(GetParam()) << " not supported on this cpu or build";
    }
  }

  // Runs Sum2 (or Sum for Alias::kDstIsA via Sum) on `reducer` and ScalarReducer with the same
  // inputs and compares results and guards.
  void CheckSum2(Reducer& reducer, DataType dtype, size_t count, std::array<size_t, 3> off,
                 Alias alias, bool use_sum) {
    SCOPED_TRACE(testing::Message() << DataTypeName(dtype) << " count " << count << " offsets "
                                    << off[0] << "," << off[1] << "," << off[2] << " alias "
                                    << static_cast<int>(alias) << (use_sum ? " Sum" : " Sum2"));
    const size_t bytes = count * DataTypeSize(dtype);
    const size_t start = (count * 7) % 64;
    GuardedBuffer a(bytes, off[1]), b(bytes, off[2]);
    a.Fill(dtype, 0, start);
    b.Fill(dtype, 1, start);
    // Expected: the reference on separate, aligned buffers.
    GuardedBuffer want(bytes, 0), a_ref(bytes, 0);
    a_ref.Fill(dtype, 0, start);
    want.Fill(dtype, 2, start);
    ScalarReducer ref;
    if (alias == Alias::kAIsB) {
      ref.Sum2(dtype, want.data(), a_ref.data(), a_ref.data(), count);
    } else {
      GuardedBuffer b_ref(bytes, 0);
      b_ref.Fill(dtype, 1, start);
      ref.Sum2(dtype, want.data(), a_ref.data(), b_ref.data(), count);
    }

    GuardedBuffer dst(bytes, off[0]);
    dst.Fill(dtype, 2, start);
    switch (alias) {
      case Alias::kNone:
        reducer.Sum2(dtype, dst.data(), a.data(), b.data(), count);
        break;
      case Alias::kDstIsA:
        dst.Fill(dtype, 0, start);
        if (use_sum) {
          reducer.Sum(dtype, dst.data(), b.data(), count);
        } else {
          reducer.Sum2(dtype, dst.data(), dst.data(), b.data(), count);
        }
        break;
      case Alias::kDstIsB:
        dst.Fill(dtype, 1, start);
        reducer.Sum2(dtype, dst.data(), a.data(), dst.data(), count);
        break;
      case Alias::kAIsB:
        reducer.Sum2(dtype, dst.data(), a.data(), a.data(), count);
        break;
    }
    EXPECT_EQ(Diff(dtype, want.data(), dst.data(), count), "");
    EXPECT_TRUE(dst.GuardsIntact());
    EXPECT_TRUE(a.GuardsIntact() && b.GuardsIntact());
  }

  void CheckDivide(Reducer& reducer, DataType dtype, size_t count, size_t offset,
                   uint64_t divisor) {
    SCOPED_TRACE(testing::Message() << DataTypeName(dtype) << " count " << count << " offset "
                                    << offset << " divisor " << divisor);
    const size_t bytes = count * DataTypeSize(dtype);
    const size_t start = (count * 5 + divisor) % 64;
    GuardedBuffer want(bytes, 0), got(bytes, offset);
    want.Fill(dtype, 0, start);
    got.Fill(dtype, 0, start);
    ScalarReducer().Divide(dtype, want.data(), count, divisor);
    reducer.Divide(dtype, got.data(), count, divisor);
    EXPECT_EQ(Diff(dtype, want.data(), got.data(), count), "");
    EXPECT_TRUE(got.GuardsIntact());
  }
};

TEST_P(CpuReducerIsaTest, ReportsItsIsa) {
  EXPECT_EQ(CpuReducer(GetParam(), 1).isa(), CpuIsaName(GetParam()));
}

TEST_P(CpuReducerIsaTest, SumMatchesScalarForEveryDtypeLengthAndAlignment) {
  CpuReducer reducer(GetParam(), 1);
  for (DataType dtype : common::kAllDataTypes) {
    for (size_t count : kLengths) {
      for (const auto& off : Offsets(count)) {
        CheckSum2(reducer, dtype, count, off, Alias::kDstIsA, /*use_sum=*/true);
        if (HasFailure()) return;
      }
    }
  }
}

TEST_P(CpuReducerIsaTest, Sum2MatchesScalarWithAndWithoutAliasing) {
  CpuReducer reducer(GetParam(), 1);
  for (DataType dtype : common::kAllDataTypes) {
    for (size_t count : kLengths) {
      for (const auto& off : Offsets(count)) {
        for (Alias alias : {Alias::kNone, Alias::kDstIsA, Alias::kDstIsB, Alias::kAIsB}) {
          // The long buffer: distinct buffers and in place are enough.
          if (count > kMaxSmall && alias != Alias::kNone && alias != Alias::kDstIsA) continue;
          CheckSum2(reducer, dtype, count, off, alias, /*use_sum=*/false);
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST_P(CpuReducerIsaTest, DivideMatchesScalar) {
  CpuReducer reducer(GetParam(), 1);
  constexpr uint64_t kDivisors[] = {
      1, 2, 3, 7, 8, 1000, 16777217, uint64_t{1} << 31, (uint64_t{1} << 40) + 1, ~uint64_t{0}};
  for (DataType dtype : common::kAllDataTypes) {
    for (size_t count : kLengths) {
      for (uint64_t divisor : kDivisors) {
        if (count > kMaxSmall && divisor != 3) continue;
        for (size_t offset : {0, 1, 4, 7}) {
          if (count > kMaxSmall && offset < 4) continue;  // Long: 4 and 7 only.
          CheckDivide(reducer, dtype, count, offset, divisor);
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST_P(CpuReducerIsaTest, ThreadsProduceTheSameBitsAsOneThread) {
  // 64 bytes per thread at least: even short buffers are split, ranges are short and many
  // boundaries fall inside the vector loops.
  CpuReducer threaded(GetParam(), 4, 64);
  ASSERT_EQ(threaded.max_threads(), 4);
  for (DataType dtype : common::kAllDataTypes) {
    for (size_t count : {size_t{65}, size_t{1000}, size_t{4099}, size_t{100003}}) {
      for (const std::array<size_t, 3>& off : {std::array<size_t, 3>{0, 0, 0}, {5, 2, 7}}) {
        CheckSum2(threaded, dtype, count, off, Alias::kDstIsA, /*use_sum=*/true);
        CheckSum2(threaded, dtype, count, off, Alias::kNone, /*use_sum=*/false);
        CheckDivide(threaded, dtype, count, off[0], 3);
        if (HasFailure()) return;
      }
    }
  }
}

TEST_P(CpuReducerIsaTest, ConcurrentCallersShareOneReducer) {
  CpuReducer reducer(GetParam(), 3, 256);
  constexpr size_t kCount = 10007;
  constexpr int kCallers = 4;
  constexpr int kRounds = 25;
  // Each caller adds its own src to its own dst kRounds times; compare with the reference.
  std::vector<std::vector<float>> dst(kCallers, std::vector<float>(kCount));
  std::vector<std::vector<float>> src(kCallers, std::vector<float>(kCount));
  for (int c = 0; c < kCallers; ++c) {
    for (size_t i = 0; i < kCount; ++i) {
      dst[c][i] = static_cast<float>(i % 97) * 0.25f;
      src[c][i] = static_cast<float>(c + 1) * 0.5f + static_cast<float>(i % 13);
    }
  }
  std::vector<std::vector<float>> want = dst;
  ScalarReducer ref;
  for (int c = 0; c < kCallers; ++c) {
    for (int r = 0; r < kRounds; ++r) {
      ref.Sum(DataType::kFloat32, want[c].data(), src[c].data(), kCount);
    }
  }
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int r = 0; r < kRounds; ++r) {
        reducer.Sum(DataType::kFloat32, dst[c].data(), src[c].data(), kCount);
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    EXPECT_EQ(std::memcmp(dst[c].data(), want[c].data(), kCount * sizeof(float)), 0)
        << "caller " << c;
  }
}

std::string IsaParamName(const testing::TestParamInfo<CpuIsa>& info) {
  return std::string(CpuIsaName(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllLevels, CpuReducerIsaTest,
                         testing::Values(CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512),
                         IsaParamName);

// Sets an environment variable for the lifetime of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_.has_value()) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(CpuReducerTest, DefaultsToTheBestIsaAndHardwareThreads) {
  ScopedEnv env("TRIBUTARY_REDUCE_ISA", "");
  CpuReducer reducer;
  EXPECT_EQ(reducer.isa(), CpuIsaName(DetectCpuIsa()));
  EXPECT_EQ(reducer.max_threads(),
            std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
}

TEST(CpuReducerTest, EnvironmentForcesALevel) {
  {
    ScopedEnv env("TRIBUTARY_REDUCE_ISA", "scalar");
    EXPECT_EQ(CpuReducer(1).isa(), "scalar");
  }
  {
    ScopedEnv env("TRIBUTARY_REDUCE_ISA", "avx2");
    EXPECT_EQ(CpuReducer(1).isa(), DetectCpuIsa() >= CpuIsa::kAvx2 ? "avx2" : "scalar");
  }
  {
    ScopedEnv env("TRIBUTARY_REDUCE_ISA", "avx512");
    EXPECT_EQ(CpuReducer(1).isa(), CpuIsaName(DetectCpuIsa()));
  }
  {
    ScopedEnv env("TRIBUTARY_REDUCE_ISA", "sse9");  // Unknown: ignored.
    EXPECT_EQ(CpuReducer(1).isa(), CpuIsaName(DetectCpuIsa()));
  }
}

}  // namespace
}  // namespace tributary::dataplane
