// The flags the CUDA benchmarks share (cuda_reduce_bench, cuda_staging_bench,
// cuda_intranode_bench), parsed by CLI11.
#pragma once

#include <cstddef>
#include <optional>

#include "CLI/CLI.hpp"

namespace tributary::bench {

struct CudaBenchFlags {
  size_t mib = 256;  // each buffer's size
  int reps = 20;     // timed repetitions (best of), after one warm-up
  int device = 0;    // CUDA device ordinal
  int gpus = 0;      // cuda_intranode_bench: "GPUs" (0: every device, or 4 on one device)
};

// Parses --mib, --reps and --device (and --gpus with `with_gpus`) into `flags` (its values are
// the defaults). Returns the exit code when the program should stop (--help: 0; a bad flag or
// value: the message and a non-zero code), nullopt to go on.
inline std::optional<int> ParseCudaBenchFlags(int argc, char** argv, const char* description,
                                              CudaBenchFlags& flags, bool with_gpus = false) {
  CLI::App app{description};
  app.add_option("--mib", flags.mib, "size of each buffer in MiB")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  app.add_option("--reps", flags.reps, "timed repetitions, best of (after one warm-up)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--device", flags.device, "CUDA device ordinal")
      ->capture_default_str()
      ->check(CLI::Range(0, 1023));
  if (with_gpus) {
    app.add_option("--gpus", flags.gpus,
                   "GPUs of the node (0: every device, or 4 on the one device there is)")
        ->capture_default_str()
        ->check(CLI::Range(0, 64));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return std::nullopt;
}

}  // namespace tributary::bench
