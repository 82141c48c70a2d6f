// Built only with TRIBUTARY_HAVE_JEMALLOC, linked as the daemons are (tests/CMakeLists.txt).
#include <gtest/gtest.h>
#include <jemalloc/jemalloc.h>

#include <cstdlib>
#include <string>

#include "common/allocator.h"

namespace tributary::common {
namespace {

TEST(AllocatorNameTest, NamesJemallocAndItsVersionWhenLinked) {
  const std::string name = AllocatorName();
  ASSERT_EQ(name.rfind("jemalloc ", 0), 0u) << name;
  EXPECT_GT(name.size(), std::string("jemalloc ").size()) << name;
}

TEST(AllocatorNameTest, MallocIsServedByJemalloc) {
  // jemalloc's own counter of the bytes it handed out moves with a malloc of this process.
  uint64_t epoch = 1;
  size_t length = sizeof(epoch);
  ASSERT_EQ(mallctl("epoch", &epoch, &length, &epoch, sizeof(epoch)), 0);
  size_t before = 0;
  length = sizeof(before);
  ASSERT_EQ(mallctl("stats.allocated", &before, &length, nullptr, 0), 0);
  void* volatile block = std::malloc(64 << 20);
  ASSERT_NE(block, nullptr);
  ASSERT_EQ(mallctl("epoch", &epoch, &length, &epoch, sizeof(epoch)), 0);
  size_t after = 0;
  length = sizeof(after);
  ASSERT_EQ(mallctl("stats.allocated", &after, &length, nullptr, 0), 0);
  std::free(block);
  EXPECT_GE(after, before + (64 << 20));
}

}  // namespace
}  // namespace tributary::common
