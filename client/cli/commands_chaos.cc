// `tributary chaos`: fault injection against a real local cluster. Each trial starts a
// controller (with its database) and agents on loopback, runs a multi-tensor exact-sum workload
// in one training process per worker node (`tributary chaos-rank`), injects one fault at a random
// point, and judges what the processes saw: hangs (a collective past 2 x the op deadline, or a
// process that does not stop), wrong sums (every element is checked), errors surfaced, and the
// recovery time to the first step that succeeded on every rank after the fault.
//
// The workload's iteration: every rank contributes its step to a world-size vector (its own
// slot), so all ranks agree on the step they run -- a restarted process resumes at the others'
// step, as a real training job would after loading a checkpoint and syncing -- then all-reduces
// its tensors with inputs whose sums are exact and checks every element.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/chaos.h"
#include "client/cli/commands.h"
#include "client/cli/table.h"
#include "client/client.h"
#include "client/cluster/local_cluster.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace tributary::client::cli {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

int64_t NowMs() {
  return std::chrono::duration_cast<milliseconds>(SteadyClock::now().time_since_epoch()).count();
}

std::string StatusText(const absl::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
}

// --- chaos-rank: one training process of the workload. ---

struct RankFlags {
  std::string agent;
  std::string job;
  uint32_t rank = 0;     // the global rank this process expects (one process per node)
  bool elastic = false;  // the job is elastic: the rank and world size may change at a resync
  std::string stop_file;
  int op_timeout_ms = 5000;
  int join_timeout_ms = 3000;
  std::vector<size_t> elements = {1024, 65536, 262144};
};

// The input of `rank` for element `e` of tensor `k` at `step`: small integers, so every sum is
// exact in float32.
float Input(uint32_t rank, uint64_t step, size_t k, size_t e) {
  return static_cast<float>((rank + 1) * ((step + e + k) % 7 + 1));
}

class ChaosRank {
 public:
  explicit ChaosRank(RankFlags f) : f_(std::move(f)) {}

  absl::Status Run() {
    while (!std::filesystem::exists(f_.stop_file)) {
      ChaosIteration it;
      it.rank = rank_;
      it.world = world_;
      it.start_ms = NowMs();
      absl::Status status = client_ ? absl::OkStatus() : Connect();
      if (status.ok()) status = Iterate(it);
      it.end_ms = NowMs();
      it.ok = status.ok() && it.wrong == 0;
      if (!status.ok()) it.error = StatusText(status);
      std::printf("%s\n", FormatChaosIteration(it).c_str());
      std::fflush(stdout);
      if (!status.ok()) {
        const absl::StatusCode code = status.code();
        if (client_ && IsMembershipChanged(status)) {
          // A process of the job was replaced: every rank starts its iterations again from
          // here, and the next iteration's step agreement is the sync point.
          if (absl::Status resynced = Resync(); !resynced.ok()) {
            std::fprintf(stderr, "rank %u: %s\n", rank_, StatusText(resynced).c_str());
            client_.reset();
          }
        } else if (code == absl::StatusCode::kNotFound || code == absl::StatusCode::kUnavailable ||
                   code == absl::StatusCode::kFailedPrecondition ||
                   code == absl::StatusCode::kCancelled) {
          // The session may be gone (its agent died): join again next time.
          client_.reset();
        }
        std::this_thread::sleep_for(milliseconds(20));  // pacing a failing loop, not a wait
      }
    }
    if (client_) (void)client_->Leave();
    return absl::OkStatus();
  }

