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
//
// collectives_bench hd-pipelining [rate_mbit] [max_bytes] [partition_bytes]: halving-doubling
// with and without its sub-chunk pipelining (CollectiveEngine::SetHalvingDoublingPipelined), side
// by side, for n = 4 and 8 and sizes 64 KiB .. max_bytes (default 64 MiB), each rank's egress
// paced to rate_mbit (default 1000; 0: not paced, memcpy speed) by PacedTransport, partitions of
// partition_bytes (default 64 KiB). The two modes alternate iteration by iteration (so drift on
// a shared machine hits both); medians are printed with the line-rate bound 2(n-1)/n * S / B.
//
// collectives_bench gather-scatter [rate_mbit] [max_bytes]: all-gather, reduce-scatter and
// all-reduce of the same buffer (256 KiB .. max_bytes, default 16 MiB), ring and
// halving-doubling, n = 4 and 8, egress paced to rate_mbit (default 1000; 0: not paced), with the
// line-rate bound (n-1)/n * S / B (x2 for the all-reduce) and nccl-tests' busbw.
//
// collectives_bench transports [ranks] [max_bytes]: the data plane's two network transports side
// by side over loopback, TcpTransport and UcxTransport (UCX_TLS=tcp, UCX_NET_DEVICES=lo unless
// set): `ranks` (default 4) DataPlaneNodes per transport, each on its own transport instance
// (real sockets, one progress thread each), every rank a worker and a summation server (k = 0),
// ring and push/pull, float32 sums of 4 KiB .. max_bytes (default 64 MiB), partition 512 KiB,
// no bundling. The transports alternate iteration by iteration (so drift on a shared machine hits
// both); medians. All ranks share this machine's cores: the figures compare the transports'
// costs (syscalls, copies, progress), not a NIC.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/logging.h"
#include "dataplane/collectives/algorithm_selector.h"
#include "dataplane/collectives/data_plane_node.h"
#include "dataplane/reduce/cpu/cpu_reducer.h"
#include "dataplane/transport/inprocess/inprocess_transport.h"
#include "dataplane/transport/paced/paced_transport.h"
#include "dataplane/transport/tcp/tcp_transport.h"
#include "dataplane/transport/ucx/ucx_transport.h"
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

// ---------------------------------------------------------------------------------------------
// Halving-doubling, pipelined or not, over paced links

// n halving-doubling ranks, each a DataPlaneNode on an in-process endpoint whose egress is paced
// to `bytes_per_s` (0: not paced).
class PacedRanks {
 public:
  PacedRanks(int n, double bytes_per_s, uint64_t partition_bytes) : reducer_(1) {
    JobView view;
    view.job_id = "hd";
    view.plan_version = 1;
    view.partition_bytes = partition_bytes;
    view.op_timeout = std::chrono::milliseconds(600000);
    for (int i = 0; i < n; ++i) view.worker_addresses.push_back(absl::StrCat("hd-", i));
    view.server_addresses = view.worker_addresses;
    for (int i = 0; i < n; ++i) view.server_weights.push_back((uint64_t{1} << 32) / n);
    view.server_weights[0] += (uint64_t{1} << 32) % n;
    for (int i = 0; i < n; ++i) {
      std::unique_ptr<Transport> t = network_.CreateEndpoint(view.worker_addresses[i]);
      if (bytes_per_s > 0) t = std::make_unique<PacedTransport>(std::move(t), bytes_per_s);
      transports_.push_back(std::move(t));
      nodes_.push_back(std::make_unique<DataPlaneNode>(transports_.back().get(), &reducer_,
                                                       common::SystemClock::Get()));
      view.my_worker_rank = i;
      view.my_server_index = i;
      nodes_.back()->SetJob(view, Algorithm::kHalvingDoubling);
    }
  }
  ~PacedRanks() {
    for (auto& t : transports_) t->Shutdown();
  }

