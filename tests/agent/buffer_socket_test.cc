// The agent's buffer socket over a real Unix socket: memfds in, ids out; every malformed or
// unauthorised request is refused with a status the client can act on and the socket keeps
// serving; a registration whose answer cannot be sent (the client gave up) is undone; socket
// paths are claimed without ever deleting what is not ours.
#include "agent/buffer_socket.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "common/buffer_socket_protocol.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tributary::agent {
namespace {

namespace protocol = common::buffer_socket;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  static std::atomic<int> next{0};
  return (std::filesystem::temp_directory_path() /
          ("trib-bs-" + std::to_string(getpid()) + "-" + std::to_string(next++) + "-" + name))
      .string();
}

common::UniqueFd Connect(const std::string& path) {
  common::UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return common::UniqueFd();
  }
  return fd;
}

common::UniqueFd SealedMemfd(size_t size) {
  common::UniqueFd fd(memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_EQ(ftruncate(fd.get(), static_cast<off_t>(size)), 0);
  EXPECT_EQ(fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  return fd;
}

// Sends raw bytes (and optionally a descriptor) and reads the response; code -1 when the agent
// answered nothing (closed).
protocol::Response Exchange(int socket, std::span<const std::byte> bytes, int fd) {
  protocol::Response response;
  response.code = -1;
  if (!common::SendWithFd(socket, bytes, fd).ok()) return response;
  if (!common::ReceiveWithFd(socket, {reinterpret_cast<std::byte*>(&response), sizeof(response)},
                             nullptr, std::chrono::milliseconds(5000))
           .ok()) {
    response.code = -1;
  }
  return response;
}

protocol::Response Request(int socket, const std::string& session, uint64_t size, int fd) {
  protocol::Request request;
  std::strncpy(request.session_id, session.c_str(), sizeof(request.session_id) - 1);
  request.size_bytes = size;
  return Exchange(socket, {reinterpret_cast<const std::byte*>(&request), sizeof(request)}, fd);
}

struct Recorded {
  std::string session;
  uint64_t size = 0;
  uid_t uid = 0;
};

class BufferSocketTest : public ::testing::Test {
 protected:
  void Start(SocketAccess access = {}) {
    auto server = BufferSocketServer::Start(
        path_, access,
        [this](const common::PeerCredentials& peer, const std::string& session, uint64_t size,
               common::UniqueFd fd) -> absl::StatusOr<uint64_t> {
          if (session == "refuse") return absl::NotFoundError("session 'refuse' not found");
          struct stat st {};
          EXPECT_EQ(fstat(fd.get(), &st), 0);
          std::lock_guard lock(mu_);
          recorded_.push_back({session, size, peer.uid});
          return recorded_.size();
        });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override {
    if (server_) server_->Stop();
    std::filesystem::remove(path_);
  }

  std::string path_ = TempPath("buffers");
  std::unique_ptr<BufferSocketServer> server_;
  std::mutex mu_;
  std::vector<Recorded> recorded_;
};

TEST_F(BufferSocketTest, RegistersMemfdsAndAnswersWithTheirIds) {
  Start();
  common::UniqueFd client = Connect(path_);
  ASSERT_TRUE(client.valid());
  for (uint64_t i = 1; i <= 3; ++i) {
    common::UniqueFd memfd = SealedMemfd(4096);
    protocol::Response r = Request(client.get(), "s1", 4096 * i, memfd.get());
    EXPECT_EQ(r.code, 0) << r.message;
    EXPECT_EQ(r.buffer_id, i);
  }
  std::lock_guard lock(mu_);
  ASSERT_EQ(recorded_.size(), 3u);
  EXPECT_EQ(recorded_[2].session, "s1");
  EXPECT_EQ(recorded_[2].size, 3 * 4096u);
  EXPECT_EQ(recorded_[2].uid, getuid());
}

TEST_F(BufferSocketTest, HostileRequestsAreRefusedAndTheSocketKeepsServing) {
  Start();
  const auto check = [&](std::span<const std::byte> bytes, int fd, int expected_code,
                         const std::string& message) {
    common::UniqueFd client = Connect(path_);
    ASSERT_TRUE(client.valid());
    protocol::Response r = Exchange(client.get(), bytes, fd);
    EXPECT_EQ(r.code, expected_code) << message << ": " << r.message;
    EXPECT_THAT(std::string(r.message), HasSubstr(message));
  };
  std::vector<std::byte> garbage(16, std::byte{0xff});
  common::UniqueFd memfd = SealedMemfd(64);
  check(garbage, -1, static_cast<int>(absl::StatusCode::kInvalidArgument),
        "message of 16 bytes, expected 120");
  check(garbage, memfd.get(), static_cast<int>(absl::StatusCode::kInvalidArgument),
        "message of 16 bytes");
  std::vector<std::byte> long_message(4096, std::byte{0});
  check(long_message, -1, static_cast<int>(absl::StatusCode::kInvalidArgument), "expected 120");
  protocol::Request bad_magic;
  bad_magic.magic = 0xdeadbeef;
  check({reinterpret_cast<const std::byte*>(&bad_magic), sizeof(bad_magic)}, memfd.get(),
        static_cast<int>(absl::StatusCode::kInvalidArgument), "not a buffer-socket request");
  protocol::Request bad_version;
  bad_version.version = 99;
  check({reinterpret_cast<const std::byte*>(&bad_version), sizeof(bad_version)}, memfd.get(),
        static_cast<int>(absl::StatusCode::kInvalidArgument), "not a buffer-socket request");
  protocol::Request no_fd;
  check({reinterpret_cast<const std::byte*>(&no_fd), sizeof(no_fd)}, -1,
        static_cast<int>(absl::StatusCode::kInvalidArgument), "carries no file descriptor");
  protocol::Request unknown;
  std::strcpy(unknown.session_id, "refuse");
  check({reinterpret_cast<const std::byte*>(&unknown), sizeof(unknown)}, memfd.get(),
        static_cast<int>(absl::StatusCode::kNotFound), "session 'refuse' not found");
  // A client that connects and leaves without a word, and one that half-closes.
  { common::UniqueFd silent = Connect(path_); }
  {
    common::UniqueFd half = Connect(path_);
    shutdown(half.get(), SHUT_WR);
  }
  // After all of it, a good request on a new connection still works.
  common::UniqueFd client = Connect(path_);
  protocol::Response ok = Request(client.get(), "s1", 64, memfd.get());
  EXPECT_EQ(ok.code, 0) << ok.message;
  EXPECT_GE(server_->refused_requests(), 7u);
}

// A client whose deadline passed shuts its connection down before the agent answers (client/
// buffer_channel.cc): the answer cannot be sent, so the registration is undone (Release) instead
// of leaving a mapped buffer whose id nobody knows. The socket keeps serving.
TEST(BufferSocketReleaseTest, ARegistrationWhoseAnswerCannotBeSentIsReleased) {
  const std::string path = TempPath("release");
  std::mutex mu;
  std::condition_variable cv;
  bool proceed = false, entered = false;
  std::vector<std::pair<std::string, uint64_t>> released;
  uint64_t next_id = 7;
  auto server = BufferSocketServer::Start(
      path, {},
      [&](const common::PeerCredentials&, const std::string&, uint64_t,
          common::UniqueFd) -> absl::StatusOr<uint64_t> {
        std::unique_lock lock(mu);
        entered = true;
        cv.notify_all();
        cv.wait_for(lock, std::chrono::seconds(10), [&] { return proceed; });
        return next_id++;
      },
      [&](const std::string& session, uint64_t id) {
        std::lock_guard lock(mu);
        released.emplace_back(session, id);
        cv.notify_all();
      });
  ASSERT_TRUE(server.ok()) << server.status();
  absl::Cleanup stop = [&] {
    (*server)->Stop();
    std::filesystem::remove(path);
  };

  common::UniqueFd client = Connect(path);
  ASSERT_TRUE(client.valid());
  protocol::Request request;
  std::strncpy(request.session_id, "s1", sizeof(request.session_id) - 1);
  request.size_bytes = 4096;
  common::UniqueFd memfd = SealedMemfd(4096);
  ASSERT_TRUE(common::SendWithFd(client.get(),
                                 {reinterpret_cast<const std::byte*>(&request), sizeof(request)},
                                 memfd.get())
                  .ok());
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return entered; }));
  }
  ASSERT_EQ(shutdown(client.get(), SHUT_RDWR), 0);  // the client gives up
  {
    std::unique_lock lock(mu);
    proceed = true;
    cv.notify_all();
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return !released.empty(); }));
    ASSERT_EQ(released.size(), 1u);
    EXPECT_EQ(released[0].first, "s1");
    EXPECT_EQ(released[0].second, 7u);
  }
  EXPECT_EQ((*server)->released_registrations(), 1u);

  // An answered registration is never released.
  common::UniqueFd again = Connect(path);
  ASSERT_TRUE(again.valid());
  common::UniqueFd memfd2 = SealedMemfd(4096);
  protocol::Response r = Request(again.get(), "s1", 4096, memfd2.get());
  EXPECT_EQ(r.code, 0) << r.message;
  EXPECT_EQ(r.buffer_id, 8u);
  std::lock_guard lock(mu);
  EXPECT_EQ(released.size(), 1u);
  EXPECT_EQ((*server)->released_registrations(), 1u);
}

