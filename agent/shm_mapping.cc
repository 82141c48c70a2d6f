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
  if (data_ != nullptr) munmap(data_, size_);
}

absl::Status CheckSharedMemoryRequest(const std::string& name, uint64_t size_bytes) {
  if (name.size() < 2 || name.size() > 255 || name[0] != '/' ||
      name.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm_name '", name, "' must be '/' followed by up to 254 characters without '/'"));
  }
  if (size_bytes == 0 || size_bytes > kMaxTensorBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer '", name, "': size_bytes ", size_bytes, " is not in [1, 1 TiB]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SharedMemoryMapping>> MapSharedMemory(const std::string& name,
                                                                     uint64_t size_bytes) {
  RETURN_IF_ERROR(CheckSharedMemoryRequest(name, size_bytes));
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("shm_open('", name, "') failed: ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < size_bytes) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("shared memory '", name, "' has ", st.st_size,
                                                   " bytes, fewer than the ", size_bytes,
                                                   " declared"));
  }
  void* data = mmap(nullptr, size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (data == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of '", name, "' failed: ", std::strerror(errno)));
  }
  return std::make_shared<SharedMemoryMapping>(name, static_cast<std::byte*>(data), size_bytes);
}

}  // namespace tributary::agent
