// gloo_allreduce_peer: one rank of an nccl-tests-style Gloo all-reduce sweep (float32 sum, every
// element checked after every timed iteration) over gloo::transport::tcp; ranks meet through a
// FileStore in a shared folder. Rank 0 prints the table and CSV lines (see peer_common.h).
//
//   gloo_allreduce_peer --rank R --size N --store-dir DIR [--hostname IP | --iface DEV]
//       [--algorithm ring|ring_chunked|hd|bcube] [--sizes 4K:256M] [--iters N] ...
//       [--tensors FILE [--bucket-bytes 25M] [--workload-name NAME]]   (ring or hd)
//
// Algorithms: ring = gloo::allreduce() with Algorithm::RING (the segmented ring PyTorch uses;
// 1 MiB segments), ring_chunked = gloo::AllreduceRingChunked, hd =
// gloo::AllreduceHalvingDoubling, bcube = gloo::allreduce() with Algorithm::BCUBE.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gloo/allreduce.h"
#include "gloo/allreduce_halving_doubling.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/barrier.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"
#include "peer_common.h"

namespace {

using tributary::bench::PeerFlags;

// Tags of the peer's own barriers, apart from the collectives' (which count up from 0).
constexpr uint32_t kStepBarrierTag = 1u << 30;         // between iterations, sizes
constexpr uint32_t kFinalBarrierTag = (1u << 30) + 1;  // before any rank tears down

void Barrier(const std::shared_ptr<gloo::rendezvous::Context>& context, uint32_t tag) {
  gloo::BarrierOptions barrier(context);
  barrier.setTag(tag);
  gloo::barrier(barrier);
}

// The DDP-style workload (see peer_common.h): one all-reduce per bucket, in backward order.
int RunWorkload(const PeerFlags& f, const std::shared_ptr<gloo::rendezvous::Context>& context,
                int rank, int world) {
  std::vector<std::unique_ptr<gloo::Algorithm>> hd;  // one per bucket (they register buffers)
  uint32_t tag = 0;
  const tributary::bench::WorkloadResult r = tributary::bench::RunBucketedWorkload(
      f, rank, world,
      [&](size_t, float* data, size_t count) {
        if (f.algorithm != "hd") return;
        std::vector<float*> ptrs{data};
        hd.push_back(std::make_unique<gloo::AllreduceHalvingDoubling<float>>(context, ptrs, count));
      },
      [&] { Barrier(context, kStepBarrierTag); },
      [&](size_t i, float* data, size_t count) {
        if (!hd.empty()) {
          hd[i]->run();
          return;
        }
        gloo::AllreduceOptions opts(context);
        opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        opts.setOutput(data, count);
        void (*sum)(void*, const void*, const void*, size_t) = &gloo::sum<float>;
        opts.setReduceFunction(sum);
        opts.setTag(tag++);
        gloo::allreduce(opts);
      });
  // No rank tears down (the halving-doubling algorithms, the context) while another still runs
  // its last collective: a closed connection is an error to a peer whose pair still reads
  // (session 28's suite lost one Gloo halving-doubling run in three so).
  Barrier(context, kFinalBarrierTag);
  if (!r.ok) {
    std::fprintf(stderr, "gloo_allreduce_peer: cannot read %s\n", f.tensors.c_str());
    return 2;
  }
  if (rank == 0 && f.iters > 0) {
    tributary::bench::PrintWorkload(f.workload_name, r, f.warmup, r.wrong);
  }
  if (r.wrong > 0) std::fprintf(stderr, "rank %d: %zu wrong elements\n", rank, r.wrong);
  return r.wrong == 0 ? 0 : 1;
}

int Run(int argc, char** argv) {
  PeerFlags f;
  f.algorithm = "ring";
  int rank = -1, world = 0;
  std::string store_dir, hostname, iface;
  const bool ok = tributary::bench::ParsePeerFlags(
      argc, argv, f, [&](const std::string& flag, const std::string& value) {
        if (flag == "--rank")
          rank = std::atoi(value.c_str());
        else if (flag == "--size")
          world = std::atoi(value.c_str());
        else if (flag == "--store-dir")
          store_dir = value;
        else if (flag == "--hostname")
          hostname = value;
        else if (flag == "--iface")
          iface = value;
        else
          return false;
        return true;
      });
  if (!ok || rank < 0 || world <= 0 || rank >= world || store_dir.empty() ||
      (f.algorithm != "ring" && f.algorithm != "ring_chunked" && f.algorithm != "hd" &&
       f.algorithm != "bcube")) {
    std::fprintf(stderr,
                 "usage: gloo_allreduce_peer --rank R --size N --store-dir DIR [--hostname IP | "
                 "--iface DEV] [--algorithm ring|ring_chunked|hd|bcube] [--sizes 4K:256M] "
                 "[--iters N] [--warmup N] [--large-iters N] [--large-from 16M] [--no-check]\n");
    return 2;
  }
  gloo::transport::tcp::attr attr;
  if (!hostname.empty()) attr.hostname = hostname;
  if (!iface.empty()) attr.iface = iface;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(store_dir);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
  context->setTimeout(std::chrono::seconds(300));
  context->connectFullMesh(store, device);

  if (!f.tensors.empty()) return RunWorkload(f, context, rank, world);
  // The sweep's one collective: the class algorithms are built per size (they register their
  // buffer once), gloo::allreduce takes options per call.
  std::unique_ptr<gloo::Algorithm> algorithm;
  uint32_t tag = 0;
  const size_t total_wrong = tributary::bench::RunSizeSweep(
      f, rank, world, "Gloo",
      [&](float* data, size_t count) {
        std::vector<float*> ptrs{data};
        algorithm.reset();
        if (f.algorithm == "hd") {
          algorithm = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(context, ptrs, count);
        } else if (f.algorithm == "ring_chunked") {
          algorithm = std::make_unique<gloo::AllreduceRingChunked<float>>(context, ptrs, count);
        }
        tag = 0;
      },
      [&](float* data, size_t count) {
        if (algorithm) {
          algorithm->run();
          return;
        }
        gloo::AllreduceOptions opts(context);
        opts.setAlgorithm(f.algorithm == "bcube" ? gloo::AllreduceOptions::Algorithm::BCUBE
                                                 : gloo::AllreduceOptions::Algorithm::RING);
        opts.setOutput(data, count);
        void (*sum)(void*, const void*, const void*, size_t) = &gloo::sum<float>;
        opts.setReduceFunction(sum);
        opts.setTag(tag++);
        gloo::allreduce(opts);
      },
      [](size_t wrong) { return wrong; },  // Rank 0 reports its own.
      [&] {
        // Keep ranks in step between sizes (the class algorithms' pairs are per instance).
        Barrier(context, kStepBarrierTag);
      });
  Barrier(context, kFinalBarrierTag);
  if (rank == 0)
    std::printf("# wrong elements on rank 0: %zu %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {  // Gloo reports errors as exceptions (gloo::IoException).
    std::fprintf(stderr, "gloo_allreduce_peer: %s\n", e.what());
    return 1;
  }
}
