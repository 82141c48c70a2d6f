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
      tributary::bench::PrintWorkload(f.workload_name, r, f.warmup, all_wrong);
    }
    MPI_Finalize();
    return all_wrong == 0 ? 0 : 1;
  }
  const size_t total_wrong = tributary::bench::RunSizeSweep(
      f, rank, world, "MPI", [](float*, size_t) {},
      [](float* data, size_t count) {
        MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
      },
      [](size_t wrong) {
        unsigned long long all_wrong = wrong, local = wrong;
        MPI_Reduce(&local, &all_wrong, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        return static_cast<size_t>(all_wrong);
      },
      [] {});
  if (rank == 0)
    std::printf("# wrong elements: %zu %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
  MPI_Finalize();
  return total_wrong == 0 ? 0 : 1;
}
