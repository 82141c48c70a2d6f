// All-reduce throughput of ring, halving-doubling and push/pull for 8 ranks as threads of one
// process over the in-process transport. Prints one row per (size, algorithm): mean time per
// all-reduce, algbw = M / t and busbw = algbw * 2(n-1)/n (the nccl-tests convention).
//
// What the numbers show: the relative protocol costs (messages, steps, pipelining, summation) of
// the three algorithms on one machine. What they do not show: network behaviour. The in-process
// transport copies every message (a memcpy on the sender's thread) and all 8 ranks share this
// machine's cores and memory bandwidth, so absolute bandwidths are those of memcpy + summation
// on a few cores, not of a NIC; the selector's thresholds must be calibrated on a real cluster.
//
// Usage: collectives_bench [max_bytes] (default 16 MiB).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "dataplane/collectives/algorithm_selector.h"
#include "dataplane/collectives/data_plane_node.h"
#include "tests/util/cluster_harness.h"

namespace tributary::dataplane {
namespace {

constexpr int kRanks = 8;
constexpr uint64_t kPartitionBytes = 512 << 10;

// Starts one all-reduce on every rank and waits for all of them.
using StartFn = std::function<absl::Status(int rank, uint64_t iteration, std::byte* buffer,
                                           uint64_t count, std::function<void(absl::Status)>)>;

double TimeOne(const StartFn& start, std::vector<std::vector<std::byte>>& bufs, uint64_t count,
               uint64_t iteration) {
  std::vector<std::promise<absl::Status>> promises(kRanks);
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < kRanks; ++r) {
    absl::Status s = start(r, iteration, bufs[r].data(), count,
                           [p = &promises[r]](absl::Status st) { p->set_value(std::move(st)); });
    if (!s.ok()) {
      std::fprintf(stderr, "start failed: %s\n", s.ToString().c_str());
      std::exit(1);
    }
  }
  for (auto& p : promises) {
    absl::Status s = p.get_future().get();
    if (!s.ok()) {
      std::fprintf(stderr, "all-reduce failed: %s\n", s.ToString().c_str());
      std::exit(1);
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int Main(int argc, char** argv) {
  const uint64_t max_bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 16 << 20;
  // Every rank is a worker and a summation server (k = 0, equal shares); the reducer uses one
  // thread per call: the rank's own (transport) thread.
  testing::ClusterOptions options;
  options.workers = kRanks;
  options.job_id = "bench";
  options.partition_bytes = kPartitionBytes;
  options.credit_bytes = 16 << 20;
  options.op_timeout = std::chrono::milliseconds(60000);
  options.clock = common::SystemClock::Get();
  testing::Cluster cluster(options);

  // Each algorithm posted straight to its implementation: no selection, no fallback.
  const auto start_with = [&](Algorithm alg) {
    return [&, alg](int r, uint64_t it, std::byte* buf, uint64_t count,
                    std::function<void(absl::Status)> done) {
      Operation op;
      op.tensor_name = "t";
      op.iteration = it;
      op.dtype = common::DataType::kFloat32;
      op.count = count;
      op.buffers = {buf};
      op.done = std::move(done);
      CollectiveAlgorithm& impl =
          alg == Algorithm::kPushPull
              ? static_cast<CollectiveAlgorithm&>(cluster.node(r).push_pull())
              : cluster.node(r).engine();
      return impl.Post("bench", alg, std::move(op));
    };
  };
  struct Candidate {
    Algorithm alg;
    StartFn start;
  };
  const std::vector<Candidate> candidates = {
      {Algorithm::kRing, start_with(Algorithm::kRing)},
      {Algorithm::kHalvingDoubling, start_with(Algorithm::kHalvingDoubling)},
      {Algorithm::kPushPull, start_with(Algorithm::kPushPull)}};
  const SelectorThresholds model = ModelThresholds(kRanks, 0);

  std::printf(
      "# %d ranks (threads) over the in-process transport, float32 sum, partition %llu KiB,"
      " %u hardware threads\n",
      kRanks, static_cast<unsigned long long>(kPartitionBytes >> 10),
      std::thread::hardware_concurrency());
  std::printf("# model-based selector (n=%d, k=0): halving_doubling below %llu bytes, else ring\n",
              kRanks, static_cast<unsigned long long>(model.halving_doubling_below));
  std::printf("%10s  %-17s %6s %12s %12s %12s  %s\n", "bytes", "algorithm", "iters", "time_us",
              "algbw_GB/s", "busbw_GB/s", "model_pick");
  uint64_t iteration = 0;
  for (uint64_t bytes = 4 << 10; bytes <= max_bytes; bytes *= 4) {
    const uint64_t count = bytes / 4;
    std::vector<std::vector<std::byte>> bufs(kRanks, std::vector<std::byte>(bytes));
    const int iters = static_cast<int>(std::clamp<uint64_t>((64ull << 20) / bytes, 3, 50));
    for (const Candidate& c : candidates) {
      TimeOne(c.start, bufs, count, iteration++);  // warm-up
      double total = 0;
      for (int i = 0; i < iters; ++i) total += TimeOne(c.start, bufs, count, iteration++);
      const double t = total / iters;
      const double algbw = bytes / t / 1e9;
      const double busbw = algbw * 2 * (kRanks - 1) / kRanks;
      std::printf("%10llu  %-17s %6d %12.1f %12.3f %12.3f  %s\n",
                  static_cast<unsigned long long>(bytes), std::string(AlgorithmName(c.alg)).c_str(),
                  iters, t * 1e6, algbw, busbw, Select(bytes, kRanks, model) == c.alg ? "*" : "");
    }
  }
  return 0;
}

}  // namespace
}  // namespace tributary::dataplane

int main(int argc, char** argv) { return tributary::dataplane::Main(argc, argv); }
