#include "client/shm_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <string>
#include <vector>

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

void MakeShm(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, S_IRUSR | S_IWUSR);
  ASSERT_GE(fd, 0) << name << ": " << std::strerror(errno);
  close(fd);
}

TEST(SharedBufferTest, UnlinksOnlyTheBuffersOfADeadProcess) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  const std::string p = std::to_string(child);
  const std::vector<std::string> its = {"/tributary-" + p + "-0-0000aaaa",
                                        "/tributary-" + p + "-7-0000bbbb"};
  // Another pid that starts with the same digits, and another program's object.
  const std::vector<std::string> others = {"/tributary-" + p + "0-0-0000cccc",
                                           "/other-tributary-" + p + "-0-0000dddd"};
  for (const auto& n : its) ASSERT_NO_FATAL_FAILURE(MakeShm(n));
  for (const auto& n : others) ASSERT_NO_FATAL_FAILURE(MakeShm(n));
  EXPECT_EQ(UnlinkSharedBuffersOf(child), 2);
  for (const auto& n : its) EXPECT_FALSE(ShmExists(n)) << n;
  for (const auto& n : others) {
    EXPECT_TRUE(ShmExists(n)) << n;
    shm_unlink(n.c_str());
  }
  EXPECT_EQ(UnlinkSharedBuffersOf(child), 0);
}

TEST(SharedBufferTest, RejectsZeroBytes) {
  auto buffer = SharedBuffer::Create(0);
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tributary::client
