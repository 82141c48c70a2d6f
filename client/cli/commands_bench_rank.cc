// `tributary bench-rank`: one training process of an nccl-tests-style sweep through the local
// agent. Start one per process of the job (every rank with the same sizes, dtype, op); global
// rank 0 prints the table.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/bench_data.h"
#include "client/cli/commands.h"
#include "client/cli/sizes.h"
#include "client/client.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "common/trace.h"

namespace tributary::client::cli {
namespace {

struct BenchFlags {
  std::string agent = ClientOptions().agent_address;
  std::string job;
  uint32_t local_rank = 0;
  uint32_t local_size = 1;
  std::string sizes = "4K:64M";
  std::string dtype = "float32";
  int iters = 20;
  int warmup = 5;
  std::string op = "sum";
  uint32_t root = 0;
  bool check = true;
  bool csv = false;
  int join_timeout_ms = 30000;
  int op_timeout_ms = 120000;
  // A model's gradient list instead of --sizes: lines "name count", in the order backward
  // produces them (last layer first). See RunWorkload.
  std::string tensors;
  std::string workload_name = "workload";
  // With --tensors: 0 submits every tensor as its own all-reduce (the agent fuses the small
  // ones); > 0 packs them in file order into DDP-style buckets of at most this many bytes (a
  // larger tensor is a bucket of its own) and submits one all-reduce per bucket, as PyTorch's
  // DistributedDataParallel does through tributary.torch's communication hook and as the
  // suite's Gloo and MPI peers do.
  uint64_t bucket_bytes = 0;
  // Chrome trace of this process's iterations and tensors (common/trace.h).
  std::string trace;
  // With --trace and --tensors: a span per tensor too (each costs the waiting thread a trace
  // write, which delays its sight of the next completion).
  bool trace_tensors = true;
};

struct WorkloadTensor {
  std::string name;
  size_t count = 0;
};

absl::StatusOr<std::vector<WorkloadTensor>> ReadTensors(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--tensors: cannot open ", path));
  std::vector<WorkloadTensor> out;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    WorkloadTensor t;
    long long count = 0;
    if (!(fields >> t.name >> count) || count <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", number, ": expected \"name count\" with a positive count, got '", line, "'"));
    }
    t.count = static_cast<size_t>(count);
    out.push_back(std::move(t));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no tensors"));
  return out;
}

// One training iteration's gradients: every tensor is submitted at once, in backward order, with
// priority = its layer's forward position (lower goes first: the first layers' gradients are
// needed first by the next forward pass, as in BytePS), then all are awaited. Each iteration
// starts at a barrier (a one-element all-reduce, kBarrierTensor), as the Gloo and Open MPI peers'
// do (bench/suite/peer_common.h), so that every implementation is timed from the same aligned
// start. The time is from the first submission to the last completion; every element of every
// tensor is checked.
// Rank 0 prints "WCSV,name,tensors,bytes,time_us,wrong".
constexpr char kBarrierTensor[] = "bench.iteration-barrier";

