// StartMirrored's streaming (agent/mirror_stager.h): mirrored regions copied in a chunk at a time
// while the operation runs, results copied back as the data plane reports them final, the
// original done after every copy; failures abort the operation and stop the copies.
#include "agent/mirror_stager.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tributary::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using namespace std::chrono_literals;

constexpr auto kGuard = 20s;
constexpr uint64_t kChunk = 4096;
constexpr uint64_t kBytes = 2 * kChunk + 12;  // three chunks, the last one short

// Host memory standing for a device buffer: CopyIn / CopyOut move bytes between `source` and the
// host mirror and record each call; a copy in may be made to fail or to wait for a release.
class FakeStagerMirror final : public MirroredMemory {
 public:
  explicit FakeStagerMirror(uint64_t size) : source(size), mirror_(size) {}
  std::byte* host() const override { return const_cast<std::byte*>(mirror_.data()); }
  uint64_t size() const override { return mirror_.size(); }
  absl::Status CopyIn(uint64_t offset, uint64_t bytes, std::chrono::milliseconds) override {
    std::unique_lock lock(mu);
    const size_t call = ins.size();
    ins.emplace_back(offset, bytes);
    cv.notify_all();
    if (hold_in_call && *hold_in_call == call) {
      cv.wait_for(lock, kGuard, [&] { return released; });
    }
    if (fail_in_call && *fail_in_call == call) {
      return absl::DeadlineExceededError("the owner's ready event never fired");
    }
    std::memcpy(mirror_.data() + offset, source.data() + offset, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyOut(uint64_t offset, uint64_t bytes, std::chrono::milliseconds) override {
    std::lock_guard lock(mu);
    outs.emplace_back(offset, bytes);
    std::memcpy(source.data() + offset, mirror_.data() + offset, bytes);
    return absl::OkStatus();
  }
  void Release() {
    std::lock_guard lock(mu);
    released = true;
    cv.notify_all();
  }
  bool WaitForIns(size_t n) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, kGuard, [&] { return ins.size() >= n; });
  }
  std::vector<std::pair<uint64_t, uint64_t>> Ins() {
    std::lock_guard lock(mu);
    return ins;
  }
  std::vector<std::pair<uint64_t, uint64_t>> Outs() {
    std::lock_guard lock(mu);
    return outs;
  }

  std::vector<std::byte> source;
  std::optional<size_t> fail_in_call, hold_in_call;

 private:
  std::vector<std::byte> mirror_;
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  std::vector<std::pair<uint64_t, uint64_t>> ins, outs;
};

// What the data plane side of the test sees.
struct Runner {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<dataplane::Operation> op;
  std::vector<uint64_t> advanced;  // ready() at each StagedInputAdvanced
  std::optional<absl::Status> aborted;
  int plain_starts = 0;

  MirrorStreaming Hooks() {
    return MirrorStreaming{[this](dataplane::Operation o) {
                             std::lock_guard lock(mu);
                             op = std::move(o);
                             cv.notify_all();
                             return absl::OkStatus();
                           },
                           [this] {
                             std::lock_guard lock(mu);
                             advanced.push_back(op->staged->ready());
                             cv.notify_all();
                           },
                           [this](const absl::Status& s) {
                             std::lock_guard lock(mu);
                             aborted = s;
                             cv.notify_all();
                           }};
  }
  template <typename Pred>
  bool WaitFor(Pred pred) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, kGuard, pred);
  }
};

class MirrorStreamingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetMirrorStagingChunkBytes(kChunk);
    for (int r = 0; r < 2; ++r) {
      auto mirror = std::make_unique<FakeStagerMirror>(kBytes + 64);
      for (uint64_t i = 0; i < mirror->source.size(); ++i) {
        mirror->source[i] = static_cast<std::byte>(i * 7 + r);
      }
      mirrors.push_back(mirror.get());
      mappings.push_back(
          std::make_shared<SharedMemoryMapping>(absl::StrCat("gpu buffer ", r), std::move(mirror)));
    }
  }
  void TearDown() override {
    stager->Stop();
    SetMirrorStagingChunkBytes(kDefaultMirrorStagingChunk);
  }

  // A sum over both mirrors' regions [32, 32 + bytes); `done` fulfils the returned future.
  std::future<absl::Status> Start(uint64_t bytes, dataplane::Reduction reduction) {
    auto result = std::make_shared<std::promise<absl::Status>>();
    dataplane::Operation op;
    op.tensor_name = "t";
    op.dtype = common::DataType::kFloat32;
    op.count = bytes / 4;
    op.reduction = reduction;
    op.done = [result](absl::Status s) { result->set_value(s); };
    std::vector<MirroredRegion> regions;
    for (auto& m : mappings) regions.push_back({m, 32, bytes});
    StartMirrored(
        stager, std::move(regions), std::move(op), 1000ms,
        [this](dataplane::Operation o) {
          std::lock_guard lock(runner.mu);
          runner.plain_starts++;
          runner.op = std::move(o);
          runner.cv.notify_all();
        },
        [result](const absl::Status& s) { result->set_value(s); }, nullptr, runner.Hooks());
    return result->get_future();
  }

  std::shared_ptr<MirrorStager> stager = std::make_shared<MirrorStager>();
  std::vector<FakeStagerMirror*> mirrors;
  std::vector<std::shared_ptr<SharedMemoryMapping>> mappings;
  Runner runner;
};

