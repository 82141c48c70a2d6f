// Shared memory that a test creates as a training process would: a memfd, sized, its size sealed,
// mapped into the test too, and registered with the agent the way the buffer socket does.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "agent/local_service.h"
#include "common/unix_fd.h"
#include "gtest/gtest.h"

namespace tributary::agent::testing {

// A sealed memfd of `size` bytes (unsealed when `seal` is false, to test the refusal), mapped
// into the test. Unmapped and closed in the destructor, which also runs when an ASSERT fails.
class ScopedShm {
 public:
  explicit ScopedShm(size_t size, bool seal = true) : size_(size) {
    static std::atomic<int> next{0};
    name_ = "tributary-agent-test-" + std::to_string(next++);
    fd_ = common::UniqueFd(memfd_create(name_.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
    EXPECT_TRUE(fd_.valid()) << name_;
    if (!fd_.valid()) return;
    EXPECT_EQ(ftruncate(fd_.get(), static_cast<off_t>(size)), 0);
    if (seal) EXPECT_EQ(fcntl(fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
    EXPECT_NE(data, MAP_FAILED);
    if (data != MAP_FAILED) data_ = static_cast<std::byte*>(data);
  }
  ScopedShm(const ScopedShm&) = delete;
  ScopedShm& operator=(const ScopedShm&) = delete;
  ~ScopedShm() {
    if (data_ != nullptr) munmap(data_, size_);
  }

  const std::string& name() const { return name_; }
  size_t size() const { return size_; }
  int fd() const { return fd_.get(); }
  // A duplicate of the memfd, as the buffer socket hands the agent one.
  common::UniqueFd Dup() const { return common::UniqueFd(fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0)); }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }

 private:
  std::string name_;
  size_t size_;
  common::UniqueFd fd_;
  std::byte* data_ = nullptr;
};

// This process's credentials, as SO_PEERCRED reports them.
inline common::PeerCredentials Self() { return {getpid(), getuid(), getgid()}; }

// Registers `shm` (its first `size` bytes; all of it by default) with `session`, as the buffer
// socket does for a process of this uid.
inline absl::StatusOr<uint64_t> RegisterShm(LocalService& service, const std::string& session,
                                            const ScopedShm& shm, uint64_t size = 0) {
  return service.RegisterBuffer(Self(), session, size == 0 ? shm.size() : size, shm.Dup());
}

}  // namespace tributary::agent::testing
