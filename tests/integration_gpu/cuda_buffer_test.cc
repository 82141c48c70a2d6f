// End to end with CUDA buffers (label `gpu`; skipped without a CUDA device): a controller and
// two worker agents as real processes; on agent A two training processes (threads of this
// test) with cudaMalloc'd tensors registered by CUDA IPC, on agent B one with a CUDA tensor and
// one with shared memory. All-reduce sum of every dtype (exact integer-valued inputs) and a
// broadcast, every element checked on every rank, bytes outside the region untouched. Then the
// same with the worker agents reporting a DGX-1V's topology, so that the controller plans the
// NVLink-rooted strategy for the job's two GPUs on each node: agent A sums its two CUDA tensors
// on the GPU (the executor's two "GPUs" on the one device there may be) and only the root's
// share crosses to host memory; agent B, with a shared-memory rank, takes the copies' path. And
// with a BytePS PCIe server's topology: the two GPUs under one switch (CPU-assisted: summed on
// the leader's GPU) and under two (host staging: each through its own mirror, by the executor).
//
// The binaries it starts come from $TRIBUTARY_BIN_DIR when set (a copied folder of binaries on
// a GPU machine), else from this build's bin/.
#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/bench_data.h"
#include "client/client.h"
#include "client/cluster/local_cluster.h"
#include "common/dtype.h"
#include "dataplane/cuda/cuda_status.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace tributary {
namespace {

using client::cli::BenchOp;
using namespace std::chrono_literals;

constexpr uint32_t kProcsPerNode = 2;
constexpr uint32_t kWorld = 2 * kProcsPerNode;
// Elements per tensor: many 64 KiB chunks for every dtype.
constexpr size_t kCount = 100003;
// The region starts this far into the allocation; the bytes before it must stay untouched.
constexpr size_t kOffset = 256;
constexpr unsigned char kSentinel = 0xA5;

std::string BinDir() {
  const char* dir = std::getenv("TRIBUTARY_BIN_DIR");
  return dir != nullptr && *dir != '\0' ? dir : TRIBUTARY_BIN_DIR;
}

class CudaBufferClusterTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(StartCluster(0, {})); }

  void StartCluster(int spares, std::vector<std::string> agent_args) {
    absl::StatusOr<int> devices = dataplane::cuda::CudaDeviceCount();
    if (!devices.ok()) GTEST_SKIP() << devices.status().message();
    client::LocalClusterOptions o;
    o.bin_dir = BinDir();
    o.workers = 2;
    o.spares = spares;
    o.agent_args = std::move(agent_args);
    o.nic_gbps = {10};
    o.sum_gbps = 4;
    o.heartbeat_timeout = 30s;
    auto c = client::LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status() << " (binaries from " << o.bin_dir
                        << "; set TRIBUTARY_BIN_DIR to the folder of tributary-controller and "
                           "tributary-agent)";
    cluster_ = *std::move(c);
    ASSERT_NO_FATAL_FAILURE(CreateJob("cuda", 30000));
  }

  void CreateJob(const std::string& id, int op_timeout_ms,
                 tributary::v1::Algorithm algorithm = tributary::v1::ALGORITHM_AUTO) {
    tributary::v1::CreateJobRequest req;
    req.set_job_id(id);
    req.mutable_spec()->set_algorithm(algorithm);
    for (const std::string& node : cluster_->worker_node_ids()) {
      req.mutable_spec()->add_worker_nodes(node);
    }
    req.mutable_spec()->set_procs_per_node(kProcsPerNode);
    req.mutable_spec()->set_partition_bytes(64 << 10);
    req.mutable_spec()->set_op_timeout_ms(op_timeout_ms);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    tributary::v1::Job job;
    grpc::Status s = cluster_->controller().CreateJob(&ctx, req, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  std::unique_ptr<client::LocalCluster> cluster_;
};

// One training process: node `node`, local rank `local`; a CUDA tensor unless `shared_memory`.
// Returns what went wrong ("" when every element of every collective was right).
std::string RunRank(const client::LocalCluster& cluster, int node, uint32_t local,
                    bool shared_memory, const std::string& job = "cuda", size_t count = kCount) {
  client::ClientOptions options;
  options.agent_address = cluster.agent_address(node);
  options.join_timeout = 20000ms;
  auto connected = client::Client::Connect(options, job, local, kProcsPerNode);
  if (!connected.ok()) return absl::StrCat("connect: ", connected.status().ToString());
  std::unique_ptr<client::Client> c = *std::move(connected);
  const uint32_t rank = c->global_rank();
  const std::string who =
      absl::StrCat("rank ", rank, shared_memory ? " (shared memory)" : " (CUDA)");
  if (c->world_size() != kWorld) return absl::StrCat(who, ": world size ", c->world_size());

  const size_t bytes = kOffset + count * sizeof(double);
  void* device = nullptr;
  cudaStream_t stream = nullptr;
  std::shared_ptr<client::SharedBuffer> buffer;
  if (shared_memory) {
    auto b = c->AllocateBuffer(bytes);
    if (!b.ok()) return absl::StrCat(who, ": AllocateBuffer: ", b.status().ToString());
    buffer = *std::move(b);
  } else {
    if (cudaSetDevice(0) != cudaSuccess || cudaMalloc(&device, bytes) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
      return absl::StrCat(who, ": cudaMalloc/cudaStreamCreate failed");
    }
    // The caller's writes go on `stream`; the registration orders the agent's copies after them.
    auto b = c->RegisterCudaBuffer(device, bytes, 0, stream);
    if (!b.ok()) {
      cudaFree(device);
      return absl::StrCat(who, ": RegisterCudaBuffer: ", b.status().ToString());
    }
    buffer = *std::move(b);
  }
  std::vector<unsigned char> host(bytes);
  // Writes `host` into the buffer (asynchronously on the stream for CUDA, not synchronized:
  // the ready event orders the agent's copy) and reads the result back.
  auto put = [&]() -> bool {
    if (shared_memory) {
      std::memcpy(buffer->data(), host.data(), bytes);
      return true;
    }
    return cudaMemcpyAsync(device, host.data(), bytes, cudaMemcpyHostToDevice, stream) ==
           cudaSuccess;
  };
  auto get = [&]() -> bool {
    if (shared_memory) {
      std::memcpy(host.data(), buffer->data(), bytes);
      return true;
    }
    return cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost) == cudaSuccess;
  };

  std::string error;
  for (int iteration = 0; iteration < 2 && error.empty(); ++iteration) {
    for (common::DataType dtype : common::kAllDataTypes) {
      const std::string what = absl::StrCat(who, " iteration ", iteration, " ",
                                            std::string(common::DataTypeName(dtype)));
      std::memset(host.data(), kSentinel, bytes);
      client::cli::FillInput(dtype, rank, host.data() + kOffset, count);
      if (!put()) return absl::StrCat(what, ": copy to the device failed");
      auto handle = c->AllReduceAsync("sum." + std::string(common::DataTypeName(dtype)), *buffer,
                                      kOffset, count, dtype, client::ReduceOp::kSum);
      if (!handle.ok()) return absl::StrCat(what, ": submit: ", handle.status().ToString());
      if (absl::Status s = handle->Wait(60000ms); !s.ok()) {
        return absl::StrCat(what, ": ", s.ToString());
      }
      if (!get()) return absl::StrCat(what, ": copy from the device failed");
      const size_t wrong =
          client::cli::CountWrong(dtype, BenchOp::kSum, kWorld, 0, host.data() + kOffset, count);
      if (wrong != 0) return absl::StrCat(what, ": ", wrong, " wrong elements of ", count);
      for (size_t i = 0; i < kOffset; ++i) {
        if (host[i] != kSentinel) return absl::StrCat(what, ": byte ", i, " before the region");
      }
    }
    // A broadcast from rank 1 (a CUDA rank on node A).
    std::memset(host.data(), kSentinel, bytes);
    client::cli::FillInput(common::DataType::kFloat32, rank, host.data() + kOffset, count);
    if (!put()) return absl::StrCat(who, ": copy to the device failed");
    if (absl::Status s = c->Broadcast("bcast", *buffer, kOffset, count, common::DataType::kFloat32,
                                      /*root_rank=*/1);
        !s.ok()) {
      return absl::StrCat(who, " broadcast: ", s.ToString());
    }
    if (!get()) return absl::StrCat(who, ": copy from the device failed");
    const size_t wrong = client::cli::CountWrong(common::DataType::kFloat32, BenchOp::kBroadcast,
                                                 kWorld, 1, host.data() + kOffset, count);
    if (wrong != 0) error = absl::StrCat(who, " broadcast: ", wrong, " wrong elements");
  }
  buffer.reset();  // unregisters it before the allocation goes
  if (device != nullptr) {
    cudaStreamDestroy(stream);
    cudaFree(device);
  }
  return error;
}