 private:
  absl::Status Connect() {
    ClientOptions o;
    o.agent_address = f_.agent;
    o.join_timeout = milliseconds(f_.join_timeout_ms);
    o.op_timeout = milliseconds(f_.op_timeout_ms);
    const int64_t until = NowMs() + f_.join_timeout_ms;
    while (true) {
      absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(o, f_.job, 0, 1);
      if (c.ok()) {
        client_ = *std::move(c);
        break;
      }
      // The process this one replaces may still hold the rank until the agent sees it gone.
      if (c.status().code() != absl::StatusCode::kAlreadyExists || NowMs() > until) {
        return c.status();
      }
      std::this_thread::sleep_for(milliseconds(50));  // bounded by until
    }
    if (!f_.elastic && client_->global_rank() != f_.rank) {
      return absl::FailedPreconditionError(
          absl::StrCat("joined as global rank ", client_->global_rank(), ", expected ", f_.rank));
    }
    rank_ = client_->global_rank();
    world_ = client_->world_size();
    ASSIGN_OR_RETURN(step_buffer_, client_->AllocateBuffer(world_ * sizeof(int32_t)));
    tensors_.clear();
    for (size_t n : f_.elements) {
      ASSIGN_OR_RETURN(auto buffer, client_->AllocateBuffer(n * sizeof(float)));
      tensors_.push_back(std::move(buffer));
    }
    pending_.assign(tensors_.size() + 1, Handle());
    return absl::OkStatus();
  }

  absl::Status Resync() {
    RETURN_IF_ERROR(client_->Resync());
    if (client_->global_rank() == rank_ && client_->world_size() == world_) {
      return absl::OkStatus();
    }
    if (!f_.elastic) {
      return absl::FailedPreconditionError(
          absl::StrCat("resynced as global rank ", client_->global_rank(), " of ",
                       client_->world_size(), ", expected ", rank_, " of ", world_));
    }
    // An elastic job went on with other workers: new rank and world size.
    rank_ = client_->global_rank();
    world_ = client_->world_size();
    ASSIGN_OR_RETURN(step_buffer_, client_->AllocateBuffer(world_ * sizeof(int32_t)));
    pending_.back() = Handle();  // a new step buffer
    return absl::OkStatus();
  }

  // One all-reduce of `count` elements of `buffer`, timed into `it`. A collective this process
  // stopped waiting for (the client's own wait ran out first) still runs in the agent and will
  // write its sum into the buffer: it stays in `pending`, and the buffer is not filled again
  // until it reported (the Client's contract; reusing the buffer at once let a late sum of an
  // earlier step overwrite a later step's result).
  absl::Status AllReduce(ChaosIteration& it, const std::string& name, SharedBuffer& buffer,
                         size_t count, common::DataType dtype, Handle& pending) {
    const int64_t start = NowMs();
    absl::StatusOr<Handle> handle =
        client_->AllReduceAsync(name, buffer, 0, count, dtype, ReduceOp::kSum);
    absl::Status status =
        handle.ok() ? handle->Wait(milliseconds(f_.op_timeout_ms)) : handle.status();
    it.max_op_ms = std::max(it.max_op_ms, NowMs() - start);
    if (handle.ok()) last_ = *handle;
    if (handle.ok() && !status.ok()) {
      absl::StatusOr<bool> done = handle->Test();
      if (done.ok() && !*done) pending = *handle;  // still running
    }
    return status;
  }

  // Before a buffer is filled again: its previous collective, if this process gave up waiting
  // for it, must have reported. If it still has not after another op timeout, the rank starts
  // over with a new session and new buffers (FAILED_PRECONDITION: Run joins again).
  absl::Status Settle(Handle& pending) {
    if (!pending.valid()) return absl::OkStatus();
    (void)pending.Wait(milliseconds(f_.op_timeout_ms));
    absl::StatusOr<bool> done = pending.Test();
    if (done.ok() && !*done) {
      return absl::FailedPreconditionError(
          absl::StrCat("collective ", pending.name(), " still running after ", 2 * f_.op_timeout_ms,
                       " ms; starting over with a new session"));
    }
    pending = Handle();
    return absl::OkStatus();
  }

