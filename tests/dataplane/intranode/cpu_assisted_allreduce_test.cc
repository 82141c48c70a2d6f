// CpuAssistedAllReduce on HostGpuOps: exact sums and averages on every GPU's buffer for every
// dtype, group layout, chunk size and count; the data path the plan prescribes (peer copies only
// inside a group, on the leader's queue; one D2H and one H2D per group and chunk; chunk c+1
// gathered before the CPU waits for chunk c); the inter-node hook; bad input.
#include "dataplane/intranode/cpu_assisted_allreduce.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "dataplane/intranode/host_gpu_ops.h"
#include "dataplane/reduce/cpu/scalar_reducer.h"
#include "gtest/gtest.h"
#include "tests/dataplane/intranode/host_node.h"
#include "tests/util/typed_values.h"

namespace tributary::dataplane {
namespace {

using common::DataType;
using testing::GetValue;
using testing::Input;
using testing::Node;
using testing::PutValue;

struct Layout {
  int gpus;
  std::vector<std::vector<int>> groups;
};

const Layout kLayouts[] = {
    {6, {{0, 1}, {2, 3, 4}, {5}}},  // Three PCIe switches, uneven.
    {2, {{0}, {1}}},                // Host staging: every GPU alone.
    {4, {{0, 1, 2, 3}}},            // One switch.
    {4, {{3, 1}, {0, 2}}},          // Leaders that are not the lowest index.
    {1, {{0}}},                     // One GPU.
};

int GroupOf(const Layout& l, int gpu) {
  for (size_t g = 0; g < l.groups.size(); ++g) {
    if (std::count(l.groups[g].begin(), l.groups[g].end(), gpu)) return static_cast<int>(g);
  }
  return -1;
}

TEST(CpuAssistedAllReduce, EveryBufferHoldsTheExactSumAndTheDataPathFollowsTheGroups) {
  for (const Layout& layout : kLayouts) {
    for (DataType dtype : common::kAllDataTypes) {
      // (count, chunk bytes): one chunk, two, many; chunks that do and do not divide.
      for (auto [count, chunk_bytes] : {std::pair<size_t, size_t>{1, 16},
                                        {3, 16},
                                        {1000, 16},
                                        {4097, 1000},
                                        {4097, 1 << 20},
                                        {3, 1 << 20}}) {
        {
          SCOPED_TRACE(::testing::Message() << layout.gpus << " GPUs, " << layout.groups.size()
                                            << " groups, " << common::DataTypeName(dtype)
                                            << ", count " << count << ", chunk " << chunk_bytes);
          Node node(layout.gpus, dtype, count, 1);
          auto ar = CpuAssistedAllReduce::Create(node.ops(), node.reducer(), layout.groups,
                                                 {.chunk_bytes = chunk_bytes});
          ASSERT_TRUE(ar.ok()) << ar.status();
          absl::Status s = (*ar)->AllReduce(dtype, node.pointers(), count, false);
          ASSERT_TRUE(s.ok()) << s;
          for (int g = 0; g < layout.gpus; ++g) {
            for (size_t i = 0; i < count; ++i) {
              double want = 0;
              for (int h = 0; h < layout.gpus; ++h) want += Input(h, i, 1);
              ASSERT_EQ(GetValue(dtype, node.buffer(g), i), want)
                  << "GPU " << g << " element " << i;
            }
          }
          // The data path.
          const size_t per_chunk = std::max<size_t>(1, chunk_bytes / common::DataTypeSize(dtype));
          const size_t chunks = (count + per_chunk - 1) / per_chunk;
          const std::vector<std::string>& log = node.ops().log();
          size_t d2h = 0, h2d = 0, fences_before_first_wait = 0;
          bool waited = false;
          for (const std::string& e : log) {
            int from = -1, to = -1, queue = -1;
            if (std::sscanf(e.c_str(), "peer %d->%d on %d", &from, &to, &queue) == 3) {
              EXPECT_EQ(GroupOf(layout, from), GroupOf(layout, to)) << e << ": across groups";
              EXPECT_EQ(layout.groups[GroupOf(layout, from)][0], queue) << e << ": not the leader";
            } else if (std::sscanf(e.c_str(), "d2h %d on %d", &from, &queue) == 2) {
              ++d2h;
              EXPECT_EQ(layout.groups[GroupOf(layout, from)][0], from) << e << ": not a leader";
            } else if (std::sscanf(e.c_str(), "h2d %d on %d", &to, &queue) == 2) {
              ++h2d;
              EXPECT_EQ(layout.groups[GroupOf(layout, to)][0], to) << e << ": not a leader";
            } else if (e.rfind("fence", 0) == 0 && !waited) {
              ++fences_before_first_wait;
            } else if (e.rfind("wait", 0) == 0) {
              waited = true;
            }
          }
          EXPECT_EQ(d2h, layout.groups.size() * chunks);
          EXPECT_EQ(h2d, layout.groups.size() * chunks);
          // Chunk 1 is gathered (and fenced) before the CPU waits for chunk 0.
          EXPECT_EQ(fences_before_first_wait, layout.groups.size() * std::min<size_t>(chunks, 2));
        }
      }
    }
  }
}

// Two "nodes": the hook doubles the node's sum (the other node holds the same inputs), sees every
// element once in order, and the average divides by all contributors.
TEST(CpuAssistedAllReduce, InterNodeHookAndAverage) {
  const Layout& layout = kLayouts[0];
  const int contributors = 2 * layout.gpus;
  for (DataType dtype : common::kAllDataTypes) {
    SCOPED_TRACE(common::DataTypeName(dtype));
    constexpr size_t kCount = 1001;
    Node node(layout.gpus, dtype, kCount, contributors);  // Inputs multiples of the divisor.
    auto ar = CpuAssistedAllReduce::Create(node.ops(), node.reducer(), layout.groups,
                                           {.chunk_bytes = 256});
    ASSERT_TRUE(ar.ok());
    size_t next = 0;
    absl::Status s = (*ar)->AllReduce(dtype, node.pointers(), kCount, true, contributors,
                                      [&](DataType t, void* data, size_t n, size_t offset) {
                                        EXPECT_EQ(offset, next);
                                        next += n;
                                        for (size_t i = 0; i < n; ++i)
                                          PutValue(t, data, i, 2 * GetValue(t, data, i));
                                        return absl::OkStatus();
                                      });
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(next, kCount);
    for (int g = 0; g < layout.gpus; ++g) {
      for (size_t i = 0; i < kCount; ++i) {
        double sum = 0;
        for (int h = 0; h < layout.gpus; ++h) sum += Input(h, i, contributors);
        ASSERT_EQ(GetValue(dtype, node.buffer(g), i), 2 * sum / contributors)
            << "GPU " << g << " element " << i;
      }
    }
  }
  // A failing hook fails the all-reduce with its status.
  Node node(layout.gpus, DataType::kFloat32, 100, 1);
  auto ar = CpuAssistedAllReduce::Create(node.ops(), node.reducer(), layout.groups, {});
  ASSERT_TRUE(ar.ok());
  absl::Status s = (*ar)->AllReduce(
      DataType::kFloat32, node.pointers(), 100, false, 1,
      [](DataType, void*, size_t, size_t) { return absl::UnavailableError("server gone"); });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST(CpuAssistedAllReduce, BadInputIsAClearError) {
  ScalarReducer reducer;
  HostGpuOps ops(4, reducer);
  auto create = [&](std::vector<std::vector<int>> groups) {
    return CpuAssistedAllReduce::Create(ops, reducer, std::move(groups), {}).status();
  };
  EXPECT_EQ(create({{0, 1}, {2}}).code(), absl::StatusCode::kInvalidArgument);  // 3 missing.
  EXPECT_NE(create({{0, 1}, {2}}).message().find("GPU 3 is in no group"), std::string::npos);
  EXPECT_EQ(create({{0, 1}, {1, 2, 3}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create({{0, 1, 2, 3, 4}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create({{0, 1, 2, 3}, {}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CpuAssistedAllReduce::Create(ops, reducer, {{0, 1, 2, 3}}, {.chunk_bytes = 8})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  auto ar = CpuAssistedAllReduce::Create(ops, reducer, {{0, 1, 2, 3}}, {});
  ASSERT_TRUE(ar.ok());
  std::vector<float> b(4);
  std::vector<void*> three{b.data(), b.data(), b.data()};
  EXPECT_EQ((*ar)->AllReduce(DataType::kFloat32, three, 4, false).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<void*> with_null{b.data(), nullptr, b.data(), b.data()};
  EXPECT_EQ((*ar)->AllReduce(DataType::kFloat32, with_null, 4, false).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<void*> four{b.data(), b.data(), b.data(), b.data()};
  EXPECT_EQ((*ar)->AllReduce(static_cast<DataType>(42), four, 4, false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*ar)->AllReduce(DataType::kFloat32, four, 0, false).ok());
}

}  // namespace
}  // namespace tributary::dataplane
