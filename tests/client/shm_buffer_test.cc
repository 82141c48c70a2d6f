#include "client/shm_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <string>

#include "gtest/gtest.h"

namespace tributary::client {
namespace {

bool ShmExists(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

TEST(SharedBufferTest, CreatesMapsAndUnlinks) {
  std::string name;
  {
    auto buffer = SharedBuffer::Create(10000);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    SharedBuffer& b = **buffer;
    name = b.name();
    EXPECT_EQ(b.size(), 10000u);
    EXPECT_EQ(b.id(), 0u);  // Not registered with an agent.
    EXPECT_EQ(name.rfind("/tributary-" + std::to_string(getpid()) + "-", 0), 0u) << name;
    ASSERT_TRUE(ShmExists(name));

    // The object has the size, and what we write is visible through a second mapping.
    int fd = shm_open(name.c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    struct stat st;
    ASSERT_EQ(fstat(fd, &st), 0);
    EXPECT_EQ(st.st_size, 10000);
    void* other = mmap(nullptr, 10000, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    ASSERT_NE(other, MAP_FAILED);

    auto floats = b.as<float>();
    ASSERT_EQ(floats.size(), 2500u);
    for (size_t i = 0; i < floats.size(); ++i) floats[i] = static_cast<float>(i) * 0.5f;
    const float* seen = static_cast<const float*>(other);
    EXPECT_EQ(seen[0], 0.0f);
    EXPECT_EQ(seen[2499], 1249.5f);
    // And the other way round.
    static_cast<char*>(other)[9999] = 42;
    EXPECT_EQ(b.as<char>()[9999], 42);
    EXPECT_EQ(b.as<double>().size(), 1250u);
    munmap(other, 10000);
  }
  EXPECT_FALSE(ShmExists(name)) << name << " still exists after the buffer was destroyed";
}

TEST(SharedBufferTest, StartsZeroedAndNamesAreUnique) {
  std::set<std::string> names;
  std::vector<std::unique_ptr<SharedBuffer>> buffers;
  for (int i = 0; i < 8; ++i) {
    auto buffer = SharedBuffer::Create(4096);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    for (char c : (*buffer)->as<char>()) ASSERT_EQ(c, 0);
    names.insert((*buffer)->name());
    buffers.push_back(std::move(*buffer));
  }
  EXPECT_EQ(names.size(), 8u);
}

TEST(SharedBufferTest, RejectsZeroBytes) {
  auto buffer = SharedBuffer::Create(0);
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tributary::client
