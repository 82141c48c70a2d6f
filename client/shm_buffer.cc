#include "client/shm_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/agent_session.h"
#include "client/cuda_export.h"
#include "common/logging.h"
#include "common/rpc/grpc_status.h"

namespace tributary::client {
namespace {

constexpr auto Log = common::ComponentLog<"client">;

// Wraps a failed syscall into a Status naming the call, the object and the reason.
absl::Status ErrnoStatus(int err, const std::string& call, const std::string& name) {
  const std::string message = absl::StrCat(call, "(", name, ") failed: ", std::strerror(err));
  switch (err) {
    case ENOSPC:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EINVAL:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

std::string NewLabel() {
  static std::atomic<uint64_t> counter{0};
  return absl::StrFormat("tributary-%d-%d", getpid(), counter.fetch_add(1));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedBuffer>> SharedBuffer::Create(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("shared buffer size must be > 0 bytes");
  const std::string name = NewLabel();
  common::UniqueFd fd(memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoStatus(errno, "memfd_create", name);
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoStatus(errno, "ftruncate", name);
  }
  // Reserve the pages now: a full tmpfs or memory cgroup then fails here with
  // RESOURCE_EXHAUSTED instead of a SIGBUS on first touch.
  if (int err = posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes)); err != 0) {
    if (err == ENOSPC || err == EFBIG || err == ENOMEM) return ErrnoStatus(err, "fallocate", name);
  }
  // The agent maps only sealed memory: its size can never change under the mapping.
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return ErrnoStatus(errno, "fcntl(F_ADD_SEALS)", name);
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (data == MAP_FAILED) return ErrnoStatus(errno, "mmap", name);
  return std::unique_ptr<SharedBuffer>(new SharedBuffer(name, data, bytes, std::move(fd)));
}

SharedBuffer::SharedBuffer(std::string name, void* data, size_t size, common::UniqueFd fd)
    : name_(std::move(name)), data_(data), size_(size), fd_(std::move(fd)) {}

SharedBuffer::SharedBuffer(std::string name, void* data, size_t size,
                           std::unique_ptr<internal::CudaExport> cuda, int device, void* stream)
    : name_(std::move(name)),
      data_(data),
      size_(size),
      cuda_(std::move(cuda)),
      cuda_device_(device),
      cuda_stream_(stream) {}

absl::Status SharedBuffer::MarkReady() const {
  if (cuda_ == nullptr) return absl::OkStatus();
  return cuda_->MarkReady(cuda_stream_);
}

void SharedBuffer::SetRegistration(std::shared_ptr<internal::AgentSession> session, uint64_t id) {
  session_ = std::move(session);
  id_ = id;
  fd_.Reset();  // the agent holds its own mapping; ours keeps the memory alive here
}

SharedBuffer::~SharedBuffer() {
  if (session_ != nullptr && id_ != 0 && session_->active()) {
    v1::UnregisterBufferRequest request;
    request.set_session_id(session_->session_id());
    request.set_buffer_id(id_);
    v1::UnregisterBufferResponse response;
    auto context = session_->NewContext();
    grpc::Status status = session_->stub().UnregisterBuffer(context.get(), request, &response);
    if (!status.ok()) {
      Log()->warn("unregistering shared buffer {} (id {}) failed: {}", name_, id_,
                  common::FromGrpcStatus(status));
    }
  }
  if (cuda_ != nullptr) return;  // the device allocation is the caller's
  if (munmap(data_, size_) != 0) {
    Log()->warn("munmap of shared buffer {} failed: {}", name_, std::strerror(errno));
  }
}

}  // namespace tributary::client
