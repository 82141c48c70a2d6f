#include "client/shm_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tributary::client {
namespace {

TEST(SharedBufferTest, CreatesASealedMemfdThatNobodyCanNameOrShrink) {
  auto buffer = SharedBuffer::Create(10000);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  SharedBuffer& b = **buffer;
  EXPECT_EQ(b.size(), 10000u);
  EXPECT_EQ(b.id(), 0u);  // Not registered with an agent.
  EXPECT_EQ(b.name().rfind("tributary-" + std::to_string(getpid()) + "-", 0), 0u) << b.name();
  ASSERT_GE(b.fd(), 0);

  // Its size is sealed: the agent's mapping can never lose pages under it (no SIGBUS).
  const int seals = fcntl(b.fd(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_NE(ftruncate(b.fd(), 100), 0);
  EXPECT_EQ(errno, EPERM);
  struct stat st {};
  ASSERT_EQ(fstat(b.fd(), &st), 0);
  EXPECT_EQ(st.st_size, 10000);
  // Nothing in /dev/shm: no other process can open it by name.
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    EXPECT_EQ(entry.path().filename().string().find(b.name()), std::string::npos);
  }

  // What we write is visible through a second mapping of the memfd (as the agent's), and back.
  void* other = mmap(nullptr, 10000, PROT_READ | PROT_WRITE, MAP_SHARED, b.fd(), 0);
  ASSERT_NE(other, MAP_FAILED);
  auto floats = b.as<float>();
  ASSERT_EQ(floats.size(), 2500u);
  for (size_t i = 0; i < floats.size(); ++i) floats[i] = static_cast<float>(i) * 0.5f;
  const float* seen = static_cast<const float*>(other);
  EXPECT_EQ(seen[0], 0.0f);
  EXPECT_EQ(seen[2499], 1249.5f);
  static_cast<char*>(other)[9999] = 42;
  EXPECT_EQ(b.as<char>()[9999], 42);
  EXPECT_EQ(b.as<double>().size(), 1250u);
  munmap(other, 10000);
}

TEST(SharedBufferTest, StartsZeroedAndLabelsAreUnique) {
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