  absl::Status Iterate(ChaosIteration& it) {
    // Agree on the step: slot r holds rank r's step + 1.
    RETURN_IF_ERROR(Settle(pending_.back()));
    auto* slots = reinterpret_cast<int32_t*>(step_buffer_->data());
    std::fill(slots, slots + world_, 0);
    slots[rank_] = static_cast<int32_t>(step_ + 1);
    RETURN_IF_ERROR(AllReduce(it, "chaos.step", *step_buffer_, world_, common::DataType::kInt32,
                              pending_.back()));
    int32_t agreed = 0;
    for (uint32_t r = 0; r < world_; ++r) {
      if (slots[r] < 1) ++it.wrong;  // a rank's contribution is missing
      agreed = std::max(agreed, slots[r]);
    }
    it.step = static_cast<uint64_t>(agreed - 1);
    step_ = it.step + 1;
    const float ranks_sum = static_cast<float>(world_ * (world_ + 1) / 2);
    for (size_t k = 0; k < tensors_.size(); ++k) {
      RETURN_IF_ERROR(Settle(pending_[k]));
      auto* values = reinterpret_cast<float*>(tensors_[k]->data());
      const size_t n = f_.elements[k];
      for (size_t e = 0; e < n; ++e) values[e] = Input(rank_, it.step, k, e);
      RETURN_IF_ERROR(AllReduce(it, absl::StrCat("chaos.t", k), *tensors_[k], n,
                                common::DataType::kFloat32, pending_[k]));
      const Handle& handle = last_;
      uint64_t wrong = 0;
      size_t first = 0;
      for (size_t e = 0; e < n; ++e) {
        if (values[e] != ranks_sum * Input(0, it.step, k, e) && wrong++ == 0) first = e;
      }
      if (wrong > 0) {
        // What a wrong sum looked like, for the trial's kept logs.
        it.wrong += wrong;
        it.error = absl::StrCat("tensor chaos.t", k, " step ", it.step, " (rank ", rank_, " of ",
                                world_, "): ", wrong, " of ", n, " elements wrong; first at ",
                                first, ": got ", values[first], ", expected ",
                                ranks_sum * Input(0, it.step, k, first), ", this rank's input ",
                                Input(rank_, it.step, k, first), "; ", handle.retries(),
                                " retries, via ", handle.via_control_ring() ? "ring" : "rpc");
      }
    }
    return absl::OkStatus();
  }

  const RankFlags f_;
  std::unique_ptr<Client> client_;
  uint32_t rank_ = 0;   // the global rank it runs as now
  uint32_t world_ = 0;  // the world size now
  uint64_t step_ = 0;
  std::shared_ptr<SharedBuffer> step_buffer_;
  std::vector<std::shared_ptr<SharedBuffer>> tensors_;
  // Per tensor, then the step buffer: a collective still running that this process stopped
  // waiting for.
  std::vector<Handle> pending_;
  Handle last_;  // the latest collective (for the record of a wrong sum)
};

// --- chaos: the trials. ---

struct ChaosFlags {
  int trials = 5;
  std::vector<std::string> faults = {kChaosFaults, kChaosFaults + std::size(kChaosFaults)};
  uint64_t seed = 1;
  int workers = 3;
  int spares = 2;
  int op_deadline_ms = 2000;
  int warmup_steps = 3;
  // After the fault, the ranks run until every rank completed a step that began after it
  // (plus settle_ms), or this long at most.
  int window_ms = 0;  // 0: 2 x the op deadline + 6 s
  int settle_ms = 500;
  std::string transport = "auto";
  std::string log_level = "warn";  // the controller's and agents'
  bool json = false;
  std::string keep_dir;  // keep logs here instead of a temp folder
  bool elastic = false;  // create the job elastic
};

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<ChaosIteration> ReadRecords(const std::string& path) {
  std::vector<ChaosIteration> out;
  for (absl::string_view line : absl::StrSplit(ReadWhole(path), '\n')) {
    absl::StatusOr<ChaosIteration> it = ParseChaosIteration(std::string(line));
    if (it.ok()) out.push_back(*it);
  }
  return out;
}

struct RankProcess {
  pid_t pid = -1;
  std::vector<std::string> argv;
  std::vector<std::string> logs;  // one per generation (a replacement gets its own)
};

class Trial {
 public:
  Trial(const ChaosFlags& f, int index, std::string dir)
      : f_(f), index_(index), dir_(std::move(dir)), rng_(f.seed * 1000003 + index) {}

