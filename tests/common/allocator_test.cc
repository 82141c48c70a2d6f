#include "common/allocator.h"

#include <gtest/gtest.h>

namespace tributary::common {
namespace {

// The test binaries keep the process's own malloc (only the daemons link jemalloc).
TEST(AllocatorNameTest, IsGlibcMallocWithoutJemalloc) {
  EXPECT_EQ(AllocatorName(), "glibc malloc");
}

}  // namespace
}  // namespace tributary::common