TEST_F(BufferSocketTest, TheSocketFileGetsTheConfiguredMode) {
  Start(SocketAccess{.mode = 0600});
  struct stat st {};
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// Runs `body` in a child process as uid/gid 65534 (nobody); returns its exit code.
int AsNobody(const std::function<int()>& body) {
  const pid_t child = fork();
  if (child == 0) {
    if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) _exit(90);
    _exit(body());
  }
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
}

TEST_F(BufferSocketTest, AnotherUidIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a process as another uid";
  // Mode 0666 lets the stranger reach the socket: SO_PEERCRED still keeps it out.
  Start(SocketAccess{.mode = 0666});
  const std::string path = path_;
  const int code = AsNobody([&] {
    common::UniqueFd client = Connect(path);
    if (!client.valid()) return 10;
    common::UniqueFd memfd = SealedMemfd(64);
    protocol::Response r = Request(client.get(), "s1", 64, memfd.get());
    if (r.code != static_cast<int>(absl::StatusCode::kPermissionDenied)) return 11;
    if (std::string(r.message).find("uid 65534") == std::string::npos) return 12;
    if (std::string(r.message).find("--socket-group") == std::string::npos) return 13;
    return 0;
  });
  EXPECT_EQ(code, 0);
  std::lock_guard lock(mu_);
  EXPECT_TRUE(recorded_.empty());
}

