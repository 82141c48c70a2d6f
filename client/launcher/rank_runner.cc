#include "client/launcher/rank_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace tributary::client::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// Self-pipe: the signal handlers write the signal number, the supervising loop polls it.
int g_signal_pipe[2] = {-1, -1};

void OnSignal(int signo) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(signo);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

// Installs OnSignal for SIGCHLD, SIGINT and SIGTERM; restores the old handlers on destruction.
class SignalScope {
 public:
  SignalScope() {
    struct sigaction action = {};
    action.sa_handler = OnSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &action, &old_[i]);
  }
  ~SignalScope() {
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &old_[i], nullptr);
  }

 private:
  static constexpr int kSignals[3] = {SIGCHLD, SIGINT, SIGTERM};
  struct sigaction old_[3];
};

void WriteAll(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(static_cast<size_t>(n));
  }
}

// One output stream of one rank: a pipe read end and the partial line read so far.
struct Stream {
  int fd = -1;
  int out_fd = 1;
  std::string prefix;
  std::string partial;

  // Reads what is available; forwards every complete line. Returns false at EOF (or error).
  bool Read() {
    char buf[65536];
    while (true) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n > 0) {
        partial.append(buf, static_cast<size_t>(n));
        size_t start = 0;
        std::string out;
        for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
          out.append(prefix).append(partial, start, nl + 1 - start);
        }
        partial.erase(0, start);
        WriteAll(out_fd, out);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      return false;  // EOF or a read error: the stream is over.
    }
  }

  void Close() {
    if (!partial.empty()) WriteAll(out_fd, absl::StrCat(prefix, partial, "\n"));
    partial.clear();
    if (fd >= 0) close(fd);
    fd = -1;
  }
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;  // Exit code, or 128 + signal.
  Stream out, err;
};

int DecodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// The launcher's environment with `overrides` set, as "K=V" strings.
std::vector<std::string> BuildEnv(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    const size_t eq = entry.find('=');
    const std::string key(entry.substr(0, eq));
    if (!overrides.contains(key)) env.emplace_back(entry);
  }
  for (const auto& [key, value] : overrides) env.push_back(absl::StrCat(key, "=", value));
  return env;
}

absl::Status Spawn(const RankLaunch& launch, const RunRanksOptions& options, Rank& rank) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    const int e = errno;
    close(out_pipe[0]);
    close(out_pipe[1]);
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(e)));
  }
  // Everything the child needs is built before fork: after it only async-signal-safe calls.
  std::vector<std::string> env = BuildEnv(launch.env);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_storage = options.command;
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string exec_error =
      absl::StrCat("tributary-run: cannot execute ", options.command[0], ": ");

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(e)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // The launcher died before prctl.
    // The launcher's handlers must not run here (the self-pipe is the launcher's).
    signal(SIGCHLD, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    execvpe(argv[0], argv.data(), envp.data());
    const char* reason = strerror(errno);
    [[maybe_unused]] ssize_t n = write(STDERR_FILENO, exec_error.data(), exec_error.size());
    n = write(STDERR_FILENO, reason, strlen(reason));
    n = write(STDERR_FILENO, "\n", 1);
    _exit(127);
  }
  setpgid(pid, pid);  // Also here: whichever runs first, the group exists before any kill.
  close(out_pipe[1]);
  close(err_pipe[1]);
  fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
  fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
  rank.rank = launch.rank;
  rank.pid = pid;
  rank.running = true;
  const std::string prefix = absl::StrCat("[", launch.rank, "] ");
  rank.out = Stream{out_pipe[0], options.stdout_fd, prefix, ""};
  rank.err = Stream{err_pipe[0], options.stderr_fd, prefix, ""};
  return absl::OkStatus();
}

void SignalAll(std::vector<Rank>& ranks, int signo) {
  for (Rank& r : ranks) {
    if (r.running) kill(-r.pid, signo);
  }
}

}  // namespace

