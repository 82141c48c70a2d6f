// POSIX shared-memory objects that a test creates, as a training process would, and that are
// unlinked when the test ends however it ends.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tributary::agent::testing {

// Every object this binary creates starts with this prefix (and the process id).
inline std::string ShmPrefix() { return "tributary-agent-test-" + std::to_string(getpid()) + "-"; }

// Names in /dev/shm left by this process (none once every ScopedShm is gone).
inline std::vector<std::string> LeftoverShm() {
  std::vector<std::string> out;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return out;
  const std::string prefix = ShmPrefix();
  while (dirent* e = readdir(dir)) {
    if (std::string(e->d_name).rfind(prefix, 0) == 0) out.push_back(e->d_name);
  }
  closedir(dir);
  return out;
}

// A shared-memory object of `size` bytes, mapped into the test too. Unlinked and unmapped in
// the destructor, which also runs when an ASSERT fails.
class ScopedShm {
 public:
  explicit ScopedShm(size_t size) : size_(size) {
    static std::atomic<int> next{0};
    name_ = "/" + ShmPrefix() + std::to_string(next++);
    const int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0) << name_;
    if (fd < 0) return;
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    EXPECT_NE(data, MAP_FAILED);
    if (data != MAP_FAILED) data_ = static_cast<std::byte*>(data);
  }
  ScopedShm(const ScopedShm&) = delete;
  ScopedShm& operator=(const ScopedShm&) = delete;
  ~ScopedShm() {
    if (data_ != nullptr) munmap(data_, size_);
    shm_unlink(name_.c_str());
  }

  const std::string& name() const { return name_; }
  size_t size() const { return size_; }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }

 private:
  std::string name_;
  size_t size_;
  std::byte* data_ = nullptr;
};

}  // namespace tributary::agent::testing