TEST_F(MirrorStreamingTest, ChunksGoInInOrderAndResultsGoBackAsReportedBeforeDone) {
  std::future<absl::Status> done = Start(kBytes, dataplane::Reduction::kSum);
  ASSERT_TRUE(runner.WaitFor([&] { return runner.advanced.size() == 3; }));
  EXPECT_EQ(runner.plain_starts, 0);
  EXPECT_THAT(runner.advanced, ElementsAre(kChunk, 2 * kChunk, kBytes));
  for (FakeStagerMirror* m : mirrors) {
    EXPECT_THAT(m->Ins(), ElementsAre(Pair(32, kChunk), Pair(32 + kChunk, kChunk),
                                      Pair(32 + 2 * kChunk, 12)));
    EXPECT_EQ(std::memcmp(m->host() + 32, m->source.data() + 32, kBytes), 0);
  }
  // The data plane writes its results and reports them, the middle first.
  dataplane::Operation& op = *runner.op;
  for (FakeStagerMirror* m : mirrors) std::memset(m->host() + 32, 0x5c, kBytes);
  op.staged->Final(kChunk, kChunk);
  op.staged->Final(0, kChunk);
  op.staged->Final(2 * kChunk, 12);
  op.done(absl::OkStatus());
  ASSERT_EQ(done.wait_for(kGuard), std::future_status::ready);
  EXPECT_TRUE(done.get().ok());
  for (FakeStagerMirror* m : mirrors) {
    // Each range once, as reported; nothing copied again at the end.
    EXPECT_THAT(m->Outs(), ElementsAre(Pair(32 + kChunk, kChunk), Pair(32, kChunk),
                                       Pair(32 + 2 * kChunk, 12)));
    for (uint64_t i = 32; i < 32 + kBytes; ++i) ASSERT_EQ(m->source[i], std::byte{0x5c}) << i;
    EXPECT_EQ(m->source[31], static_cast<std::byte>(31 * 7 + (m == mirrors[0] ? 0 : 1)));
  }
}

TEST_F(MirrorStreamingTest, AnAlgorithmThatReportsNothingGetsEverythingCopiedBackAfterIt) {
  std::future<absl::Status> done = Start(kBytes, dataplane::Reduction::kAverage);
  ASSERT_TRUE(runner.WaitFor([&] { return runner.advanced.size() == 3; }));
  runner.op->done(absl::OkStatus());
  ASSERT_EQ(done.wait_for(kGuard), std::future_status::ready);
  EXPECT_TRUE(done.get().ok());
  for (FakeStagerMirror* m : mirrors) EXPECT_THAT(m->Outs(), ElementsAre(Pair(32, kBytes)));
}

TEST_F(MirrorStreamingTest, AFailedCopyInAbortsTheOperationAndCopiesNothingBack) {
  mirrors[1]->fail_in_call = 1;  // chunk 1 of the second region
  std::future<absl::Status> done = Start(kBytes, dataplane::Reduction::kSum);
  ASSERT_TRUE(runner.WaitFor([&] { return runner.aborted.has_value(); }));
  EXPECT_EQ(runner.aborted->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(runner.aborted->message(), HasSubstr("copying the input from gpu buffer 1"));
  EXPECT_THAT(runner.advanced, ElementsAre(kChunk));
  runner.op->staged->Final(0, kChunk);  // a result that came meanwhile: not copied back
  // The operation ends with a server's verdict on this node's missing chunks: the copy's
  // failure, its cause, is what the processes get.
  runner.op->done(absl::DeadlineExceededError("summation server 1 waited 1500 ms for chunk 3"));
  ASSERT_EQ(done.wait_for(kGuard), std::future_status::ready);
  absl::Status s = done.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("copying the input from gpu buffer 1"));
  for (FakeStagerMirror* m : mirrors) {
    EXPECT_TRUE(m->Outs().empty());
    EXPECT_LE(m->Ins().size(), 2u);
  }
}