absl::Status RunWorkload(Client& client, const BenchFlags& flags,
                         const std::vector<WorkloadTensor>& tensors, common::DataType dtype,
                         BenchOp op) {
  const size_t element = common::DataTypeSize(dtype);
  std::vector<size_t> offsets;
  size_t total = 0;
  for (const WorkloadTensor& t : tensors) {
    offsets.push_back(total);
    total += t.count * element;
  }
  // What is submitted: each tensor, or each bucket (consecutive tensors, contiguous in the
  // buffer).
  std::vector<WorkloadTensor> units;
  std::vector<size_t> unit_offsets;
  if (flags.bucket_bytes == 0) {
    units = tensors;
    unit_offsets = offsets;
  } else {
    for (size_t j = 0; j < tensors.size(); ++j) {
      if (units.empty() || (units.back().count + tensors[j].count) * element > flags.bucket_bytes) {
        units.push_back(WorkloadTensor{"", 0});
        unit_offsets.push_back(offsets[j]);
      }
      units.back().count += tensors[j].count;
    }
    for (size_t b = 0; b < units.size(); ++b) {
      units[b].name = absl::StrCat(flags.workload_name, ".bucket.", b, ".", units[b].count);
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<SharedBuffer> buffer, client.AllocateBuffer(total));
  ASSIGN_OR_RETURN(std::shared_ptr<SharedBuffer> barrier, client.AllocateBuffer(sizeof(int32_t)));
  const uint32_t rank = client.global_rank();
  const uint32_t world = client.world_size();
  const auto reduce = op == BenchOp::kAverage ? ReduceOp::kAverage : ReduceOp::kSum;
  const int n = static_cast<int>(tensors.size());
  const int submissions = static_cast<int>(units.size());
  double seconds = 0;
  size_t wrong = 0;
  // The timed iterations' window on the steady clock (see the WTIMED line below), and each
  // iteration's time, warm-up included (ms).
  std::chrono::steady_clock::time_point timed_from;
  std::vector<double> iteration_ms;
  // Reused across iterations: growing a fresh vector in the timed window cost a large allocation
  // each iteration, and glibc's malloc then consolidated the previous iteration's freed handles
  // (a third of this process's CPU at an iteration's start, on BERT-large's small tensors).
  std::vector<Handle> handles;
  handles.reserve(submissions);
  for (int it = -flags.warmup; it < flags.iters; ++it) {
    if (it == 0) timed_from = std::chrono::steady_clock::now();
    for (int j = 0; j < n; ++j) {
      FillInput(dtype, rank, static_cast<std::byte*>(buffer->data()) + offsets[j],
                tensors[j].count);
    }
    *static_cast<int32_t*>(barrier->data()) = 1;
    RETURN_IF_ERROR(
        client.AllReduce(kBarrierTensor, *barrier, 0, 1, common::DataType::kInt32, ReduceOp::kSum));
    if (const int32_t arrived = *static_cast<const int32_t*>(barrier->data());
        arrived != static_cast<int32_t>(world)) {
      return absl::InternalError(absl::StrCat("the barrier before ", flags.workload_name,
                                              " iteration ", it, " counted ", arrived,
                                              " processes, expected ", world));
    }
    const auto start = std::chrono::steady_clock::now();
    for (int j = 0; j < submissions; ++j) {
      ASSIGN_OR_RETURN(Handle h, client.AllReduceAsync(units[j].name, *buffer, unit_offsets[j],
                                                       units[j].count, dtype, reduce,
                                                       /*priority=*/submissions - 1 - j));
      handles.push_back(std::move(h));
    }
    if (common::Trace::enabled()) {
      common::Trace::Span("iterations", "submissions", start, std::chrono::steady_clock::now());
    }
    for (int j = 0; j < submissions; ++j) {
      absl::Status status = handles[j].Wait(std::chrono::milliseconds(flags.op_timeout_ms));
      if (!status.ok()) {
        // A bucket's name starts with the workload's.
        return absl::Status(
            status.code(),
            absl::StrCat(flags.bucket_bytes == 0 ? absl::StrCat(flags.workload_name, " tensor ")
                                                 : std::string(),
                         units[j].name, ": ", status.message()));
      }
      if (common::Trace::enabled() && flags.trace_tensors) {
        // Seen done by this thread, which waits in submission order: an upper bound for all but
        // the tensor it waited on.
        common::Trace::Async(units[j].name, (static_cast<uint64_t>(it + flags.warmup) << 32) | j,
                             start, std::chrono::steady_clock::now(),
                             {{"bytes", static_cast<int64_t>(units[j].count * element)},
                              {"priority", submissions - 1 - j}});
      }
    }
    if (common::Trace::enabled()) {
      common::Trace::Span("iterations", absl::StrCat(flags.workload_name, " iteration ", it), start,
                          std::chrono::steady_clock::now());
    }
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    iteration_ms.push_back(took * 1e3);
    handles.clear();  // outside the timed window, as the vector's destruction was
    if (it < 0) continue;
    seconds += took;
    if (flags.check) {
      for (int j = 0; j < n; ++j) {
        wrong += CountWrong(dtype, op, world, flags.root,
                            static_cast<const std::byte*>(buffer->data()) + offsets[j],
                            tensors[j].count);
      }
    }
  }
  if (rank == 0 && flags.iters > 0) {
    std::printf(
        "# %s: %d tensors%s, %zu bytes, %.1f us per iteration, %zu wrong\n",
        flags.workload_name.c_str(), n,
        flags.bucket_bytes == 0 ? "" : absl::StrCat(" in ", submissions, " buckets").c_str(), total,
        seconds / flags.iters * 1e6, wrong);
    std::printf("# %s iterations (ms, %d warm-up first):%s\n", flags.workload_name.c_str(),
                flags.warmup, absl::StrJoin(iteration_ms, "", [](std::string* out, double ms) {
                                absl::StrAppend(out, " ", absl::SixDigits(ms));
                              }).c_str());
    std::printf("WCSV,%s,%d,%zu,%.3f,%zu\n", flags.workload_name.c_str(), n, total,
                seconds / flags.iters * 1e6, wrong);
    // Steady-clock seconds (CLOCK_MONOTONIC, the suite's time.monotonic()) from the first timed
    // iteration's input fill to the last one's check: the suite meters the hosts' CPU in it.
    const auto secs = [](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double>(t.time_since_epoch()).count();
    };
    std::printf("WTIMED,%.6f,%.6f\n", secs(timed_from), secs(std::chrono::steady_clock::now()));
    std::fflush(stdout);
  }
  if (wrong > 0) {
    return absl::DataLossError(
        absl::StrCat("rank ", rank, ": ", wrong, " wrong elements in ", flags.workload_name));
  }
  return client.Leave();
}

bool IsBlockwise(BenchOp op) { return op == BenchOp::kAllGather || op == BenchOp::kReduceScatter; }

// As nccl-tests: broadcast 1, all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n (their
// algbw is from the whole region's size).
double BusBandwidthFactor(BenchOp op, uint32_t world_size) {
  if (op == BenchOp::kBroadcast || world_size == 0) return 1.0;
  if (IsBlockwise(op)) return static_cast<double>(world_size - 1) / world_size;
  return 2.0 * (world_size - 1) / world_size;
}

absl::Status RunOnce(Client& client, const BenchFlags& flags, BenchOp op, const std::string& name,
                     const SharedBuffer& buffer, size_t count, common::DataType dtype) {
  if (op == BenchOp::kBroadcast) {
    return client.Broadcast(name, buffer, 0, count, dtype, flags.root);
  }
  // `count` is one rank's block.
  if (op == BenchOp::kAllGather) return client.AllGather(name, buffer, 0, count, dtype);
  if (op == BenchOp::kReduceScatter) {
    return client.ReduceScatter(name, buffer, 0, count, dtype, ReduceOp::kSum);
  }
  return client.AllReduce(name, buffer, 0, count, dtype,
                          op == BenchOp::kAverage ? ReduceOp::kAverage : ReduceOp::kSum);
}

absl::Status RunBenchRank(const BenchFlags& flags) {
  ASSIGN_OR_RETURN(std::vector<uint64_t> sizes, ParseSizeList(flags.sizes));
  ASSIGN_OR_RETURN(common::DataType dtype, common::ParseDataType(flags.dtype));
  ASSIGN_OR_RETURN(BenchOp op, ParseBenchOp(flags.op));
  const size_t element = common::DataTypeSize(dtype);
  uint64_t largest = 0;
  for (uint64_t size : sizes) largest = std::max(largest, size / element * element);
  if (largest == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("every size is smaller than one ", flags.dtype, " element"));
  }

  // A workload file is checked before joining: a bad line is reported, not a stuck job.
  std::vector<WorkloadTensor> tensors;
  if (!flags.tensors.empty()) {
    if (op != BenchOp::kSum && op != BenchOp::kAverage) {
      return absl::InvalidArgumentError("--tensors runs all-reduces (--op sum or avg)");
    }
    ASSIGN_OR_RETURN(tensors, ReadTensors(flags.tensors));
  } else if (flags.bucket_bytes > 0) {
    return absl::InvalidArgumentError("--bucket-bytes packs the tensors of --tensors; give one");
  }
  ClientOptions options;
  options.agent_address = flags.agent;
  options.join_timeout = std::chrono::milliseconds(flags.join_timeout_ms);
  options.op_timeout = std::chrono::milliseconds(flags.op_timeout_ms);
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client,
                   Client::Connect(options, flags.job, flags.local_rank, flags.local_size));
  const uint32_t rank = client->global_rank();
  const uint32_t world = client->world_size();
  if (!tensors.empty()) return RunWorkload(*client, flags, tensors, dtype, op);
  if (op == BenchOp::kBroadcast && flags.root >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("--root ", flags.root, " is not below the world size ", world));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<SharedBuffer> buffer, client->AllocateBuffer(largest));

  const bool leader = rank == 0;
  const std::string op_name(BenchOpName(op));
  const std::string type_name(common::DataTypeName(dtype));
  if (leader) {
    std::printf(
        "# tributary bench-rank: job %s, world size %u, dtype %s, op %s, iters %d, "
        "warmup %d, check %s\n#\n",
        flags.job.c_str(), world, type_name.c_str(), op_name.c_str(), flags.iters, flags.warmup,
        flags.check ? "on" : "off");
    std::printf("# %12s %14s %9s %6s %12s %10s %10s %8s\n", "size", "count", "type", "redop",
                "time", "algbw", "busbw", "#wrong");
    std::printf("# %12s %14s %9s %6s %12s %10s %10s %8s\n", "(B)", "(elements)", "", "", "(us)",
                "(GB/s)", "(GB/s)", "");
    std::fflush(stdout);
  }

  size_t total_wrong = 0;
  double busbw_sum = 0;
  int rows = 0;
  // All-gather and reduce-scatter, as nccl-tests: a size is the whole region, world blocks of
  // `count` elements each.
  const uint32_t blocks = IsBlockwise(op) ? world : 1;
  const auto fill = [&](size_t count) {
    if (IsBlockwise(op)) {
      FillBlockwiseInput(dtype, op, rank, world, buffer->data(), count);
    } else {
      FillInput(dtype, rank, buffer->data(), count);
    }
  };
  const auto count_wrong = [&](size_t count) {
    if (IsBlockwise(op)) return CountWrongBlockwise(dtype, op, rank, world, buffer->data(), count);
    return CountWrong(dtype, op, world, flags.root, buffer->data(), count);
  };
  for (uint64_t size : sizes) {
    const size_t count = size / element / blocks;
    if (count == 0) continue;
    const size_t bytes = count * element * blocks;
    const std::string name = absl::StrCat("bench.", bytes);
    for (int i = 0; i < flags.warmup; ++i) {
      fill(count);
      absl::Status status = RunOnce(*client, flags, op, name, *buffer, count, dtype);
      if (!status.ok()) {
        return absl::Status(status.code(), absl::StrCat(name, " warm-up iteration ", i, " on rank ",
                                                        rank, ": ", status.message()));
      }
    }
    double total_seconds = 0;
    size_t wrong = 0;
    for (int i = 0; i < flags.iters; ++i) {
      fill(count);
      const auto start = std::chrono::steady_clock::now();
      absl::Status status = RunOnce(*client, flags, op, name, *buffer, count, dtype);
      total_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!status.ok()) {
        return absl::Status(status.code(), absl::StrCat(name, " iteration ", i, " on rank ", rank,
                                                        ": ", status.message()));
      }
      if (flags.check) wrong += count_wrong(count);
    }
    total_wrong += wrong;
    if (wrong > 0) {
      std::fprintf(stderr, "rank %u: %zu wrong elements at size %zu B\n", rank, wrong, bytes);
    }
    if (leader && flags.iters > 0) {
      const double seconds = total_seconds / flags.iters;
      const double algbw = static_cast<double>(bytes) / seconds / 1e9;
      const double busbw = algbw * BusBandwidthFactor(op, world);
      busbw_sum += busbw;
      ++rows;
      std::printf("  %12zu %14zu %9s %6s %12.1f %10.3f %10.3f %8zu\n", bytes, count * blocks,
                  type_name.c_str(), op_name.c_str(), seconds * 1e6, algbw, busbw, wrong);
      if (flags.csv) {
        std::printf("CSV,%zu,%zu,%s,%s,%.3f,%.6f,%.6f,%zu\n", bytes, count * blocks,
                    type_name.c_str(), op_name.c_str(), seconds * 1e6, algbw, busbw, wrong);
      }
      std::fflush(stdout);
    }
  }
  if (leader) {
    std::printf("# Out of bounds values : %zu %s\n", total_wrong,
                total_wrong == 0 ? "OK" : "FAILED");
    std::printf("# Avg bus bandwidth    : %.3f\n#\n", rows > 0 ? busbw_sum / rows : 0.0);
    std::fflush(stdout);
  }
  if (total_wrong > 0) {
    return absl::DataLossError(
        absl::StrCat("rank ", rank, ": ", total_wrong, " wrong elements in the results"));
  }
  return client->Leave();
}

}  // namespace

