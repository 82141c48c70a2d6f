// mpi_allreduce_peer: an nccl-tests-style MPI_Allreduce sweep (float32 sum, every element checked
// after every timed iteration). Rank 0 prints the table and CSV lines (see peer_common.h).
// The algorithm is Open MPI's choice unless forced with MCA parameters on the command line, e.g.
// --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4 (ring).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "peer_common.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  tributary::bench::PeerFlags f;
  f.algorithm = "default";
  if (!tributary::bench::ParsePeerFlags(argc, argv, f, [](auto&, auto&) { return false; })) {
    if (rank == 0) {
      std::fprintf(stderr,
                   "usage: mpi_allreduce_peer [--sizes 4K:256M] [--iters N] [--warmup N] "
                   "[--large-iters N] [--large-from 16M] [--algorithm LABEL] [--no-check]\n");
    }
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (!f.tensors.empty()) {
    const tributary::bench::WorkloadResult r = tributary::bench::RunBucketedWorkload(
        f, rank, world, [](size_t, float*, size_t) {}, [] { MPI_Barrier(MPI_COMM_WORLD); },
        [](size_t, float* data, size_t count) {
          MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                        MPI_COMM_WORLD);
        });
    if (!r.ok) {
      if (rank == 0)
        std::fprintf(stderr, "mpi_allreduce_peer: cannot read %s\n", f.tensors.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    unsigned long long all_wrong = r.wrong, local = r.wrong;
    MPI_Reduce(&local, &all_wrong, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0 && f.iters > 0) {
      tributary::bench::PrintWorkload(f.workload_name, r.tensors, r.buckets, r.bytes, r.seconds,
                                      all_wrong);
    }
    MPI_Finalize();
    return all_wrong == 0 ? 0 : 1;
  }
  const auto sizes = tributary::bench::ParseSizes(f.sizes);
  uint64_t largest = 0;
  for (auto s : sizes) largest = std::max(largest, s);
  std::vector<float> buffer(largest / sizeof(float));
  if (rank == 0) tributary::bench::PrintHeader("MPI", f.algorithm, world);
  size_t total_wrong = 0;
  for (uint64_t size : sizes) {
    const size_t count = size / sizeof(float);
    if (count == 0) continue;
    const int iters = size >= f.large_from ? f.large_iters : f.iters;
    for (int i = 0; i < f.warmup; ++i) {
      tributary::bench::Fill(buffer.data(), count, rank);
      MPI_Allreduce(MPI_IN_PLACE, buffer.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    }
    double seconds = 0;
    size_t wrong = 0;
    for (int i = 0; i < iters; ++i) {
      tributary::bench::Fill(buffer.data(), count, rank);
      const double start = tributary::bench::Now();
      MPI_Allreduce(MPI_IN_PLACE, buffer.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      seconds += tributary::bench::Now() - start;
      if (f.check) wrong += tributary::bench::CountWrong(buffer.data(), count, world);
    }
    unsigned long long all_wrong = wrong, local = wrong;
    MPI_Reduce(&local, &all_wrong, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    total_wrong += all_wrong;
    if (rank == 0 && iters > 0) {
      tributary::bench::PrintRow(count * sizeof(float), count, seconds / iters, world, all_wrong);
    }
  }
  if (rank == 0)
    std::printf("# wrong elements: %zu %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
  MPI_Finalize();
  return total_wrong == 0 ? 0 : 1;
}