  absl::StatusOr<ChaosTrial> Run(const std::string& fault) {
    ChaosTrial out;
    out.fault = fault;
    out.world_size = static_cast<uint32_t>(f_.workers);
    out.elastic = f_.elastic;
    out.op_deadline_ms = f_.op_deadline_ms;
    LocalClusterOptions o;
    o.bin_dir = ExecutableDir();
    o.run_dir = absl::StrCat(dir_, "/trial-", index_);
    std::filesystem::create_directories(o.run_dir);
    o.workers = f_.workers;
    o.spares = f_.spares;
    o.sum_gbps = 4;  // declared: plans do not wait for a measurement
    o.transport = f_.transport;
    o.log_level = f_.log_level;
    o.heartbeat = milliseconds(200);
    o.heartbeat_timeout = milliseconds(1200);
    o.state_db = absl::StrCat(o.run_dir, "/controller.db");
    ASSIGN_OR_RETURN(cluster_, LocalCluster::Start(o));

    const std::string job = absl::StrCat("chaos-", index_);
    v1::CreateJobRequest req;
    req.set_job_id(job);
    for (const auto& w : cluster_->worker_node_ids()) req.mutable_spec()->add_worker_nodes(w);
    req.mutable_spec()->set_procs_per_node(1);
    req.mutable_spec()->set_max_spare_nodes(f_.spares);
    req.mutable_spec()->set_partition_bytes(64 << 10);  // many chunks, on every server
    req.mutable_spec()->set_credit_bytes(256 << 10);
    req.mutable_spec()->set_op_timeout_ms(f_.op_deadline_ms);
    req.mutable_spec()->set_algorithm(v1::ALGORITHM_PUSH_PULL);
    req.mutable_spec()->set_elastic(f_.elastic);
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::Job created;
      grpc::Status s = cluster_->controller().CreateJob(&ctx, req, &created);
      if (!s.ok()) return absl::InternalError(absl::StrCat("create job: ", s.error_message()));
    }
    stop_file_ = absl::StrCat(o.run_dir, "/stop");
    for (int w = 0; w < f_.workers; ++w) {
      RankProcess p;
      p.argv = {ExecutableDir() + "/tributary",
                "chaos-rank",
                "--agent",
                cluster_->agent_address(w),
                "--job",
                job,
                "--rank",
                std::to_string(w),
                "--stop-file",
                stop_file_,
                "--op-timeout-ms",
                std::to_string(2 * f_.op_deadline_ms + 1000),
                "--join-timeout-ms",
                std::to_string(f_.op_deadline_ms),
                "--log-level",
                "warn"};
      if (f_.elastic) p.argv.push_back("--elastic");
      ranks_.push_back(std::move(p));
      RETURN_IF_ERROR(Spawn(w));
    }
    // Warm up: every rank completed a few steps.
    RETURN_IF_ERROR(WaitUntil([&] { return MinOkSteps(0) >= f_.warmup_steps; }, 60000,
                              "the workload to warm up"));