// Every rank of both nodes at once (RunRank); node B's local rank 1 uses shared memory: CUDA and
// shared-memory buffers in one gather. Returns what went wrong.
std::vector<std::string> RunAllRanks(const client::LocalCluster& cluster,
                                     const std::string& job = "cuda", size_t count = kCount) {
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<std::thread> ranks;
  for (int node = 0; node < 2; ++node) {
    for (uint32_t local = 0; local < kProcsPerNode; ++local) {
      const bool shared_memory = node == 1 && local == 1;
      ranks.emplace_back([&, node, local, shared_memory] {
        std::string e = RunRank(cluster, node, local, shared_memory, job, count);
        if (!e.empty()) {
          std::lock_guard lock(mu);
          errors.push_back(e);
        }
      });
    }
  }
  for (auto& t : ranks) t.join();
  return errors;
}

TEST_F(CudaBufferClusterTest, AllReduceOfCudaTensorsIsExactOnEveryRank) {
  for (const std::string& e : RunAllRanks(*cluster_)) ADD_FAILURE() << e;
}

TEST(CudaIntraNodePlanTest, TheAgentSumsItsGpuTensorsOnTheGpusAsPlanned) {
  absl::StatusOr<int> devices = dataplane::cuda::CudaDeviceCount();
  if (!devices.ok()) GTEST_SKIP() << devices.status().message();
  // The fixtures where this build put them, or under the working directory (a packed build run
  // from the repository's root on another machine).
  std::string fixtures = TRIBUTARY_TOPOLOGY_FIXTURES;
  if (!std::filesystem::exists(fixtures)) fixtures = "tests/topology/fixtures";
  struct Case {
    std::string topology;
    std::vector<int> gpus;
    std::string strategy;
  };
  for (const Case& c :
       std::vector<Case>{{"dgx1v_nccl_topo.xml", {0, 1}, "nvlink-rooted-outside-nic-switch"},
                         {"byteps_pcie_server.yaml", {0, 1}, "cpu-assisted-per-switch"},
                         {"byteps_pcie_server.yaml", {0, 4}, "host-staging"}}) {
    SCOPED_TRACE(c.strategy);
    const std::string run_dir = ::testing::TempDir() + "tributary_cuda_intranode";
    std::filesystem::remove_all(run_dir);
    std::filesystem::create_directories(run_dir);
    client::LocalClusterOptions o;
    o.bin_dir = BinDir();
    o.run_dir = run_dir;
    o.workers = 2;
    o.nic_gbps = {10};
    o.sum_gbps = 4;
    o.heartbeat_timeout = 30s;
    o.log_level = "info";
    o.worker_topology_file = fixtures + "/" + c.topology;
    auto started = client::LocalCluster::Start(o);
    ASSERT_TRUE(started.ok()) << started.status();
    std::unique_ptr<client::LocalCluster> cluster = *std::move(started);
    tributary::v1::CreateJobRequest req;
    req.set_job_id("cuda");
    for (const std::string& node : cluster->worker_node_ids()) {
      req.mutable_spec()->add_worker_nodes(node);
    }
    req.mutable_spec()->set_procs_per_node(kProcsPerNode);
    for (int g : c.gpus) req.mutable_spec()->add_gpus(g);
    req.mutable_spec()->set_partition_bytes(64 << 10);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    tributary::v1::Job job;
    grpc::Status s = cluster->controller().CreateJob(&ctx, req, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_GE(job.plan().intra_node_size(), 1);
    EXPECT_EQ(job.plan().intra_node(0).strategy(), c.strategy);

    for (const std::string& e : RunAllRanks(*cluster)) ADD_FAILURE() << e;
    auto log_of = [&](int node) {
      std::ifstream in(run_dir + "/" + cluster->node_id(node) + ".log");
      std::stringstream text;
      text << in.rdbuf();
      return text.str();
    };
    const std::string a = log_of(0), b = log_of(1);
    EXPECT_NE(a.find("the node's GPU tensors are summed on the GPUs (" + c.strategy),
              std::string::npos)
        << a;
    EXPECT_EQ(b.find("summed on the GPUs"), std::string::npos) << b;
    cluster->Stop();
    std::filesystem::remove_all(run_dir);
  }
}

// The agent's copy of a CUDA buffer waits for the process's GPU work before the submit with the
// job's op deadline: rank 0's stream is held by a host function that does not return (a stuck
// kernel), so its agent fails the collective by the deadline, every rank gets an error, and
// once the stream moves on the next collective is exact.
// Rank 0's GPU work before its submit never finishes (until released): the collective fails on
// every rank within the op deadline, rank 0's error saying why, and the next one is exact.
void RunStuck(const client::LocalCluster& cluster, const std::string& job, size_t count) {
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
  } gate;
  std::mutex mu;
  std::vector<std::string> errors;
  auto error = [&](std::string e) {
    std::lock_guard lock(mu);
    errors.push_back(std::move(e));
  };
  std::vector<std::thread> ranks;
  for (int node = 0; node < 2; ++node) {
    for (uint32_t local = 0; local < kProcsPerNode; ++local) {
      ranks.emplace_back([&, node, local] {
        client::ClientOptions options;
        options.agent_address = cluster.agent_address(node);
        options.join_timeout = 20000ms;
        auto c = client::Client::Connect(options, job, local, kProcsPerNode);
        if (!c.ok()) return error(absl::StrCat("connect: ", c.status().ToString()));
        const uint32_t rank = (*c)->global_rank();
        const bool stuck = rank == 0;
        const size_t bytes = count * sizeof(float);
        void* device = nullptr;
        cudaStream_t stream = nullptr;
        std::shared_ptr<client::SharedBuffer> buffer;
        if (stuck) {
          if (cudaSetDevice(0) != cudaSuccess || cudaMalloc(&device, bytes) != cudaSuccess ||
              cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
            return error("rank 0: cudaMalloc/cudaStreamCreate failed");
          }
          auto b = (*c)->RegisterCudaBuffer(device, bytes, 0, stream);
          if (!b.ok()) return error(absl::StrCat("rank 0: ", b.status().ToString()));
          buffer = *std::move(b);
        } else {
          auto b = (*c)->AllocateBuffer(bytes);
          if (!b.ok()) return error(absl::StrCat("rank ", rank, ": ", b.status().ToString()));
          buffer = *std::move(b);
        }
        std::vector<unsigned char> host(bytes);
        auto fill = [&] {
          client::cli::FillInput(common::DataType::kFloat32, rank, host.data(), count);
          if (stuck) return cudaMemcpy(device, host.data(), bytes, cudaMemcpyHostToDevice);
          std::memcpy(buffer->data(), host.data(), bytes);
          return cudaSuccess;
        };
        if (fill() != cudaSuccess) return error("rank 0: copy to the device failed");
        if (stuck) {
          // Work on the stream that does not finish until the gate opens (at most 20 s).
          cudaLaunchHostFunc(
              stream,
              [](void* p) {
                Gate& g = *static_cast<Gate*>(p);
                std::unique_lock lock(g.mu);
                g.cv.wait_for(lock, 20s, [&] { return g.open; });
              },
              &gate);
        }
        const auto start = std::chrono::steady_clock::now();
        absl::Status first = (*c)->AllReduce("t", *buffer, 0, count, common::DataType::kFloat32,
                                             client::ReduceOp::kSum);
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (first.ok()) error(absl::StrCat("rank ", rank, ": the stuck collective succeeded"));
        if (seconds > 10) error(absl::StrCat("rank ", rank, ": failed after ", seconds, " s"));
        if (stuck &&
            (first.code() != absl::StatusCode::kDeadlineExceeded ||
             first.message().find("is a kernel of the process stuck?") == std::string::npos)) {
          error(absl::StrCat("rank 0: ", first.ToString()));
        }
        if (stuck) {
          {
            std::lock_guard lock(gate.mu);
            gate.open = true;
          }
          gate.cv.notify_all();
          if (cudaStreamSynchronize(stream) != cudaSuccess) return error("rank 0: stream failed");
        }
        // The next iteration of the same tensor is exact on every rank.
        if (fill() != cudaSuccess) return error("rank 0: copy to the device failed");
        absl::Status again = (*c)->AllReduce("t", *buffer, 0, count, common::DataType::kFloat32,
                                             client::ReduceOp::kSum);
        if (!again.ok()) {
          error(absl::StrCat("rank ", rank, " after the stuck one: ", again.ToString()));
        } else {
          if (stuck) {
            cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost);
          } else {
            std::memcpy(host.data(), buffer->data(), bytes);
          }
          const size_t wrong = client::cli::CountWrong(common::DataType::kFloat32, BenchOp::kSum,
                                                       kWorld, 0, host.data(), count);
          if (wrong != 0) error(absl::StrCat("rank ", rank, ": ", wrong, " wrong elements"));
        }
        buffer.reset();
        if (device != nullptr) {
          cudaStreamDestroy(stream);
          cudaFree(device);
        }
      });
    }
  }
  for (auto& t : ranks) t.join();
  {
    std::lock_guard lock(gate.mu);
    gate.open = true;  // Whatever happened, nothing stays stuck.
  }
  gate.cv.notify_all();
  for (const std::string& e : errors) ADD_FAILURE() << e;
}

