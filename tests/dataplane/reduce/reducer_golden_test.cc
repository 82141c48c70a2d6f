// Exact expected results for every Reducer implementation: rounding, specials, wraparound and
// truncating division, independent of the reference implementation.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "dataplane/reduce/cpu/cpu_reducer.h"
#include "dataplane/reduce/cpu/scalar_reducer.h"
#include "gtest/gtest.h"

namespace tributary::dataplane {
namespace {

using common::DataType;

constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr double kInfD = std::numeric_limits<double>::infinity();

float F(uint32_t bits) { return std::bit_cast<float>(bits); }
double D(uint64_t bits) { return std::bit_cast<double>(bits); }

enum class Impl { kScalarReducer, kCpuScalar, kCpuAvx2, kCpuAvx512 };

std::string ImplName(Impl impl) {
  switch (impl) {
    case Impl::kScalarReducer:
      return "ScalarReducer";
    case Impl::kCpuScalar:
      return "CpuScalar";
    case Impl::kCpuAvx2:
      return "CpuAvx2";
    case Impl::kCpuAvx512:
      return "CpuAvx512";
  }
  return "Unknown";
}

void PrintTo(Impl impl, std::ostream* os) { *os << ImplName(impl); }

class ReducerGoldenTest : public testing::TestWithParam<Impl> {
 protected:
  void SetUp() override {
    switch (GetParam()) {
      case Impl::kScalarReducer:
        reducer_ = std::make_unique<ScalarReducer>();
        return;
      case Impl::kCpuScalar:
        return MakeCpu(CpuIsa::kScalar);
      case Impl::kCpuAvx2:
        return MakeCpu(CpuIsa::kAvx2);
      case Impl::kCpuAvx512:
        return MakeCpu(CpuIsa::kAvx512);
    }
  }

  void MakeCpu(CpuIsa isa) {
    if (isa > DetectCpuIsa()) GTEST_SKIP() << CpuIsaName(isa) << " not supported here";
    reducer_ = std::make_unique<CpuReducer>(isa, 1);
  }

  // a[i] + b[i] through Sum (in place); also checks that Sum2 agrees.
  template <typename T>
  std::vector<T> Add(DataType dtype, std::vector<T> a, const std::vector<T>& b) {
    std::vector<T> sum2(a.size());
    reducer_->Sum2(dtype, sum2.data(), a.data(), b.data(), a.size());
    reducer_->Sum(dtype, a.data(), b.data(), a.size());
    EXPECT_EQ(std::memcmp(sum2.data(), a.data(), a.size() * sizeof(T)), 0) << "Sum2 != Sum";
    return a;
  }

  template <typename T>
  std::vector<T> Div(DataType dtype, std::vector<T> x, uint64_t divisor) {
    reducer_->Divide(dtype, x.data(), x.size(), divisor);
    return x;
  }

  template <typename T, typename U>
  static std::vector<U> BitsOf(const std::vector<T>& v) {
    std::vector<U> out;
    for (T x : v) out.push_back(std::bit_cast<U>(x));
    return out;
  }