absl::StatusOr<int> RunRanks(const std::vector<RankLaunch>& launches,
                             const RunRanksOptions& options) {
  if (options.command.empty()) return absl::InvalidArgumentError("no command to run");
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  SignalScope signals;
  std::vector<Rank> ranks(launches.size());
  absl::Status spawn_status;
  for (size_t i = 0; i < launches.size() && spawn_status.ok(); ++i) {
    spawn_status = Spawn(launches[i], options, ranks[i]);
  }

  std::optional<int> result;  // Set once the run has failed or was interrupted.
  std::optional<Clock::time_point> kill_deadline;
  auto stop_all = [&](int status, const std::string& why) {
    if (result) return;
    result = status;
    WriteAll(options.stderr_fd, absl::StrCat("tributary-run: ", why, "\n"));
    SignalAll(ranks, SIGTERM);
    kill_deadline = Clock::now() + options.stop_grace;
  };
  if (!spawn_status.ok()) {
    stop_all(1, absl::StrCat("could not start every rank: ", spawn_status.message()));
  }

  // Output still open after every rank has exited belongs to processes the ranks left
  // behind; it is drained for at most this long.
  std::optional<Clock::time_point> drain_deadline;
  bool killed = false;
  while (true) {
    // Reap.
    bool any_running = false;
    for (Rank& r : ranks) {
      if (!r.running) continue;
      int status = 0;
      const pid_t w = waitpid(r.pid, &status, WNOHANG);
      if (w == r.pid || (w < 0 && errno == ECHILD)) {
        r.running = false;
        r.status = w == r.pid ? DecodeStatus(status) : 1;
        if (r.status != 0 && !result) {
          stop_all(r.status, absl::StrCat("rank ", r.rank, " exited with status ", r.status,
                                          "; stopping the other ranks"));
        }
      } else {
        any_running = true;
      }
    }
    const auto now = Clock::now();
    if (any_running && kill_deadline && !killed && now >= *kill_deadline) {
      WriteAll(options.stderr_fd, "tributary-run: ranks still running after SIGTERM: SIGKILL\n");
      SignalAll(ranks, SIGKILL);
      killed = true;
    }
    std::vector<pollfd> fds;
    std::vector<Stream*> streams;
    for (Rank& r : ranks) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        streams.push_back(s);
      }
    }
    if (!any_running) {
      if (streams.empty()) break;
      if (!drain_deadline) drain_deadline = now + std::chrono::seconds(1);
      if (now >= *drain_deadline) {
        for (Stream* s : streams) s->Close();
        break;
      }
    }
    fds.push_back({g_signal_pipe[0], POLLIN, 0});
    // SIGCHLD wakes the poll; the timeout only bounds the wait for the kill and drain
    // deadlines (and a SIGCHLD lost to a race between waitpid and poll).
    int timeout_ms = 200;
    for (auto deadline : {kill_deadline, drain_deadline}) {
      if (!deadline) continue;
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - now).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, timeout_ms));
    }
    const int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) {
      stop_all(1, absl::StrCat("poll: ", std::strerror(errno)));
      continue;
    }
    for (size_t i = 0; i < streams.size(); ++i) {
      if (fds[i].revents != 0 && !streams[i]->Read()) streams[i]->Close();
    }
    if (fds.back().revents & POLLIN) {
      unsigned char sig[64];
      ssize_t got;
      while ((got = read(g_signal_pipe[0], sig, sizeof(sig))) > 0) {
        for (ssize_t k = 0; k < got; ++k) {
          if (sig[k] == SIGINT || sig[k] == SIGTERM) {
            stop_all(128 + sig[k],
                     absl::StrCat("got signal ", static_cast<int>(sig[k]), "; stopping the ranks"));
          }
        }
      }
    }
  }
  close(g_signal_pipe[0]);
  close(g_signal_pipe[1]);
  g_signal_pipe[0] = g_signal_pipe[1] = -1;
  if (result) return *result;
  for (const Rank& r : ranks) {
    if (r.status != 0) return r.status;
  }
  return 0;
}

}  // namespace tributary::client::launcher