TEST_F(BufferSocketTest, WithTheDefaultModeAnotherUidCannotEvenConnect) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a process as another uid";
  Start();  // 0660, root's group
  const std::string path = path_;
  const int code = AsNobody([&] {
    common::UniqueFd client = Connect(path);
    return client.valid() ? 1 : (errno == EACCES ? 0 : 2);
  });
  EXPECT_EQ(code, 0);
}

TEST_F(BufferSocketTest, AnAllowedUidIsServed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a process as another uid";
  Start(SocketAccess{.mode = 0666, .allowed_uids = {65534}});
  const std::string path = path_;
  const int code = AsNobody([&] {
    common::UniqueFd client = Connect(path);
    if (!client.valid()) return 10;
    common::UniqueFd memfd = SealedMemfd(64);
    protocol::Response r = Request(client.get(), "s1", 64, memfd.get());
    return r.code == 0 ? 0 : 11;
  });
  EXPECT_EQ(code, 0);
  std::lock_guard lock(mu_);
  ASSERT_EQ(recorded_.size(), 1u);
  EXPECT_EQ(recorded_[0].uid, 65534u);
}

TEST(ClaimSocketPathTest, NeverDeletesWhatIsNotAStaleSocket) {
  // A regular file: refused and left alone.
  const std::string file = TempPath("file");
  std::ofstream(file) << "precious";
  absl::Status s = ClaimSocketPath(file);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("not a socket"));
  EXPECT_TRUE(std::filesystem::exists(file));
  std::filesystem::remove(file);

  // A socket someone serves: ALREADY_EXISTS, left alone.
  const std::string live = TempPath("live");
  auto server =
      BufferSocketServer::Start(live, {}, [](auto&&...) -> absl::StatusOr<uint64_t> { return 1; });
  ASSERT_TRUE(server.ok());
  s = ClaimSocketPath(live);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_TRUE(std::filesystem::exists(live));
  auto second =
      BufferSocketServer::Start(live, {}, [](auto&&...) -> absl::StatusOr<uint64_t> { return 1; });
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  (*server)->Stop();

  // A socket whose process stopped accepting, its backlog full: alive, so ALREADY_EXISTS at
  // once (the probe does not block on it).
  const std::string stuck = TempPath("stuck");
  {
    common::UniqueFd listener(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, stuck.c_str(), sizeof(address.sun_path) - 1);
    ASSERT_EQ(bind(listener.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    ASSERT_EQ(listen(listener.get(), 0), 0);
    common::UniqueFd pending(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_EQ(connect(pending.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    s = ClaimSocketPath(stuck);
    EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
    EXPECT_TRUE(std::filesystem::exists(stuck));
  }
  std::filesystem::remove(stuck);

  // A stale socket (bound, nobody listening any more): removed.
  const std::string stale = TempPath("stale");
  {
    common::UniqueFd fd(socket(AF_UNIX, SOCK_STREAM, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, stale.c_str(), sizeof(address.sun_path) - 1);
    ASSERT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  }
  EXPECT_TRUE(ClaimSocketPath(stale).ok());
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(ClaimSocketPath(stale).ok());  // nothing there
}

}  // namespace
}  // namespace tributary::agent
