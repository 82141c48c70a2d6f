#include "client/shm_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/agent_session.h"
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

constexpr char kNamePrefix[] = "tributary-";

std::string NewName() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937 rng(std::random_device{}());
  return absl::StrFormat("/%s%d-%d-%08x", kNamePrefix, getpid(), counter.fetch_add(1),
                         static_cast<uint32_t>(rng()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedBuffer>> SharedBuffer::Create(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("shared buffer size must be > 0 bytes");
  std::string name;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    name = NewName();
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, S_IRUSR | S_IWUSR);
    if (fd < 0 && errno != EEXIST) return ErrnoStatus(errno, "shm_open", name);
  }
  if (fd < 0) return ErrnoStatus(EEXIST, "shm_open", name);

  auto fail = [&](const char* call) {
    const int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    return ErrnoStatus(err, call, name);
  };
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail("ftruncate");
  // Reserve the pages now: a full /dev/shm then fails here with RESOURCE_EXHAUSTED instead of
  // a SIGBUS on first touch. Filesystems without fallocate support just skip it.
  if (int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    if (err == ENOSPC || err == EFBIG) {
      errno = err;
      return fail("posix_fallocate");
    }
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return fail("mmap");
  close(fd);  // The mapping keeps the object alive.
  return std::unique_ptr<SharedBuffer>(new SharedBuffer(std::move(name), data, bytes));
}

SharedBuffer::SharedBuffer(std::string name, void* data, size_t size)
    : name_(std::move(name)), data_(data), size_(size) {}

void SharedBuffer::SetRegistration(std::shared_ptr<internal::AgentSession> session, uint64_t id) {
  session_ = std::move(session);
  id_ = id;
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
  if (munmap(data_, size_) != 0) {
    Log()->warn("munmap of shared buffer {} failed: {}", name_, std::strerror(errno));
  }
  if (shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
    Log()->warn("shm_unlink({}) failed: {}", name_, std::strerror(errno));
  }
}

int UnlinkSharedBuffersOf(int pid) {
  const std::string prefix = absl::StrCat(kNamePrefix, pid, "-");
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace tributary::client
