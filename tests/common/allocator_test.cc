#include "common/allocator.h"

#include <gtest/gtest.h>

namespace tributary::common {
namespace {

// The test binaries keep the process's own malloc (only the daemons link jemalloc).
TEST(AllocatorNameTest, IsTheSystemMallocWithoutJemalloc) {
  EXPECT_EQ(AllocatorName(), "system malloc");
}

}  // namespace
}  // namespace tributary::common