    std::this_thread::sleep_for(milliseconds(std::uniform_int_distribution<int>(0, 300)(rng_)));
    out.fault_ms = NowMs();
    RETURN_IF_ERROR(Inject(fault));
    const int window = f_.window_ms > 0 ? f_.window_ms : 2 * f_.op_deadline_ms + 6000;
    if (ChaosFaultRecovers(fault, f_.elastic)) {
      (void)WaitUntil([&] { return MinOkSteps(out.fault_ms) >= 1; },
                      out.fault_ms + window - NowMs(), "");
      std::this_thread::sleep_for(milliseconds(f_.settle_ms));
    } else {
      std::this_thread::sleep_for(
          milliseconds(std::max<int64_t>(0, out.fault_ms + window - NowMs())));
    }
    out.stop_ms = NowMs();
    std::ofstream(stop_file_) << "stop\n";
    for (RankProcess& p : ranks_) {
      if (p.pid < 0) continue;
      const auto started = SteadyClock::now();
      WaitProcess(p.pid, milliseconds(2 * f_.op_deadline_ms + 2000));
      if (SteadyClock::now() - started >= milliseconds(2 * f_.op_deadline_ms + 2000)) {
        ++out.stuck_processes;
      }
      p.pid = -1;
    }
    for (const RankProcess& p : ranks_) {
      for (const std::string& log : p.logs) {
        for (ChaosIteration& it : ReadRecords(log)) out.iterations.push_back(it);
      }
    }
    cluster_->Stop();
    return out;
  }

  ~Trial() {
    for (RankProcess& p : ranks_) {
      if (p.pid > 0) WaitProcess(p.pid, milliseconds(0));
    }
  }

 private:
  // Starts rank `rank`'s process (again): each generation logs to its own file.
  absl::Status Spawn(int rank) {
    RankProcess& p = ranks_[rank];
    p.logs.push_back(absl::StrCat(cluster_->run_dir(), "/rank-", rank, "-", p.logs.size(), ".log"));
    ASSIGN_OR_RETURN(p.pid, SpawnProcess(p.argv, p.logs.back()));
    return absl::OkStatus();
  }

  // Steps every rank (but one on a killed worker node) completed OK that began at or after
  // `since_ms`.
  int MinOkSteps(int64_t since_ms) {
    int least = INT32_MAX;
    for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
      if (r == killed_worker_) continue;
      const RankProcess& p = ranks_[r];
      int ok = 0;
      for (const std::string& log : p.logs) {
        for (const ChaosIteration& it : ReadRecords(log)) ok += it.ok && it.start_ms >= since_ms;
      }
      least = std::min(least, ok);
    }
    return least;
  }

  absl::Status WaitUntil(const std::function<bool()>& done, int64_t timeout_ms,
                         const std::string& what) {
    const int64_t until = NowMs() + std::max<int64_t>(timeout_ms, 0);
    while (!done()) {
      if (NowMs() >= until) {
        return absl::DeadlineExceededError(absl::StrCat("timed out waiting for ", what));
      }
      std::this_thread::sleep_for(milliseconds(50));  // polling the ranks' logs
    }
    return absl::OkStatus();
  }

  absl::Status Inject(const std::string& fault) {
    auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); };
    if (fault == "spare-kill" || fault == "spare-freeze") {
      if (f_.spares < 1) return absl::InvalidArgumentError(fault + " needs --spares >= 1");
      const int node = f_.workers + pick(f_.spares);
      if (fault == "spare-kill") {
        cluster_->KillNode(node);
      } else {
        cluster_->FreezeNode(node);
        std::this_thread::sleep_for(milliseconds(f_.op_deadline_ms + 1000));
        cluster_->ThawNode(node);
      }
    } else if (fault == "controller-restart") {
      cluster_->KillController();
      RETURN_IF_ERROR(cluster_->RestartController(milliseconds(20000)));
    } else if (fault == "process-restart") {
      const int victim = pick(f_.workers);
      kill(ranks_[victim].pid, SIGKILL);
      WaitProcess(ranks_[victim].pid, milliseconds(5000));
      RETURN_IF_ERROR(Spawn(victim));
    } else if (fault == "worker-agent-kill") {
      killed_worker_ = pick(f_.workers);
      cluster_->KillNode(killed_worker_);
    } else if (fault == "worker-agent-restart") {
      RETURN_IF_ERROR(cluster_->RestartNode(pick(f_.workers)));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown fault '", fault, "'"));
    }
    return absl::OkStatus();
  }

  const ChaosFlags& f_;
  const int index_;
  const std::string dir_;
  std::mt19937_64 rng_;
  std::unique_ptr<LocalCluster> cluster_;
  std::vector<RankProcess> ranks_;
  std::string stop_file_;
  int killed_worker_ = -1;  // worker-agent-kill's victim
};

std::string Ms(const std::optional<int64_t>& ms) {
  return ms ? std::to_string(*ms) : std::string("-");
}