  // Seconds of one float32 sum over `bufs`, every rank pipelined or not.
  double Time(bool pipelined, std::vector<std::vector<std::byte>>& bufs, uint64_t count) {
    const int n = static_cast<int>(nodes_.size());
    for (auto& node : nodes_) node->engine().SetHalvingDoublingPipelined(pipelined);
    std::vector<std::promise<absl::Status>> promises(n);
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < n; ++r) {
      Operation op;
      op.tensor_name = "t";
      op.iteration = iteration_;
      op.dtype = common::DataType::kFloat32;
      op.count = count;
      op.buffers = {bufs[r].data()};
      op.done = [p = &promises[r]](absl::Status st) { p->set_value(std::move(st)); };
      absl::Status s = nodes_[r]->engine().Post("hd", Algorithm::kHalvingDoubling, std::move(op));
      if (!s.ok()) promises[r].set_value(s);
    }
    for (auto& p : promises) {
      absl::Status s = p.get_future().get();
      if (!s.ok()) {
        std::fprintf(stderr, "all-reduce failed: %s\n", s.ToString().c_str());
        std::exit(1);
      }
    }
    ++iteration_;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // Seconds of one float32 `reduction` by `algorithm` (posted to the engine: no selection) over
  // `bufs`; `count` is the whole buffer, cut into n blocks for all-gather and reduce-scatter.
  double TimeOp(Algorithm algorithm, Reduction reduction, std::vector<std::vector<std::byte>>& bufs,
                uint64_t count) {
    const int n = static_cast<int>(nodes_.size());
    std::vector<std::promise<absl::Status>> promises(n);
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < n; ++r) {
      Operation op;
      op.tensor_name = "t";
      op.iteration = iteration_;
      op.dtype = common::DataType::kFloat32;
      op.count = IsBlockwise(reduction) ? count / n : count;
      op.reduction = reduction;
      op.buffers = {bufs[r].data()};
      op.done = [p = &promises[r]](absl::Status st) { p->set_value(std::move(st)); };
      absl::Status s = nodes_[r]->engine().Post("hd", algorithm, std::move(op));
      if (!s.ok()) promises[r].set_value(s);
    }
    for (auto& p : promises) {
      absl::Status s = p.get_future().get();
      if (!s.ok()) {
        std::fprintf(stderr, "%s failed: %s\n", std::string(ReductionName(reduction)).c_str(),
                     s.ToString().c_str());
        std::exit(1);
      }
    }
    ++iteration_;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  CpuReducer reducer_;
  InProcessNetwork network_;
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<std::unique_ptr<DataPlaneNode>> nodes_;
  uint64_t iteration_ = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

int HalvingDoublingPipelining(int argc, char** argv) {
  const double rate_mbit = argc > 2 ? std::strtod(argv[2], nullptr) : 1000;
  const uint64_t max_bytes = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 64 << 20;
  const uint64_t partition_bytes = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 64 << 10;
  const double bytes_per_s = rate_mbit * 1e6 / 8;
  std::printf(
      "# halving-doubling, float32 sum, ranks as threads over the in-process transport, egress "
      "%s, partition %llu KiB, %u hardware threads\n",
      rate_mbit > 0 ? absl::StrCat("paced to ", rate_mbit, " Mbit/s per rank").c_str()
                    : "not paced",
      static_cast<unsigned long long>(partition_bytes >> 10), std::thread::hardware_concurrency());
  std::printf(
      "# plain: every step after the whole previous one; pipelined: sub-chunk by sub-chunk. "
      "Medians; bound = 2(n-1)/n * S / rate\n");
  std::printf("%3s %10s %6s %11s %11s %13s %9s %11s %14s\n", "n", "bytes", "iters", "bound_ms",
              "plain_ms", "pipelined_ms", "speedup", "plain/bound", "pipelined/bound");
  for (int n : {4, 8}) {
    PacedRanks ranks(n, bytes_per_s, partition_bytes);
    for (uint64_t bytes = 64 << 10; bytes <= max_bytes; bytes *= 4) {
      const uint64_t count = bytes / 4;
      std::vector<std::vector<std::byte>> bufs(n, std::vector<std::byte>(bytes));
      const int iters = static_cast<int>(std::clamp<uint64_t>((256ull << 20) / bytes, 3, 30));
      ranks.Time(true, bufs, count);  // warm-up
      ranks.Time(false, bufs, count);
      std::vector<double> plain, piped;
      for (int i = 0; i < iters; ++i) {
        plain.push_back(ranks.Time(false, bufs, count));
        piped.push_back(ranks.Time(true, bufs, count));
      }
      const double bound = rate_mbit > 0 ? 2.0 * (n - 1) / n * bytes / bytes_per_s : 0;
      const double a = Median(plain);
      const double b = Median(piped);
      std::printf("%3d %10llu %6d %11.2f %11.2f %13.2f %9.3f %11s %14s\n", n,
                  static_cast<unsigned long long>(bytes), iters, bound * 1e3, a * 1e3, b * 1e3,
                  a / b, bound > 0 ? absl::StrFormat("%.3f", a / bound).c_str() : "-",
                  bound > 0 ? absl::StrFormat("%.3f", b / bound).c_str() : "-");
      std::fflush(stdout);
    }
  }
  return 0;
}

// All-gather and reduce-scatter against the all-reduce of the same buffer, ring and
// halving-doubling, n = 4 and 8, over paced links: each of the two halves should take about half
// of the all-reduce's time, (n-1)/n * S / rate (the bound) on a network-bound link.
int GatherScatter(int argc, char** argv) {
  const double rate_mbit = argc > 2 ? std::strtod(argv[2], nullptr) : 1000;
  const uint64_t max_bytes = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 16 << 20;
  const uint64_t partition_bytes = 64 << 10;
  const double bytes_per_s = rate_mbit * 1e6 / 8;
  std::printf(
      "# float32, ranks as threads over the in-process transport, egress %s, partition %llu KiB, "
      "%u hardware threads\n",
      rate_mbit > 0 ? absl::StrCat("paced to ", rate_mbit, " Mbit/s per rank").c_str()
                    : "not paced",
      static_cast<unsigned long long>(partition_bytes >> 10), std::thread::hardware_concurrency());
  std::printf(
      "# bytes = the whole buffer S (all-gather / reduce-scatter: n blocks of S/n); medians; "
      "bound = (n-1)/n * S / rate (x2 for allreduce); busbw = algbw * (n-1)/n (x2 for "
      "allreduce), as nccl-tests\n");
  std::printf("%3s %-17s %-18s %10s %6s %10s %10s %9s %11s\n", "n", "algorithm", "op", "bytes",
              "iters", "bound_ms", "median_ms", "/bound", "busbw_GB/s");
  for (int n : {4, 8}) {
    PacedRanks ranks(n, bytes_per_s, partition_bytes);
    for (uint64_t bytes = 256 << 10; bytes <= max_bytes; bytes *= 4) {
      const uint64_t count = bytes / 4;
      std::vector<std::vector<std::byte>> bufs(n, std::vector<std::byte>(bytes));
      const int iters = static_cast<int>(std::clamp<uint64_t>((128ull << 20) / bytes, 3, 20));
      for (Algorithm alg : {Algorithm::kRing, Algorithm::kHalvingDoubling}) {
        for (Reduction red :
             {Reduction::kAllGather, Reduction::kReduceScatterSum, Reduction::kSum}) {
          ranks.TimeOp(alg, red, bufs, count);  // warm-up
          std::vector<double> t;
          for (int i = 0; i < iters; ++i) t.push_back(ranks.TimeOp(alg, red, bufs, count));
          const double factor = (red == Reduction::kSum ? 2.0 : 1.0) * (n - 1) / n;
          const double bound = rate_mbit > 0 ? factor * bytes / bytes_per_s : 0;
          const double m = Median(t);
          std::printf(
              "%3d %-17s %-18s %10llu %6d %10.2f %10.2f %9s %11.3f\n", n,
              std::string(AlgorithmName(alg)).c_str(),
              red == Reduction::kSum ? "allreduce" : std::string(ReductionName(red)).c_str(),
              static_cast<unsigned long long>(bytes), iters, bound * 1e3, m * 1e3,
              bound > 0 ? absl::StrFormat("%.3f", m / bound).c_str() : "-",
              bytes / m / 1e9 * factor);
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// TCP vs UCX over loopback

// n ranks, each a DataPlaneNode on its own network transport from `make`; every rank a worker
// and a server with equal shares.
class NetworkRanks {
 public:
  NetworkRanks(int n, const std::function<std::unique_ptr<Transport>()>& make,
               uint64_t partition_bytes)
      : reducer_(1) {
    JobView view;
    view.job_id = "net";
    view.plan_version = 1;
    view.partition_bytes = partition_bytes;
    view.credit_bytes = 16 << 20;
    view.op_timeout = std::chrono::milliseconds(600000);
    for (int i = 0; i < n; ++i) {
      transports_.push_back(make());
      view.worker_addresses.push_back(transports_.back()->Address());
    }
    view.server_addresses = view.worker_addresses;
    for (int i = 0; i < n; ++i) view.server_weights.push_back((uint64_t{1} << 32) / n);
    view.server_weights[0] += (uint64_t{1} << 32) % n;
    for (int i = 0; i < n; ++i) {
      nodes_.push_back(std::make_unique<DataPlaneNode>(transports_[i].get(), &reducer_,
                                                       common::SystemClock::Get()));
      view.my_worker_rank = i;
      view.my_server_index = i;
      nodes_.back()->SetJob(view, Algorithm::kAuto);
    }
  }
  ~NetworkRanks() {
    for (auto& t : transports_) t->Shutdown();
  }

  // Seconds of one float32 sum of `bufs` by `algorithm` (posted to its implementation).
  double Time(Algorithm algorithm, std::vector<std::vector<std::byte>>& bufs, uint64_t count) {
    const int n = static_cast<int>(nodes_.size());
    std::vector<std::promise<absl::Status>> promises(n);
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < n; ++r) {
      Operation op;
      op.tensor_name = "t";
      op.iteration = iteration_;
      op.dtype = common::DataType::kFloat32;
      op.count = count;
      op.buffers = {bufs[r].data()};
      op.done = [p = &promises[r]](absl::Status st) { p->set_value(std::move(st)); };
      CollectiveAlgorithm& impl = algorithm == Algorithm::kPushPull
                                      ? static_cast<CollectiveAlgorithm&>(nodes_[r]->push_pull())
                                      : nodes_[r]->engine();
      absl::Status s = impl.Post("net", algorithm, std::move(op));
      if (!s.ok()) promises[r].set_value(s);
    }
    for (auto& p : promises) {
      absl::Status s = p.get_future().get();
      if (!s.ok()) {
        std::fprintf(stderr, "all-reduce failed: %s\n", s.ToString().c_str());
        std::exit(1);
      }
    }
    ++iteration_;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  CpuReducer reducer_;
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<std::unique_ptr<DataPlaneNode>> nodes_;
  uint64_t iteration_ = 0;
};

int Transports(int argc, char** argv) {
  const int n = argc > 2 ? std::atoi(argv[2]) : 4;
  const uint64_t max_bytes = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 64 << 20;
  setenv("UCX_NET_DEVICES", "lo", 0);
  setenv("UCX_TLS", "tcp", 0);
  common::InitLogging("warn");  // Not the connections' info lines at shutdown.
  auto tcp = [] {
    absl::StatusOr<std::unique_ptr<TcpTransport>> t = TcpTransport::Create({});
    if (!t.ok()) {
      std::fprintf(stderr, "tcp transport: %s\n", t.status().ToString().c_str());
      std::exit(1);
    }
    return std::unique_ptr<Transport>(*std::move(t));
  };
  auto ucx = [] {
    absl::StatusOr<std::unique_ptr<UcxTransport>> t = UcxTransport::Create({});
    if (!t.ok()) {
      std::fprintf(stderr, "ucx transport: %s\n", t.status().ToString().c_str());
      std::exit(1);
    }
    return std::unique_ptr<Transport>(*std::move(t));
  };
  NetworkRanks tcp_ranks(n, tcp, kPartitionBytes);
  NetworkRanks ucx_ranks(n, ucx, kPartitionBytes);
  std::printf(
      "# %d ranks per transport over loopback (UCX_TLS=%s), float32 sum, k = 0, partition %llu "
      "KiB, no bundling, %u hardware threads; medians, transports alternating\n",
      n, std::getenv("UCX_TLS"), static_cast<unsigned long long>(kPartitionBytes >> 10),
      std::thread::hardware_concurrency());
  std::printf("%10s  %-10s %6s %10s %10s %12s %12s %9s\n", "bytes", "algorithm", "iters", "tcp_us",
              "ucx_us", "tcp_busbw", "ucx_busbw", "ucx/tcp");
  for (uint64_t bytes = 4 << 10; bytes <= max_bytes; bytes *= 4) {
    const uint64_t count = bytes / 4;
    std::vector<std::vector<std::byte>> bufs(n, std::vector<std::byte>(bytes));
    const int iters = static_cast<int>(std::clamp<uint64_t>((256ull << 20) / bytes, 5, 50));
    for (Algorithm alg : {Algorithm::kRing, Algorithm::kPushPull}) {
      tcp_ranks.Time(alg, bufs, count);  // warm-up (and connections)
      ucx_ranks.Time(alg, bufs, count);
      std::vector<double> t_tcp, t_ucx;
      for (int i = 0; i < iters; ++i) {
        t_tcp.push_back(tcp_ranks.Time(alg, bufs, count));
        t_ucx.push_back(ucx_ranks.Time(alg, bufs, count));
      }
      const double a = Median(t_tcp);
      const double b = Median(t_ucx);
      const double bus = 2.0 * (n - 1) / n * bytes / 1e9;  // GB moved per rank, as nccl-tests
      std::printf("%10llu  %-10s %6d %10.1f %10.1f %12.3f %12.3f %9.3f\n",
                  static_cast<unsigned long long>(bytes), std::string(AlgorithmName(alg)).c_str(),
                  iters, a * 1e6, b * 1e6, bus / a, bus / b, b / a);
      std::fflush(stdout);
    }
  }
  return 0;
}

int Main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "hd-pipelining") {
    return HalvingDoublingPipelining(argc, argv);
  }
  if (argc > 1 && std::string(argv[1]) == "gather-scatter") return GatherScatter(argc, argv);
  if (argc > 1 && std::string(argv[1]) == "transports") return Transports(argc, argv);
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