TEST_F(CudaBufferClusterTest, StuckGpuWorkBeforeASubmitFailsTheCollectiveByTheDeadline) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("cuda-stuck", 1500));
  RunStuck(*cluster_, "cuda-stuck", kCount);
}

// GPU tensors larger than the staging chunk are copied in and back chunk by chunk while the
// collective runs (agent/mirror_stager.h): push/pull sends each chunk as its input arrives; ring
// waits for the whole input. 1 MiB chunks; a spare summation host.
class CudaStreamedClusterTest : public CudaBufferClusterTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartCluster(1, {"--staging-chunk-kib", "1024"}));
  }
};

// 12 MiB of float64 (3 MiB of 16-bit types): many chunks, and an odd element count.
constexpr size_t kStreamedCount = 1572869;

TEST_F(CudaStreamedClusterTest, PushPullSumsOfCudaTensorsStreamedThroughHostAreExact) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("cuda-pp", 30000, tributary::v1::ALGORITHM_PUSH_PULL));
  for (const std::string& e : RunAllRanks(*cluster_, "cuda-pp", kStreamedCount)) {
    ADD_FAILURE() << e;
  }
}

TEST_F(CudaStreamedClusterTest, RingWaitsForTheWholeStreamedInputAndIsExact) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("cuda-ring", 30000, tributary::v1::ALGORITHM_RING));
  for (const std::string& e : RunAllRanks(*cluster_, "cuda-ring", kStreamedCount)) {
    ADD_FAILURE() << e;
  }
}

TEST_F(CudaStreamedClusterTest, StuckGpuWorkFailsAStreamedPushPullByTheDeadline) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("cuda-pp-stuck", 1500, tributary::v1::ALGORITHM_PUSH_PULL));
  RunStuck(*cluster_, "cuda-pp-stuck", kStreamedCount);
}

}  // namespace
}  // namespace tributary
