// GPU tensors through pinned staging (dataplane/staging) against the copy engine's own ceiling.
//
// On CUDA device 0, a tensor of --mib MiB in device memory:
//  * the ceilings: one cudaMemcpyAsync of the whole tensor device -> pinned host (D2H) and pinned
//    host -> device (H2D) on the engine's stream (the PCIe/NVLink-C2C rate the pipeline can
//    reach at best);
//  * StagingPipeline::Send (device -> slots -> sink) and Receive (source -> slots -> device)
//    for chunk sizes 256 KiB .. 16 MiB and 2 or 4 slots, with two kinds of network side:
//    "instant" (the sink releases / the source fills at once: the pipeline's own overhead per
//    chunk) and "memcpy" (a thread copies each chunk between the slot and a plain host buffer,
//    like a TCP stack copying into its socket buffers: the overlap of the GPU copy with the
//    host-side work). Next to each "memcpy" row, the time the same work takes serially (the
//    whole D2H, then the whole host copy) and the pipeline's speed-up over it.
// Times are the best of --reps after one warm-up; GB/s = tensor bytes per second.
//
// Flags (bench/cuda_bench_flags.h): --mib N (default 256), --reps N (default 5), --device N.
// Without a CUDA device it prints why and exits 77 (scripts/gpu_check.sh reports "skipped").
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "bench/cuda_bench_flags.h"
#include "dataplane/cuda/cuda_status.h"
#include "dataplane/staging/cuda_copy_engine.h"
#include "dataplane/staging/staging_pipeline.h"

namespace tributary::dataplane {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const absl::Status& s) {
  std::fprintf(stderr, "cuda_staging_bench: %s\n", s.ToString().c_str());
  std::exit(1);
}
void Check(const absl::Status& s) {
  if (!s.ok()) Die(s);
}
void Check(cudaError_t e, const char* call) { Check(cuda::CudaStatus(e, call)); }

// The "network" side of the memcpy rows: one thread that runs queued jobs in order.
class Worker {
 public:
  Worker() : thread_([this] { Run(); }) {}
  ~Worker() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void Post(std::function<void()> job) {
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  void Run() {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

template <typename F>
double BestSeconds(int reps, F&& run) {
  run();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

int Main(int argc, char** argv) {
  bench::CudaBenchFlags flags{.reps = 5};
  if (std::optional<int> exit = bench::ParseCudaBenchFlags(
          argc, argv, "GPU tensors through pinned staging against one whole-tensor copy", flags)) {
    return *exit;
  }
  const size_t mib = flags.mib;
  const int reps = flags.reps, device = flags.device;
  absl::StatusOr<std::unique_ptr<CudaCopyEngine>> engine = CudaCopyEngine::Create(device);
  if (!engine.ok()) {
    std::fprintf(stderr, "cuda_staging_bench needs a CUDA device: %s\n",
                 engine.status().ToString().c_str());
    return engine.status().code() == absl::StatusCode::kFailedPrecondition ? 77 : 1;
  }
  Check(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  const size_t bytes = mib << 20;
  void* tensor = nullptr;
  Check(cudaMalloc(&tensor, bytes), "cudaMalloc");
  Check(cudaMemset(tensor, 1, bytes), "cudaMemset");
  absl::StatusOr<StagingMemory> whole = (*engine)->AllocateStaging(bytes);
  Check(whole.status());
  std::vector<unsigned char> network(bytes, 2);  // The "socket buffers": plain pageable memory.

  const double d2h = BestSeconds(reps, [&] {
    Check((*engine)->CopyAsync(whole->data(), tensor, bytes));
    Check((*engine)->Synchronize());
  });
  const double h2d = BestSeconds(reps, [&] {
    Check((*engine)->CopyAsync(tensor, whole->data(), bytes));
    Check((*engine)->Synchronize());
  });
  const double host_copy =
      BestSeconds(reps, [&] { std::memcpy(network.data(), whole->data(), bytes); });
  auto gbs = [&](double s) { return bytes / s / 1e9; };
  std::printf("device %d: %s; tensor %zu MiB, best of %d; GB/s = tensor bytes per second\n", device,
              prop.name, mib, reps);
  std::printf(
      "ceilings: D2H %.1f GB/s, H2D %.1f GB/s (one cudaMemcpyAsync, pinned); host memcpy "
      "pinned -> pageable %.1f GB/s\n",
      gbs(d2h), gbs(h2d), gbs(host_copy));
  std::printf("%-8s %-8s %9s %5s %9s %8s %9s %9s\n", "dir", "network", "chunk", "slots", "time_ms",
              "GB/s", "vs_copy", "vs_serial");

  const auto timeout = std::chrono::seconds(60);
  for (const bool memcpy_side : {false, true}) {
    for (const size_t chunk :
         {size_t{256} << 10, size_t{1} << 20, size_t{4} << 20, size_t{16} << 20}) {
      for (const int slots : {2, 4}) {
        absl::StatusOr<std::unique_ptr<StagingPipeline>> pipeline =
            StagingPipeline::Create(**engine, {.chunk_bytes = chunk, .slots = slots});
        Check(pipeline.status());
        Worker worker;
        const double send = BestSeconds(reps, [&] {
          Check((*pipeline)->Send(
              tensor, bytes,
              [&](const StagingPipeline::Chunk& c, absl::AnyInvocable<void()> release) {
                if (!memcpy_side) {
                  release();
                  return;
                }
                worker.Post(
                    [&network, c,
                     release = std::make_shared<absl::AnyInvocable<void()>>(std::move(release))] {
                      std::memcpy(network.data() + c.offset, c.host, c.bytes);
                      (*release)();
                    });
              },
              timeout));
        });
        const double receive = BestSeconds(reps, [&] {
          Check((*pipeline)->Receive(
              tensor, bytes,
              [&](const StagingPipeline::Chunk& c, absl::AnyInvocable<void(absl::Status)> filled) {
                if (!memcpy_side) {
                  filled(absl::OkStatus());
                  return;
                }
                worker.Post([&network, c,
                             filled = std::make_shared<absl::AnyInvocable<void(absl::Status)>>(
                                 std::move(filled))] {
                  std::memcpy(c.host, network.data() + c.offset, c.bytes);
                  (*filled)(absl::OkStatus());
                });
              },
              timeout));
        });
        const struct {
          const char* dir;
          double seconds, ceiling;
        } rows[] = {{"send", send, d2h}, {"receive", receive, h2d}};
        for (const auto& row : rows) {
          const double serial = row.ceiling + host_copy;
          char vs_serial[16] = "-";
          if (memcpy_side)
            std::snprintf(vs_serial, sizeof(vs_serial), "%.2fx", serial / row.seconds);
          std::printf("%-8s %-8s %8zuK %5d %9.2f %8.1f %9.3f %9s\n", row.dir,
                      memcpy_side ? "memcpy" : "instant", chunk >> 10, slots, row.seconds * 1e3,
                      gbs(row.seconds), row.ceiling / row.seconds, vs_serial);
        }
      }
    }
  }
  cudaFree(tensor);
  return 0;
}

}  // namespace
}  // namespace tributary::dataplane

int main(int argc, char** argv) { return tributary::dataplane::Main(argc, argv); }