void AddBenchRankCommand(CLI::App& app, GlobalOptions& global) {
  CLI::App* command = app.add_subcommand(
      "bench-rank",
      "one process of a collective benchmark sweep through the local agent (start one per rank; "
      "global rank 0 prints the table; with --csv also lines "
      "CSV,size,count,type,op,time_us,algbw,busbw,wrong)");
  auto flags = std::make_shared<BenchFlags>();
  command->add_option("--agent", flags->agent, "agent address, unix:PATH")->capture_default_str();
  command->add_option("--job", flags->job, "job id")->required();
  command->add_option("--local-rank", flags->local_rank, "this process's rank on the node")
      ->capture_default_str();
  command->add_option("--local-size", flags->local_size, "processes of the job on this node")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--sizes", flags->sizes,
                   "MIN:MAX (powers of 2 from MIN to MAX) or a list like 1K,3,1M")
      ->capture_default_str()
      ->check(ByteSizeList());
  command
      ->add_option("--dtype", flags->dtype, "float32, float64, float16, bfloat16, int32 or int64")
      ->capture_default_str();
  command->add_option("--iters", flags->iters, "timed iterations per size")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command->add_option("--warmup", flags->warmup, "untimed iterations per size first")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command
      ->add_option("--op", flags->op,
                   "sum, avg, bcast, allgather or reduce-scatter (sum; for these two a size is "
                   "the whole region of world-size blocks, busbw (n-1)/n x algbw as nccl-tests)")
      ->capture_default_str();
  command->add_option("--root", flags->root, "broadcast root (global rank)")->capture_default_str();
  command->add_flag("--check,!--no-check", flags->check,
                    "check every element after every timed iteration (default on)");
  command->add_flag("--csv", flags->csv, "also print CSV lines");
  command
      ->add_option("--join-timeout-ms", flags->join_timeout_ms,
                   "how long to retry joining the job, ms")
      ->capture_default_str();
  command->add_option("--tensors", flags->tensors,
                      "run a model's gradient list instead of --sizes: a file of \"name count\" "
                      "lines in backward order, all submitted at once with priorities");
  command->add_option("--workload-name", flags->workload_name, "name printed with --tensors")
      ->capture_default_str();
  command
      ->add_option("--bucket-bytes", flags->bucket_bytes,
                   "with --tensors: pack the tensors in file order into DDP-style buckets of at "
                   "most this many bytes (a larger tensor alone) and all-reduce each bucket, all "
                   "at once with priorities, first layers first, as the tensors (0: each tensor "
                   "on its own; the agent fuses the small ones)")
      ->capture_default_str();
  command
      ->add_option("--op-timeout-ms", flags->op_timeout_ms,
                   "how long to wait for one collective, ms")
      ->capture_default_str();
  command->add_option("--trace", flags->trace,
                      "write a Chrome trace (chrome://tracing, ui.perfetto.dev) of every iteration "
                      "and tensor to this file (\"{pid}\" in it: this process's id)");
  command
      ->add_flag("--trace-tensors,!--no-trace-tensors", flags->trace_tensors,
                 "with --trace and --tensors, a span per tensor (--no-trace-tensors: the "
                 "iterations and submissions only; a tensor's span costs the waiting thread a "
                 "trace write before it sees the next completion)")
      ->capture_default_str();
  SetAction(command, global, [flags]() -> absl::Status {
    if (flags->trace.empty()) return RunBenchRank(*flags);
    std::string path = flags->trace;
    if (size_t at = path.find("{pid}"); at != std::string::npos) {
      path.replace(at, 5, std::to_string(getpid()));
    }
    RETURN_IF_ERROR(common::Trace::Start(path, absl::StrCat("bench-rank ", flags->job)));
    absl::Status status = RunBenchRank(*flags);
    absl::Status stopped = common::Trace::Stop();
    return status.ok() ? stopped : status;
  });
}

}  // namespace tributary::client::cli