absl::Status RunChaos(const ChaosFlags& f) {
  for (const std::string& fault : f.faults) {
    if (std::find(std::begin(kChaosFaults), std::end(kChaosFaults), fault) ==
        std::end(kChaosFaults)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown fault '", fault, "'; known: ", absl::StrJoin(kChaosFaults, ", ")));
    }
  }
  if (f.trials < 1 || f.faults.empty()) {
    return absl::InvalidArgumentError("--trials must be at least 1 and --faults not empty");
  }
  std::string dir = f.keep_dir;
  if (dir.empty()) {
    char tmpl[] = "/tmp/tributary-chaos-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
    dir = tmpl;
  }
  std::vector<std::pair<std::string, ChaosVerdict>> verdicts;
  std::map<int, std::string> failed_trials;  // trials with a hang or a wrong sum
  nlohmann::json trials_json = nlohmann::json::array();
  absl::Status failure;
  for (int t = 0; t < f.trials; ++t) {
    const std::string& fault = f.faults[t % f.faults.size()];
    absl::StatusOr<ChaosTrial> trial = Trial(f, t, dir).Run(fault);
    if (!trial.ok()) {
      failure = absl::InternalError(
          absl::StrCat("trial ", t, " (", fault, ") could not run: ", trial.status().message()));
      break;
    }
    const ChaosVerdict v = JudgeChaosTrial(*trial);
    verdicts.emplace_back(fault, v);
    if (v.hangs > 0 || v.wrong_elements > 0) failed_trials[t] = fault;
    std::fprintf(stderr,
                 "trial %d %-18s hangs %u, wrong elements %lu, failed iterations %lu (+%lu at "
                 "the stop), recovery %s ms\n",
                 t, fault.c_str(), v.hangs, static_cast<unsigned long>(v.wrong_elements),
                 static_cast<unsigned long>(v.failed_iterations),
                 static_cast<unsigned long>(v.failed_at_stop), Ms(v.recovery_ms).c_str());
    trials_json.push_back({{"trial", t},
                           {"fault", fault},
                           {"elastic", f.elastic},
                           {"hangs", v.hangs},
                           {"wrong_elements", v.wrong_elements},
                           {"failed_iterations", v.failed_iterations},
                           {"failed_at_stop", v.failed_at_stop},
                           {"split_steps", v.split_steps},
                           {"recovery_ms", v.recovery_ms ? nlohmann::json(*v.recovery_ms)
                                                         : nlohmann::json(nullptr)}});
  }
  if (f.keep_dir.empty()) {
    // A trial with a hang or a wrong sum keeps its logs (every process's, and the ranks' records).
    for (const auto& [t, v] : failed_trials) {
      std::fprintf(stderr, "trial %d kept for inspection: %s/trial-%d\n", t, dir.c_str(), t);
    }
    if (failed_trials.empty()) {
      std::filesystem::remove_all(dir);
    } else {
      for (int t = 0; t < f.trials; ++t) {
        if (!failed_trials.contains(t))
          std::filesystem::remove_all(absl::StrCat(dir, "/trial-", t));
      }
    }
  }

  const std::vector<ChaosSummary> summary = SummarizeChaos(verdicts);
  bool bad = false;
  for (const ChaosSummary& s : summary) {
    bad |= s.hangs > 0 || s.trials_with_wrong_sums > 0 || s.recovered < s.expected_to_recover;
  }
  if (f.json) {
    nlohmann::json j = {{"trials", trials_json}, {"summary", nlohmann::json::array()}};
    for (const ChaosSummary& s : summary) {
      auto opt = [](const std::optional<int64_t>& v) {
        return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
      };
      j["summary"].push_back({{"fault", s.fault},
                              {"trials", s.trials},
                              {"hangs", s.hangs},
                              {"trials_with_wrong_sums", s.trials_with_wrong_sums},
                              {"failed_iterations", s.failed_iterations},
                              {"failed_at_stop", s.failed_at_stop},
                              {"recovered", s.recovered},
                              {"expected_to_recover", s.expected_to_recover},
                              {"recovery_p50_ms", opt(s.recovery_p50_ms)},
                              {"recovery_p99_ms", opt(s.recovery_p99_ms)},
                              {"recovery_max_ms", opt(s.recovery_max_ms)}});
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    Table table({"fault", "trials", "hangs", "wrong sums", "errors surfaced", "at the stop",
                 "recovered", "recovery p50 ms", "p99 ms", "max ms"});
    for (size_t c = 1; c < 10; ++c) table.SetAlign(c, Table::Align::kRight);
    for (const ChaosSummary& s : summary) {
      table.AddRow({s.fault, std::to_string(s.trials), std::to_string(s.hangs),
                    std::to_string(s.trials_with_wrong_sums), std::to_string(s.failed_iterations),
                    std::to_string(s.failed_at_stop),
                    s.expected_to_recover > 0
                        ? absl::StrCat(s.recovered, "/", s.expected_to_recover)
                        : std::string("n/a"),
                    Ms(s.recovery_p50_ms), Ms(s.recovery_p99_ms), Ms(s.recovery_max_ms)});
    }
    std::printf("%s", table.Render().c_str());
  }
  RETURN_IF_ERROR(failure);
  if (bad) {
    return absl::InternalError(
        "chaos found hangs, wrong sums or a fault the workload did not recover from (see above)");
  }
  return absl::OkStatus();
}

}  // namespace

