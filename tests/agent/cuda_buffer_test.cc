// CUDA buffers at the agent without a GPU: RegisterCudaBuffer's refusals (an agent built
// without CUDA, a machine without a device, malformed records) leave the agent serving; the
// staging of mirrored buffers (copy in before the data plane starts, copy back before the
// handle completes, failures) with a fake mirror in place of CUDA; MirrorStager.
#include "agent/cuda_buffer.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/fake_collective_runner.h"
#include "agent/gpu_aggregation.h"
#include "agent/local_service.h"
#include "agent/mirror_stager.h"
#include "common/status_macros.h"
#include "dataplane/intranode/host_gpu_ops.h"
#include "dataplane/reduce/cpu/scalar_reducer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/shm_test_util.h"

namespace tributary::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ScopedShm;
using ::testing::StartsWith;
using namespace std::chrono_literals;

// dataplane/cuda/cuda_ipc.cc's record: magic, version 1, device, offset, bytes, two 64-byte
// handles (zero: no allocation of any process).
std::string Record(uint64_t bytes, int32_t device = 0, const char* magic = "TRBCUIPC") {
  std::string r(magic, 8);
  const uint32_t version = 1;
  const uint64_t offset = 0;
  r.append(reinterpret_cast<const char*>(&version), 4);
  r.append(reinterpret_cast<const char*>(&device), 4);
  r.append(reinterpret_cast<const char*>(&offset), 8);
  r.append(reinterpret_cast<const char*>(&bytes), 8);
  r.append(128, '\0');
  return r;
}

// A "device" buffer in host memory behind a host mirror, recording the copies.
class FakeMirror final : public MirroredMemory {
 public:
  struct Shared {
    std::mutex mu;
    std::vector<float> device;
    std::vector<std::string> copies;  // "in 0 64", "out 0 64", "ready"
    absl::Status fail_in, fail_out;
    // Offer `device` as GPU memory on `ordinal` (device_data, WaitReady), for the intra-node
    // executors; `host` is the mirror's memory once made.
    bool gpu = false;
    int ordinal = 0;
    std::byte* host = nullptr;
  };
  FakeMirror(std::shared_ptr<Shared> shared)
      : shared_(std::move(shared)), host_(shared_->device.size()) {
    shared_->host = host();
  }
  void* device_data() const override {
    return shared_->gpu ? static_cast<void*>(shared_->device.data()) : nullptr;
  }
  int device() const override { return shared_->gpu ? shared_->ordinal : -1; }
  absl::Status WaitReady(std::chrono::milliseconds) override {
    std::lock_guard lock(shared_->mu);
    shared_->copies.push_back("ready");
    return absl::OkStatus();
  }
  std::byte* host() const override { return reinterpret_cast<std::byte*>(host_.data()); }
  uint64_t size() const override { return host_.size() * sizeof(float); }
  absl::Status CopyIn(uint64_t offset, uint64_t bytes, std::chrono::milliseconds) override {
    std::lock_guard lock(shared_->mu);
    shared_->copies.push_back("in " + std::to_string(offset) + " " + std::to_string(bytes));
    if (!shared_->fail_in.ok()) return shared_->fail_in;
    std::memcpy(host() + offset, reinterpret_cast<std::byte*>(shared_->device.data()) + offset,
                bytes);
    return absl::OkStatus();
  }
  absl::Status CopyOut(uint64_t offset, uint64_t bytes, std::chrono::milliseconds) override {
    std::lock_guard lock(shared_->mu);
    shared_->copies.push_back("out " + std::to_string(offset) + " " + std::to_string(bytes));
    if (!shared_->fail_out.ok()) return shared_->fail_out;
    std::memcpy(reinterpret_cast<std::byte*>(shared_->device.data()) + offset, host() + offset,
                bytes);
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<Shared> shared_;
  mutable std::vector<float> host_;
};

LocalJob OneNodeTwoProcs() {
  return LocalJob{.job_id = "job",
                  .plan_version = 1,
                  .node_rank = 0,
                  .num_nodes = 1,
                  .procs_per_node = 2,
                  .op_timeout = 1000ms,
                  .down_workers = {}};
}

class CudaBufferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_.SetJobs({OneNodeTwoProcs()});
    for (uint32_t r = 0; r < 2; ++r) {
      tributary::v1::JoinJobRequest req;
      req.set_job_id("job");
      req.set_local_rank(r);
      req.set_local_size(2);
      tributary::v1::JoinJobResponse resp;
      ASSERT_TRUE(service_.Join(req, &resp).ok());
      sessions_.push_back(resp.session_id());
    }
  }
  absl::StatusOr<uint64_t> RegisterCuda(const std::string& session, const std::string& record) {
    tributary::v1::RegisterCudaBufferRequest req;
    req.set_session_id(session);
    req.set_record(record);
    return service_.RegisterCudaBuffer(req);
  }
  // Makes RegisterCudaBuffer open fake mirrors of `shared`.
  void UseFakeMirror(std::shared_ptr<FakeMirror::Shared> shared) {
    service_.SetCudaImporterForTest(
        [shared](const std::string&,
                 const std::string& what) -> absl::StatusOr<std::shared_ptr<SharedMemoryMapping>> {
          return std::make_shared<SharedMemoryMapping>(what, std::make_unique<FakeMirror>(shared));
        });
  }
  absl::StatusOr<uint64_t> Submit(const std::string& session, uint64_t buffer, uint64_t count,
                                  uint64_t offset = 0) {
    tributary::v1::SubmitRequest req;
    req.set_session_id(session);
    req.set_tensor_name("t");
    req.set_buffer_id(buffer);
    req.set_offset_bytes(offset);
    req.set_count(count);
    req.set_dtype(tributary::v1::DATA_TYPE_FLOAT32);
    req.set_op(tributary::v1::COLLECTIVE_OP_SUM);
    tributary::v1::SubmitResponse resp;
    RETURN_IF_ERROR(service_.Submit(req, &resp));
    return resp.handle();
  }
  // Polls the handle until it is done (the staging thread completes it), up to 5 s.
  absl::StatusOr<absl::Status> Result(const std::string& session, uint64_t handle) {
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < deadline) {
      absl::Status status;
      bool done = false;
      service_.Await(session, handle, 0, [&](const absl::Status& s, bool d) {
        status = s;
        done = d;
      });
      if (done) return status;
      std::this_thread::sleep_for(1ms);
    }
    return absl::DeadlineExceededError("the operation did not complete within 5 s");
  }

  common::FakeClock clock_;
  FakeCollectiveRunner runner_;
  LocalService service_{&runner_, &clock_};
  std::vector<std::string> sessions_;
};