  std::unique_ptr<Reducer> reducer_;
};

using u16 = std::vector<uint16_t>;

TEST_P(ReducerGoldenTest, Float32) {
  const std::vector<float> a = {1.0f, 2.5f,          -3.0f,         0.1f,    -0.0f, -0.0f,
                                F(1), F(1),          F(0x807FFFFF), 3.4e38f, kInfF, kInfF,
                                1.0f, F(0x7FA00001), F(0xFFC00123), 1e-30f};
  const std::vector<float> b = {2.0f,          0.5f,          3.0f,          0.2f,    -0.0f, 0.0f,
                                F(1),          F(0x80000001), F(0x00000001), 3.4e38f, 1.0f,  -kInfF,
                                F(0x7FC00000), 1.0f,          1.0f,          1.0f};
  const std::vector<uint32_t> want = {std::bit_cast<uint32_t>(3.0f),
                                      std::bit_cast<uint32_t>(3.0f),
                                      0x00000000u,
                                      std::bit_cast<uint32_t>(0.1f + 0.2f),
                                      0x80000000u,  // -0 + -0 = -0.
                                      0x00000000u,  // -0 + 0 = +0.
                                      0x00000002u,  // Subnormals add exactly.
                                      0x00000000u,
                                      0x807FFFFEu,
                                      0x7F800000u,  // Overflow -> Inf.
                                      0x7F800000u,
                                      0x7FC00000u,  // Inf - Inf -> canonical NaN.
                                      0x7FC00000u,
                                      0x7FC00000u,
                                      0x7FC00000u,  // Any NaN -> canonical NaN.
                                      std::bit_cast<uint32_t>(1.0f)};
  EXPECT_EQ((BitsOf<float, uint32_t>(Add(DataType::kFloat32, a, b))), want);
}

TEST_P(ReducerGoldenTest, Float64) {
  const std::vector<double> a = {1.0, 0.1, -0.0, D(1), 1.7e308, kInfD, 1.0, D(0xFFF0000000000001)};
  const std::vector<double> b = {2.0, 0.2, -0.0, D(1), 1.7e308, -kInfD, D(0x7FF8000000000001), 1};
  const std::vector<uint64_t> want = {
      std::bit_cast<uint64_t>(3.0), std::bit_cast<uint64_t>(0.1 + 0.2),
      0x8000000000000000u,          2u,
      0x7FF0000000000000u,          0x7FF8000000000000u,
      0x7FF8000000000000u,          0x7FF8000000000000u};
  EXPECT_EQ((BitsOf<double, uint64_t>(Add(DataType::kFloat64, a, b))), want);
}

TEST_P(ReducerGoldenTest, Float16RoundsOnceToNearestEven) {
  const u16 a = {0x3C00, 0x3C00, 0x3C00, 0x3C01, 0x7BFF, 0x7BFF, 0x0001, 0x03FF,
                 0x8000, 0x8000, 0x7C00, 0x7C00, 0x7D00, 0xFE01, 0xC000, 0x0200};
  const u16 b = {0x3C00, 0x1000, 0x1200, 0x1000, 0x4C00, 0x4800, 0x0001, 0x0001,
                 0x8000, 0x0000, 0x3C00, 0xFC00, 0x3C00, 0x0000, 0x4000, 0x8001};
  const u16 want = {
      0x4000,  // 1 + 1 = 2.
      0x3C00,  // 1 + 2^-11: tie -> even (1).
      0x3C01,  // 1 + 3 * 2^-12: 0.75 ulp -> up.
      0x3C02,  // (1 + 2^-10) + 2^-11: tie -> even.
      0x7C00,  // 65504 + 16 = 65520: tie -> even (Inf).
      0x7BFF,  // 65504 + 8 -> 65504.
      0x0002,  // Subnormals add exactly.
      0x0400,  // Largest subnormal + smallest -> smallest normal.
      0x8000,  // -0 + -0 = -0.
      0x0000,  // -0 + 0 = +0.
      0x7C00,  // Inf + 1 = Inf.
      0x7E00,  // Inf - Inf -> canonical NaN.
      0x7E00,  // Signalling NaN -> canonical NaN.
      0x7E00,  // Negative NaN with payload -> canonical NaN.
      0x0000,  // -2 + 2 = +0.
      0x01FF,  // Subnormal difference.
  };
  EXPECT_EQ(Add(DataType::kFloat16, a, b), want);
}

TEST_P(ReducerGoldenTest, BFloat16RoundsOnceToNearestEven) {
  const u16 a = {0x3F80, 0x3F80, 0x3F80, 0x3F81, 0x7F7F, 0x7F7F, 0x7F7F,
                 0x0001, 0x8000, 0x7F80, 0xFFC1, 0xFF80, 0x4049, 0x0080};
  const u16 b = {0x3F80, 0x3B80, 0x3BC0, 0x3B80, 0x7F7F, 0x7B00, 0x7A80,
                 0x0001, 0x8000, 0xFF80, 0x3F80, 0xBF80, 0xC049, 0x8001};
  const u16 want = {
      0x4000,  // 1 + 1 = 2.
      0x3F80,  // 1 + 2^-8: tie -> even (1).
      0x3F81,  // 1 + 3 * 2^-9: 0.75 ulp -> up.
      0x3F82,  // (1 + 2^-7) + 2^-8: tie -> even.
      0x7F80,  // max + max -> Inf.
      0x7F80,  // max + half ulp: tie -> even (Inf).
      0x7F7F,  // max + quarter ulp -> max.
      0x0002,  // Subnormals are not flushed.
      0x8000,  // -0 + -0 = -0.
      0x7FC0,  // Inf - Inf -> canonical NaN.
      0x7FC0,  // Negative NaN -> canonical NaN.
      0xFF80,  // -Inf - 1 = -Inf.
      0x0000,  // x - x = +0.
      0x007F,  // Smallest normal - smallest subnormal.
  };
  EXPECT_EQ(Add(DataType::kBFloat16, a, b), want);
}

TEST_P(ReducerGoldenTest, IntegersWrapAround) {
  constexpr int32_t kMax32 = std::numeric_limits<int32_t>::max();
  constexpr int32_t kMin32 = std::numeric_limits<int32_t>::min();
  EXPECT_EQ(
      Add<int32_t>(DataType::kInt32, {kMax32, kMin32, -1, 5, kMin32}, {1, -1, -1, -7, kMin32}),
      (std::vector<int32_t>{kMin32, kMax32, -2, -2, 0}));
  constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(Add<int64_t>(DataType::kInt64, {kMax64, kMin64, -1, int64_t{1} << 40, kMin64},
                         {1, -1, -1, -(int64_t{1} << 41), kMin64}),
            (std::vector<int64_t>{kMin64, kMax64, -2, -(int64_t{1} << 40), 0}));
}

TEST_P(ReducerGoldenTest, DivideFloats) {
  const std::vector<float> f = {1.0f, -7.0f, 6.0f, -0.0f, kInfF, F(0x7FC00001), 3.0f, F(2)};
  const std::vector<uint32_t> f_want = {std::bit_cast<uint32_t>(1.0f / 3.0f),
                                        std::bit_cast<uint32_t>(-7.0f / 3.0f),
                                        std::bit_cast<uint32_t>(2.0f),
                                        0x80000000u,
                                        0x7F800000u,
                                        0x7FC00000u,
                                        std::bit_cast<uint32_t>(1.0f),
                                        1u};  // 2 * 2^-149 / 3 rounds to 2^-149.
  EXPECT_EQ((BitsOf<float, uint32_t>(Div(DataType::kFloat32, f, 3))), f_want);
  const std::vector<double> d = {1.0, -7.0, kInfD, D(0xFFF8000000000000)};
  const std::vector<uint64_t> d_want = {std::bit_cast<uint64_t>(1.0 / 3.0),
                                        std::bit_cast<uint64_t>(-7.0 / 3.0), 0x7FF0000000000000u,
                                        0x7FF8000000000000u};
  EXPECT_EQ((BitsOf<double, uint64_t>(Div(DataType::kFloat64, d, 3))), d_want);
  // float16: 1/3 in float32 rounded once; 3/2 = 1.5; the smallest subnormal / 2 ties to 0.
  EXPECT_EQ(Div<uint16_t>(DataType::kFloat16, {0x3C00, 0x4200, 0x0001, 0x0003, 0x7C01}, 2),
            (u16{0x3800, 0x3E00, 0x0000, 0x0002, 0x7E00}));
  EXPECT_EQ(Div<uint16_t>(DataType::kFloat16, {0x3C00, 0xBC00}, 3), (u16{0x3555, 0xB555}));
  EXPECT_EQ(Div<uint16_t>(DataType::kBFloat16, {0x3F80, 0xBF80, 0x4040, 0xFF81}, 3),
            (u16{0x3EAB, 0xBEAB, 0x3F80, 0x7FC0}));
  // Divisors beyond 2^24 are rounded to float32 first (dividing "in float32").
  EXPECT_EQ(Div<float>(DataType::kFloat32, {16777217.0f}, 16777217), std::vector<float>{1.0f});
}

TEST_P(ReducerGoldenTest, DivideIntegersTruncatesTowardZero) {
  constexpr int32_t kMax32 = std::numeric_limits<int32_t>::max();
  constexpr int32_t kMin32 = std::numeric_limits<int32_t>::min();
  const std::vector<int32_t> i32 = {7, -7, 6, -6, kMin32, kMax32, 0, -1, 1};
  EXPECT_EQ(Div(DataType::kInt32, i32, 2),
            (std::vector<int32_t>{3, -3, 3, -3, -1073741824, 1073741823, 0, 0, 0}));
  EXPECT_EQ(Div(DataType::kInt32, i32, 3),
            (std::vector<int32_t>{2, -2, 2, -2, -715827882, 715827882, 0, 0, 0}));
  EXPECT_EQ(Div(DataType::kInt32, i32, 1), i32);
  EXPECT_EQ(Div(DataType::kInt32, i32, uint64_t{1} << 31),
            (std::vector<int32_t>{0, 0, 0, 0, -1, 0, 0, 0, 0}));
  EXPECT_EQ(Div(DataType::kInt32, i32, std::numeric_limits<uint64_t>::max()),
            (std::vector<int32_t>(i32.size(), 0)));

  constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
  const std::vector<int64_t> i64 = {9, -9, kMin64, kMax64, -1};
  EXPECT_EQ(Div(DataType::kInt64, i64, 4),
            (std::vector<int64_t>{2, -2, kMin64 / 4, kMax64 / 4, 0}));
  EXPECT_EQ(Div(DataType::kInt64, i64, 1), i64);
  EXPECT_EQ(Div(DataType::kInt64, i64, uint64_t{1} << 63), (std::vector<int64_t>{0, 0, -1, 0, 0}));
  EXPECT_EQ(Div(DataType::kInt64, i64, std::numeric_limits<uint64_t>::max()),
            (std::vector<int64_t>(i64.size(), 0)));
}

TEST_P(ReducerGoldenTest, EmptyBuffersAreNoOps) {
  for (DataType t : common::kAllDataTypes) {
    reducer_->Sum(t, nullptr, nullptr, 0);
    reducer_->Sum2(t, nullptr, nullptr, nullptr, 0);
    reducer_->Divide(t, nullptr, 0, 3);
  }
}

INSTANTIATE_TEST_SUITE_P(AllImplementations, ReducerGoldenTest,
                         testing::Values(Impl::kScalarReducer, Impl::kCpuScalar, Impl::kCpuAvx2,
                                         Impl::kCpuAvx512),
                         [](const testing::TestParamInfo<Impl>& info) {
                           return ImplName(info.param);
                         });

}  // namespace
}  // namespace tributary::dataplane