void AddChaosCommands(CLI::App& app, GlobalOptions& global) {
  auto flags = std::make_shared<ChaosFlags>();
  CLI::App* cmd = app.add_subcommand(
      "chaos",
      "fault injection: start a local cluster per trial, run an exact-sum workload, kill or stop "
      "a role at a random point, and report hangs, wrong sums, errors and recovery per fault");
  cmd->add_option("--trials", flags->trials, "trials; faults are taken in turn")
      ->capture_default_str();
  cmd->add_option("--faults", flags->faults,
                  "faults to inject: " + absl::StrJoin(kChaosFaults, ", "))
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--seed", flags->seed, "seed of the fault points and victims")
      ->capture_default_str();
  cmd->add_option("--workers", flags->workers, "worker nodes (one training process each)")
      ->capture_default_str();
  cmd->add_option("--spares", flags->spares, "spare summation servers")->capture_default_str();
  cmd->add_option("--op-deadline-ms", flags->op_deadline_ms, "the job's op timeout")
      ->capture_default_str();
  cmd->add_option("--window-ms", flags->window_ms,
                  "longest run after the fault (0: 2 x the op deadline + 6 s)")
      ->capture_default_str();
  cmd->add_option("--transport", flags->transport, "the agents' --transport")
      ->check(CLI::IsMember({"auto", "tcp", "ucx"}))
      ->capture_default_str();
  cmd->add_option("--agent-log-level", flags->log_level, "log level of the controller and agents")
      ->capture_default_str();
  cmd->add_option("--keep-dir", flags->keep_dir, "keep every trial's logs in this folder");
  cmd->add_flag("--elastic", flags->elastic,
                "create the job elastic: a dead worker node's job goes on with the others "
                "(worker-agent-kill is then expected to recover)");
  cmd->add_flag("--json", flags->json, "print the per-trial verdicts and the summary as JSON");
  SetAction(cmd, global, [flags] { return RunChaos(*flags); });

  auto rank = std::make_shared<RankFlags>();
  CLI::App* rank_cmd = app.add_subcommand(
      "chaos-rank", "one training process of `tributary chaos`'s workload (started by chaos)");
  rank_cmd->group("");  // internal: not listed in --help
  rank_cmd->add_option("--agent", rank->agent, "the agent's local address")->required();
  rank_cmd->add_option("--job", rank->job, "job id")->required();
  rank_cmd->add_option("--rank", rank->rank, "the global rank this process expects")->required();
  rank_cmd->add_option("--stop-file", rank->stop_file, "stop once this file exists")->required();
  rank_cmd->add_option("--op-timeout-ms", rank->op_timeout_ms, "client-side wait per collective");
  rank_cmd->add_option("--join-timeout-ms", rank->join_timeout_ms, "how long a join retries");
  rank_cmd->add_flag("--elastic", rank->elastic, "the job is elastic");
  rank_cmd->add_option("--elements", rank->elements, "float32 elements of each tensor")
      ->delimiter(',');
  SetAction(rank_cmd, global, [rank] { return ChaosRank(*rank).Run(); });
}

}  // namespace tributary::client::cli
