// A training process's POSIX shared-memory object mapped into the agent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tributary::agent {

// The largest buffer or tensor the agent accepts: 1 TiB.
inline constexpr uint64_t kMaxTensorBytes = uint64_t{1} << 40;

// One mapping, read-write and shared with its creator. Unmapped when the last owner (the
// session that registered it, or an operation still using it) lets go. Immutable once made.
class SharedMemoryMapping {
 public:
  SharedMemoryMapping(std::string name, std::byte* data, uint64_t size)
      : name_(std::move(name)), data_(data), size_(size) {}
  SharedMemoryMapping(const SharedMemoryMapping&) = delete;
  SharedMemoryMapping& operator=(const SharedMemoryMapping&) = delete;
  ~SharedMemoryMapping();

  const std::string& name() const { return name_; }
  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  const std::string name_;
  std::byte* const data_;
  const uint64_t size_;
};

// INVALID_ARGUMENT unless `name` is '/' followed by 1 to 254 characters without '/' and
// `size_bytes` is in [1, 1 TiB].
absl::Status CheckSharedMemoryRequest(const std::string& name, uint64_t size_bytes);

// Maps the first `size_bytes` of the existing object `name` (checked as above). NOT_FOUND when
// it does not exist, INVALID_ARGUMENT when it is smaller than `size_bytes`, RESOURCE_EXHAUSTED
// when mmap fails. System calls: call it with no lock held.
absl::StatusOr<std::shared_ptr<SharedMemoryMapping>> MapSharedMemory(const std::string& name,
                                                                     uint64_t size_bytes);

}  // namespace tributary::agent
