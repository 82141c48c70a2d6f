// LocalGather on its own: submissions in any rank order become one operation in rank order,
// and nothing reaches the runner or a handle before the caller runs its Deferred work.
#include "agent/local_gather.h"

#include <chrono>
#include <memory>
#include <vector>

#include "agent/fake_collective_runner.h"
#include "gtest/gtest.h"
#include "tests/agent/shm_test_util.h"

namespace tributary::agent {
namespace {

using namespace std::chrono_literals;

TEST(LocalGatherTest, ThreeRanksInAnyOrderBecomeOneOperationInRankOrder) {
  common::FakeClock clock;
  FakeCollectiveRunner runner;
  LocalGather gather(&runner, &clock);
  const LocalJob job{.job_id = "job",
                     .plan_version = 1,
                     .node_rank = 0,
                     .num_nodes = 1,
                     .procs_per_node = 3,
                     .op_timeout = 1000ms};
  const GatherKey key{"job", "grad", 4};
  // One shared-memory object; each rank's region is 8 floats at rank * 8, holding its rank.
  testing::ScopedShm shm(3 * 8 * sizeof(float));
  for (int i = 0; i < 3 * 8; ++i) shm.as<float>()[i] = static_cast<float>(i / 8);
  std::vector<std::shared_ptr<OpHandle>> handles;
  Deferred after;
  for (uint32_t rank : {2u, 0u, 1u}) {
    auto mapping = MapSealedMemory(shm.fd(), shm.size(), shm.name());
    ASSERT_TRUE(mapping.ok()) << mapping.status();
    Submission sub;
    sub.local_rank = rank;
    sub.mapping = *mapping;
    sub.offset = rank * 8 * sizeof(float);
    sub.count = 8;
    sub.reduction = dataplane::Reduction::kSum;
    sub.priority = static_cast<int32_t>(10 - rank);
    sub.handle = std::make_shared<OpHandle>();
    handles.push_back(sub.handle);
    gather.Add(job, key, std::move(sub), after);
  }
  EXPECT_EQ(gather.size(), 0u);
  EXPECT_EQ(runner.num_starts(), 0u);  // deferred until the caller's lock is released
  after.Run();
  ASSERT_EQ(runner.num_starts(), 1u);
  const FakeCollectiveRunner::StartCall call = runner.start(0);
  EXPECT_EQ(call.op.iteration, 4u);
  EXPECT_EQ(call.op.count, 8u);
  EXPECT_EQ(call.op.priority, 8);
  ASSERT_EQ(call.op.buffers.size(), 3u);
  for (uint32_t rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(reinterpret_cast<const float*>(call.op.buffers[rank])[7], static_cast<float>(rank));
  }
  runner.Complete(0, absl::OkStatus());
  for (const auto& h : handles) EXPECT_EQ(h->ResultOrPark(nullptr), absl::OkStatus());
}

}  // namespace
}  // namespace tributary::agent