TEST_F(CudaBufferTest, RegistrationIsRefusedWithoutCudaOrADeviceAndTheAgentKeepsServing) {
  absl::StatusOr<uint64_t> id = RegisterCuda(sessions_[0], Record(1024));
  if (AgentHasCuda()) {
    // A well-formed record: without a device FAILED_PRECONDITION "no CUDA device"; with one the
    // zero handle is no allocation (the runtime's error).
    ASSERT_FALSE(id.ok());
    if (id.status().code() == absl::StatusCode::kFailedPrecondition) {
      EXPECT_THAT(id.status().message(), HasSubstr("no CUDA device"));
    }
  } else {
    EXPECT_EQ(id.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(id.status().message(), HasSubstr("this agent was built without CUDA"));
  }
  // An unknown session is NOT_FOUND before anything is opened.
  EXPECT_EQ(RegisterCuda("no-such-session", Record(1024)).status().code(),
            absl::StatusCode::kNotFound);

  // The service goes on: a shared-memory buffer registers and a collective runs on it.
  runner_.CompleteOnStart(true);
  ScopedShm shm0(64), shm1(64);
  for (int i = 0; i < 16; ++i) {
    shm0.as<float>()[i] = static_cast<float>(i);
    shm1.as<float>()[i] = 100.0f;
  }
  auto b0 = testing::RegisterShm(service_, sessions_[0], shm0);
  auto b1 = testing::RegisterShm(service_, sessions_[1], shm1);
  ASSERT_TRUE(b0.ok() && b1.ok());
  auto h0 = Submit(sessions_[0], *b0, 16);
  auto h1 = Submit(sessions_[1], *b1, 16);
  ASSERT_TRUE(h0.ok() && h1.ok());
  auto r0 = Result(sessions_[0], *h0);
  ASSERT_TRUE(r0.ok());
  EXPECT_TRUE(r0->ok()) << *r0;
  for (int i = 0; i < 16; ++i) EXPECT_EQ(shm0.as<float>()[i], 100.0f + i) << i;
}

TEST_F(CudaBufferTest, MalformedRecordsAreInvalidArgument) {
  if (!AgentHasCuda())
    GTEST_SKIP() << "this agent was built without CUDA (every record is refused)";
  for (const std::string& bad :
       {std::string(), std::string(159, 'x'), Record(1024).substr(0, 100) + std::string(61, '\0'),
        Record(1024, 0, "NOTCUIPC"), Record(0), Record(1024, -1)}) {
    absl::StatusOr<uint64_t> id = RegisterCuda(sessions_[0], bad);
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << id.status();
    EXPECT_THAT(id.status().message(), HasSubstr("CUDA buffer of session"));
  }
  // And the next good record is judged on its own.
  absl::StatusOr<uint64_t> id = RegisterCuda(sessions_[0], Record(1024));
  EXPECT_NE(id.status().code(), absl::StatusCode::kInvalidArgument) << id.status();
}

TEST_F(CudaBufferTest, MirroredRegionsAreCopiedInBeforeTheStartAndBackBeforeTheHandle) {
  auto device = std::make_shared<FakeMirror::Shared>();
  device->device.assign(32, 0.0f);
  for (int i = 0; i < 32; ++i) device->device[i] = static_cast<float>(i);
  UseFakeMirror(device);
  auto cuda = RegisterCuda(sessions_[0], "any record");
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  ScopedShm shm(128);
  for (int i = 0; i < 32; ++i) shm.as<float>()[i] = 1000.0f;
  auto b1 = testing::RegisterShm(service_, sessions_[1], shm);
  ASSERT_TRUE(b1.ok());

  // Elements [8, 24) of each: a mirrored and a shared-memory process.
  auto h0 = Submit(sessions_[0], *cuda, 16, 32);
  auto h1 = Submit(sessions_[1], *b1, 16, 32);
  ASSERT_TRUE(h0.ok() && h1.ok());
  // The data plane starts the operation only after the copy in (on the staging thread).
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (runner_.num_starts() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(runner_.num_starts(), 1u);
  {
    std::lock_guard lock(device->mu);
    EXPECT_THAT(device->copies, ElementsAre("in 32 64"));
  }
  // What the data plane sees is the mirror, holding the device's bytes.
  const auto* in = reinterpret_cast<const float*>(runner_.start(0).op.buffers[0]);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(in[i], 8.0f + i) << i;
  // The data plane writes the sum into both buffers and completes.
  for (void* b : runner_.start(0).op.buffers) {
    for (int i = 0; i < 16; ++i) static_cast<float*>(b)[i] = 1008.0f + i;
  }
  runner_.Complete(0, absl::OkStatus());
  auto r0 = Result(sessions_[0], *h0);
  ASSERT_TRUE(r0.ok()) << r0.status();
  EXPECT_TRUE(r0->ok()) << *r0;
  // Done means the result is in the device buffer, and only the region was written.
  std::lock_guard lock(device->mu);
  EXPECT_THAT(device->copies, ElementsAre("in 32 64", "out 32 64"));
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(device->device[i], (i >= 8 && i < 24) ? 1000.0f + i : static_cast<float>(i)) << i;
  }
}

TEST_F(CudaBufferTest, FailedCopiesAndFailedOperationsReachEveryProcess) {
  auto device = std::make_shared<FakeMirror::Shared>();
  device->device.assign(16, 1.0f);
  UseFakeMirror(device);
  auto c0 = RegisterCuda(sessions_[0], "r0");
  auto c1 = RegisterCuda(sessions_[1], "r1");
  ASSERT_TRUE(c0.ok() && c1.ok());

  // A failed copy in: nothing starts, both handles fail with it, the peers are told.
  device->fail_in = absl::InternalError("cudaMemcpyAsync failed: cudaErrorInvalidValue");
  auto h0 = Submit(sessions_[0], *c0, 16);
  auto h1 = Submit(sessions_[1], *c1, 16);
  ASSERT_TRUE(h0.ok() && h1.ok());
  for (auto [s, h] : {std::pair{sessions_[0], *h0}, std::pair{sessions_[1], *h1}}) {
    auto r = Result(s, h);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->code(), absl::StatusCode::kInternal);
    EXPECT_THAT(std::string(r->message()),
                StartsWith("copying the input from CUDA buffer of session"));
    EXPECT_THAT(r->message(), HasSubstr("cudaErrorInvalidValue"));
  }
  EXPECT_EQ(runner_.num_starts(), 0u);
  ASSERT_EQ(runner_.aborts().size(), 1u);

  // A failed operation: its error, and nothing is copied back.
  {
    std::lock_guard lock(device->mu);
    device->fail_in = absl::OkStatus();
    device->copies.clear();
  }
  h0 = Submit(sessions_[0], *c0, 16);
  h1 = Submit(sessions_[1], *c1, 16);
  ASSERT_TRUE(h0.ok() && h1.ok());
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (runner_.num_starts() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(runner_.num_starts(), 1u);
  runner_.Complete(0, absl::DeadlineExceededError("peer node 2 silent"));
  auto r = Result(sessions_[1], *h1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->code(), absl::StatusCode::kDeadlineExceeded);
  {
    std::lock_guard lock(device->mu);
    EXPECT_THAT(device->copies, ElementsAre("in 0 64", "in 0 64"));
  }

  // A failed copy back: the operation's result is that error.
  {
    std::lock_guard lock(device->mu);
    device->fail_out = absl::InternalError("cudaStreamSynchronize failed: cudaErrorLaunchFailure");
  }
  h0 = Submit(sessions_[0], *c0, 16);
  h1 = Submit(sessions_[1], *c1, 16);
  ASSERT_TRUE(h0.ok() && h1.ok());
  const auto deadline2 = std::chrono::steady_clock::now() + 5s;
  while (runner_.num_starts() < 2 && std::chrono::steady_clock::now() < deadline2) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(runner_.num_starts(), 2u);
  runner_.Complete(1, absl::OkStatus());
  r = Result(sessions_[0], *h0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(r->message()),
              StartsWith("copying the result back to CUDA buffer of session"));
}

// With the job's intra-node plan (the NVLink ring of GPUs 0 and 1 cut at GPU 1) and both
// processes' buffers in GPU memory, the node's sum is formed on the GPUs (HostGpuOps standing in
// for CudaGpuOps): only the root's mirror is filled -- by the executor, with the node's sum --
// and the other zeroed, so the data plane's sum of the mirrors counts it once; only the root's
// result is copied back, and the GPUs broadcast it. The inputs stay as they were until then, and
// after a failed operation. CPU-assisted plans sum each group on its leader's GPU.
TEST_F(CudaBufferTest, TheIntraNodePlanSumsTheNodesGpuTensorsOnTheGpus) {
  auto plan = std::make_shared<tributary::v1::IntraNodePlan>();
  plan->set_strategy("nvlink-rooted-outside-nic-switch");
  plan->add_gpus(0);
  plan->add_gpus(1);
  plan->set_root_gpu(1);
  plan->add_ring(0);
  plan->add_ring(1);
  LocalJob job = OneNodeTwoProcs();
  job.intra_node = plan;
  service_.SetJobs({job});
  std::vector<std::shared_ptr<FakeMirror::Shared>> devices;
  for (int r = 0; r < 2; ++r) {
    devices.push_back(std::make_shared<FakeMirror::Shared>());
    devices[r]->device.resize(32);
    for (int i = 0; i < 32; ++i) devices[r]->device[i] = static_cast<float>((r + 1) * 100 + i);
    devices[r]->gpu = true;
    devices[r]->ordinal = r;
  }
  service_.SetCudaImporterForTest(
      [devices](const std::string& record,
                const std::string& what) -> absl::StatusOr<std::shared_ptr<SharedMemoryMapping>> {
        return std::make_shared<SharedMemoryMapping>(
            what, std::make_unique<FakeMirror>(devices[record == "r0" ? 0 : 1]));
      });
  dataplane::ScalarReducer reducer;
  std::vector<int> factory_devices;
  service_.SetGpuOpsFactoryForTest(
      [&](const std::vector<int>& ordinals) -> absl::StatusOr<std::unique_ptr<dataplane::GpuOps>> {
        factory_devices = ordinals;
        const int n = static_cast<int>(ordinals.size());
        auto ops = std::make_unique<dataplane::HostGpuOps>(
            n, reducer, dataplane::HostGpuOps::Options{.deferred = true, .seed = 4});
        for (int g = 0; g < n; ++g) {  // Rank r's buffer is on fake device r.
          ops->RegisterBuffer(g, devices[ordinals[g]]->device.data(), 32 * sizeof(float));
        }
        for (int r = 0; r < 2; ++r) ops->RegisterBuffer(-1, devices[r]->host, 32 * sizeof(float));
        return std::unique_ptr<dataplane::GpuOps>(std::move(ops));
      });
  auto c0 = RegisterCuda(sessions_[0], "r0");
  auto c1 = RegisterCuda(sessions_[1], "r1");
  ASSERT_TRUE(c0.ok() && c1.ok());
  auto wait_starts = [&](size_t n) {
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (runner_.num_starts() < n && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    return runner_.num_starts() == n;
  };
  for (int round = 0; round < 2; ++round) {  // The second reuses the aggregation.
    // Elements [4, 20) of each buffer.
    auto h0 = Submit(sessions_[0], *c0, 16, 16);
    auto h1 = Submit(sessions_[1], *c1, 16, 16);
    ASSERT_TRUE(h0.ok() && h1.ok());
    ASSERT_TRUE(wait_starts(round + 1));
    EXPECT_EQ(factory_devices, (std::vector<int>{0, 1}));
    const auto& op = runner_.start(round).op;
    const auto* root = reinterpret_cast<const float*>(op.buffers[1]);
    const auto* other = reinterpret_cast<const float*>(op.buffers[0]);
    for (int i = 0; i < 16; ++i) {
      EXPECT_EQ(root[i], 300.0f + 2 * (4 + i)) << i;  // The node's sum, at the root.
      EXPECT_EQ(other[i], 0.0f) << i;
      // The inputs are untouched.
      EXPECT_EQ(devices[0]->device[4 + i], 100.0f + 4 + i);
      EXPECT_EQ(devices[1]->device[4 + i], 200.0f + 4 + i);
    }
    {
      std::lock_guard lock0(devices[0]->mu);
      EXPECT_THAT(devices[0]->copies, ElementsAre("ready"));  // Nothing copied one by one.
    }
    // The data plane: another node adds 1000 to every element, in every mirror.
    for (std::byte* b : op.buffers) {
      for (int i = 0; i < 16; ++i) {
        reinterpret_cast<float*>(b)[i] = 1000.0f + 300.0f + 2 * (4 + i);
      }
    }
    runner_.Complete(round, absl::OkStatus());
    for (auto [session, h] : {std::pair{sessions_[0], *h0}, std::pair{sessions_[1], *h1}}) {
      auto r = Result(session, h);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE(r->ok()) << *r;
    }
    for (int g = 0; g < 2; ++g) {
      std::lock_guard lock(devices[g]->mu);
      for (int i = 0; i < 32; ++i) {
        const float want = (i >= 4 && i < 20) ? 1300.0f + 2 * i : (g + 1) * 100.0f + i;
        EXPECT_EQ(devices[g]->device[i], want) << "rank " << g << " element " << i;
      }
      // Only the root's result came back from host memory; rank 0 got it over the "NVLink".
      if (g == 1) {
        EXPECT_THAT(devices[g]->copies, ElementsAre("ready", "out 16 64"));
      } else {
        EXPECT_THAT(devices[g]->copies, ElementsAre("ready"));
      }
      devices[g]->copies.clear();
      for (int i = 0; i < 32; ++i) devices[g]->device[i] = static_cast<float>((g + 1) * 100 + i);
    }
  }
  // A failed operation leaves the inputs as they were.
  auto h0 = Submit(sessions_[0], *c0, 16, 16);
  auto h1 = Submit(sessions_[1], *c1, 16, 16);
  ASSERT_TRUE(h0.ok() && h1.ok());
  ASSERT_TRUE(wait_starts(3));
  runner_.Complete(2, absl::UnavailableError("a summation server left"));
  auto r = Result(sessions_[0], *h0);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->ok());
  ASSERT_TRUE(Result(sessions_[1], *h1).ok());
  for (int g = 0; g < 2; ++g) {
    std::lock_guard lock(devices[g]->mu);
    for (int i = 0; i < 32; ++i) {
      EXPECT_EQ(devices[g]->device[i], (g + 1) * 100.0f + i) << "rank " << g << " element " << i;
    }
    devices[g]->copies.clear();
  }
  // CPU-assisted plans: one PCIe switch holding both GPUs (GPU 1, the root, leads: the sum is
  // formed there), and host staging (each GPU its own group: each mirror holds its input).
  int start = 3;
  for (const bool one_switch : {true, false}) {
    SCOPED_TRACE(one_switch ? "one switch" : "host staging");
    plan = std::make_shared<tributary::v1::IntraNodePlan>();
    plan->set_strategy(one_switch ? "cpu-assisted-per-switch" : "host-staging");
    plan->add_gpus(0);
    plan->add_gpus(1);
    plan->set_root_gpu(1);
    if (one_switch) {
      plan->add_groups()->add_gpus(0);
      plan->mutable_groups(0)->add_gpus(1);
    } else {
      plan->add_groups()->add_gpus(0);
      plan->add_groups()->add_gpus(1);
    }
    job.plan_version++;
    job.intra_node = plan;
    service_.SetJobs({job});
    h0 = Submit(sessions_[0], *c0, 16, 16);
    h1 = Submit(sessions_[1], *c1, 16, 16);
    ASSERT_TRUE(h0.ok() && h1.ok());
    ASSERT_TRUE(wait_starts(start + 1));
    EXPECT_EQ(factory_devices, one_switch ? (std::vector<int>{1, 0}) : (std::vector<int>{1}));
    const auto& op = runner_.start(start).op;
    for (int i = 0; i < 16; ++i) {
      const auto* m0 = reinterpret_cast<const float*>(op.buffers[0]);
      const auto* m1 = reinterpret_cast<const float*>(op.buffers[1]);
      if (one_switch) {
        EXPECT_EQ(m1[i], 300.0f + 2 * (4 + i)) << i;
        EXPECT_EQ(m0[i], 0.0f) << i;
      } else {
        EXPECT_EQ(m0[i], 100.0f + 4 + i) << i;
        EXPECT_EQ(m1[i], 200.0f + 4 + i) << i;
      }
    }
    for (std::byte* b : op.buffers) {
      for (int i = 0; i < 16; ++i) reinterpret_cast<float*>(b)[i] = 7.0f;
    }
    runner_.Complete(start, absl::OkStatus());
    ASSERT_TRUE(Result(sessions_[0], *h0).ok());
    ASSERT_TRUE(Result(sessions_[1], *h1).ok());
    for (int g = 0; g < 2; ++g) {
      std::lock_guard lock(devices[g]->mu);
      for (int i = 4; i < 20; ++i) EXPECT_EQ(devices[g]->device[i], 7.0f) << g << " " << i;
      if (one_switch && g == 0) {
        EXPECT_THAT(devices[g]->copies, ElementsAre("ready"));  // Its result came over the GPU.
      } else {
        EXPECT_THAT(devices[g]->copies, ElementsAre("ready", "out 16 64"));
      }
      devices[g]->copies.clear();
      for (int i = 0; i < 32; ++i) devices[g]->device[i] = static_cast<float>((g + 1) * 100 + i);
    }
    ++start;
  }
}

TEST(MirrorStagerTest, RunsTasksInOrderOnItsThreadAndInlineAfterStop) {
  MirrorStager stager;
  std::mutex mu;
  std::vector<int> order;
  std::thread::id worker;
  for (int i = 0; i < 5; ++i) {
    stager.Post([&, i] {
      std::lock_guard lock(mu);
      order.push_back(i);
      worker = std::this_thread::get_id();
      // A task may post more; Stop still runs them.
      if (i == 4) stager.Post([&] { order.push_back(5); });
    });
  }
  stager.Stop();
  EXPECT_THAT(order, ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_NE(worker, std::this_thread::get_id());
  EXPECT_EQ(stager.tasks_run(), 6u);
  bool ran = false;
  stager.Post([&] { ran = true; });  // after Stop: inline
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace tributary::agent
