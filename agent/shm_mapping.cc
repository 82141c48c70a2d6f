#include "agent/shm_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tributary::agent {

SharedMemoryMapping::~SharedMemoryMapping() {
  if (data_ != nullptr && mirror_ == nullptr) munmap(data_, size_);
}

absl::Status CheckBufferSize(uint64_t size_bytes) {
  if (size_bytes == 0 || size_bytes > kMaxTensorBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer size ", size_bytes, " bytes is not in [1, 1 TiB]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SharedMemoryMapping>> MapSealedMemory(int fd, uint64_t size_bytes,
                                                                     const std::string& what) {
  RETURN_IF_ERROR(CheckBufferSize(size_bytes));
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the descriptor is not a sealable memfd (", std::strerror(errno),
                     "); create it with memfd_create(MFD_ALLOW_SEALING)"));
  }
  if ((seals & F_SEAL_SHRINK) == 0 || (seals & F_SEAL_GROW) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the memfd must be sealed with F_SEAL_SHRINK and F_SEAL_GROW"));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) < size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the memfd holds ", st.st_size,
                                                   " bytes, fewer than the ", size_bytes,
                                                   " declared"));
  }
  void* data = mmap(nullptr, size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of ", what, " failed: ", std::strerror(errno)));
  }
  return std::make_shared<SharedMemoryMapping>(what, static_cast<std::byte*>(data), size_bytes);
}

}  // namespace tributary::agent
