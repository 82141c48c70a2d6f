#include "agent/session_registry.h"

#include <sys/random.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tributary::agent {
namespace {

// 128 bits from the kernel's CSPRNG: a session id is a capability (whoever holds it acts for the
// session), so it must not be guessable from the ids of other sessions.
std::string NewSessionId() {
  uint64_t words[2] = {0, 0};
  size_t filled = 0;
  while (filled < sizeof(words)) {
    const ssize_t n = getrandom(reinterpret_cast<char*>(words) + filled, sizeof(words) - filled, 0);
    if (n > 0) filled += static_cast<size_t>(n);
  }
  return absl::StrFormat("%016x%016x", words[0], words[1]);
}

}  // namespace

void SessionRegistry::SetJobs(const std::vector<LocalJob>& jobs) {
  jobs_.clear();
  for (const LocalJob& j : jobs) jobs_[j.job_id] = j;
}

const LocalJob* SessionRegistry::FindJob(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Join(const std::string& job_id,
                                                               uint32_t local_rank,
                                                               uint32_t local_size) {
  const LocalJob* job = FindJob(job_id);
  if (job == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job_id,
        "' has no plan on this node yet: create it with this node as a worker, then retry"));
  }
  if (local_size != job->procs_per_node) {
    return absl::InvalidArgumentError(absl::StrCat("job '", job_id, "' runs ", job->procs_per_node,
                                                   " processes per node; local_size is ",
                                                   local_size));
  }
  if (local_rank >= local_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("local_rank ", local_rank, " is not below local_size ", local_size));
  }
  if (std::shared_ptr<Session> holder = Holder(job_id, local_rank)) {
    return absl::AlreadyExistsError(absl::StrCat("local rank ", local_rank, " of job '", job_id,
                                                 "' is taken by session ", holder->id));
  }
  auto session = std::make_shared<Session>();
  session->id = NewSessionId();
  session->job_id = job_id;
  session->local_rank = local_rank;
  session->local_size = local_size;
  session->generation = job->generation;
  sessions_[session->id] = session;
  return session;
}

std::shared_ptr<Session> SessionRegistry::Holder(const std::string& job_id,
                                                 uint32_t local_rank) const {
  for (const auto& [id, s] : sessions_) {
    if (s->job_id == job_id && s->local_rank == local_rank) return s;
  }
  return nullptr;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Find(
    const std::string& session_id) const {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("session '", session_id,
                     "' not found: call JoinJob first (sessions end when the process "
                     "disconnects or leaves)"));
  }
  return it->second;
}

std::shared_ptr<Session> SessionRegistry::Remove(const std::string& session_id) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return nullptr;
  std::shared_ptr<Session> session = std::move(it->second);
  sessions_.erase(it);
  return session;
}

}  // namespace tributary::agent