TEST_F(MirrorStreamingTest, AnOperationThatEndedReadsNoMoreInput) {
  mirrors[0]->hold_in_call = 1;  // chunk 1 waits until released
  std::future<absl::Status> done = Start(kBytes, dataplane::Reduction::kSum);
  ASSERT_TRUE(mirrors[0]->WaitForIns(2));
  ASSERT_TRUE(runner.WaitFor([&] { return runner.op.has_value(); }));
  // A peer failed the collective while chunk 1 was being copied.
  runner.op->done(absl::AbortedError("rank 2 aborted"));
  mirrors[0]->Release();
  ASSERT_EQ(done.wait_for(kGuard), std::future_status::ready);
  EXPECT_EQ(done.get().code(), absl::StatusCode::kAborted);
  // Chunk 2 is never read: the mirror may be the next operation's by then.
  stager->Stop();
  EXPECT_EQ(mirrors[0]->Ins().size(), 2u);
  EXPECT_EQ(mirrors[1]->Ins().size(), 2u);
  EXPECT_TRUE(mirrors[0]->Outs().empty());
}

TEST_F(MirrorStreamingTest, RegionsOfOneChunkOrLessAreCopiedWholeBeforeTheStart) {
  std::future<absl::Status> done = Start(kChunk, dataplane::Reduction::kSum);
  ASSERT_TRUE(runner.WaitFor([&] { return runner.op.has_value(); }));
  EXPECT_EQ(runner.plain_starts, 1);
  EXPECT_EQ(runner.op->staged, nullptr);
  for (FakeStagerMirror* m : mirrors) EXPECT_THAT(m->Ins(), ElementsAre(Pair(32, kChunk)));
  runner.op->done(absl::OkStatus());
  ASSERT_EQ(done.wait_for(kGuard), std::future_status::ready);
  EXPECT_TRUE(done.get().ok());
  for (FakeStagerMirror* m : mirrors) EXPECT_THAT(m->Outs(), ElementsAre(Pair(32, kChunk)));
}

TEST_F(MirrorStreamingTest, ChunkZeroTurnsStreamingOff) {
  SetMirrorStagingChunkBytes(0);
  std::future<absl::Status> done = Start(kBytes, dataplane::Reduction::kSum);
  ASSERT_TRUE(runner.WaitFor([&] { return runner.op.has_value(); }));
  EXPECT_EQ(runner.plain_starts, 1);
  for (FakeStagerMirror* m : mirrors) EXPECT_THAT(m->Ins(), ElementsAre(Pair(32, kBytes)));
  runner.op->done(absl::OkStatus());
  ASSERT_EQ(done.wait_for(kGuard), std::future_status::ready);
}

TEST_F(MirrorStreamingTest, ARefusedStartFailsWithoutCopying) {
  MirrorStreaming hooks = runner.Hooks();
  hooks.start = [](dataplane::Operation) {
    return absl::NotFoundError("job 'x' has no plan on this node");
  };
  auto result = std::make_shared<std::promise<absl::Status>>();
  dataplane::Operation op;
  op.tensor_name = "t";
  op.dtype = common::DataType::kFloat32;
  op.count = kBytes / 4;
  op.reduction = dataplane::Reduction::kSum;
  op.done = [result](absl::Status s) { result->set_value(s); };
  std::vector<MirroredRegion> regions;
  for (auto& m : mappings) regions.push_back({m, 32, kBytes});
  StartMirrored(
      stager, std::move(regions), std::move(op), 1000ms, [](dataplane::Operation) {},
      [result](const absl::Status& s) { result->set_value(s); }, nullptr, hooks);
  std::future<absl::Status> done = result->get_future();
  ASSERT_EQ(done.wait_for(kGuard), std::future_status::ready);
  EXPECT_EQ(done.get().code(), absl::StatusCode::kNotFound);
  stager->Stop();
  for (FakeStagerMirror* m : mirrors) EXPECT_TRUE(m->Ins().empty());
}

}  // namespace
}  // namespace tributary::agent
