// The project's one byte-size parser (common/byte_size.h), used by the CLI and the suite's peers.
#include "common/byte_size.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tributary::common {
namespace {

TEST(ByteSizeTest, ParsesEveryUnitAsPowersOf1024) {
  EXPECT_EQ(ParseByteSize("0"), 0u);
  EXPECT_EQ(ParseByteSize("4096"), 4096u);
  EXPECT_EQ(ParseByteSize("7b"), 7u);
  EXPECT_EQ(ParseByteSize("4K"), 4096u);
  EXPECT_EQ(ParseByteSize("4kb"), 4096u);
  EXPECT_EQ(ParseByteSize("4KiB"), 4096u);
  EXPECT_EQ(ParseByteSize("16MiB"), 16u << 20);
  EXPECT_EQ(ParseByteSize("3 G"), 3ull << 30);
  EXPECT_EQ(ParseByteSize("\t2tb\n"), 2ull << 40);
}

TEST(ByteSizeTest, OverflowIsAnErrorAtTheExactBoundary) {
  EXPECT_EQ(ParseByteSize("18446744073709551615"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(ParseByteSize("18446744073709551616"), std::nullopt);
  EXPECT_EQ(ParseByteSize("16777215T"), 16777215ull << 40);
  EXPECT_EQ(ParseByteSize("16777216T"), std::nullopt);  // 2^64.
}

TEST(ByteSizeTest, ErrorsSayWhatWasWrong) {
  std::string error;
  EXPECT_EQ(ParseByteSize("4.5M", &error), std::nullopt);
  EXPECT_EQ(error, "invalid size '4.5M': unknown unit; use B, K, M, G or T (powers of 1024)");
  EXPECT_EQ(ParseByteSize("K", &error), std::nullopt);
  EXPECT_EQ(error, "invalid size 'K': expected a number such as 4096, 4K, 64M or 1G");
  EXPECT_EQ(ParseByteSize("99999999999999999999", &error), std::nullopt);
  EXPECT_EQ(error, "invalid size '99999999999999999999': too large");
  EXPECT_EQ(ParseByteSize("-1"), std::nullopt);  // No error string wanted: still nullopt.
}

TEST(ByteSizeTest, ListsExpandRangesInOrder) {
  EXPECT_EQ(ParseByteSizeList("4K:16K,1,2M:2M"),
            (std::vector<uint64_t>{4096, 8192, 16384, 1, 2 << 20}));
  // A range whose doubling would pass 2^64 stops at the last size that fits.
  const auto top = ParseByteSizeList("8192T:18446744073709551615");
  ASSERT_TRUE(top.has_value());
  EXPECT_EQ(*top, (std::vector<uint64_t>{1ull << 53, 1ull << 54, 1ull << 55, 1ull << 56, 1ull << 57,
                                         1ull << 58, 1ull << 59, 1ull << 60, 1ull << 61, 1ull << 62,
                                         1ull << 63}));
}

TEST(ByteSizeTest, BadListsSayWhichItem) {
  std::string error;
  EXPECT_EQ(ParseByteSizeList("1K,,2K", &error), std::nullopt);
  EXPECT_EQ(error, "invalid size '1K,,2K': empty item in the list");
  EXPECT_EQ(ParseByteSizeList("1K, 0", &error), std::nullopt);
  EXPECT_EQ(error, "invalid size '0': sizes must be > 0");
  EXPECT_EQ(ParseByteSizeList("64M:4K", &error), std::nullopt);
  EXPECT_EQ(error, "invalid size '64M:4K': a range MIN:MAX needs MIN <= MAX");
  EXPECT_EQ(ParseByteSizeList("0:4K", &error), std::nullopt);
  EXPECT_EQ(error, "invalid size '0:4K': a range must start above 0");
  EXPECT_EQ(ParseByteSizeList("1K:4Q", &error), std::nullopt);
  EXPECT_EQ(error, "invalid size '4Q': unknown unit; use B, K, M, G or T (powers of 1024)");
}

}  // namespace
}  // namespace tributary::common
