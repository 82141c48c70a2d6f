// The CLI's pure helpers: size lists, tables, benchmark data, plan view.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "client/cli/bench_data.h"
#include "client/cli/plan_view.h"
#include "client/cli/sizes.h"
#include "client/cli/table.h"
#include "common/half.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tributary::client::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// --- sizes -----------------------------------------------------------------------------------

TEST(SizesTest, ParsesUnits) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("4K"), 4096u);
  EXPECT_EQ(*ParseSize("4k"), 4096u);
  EXPECT_EQ(*ParseSize("4KiB"), 4096u);
  EXPECT_EQ(*ParseSize("64M"), 64u << 20);
  EXPECT_EQ(*ParseSize("64mb"), 64u << 20);
  EXPECT_EQ(*ParseSize("1G"), 1u << 30);
  EXPECT_EQ(*ParseSize("2T"), 2ull << 40);
  EXPECT_EQ(*ParseSize("7B"), 7u);
  EXPECT_EQ(*ParseSize(" 3 "), 3u);
}

TEST(SizesTest, RejectsGarbage) {
  for (const char* bad :
       {"", "K", "-4", "4X", "4.5M", "1K1", "99999999999999999999", "17179869184G"}) {
    auto size = ParseSize(bad);
    EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(SizesTest, RangeIsPowersOfTwoInclusive) {
  EXPECT_THAT(*ParseSizeList("4K:64K"), ElementsAre(4096, 8192, 16384, 32768, 65536));
  EXPECT_THAT(*ParseSizeList("4K:4K"), ElementsAre(4096));
  // MAX that is not MIN * 2^k stops below it.
  EXPECT_THAT(*ParseSizeList("3:20"), ElementsAre(3, 6, 12));
  auto full = ParseSizeList("4K:64M");
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->size(), 15u);
  EXPECT_EQ(full->front(), 4096u);
  EXPECT_EQ(full->back(), 64u << 20);
}

TEST(SizesTest, CommaListsKeepOrderAndMayMixRanges) {
  EXPECT_THAT(*ParseSizeList("1K,3,1M"), ElementsAre(1024, 3, 1 << 20));
  EXPECT_THAT(*ParseSizeList("1M, 1K:2K"), ElementsAre(1 << 20, 1024, 2048));
}

TEST(SizesTest, CliValidatorsCheckAtParseTimeAndConvert) {
  CLI::App app;
  uint64_t bytes = 0;
  std::string sizes;
  app.add_option("--bytes", bytes)->transform(ByteSize());
  app.add_option("--sizes", sizes)->check(ByteSizeList());
  app.parse("--bytes 16MiB --sizes 4K:64K", /*program_name_included=*/false);
  EXPECT_EQ(bytes, 16u << 20);
  EXPECT_EQ(sizes, "4K:64K");  // Checked, left as given.
  EXPECT_THROW(app.parse("--bytes 1.5M", false), CLI::ValidationError);
  EXPECT_THROW(app.parse("--sizes 64K:4K", false), CLI::ValidationError);
}

TEST(SizesTest, RejectsBadLists) {
  for (const char* bad : {"", ",", "1K,", "0", "0:4K", "64M:4K", "1K:", ":4K", "1K,x"}) {
    EXPECT_EQ(ParseSizeList(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// --- table -----------------------------------------------------------------------------------

TEST(TableTest, PadsColumnsAndAligns) {
  Table table({"NAME", "N", "NOTE"});
  table.SetAlign(1, Table::Align::kRight);
  table.AddRow({"a", "1", "x"});
  table.AddRow({"long-name", "12345"});
  EXPECT_EQ(table.num_rows(), 2u);
  EXPECT_EQ(table.Render(),
            "NAME           N  NOTE\n"
            "a              1  x\n"
            "long-name  12345\n");
}

TEST(TableTest, HeaderOnlyAndWideRows) {
  Table empty({"A", "B"});
  EXPECT_EQ(empty.Render(), "A  B\n");
  Table wide({"A"});
  wide.AddRow({"1", "extra"});
  EXPECT_EQ(wide.Render(), "A\n1  extra\n");
}

TEST(TableTest, Formatting) {
  EXPECT_EQ(FormatFixed(1.005, 1), "1.0");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(4096), "4.0 KiB");
  EXPECT_EQ(FormatBytes(64ull << 20), "64.0 MiB");
  EXPECT_EQ(FormatBytes(3ull << 29), "1.5 GiB");
  EXPECT_EQ(FormatSeconds(0.00085), "850 us");
  EXPECT_EQ(FormatSeconds(0.0123), "12.30 ms");
  EXPECT_EQ(FormatSeconds(0.5), "500.0 ms");
  EXPECT_EQ(FormatSeconds(1.25), "1.25 s");
  EXPECT_EQ(FormatSeconds(-1), "-");
  EXPECT_EQ(JoinOrDash({}), "-");
  EXPECT_EQ(JoinOrDash({"a", "b"}), "a,b");
}

// --- benchmark data --------------------------------------------------------------------------

// Element-wise reduction of every rank's input, as a correct agent would compute it.
std::vector<float> ReduceFloat32(BenchOp op, uint32_t world, size_t count) {
  std::vector<float> out(count, 0), in(count);
  for (uint32_t rank = 0; rank < world; ++rank) {
    FillInput(common::DataType::kFloat32, rank, in.data(), count);
    for (size_t i = 0; i < count; ++i) out[i] += in[i];
  }
  if (op == BenchOp::kAverage) {
    for (float& v : out) v /= static_cast<float>(world);
  }
  return out;
}

TEST(BenchDataTest, CorrectSumsPassAndWrongOnesAreCounted) {
  for (BenchOp op : {BenchOp::kSum, BenchOp::kAverage}) {
    for (uint32_t world : {1u, 2u, 3u, 8u}) {
      std::vector<float> out = ReduceFloat32(op, world, 1000);
      EXPECT_EQ(CountWrong(common::DataType::kFloat32, op, world, 0, out.data(), out.size()), 0u)
          << BenchOpName(op) << " world " << world;
      out[17] += 1;
      out[999] = 0;
      EXPECT_EQ(CountWrong(common::DataType::kFloat32, op, world, 0, out.data(), out.size()), 2u);
    }
  }
}

TEST(BenchDataTest, EveryTypeChecksItsOwnSum) {
  constexpr uint32_t kWorld = 5;
  constexpr size_t kCount = 64;
  for (common::DataType dtype : common::kAllDataTypes) {
    // Sum the inputs in double and store them as the type: exact by construction.
    std::vector<double> sum(kCount, 0);
    for (uint32_t rank = 0; rank < kWorld; ++rank) {
      for (size_t i = 0; i < kCount; ++i) sum[i] += InputValue(dtype, rank, i);
    }
    std::vector<unsigned char> bytes(kCount * common::DataTypeSize(dtype));
    // Fill with rank 0's data, then check that it is not taken for the sum.
    FillInput(dtype, 0, bytes.data(), kCount);
    EXPECT_EQ(CountWrong(dtype, BenchOp::kSum, kWorld, 0, bytes.data(), kCount), kCount)
        << common::DataTypeName(dtype);
    // Rank 0's data is what a broadcast from root 0 leaves.
    EXPECT_EQ(CountWrong(dtype, BenchOp::kBroadcast, kWorld, 0, bytes.data(), kCount), 0u)
        << common::DataTypeName(dtype);
    EXPECT_EQ(CountWrong(dtype, BenchOp::kBroadcast, kWorld, 1, bytes.data(), kCount), kCount)
        << common::DataTypeName(dtype);
    for (size_t i = 0; i < kCount; ++i) {
      EXPECT_EQ(sum[i], ExpectedValue(dtype, BenchOp::kSum, kWorld, 0, i));
    }
  }
}

TEST(BenchDataTest, HalfWidthInputsStayExact) {
  // 16-bit types use small values so that sums of many ranks stay exact.
  EXPECT_EQ(InputValue(common::DataType::kBFloat16, 0, 0), 1);
  EXPECT_EQ(InputValue(common::DataType::kBFloat16, 1, 2), 6);
  EXPECT_EQ(InputValue(common::DataType::kBFloat16, 2, 3), 1);
  EXPECT_EQ(InputValue(common::DataType::kFloat32, 3, 6), 28);
  EXPECT_EQ(ExpectedValue(common::DataType::kFloat16, BenchOp::kSum, 3, 0, 1), (1 + 2 + 1) * 2);
  std::vector<uint16_t> h(6);
  FillInput(common::DataType::kFloat16, 1, h.data(), h.size());
  EXPECT_EQ(common::Fp16ToFp32(h[0]), 2);
  EXPECT_EQ(common::Fp16ToFp32(h[5]), 6);
}

TEST(BenchDataTest, ParsesOps) {
  EXPECT_EQ(*ParseBenchOp("sum"), BenchOp::kSum);
  EXPECT_EQ(*ParseBenchOp("avg"), BenchOp::kAverage);
  EXPECT_EQ(*ParseBenchOp("bcast"), BenchOp::kBroadcast);
  EXPECT_EQ(*ParseBenchOp("allgather"), BenchOp::kAllGather);
  EXPECT_EQ(*ParseBenchOp("reduce-scatter"), BenchOp::kReduceScatter);
  EXPECT_EQ(BenchOpName(BenchOp::kReduceScatter), "reduce-scatter");
  EXPECT_FALSE(ParseBenchOp("max").ok());
}

// All-gather and reduce-scatter regions, computed as a correct data plane would from every
// rank's input, pass; a block left as it was, or one wrong element, is counted.
TEST(BenchDataTest, BlockwiseRegionsAreCheckedBlockByBlock) {
  constexpr size_t kBlock = 10;  // not a multiple of the pattern's period: offsets matter
  for (common::DataType dtype : common::kAllDataTypes) {
    const size_t es = common::DataTypeSize(dtype);
    for (uint32_t world : {1u, 3u, 4u}) {
      const size_t region = kBlock * world;
      std::vector<std::vector<std::byte>> in(world, std::vector<std::byte>(region * es));
      for (uint32_t r = 0; r < world; ++r) {
        FillBlockwiseInput(dtype, BenchOp::kAllGather, r, world, in[r].data(), kBlock);
      }
      // All-gather: block b from rank b.
      std::vector<std::byte> gathered(region * es);
      for (uint32_t b = 0; b < world; ++b) {
        std::memcpy(gathered.data() + b * kBlock * es, in[b].data() + b * kBlock * es, kBlock * es);
      }
      for (uint32_t r = 0; r < world; ++r) {
        EXPECT_EQ(
            CountWrongBlockwise(dtype, BenchOp::kAllGather, r, world, gathered.data(), kBlock), 0u)
            << common::DataTypeName(dtype) << " world " << world;
        // Before the all-gather every other rank's block is wrong.
        EXPECT_EQ(CountWrongBlockwise(dtype, BenchOp::kAllGather, r, world, in[r].data(), kBlock),
                  (world - 1) * kBlock);
      }
      // Reduce-scatter: the inputs cover the whole region and sum to ExpectedValue.
      std::vector<std::byte> one(region * es);
      for (uint32_t r = 0; r < world; ++r) {
        FillBlockwiseInput(dtype, BenchOp::kReduceScatter, r, world, one.data(), kBlock);
        // Only its own input: its block is wrong unless the world is one rank.
        EXPECT_EQ(CountWrongBlockwise(dtype, BenchOp::kReduceScatter, r, world, one.data(), kBlock),
                  world == 1 ? 0u : kBlock)
            << common::DataTypeName(dtype) << " world " << world << " rank " << r;
      }
    }
  }
  // The float32 sum of every rank's region passes on every rank's block, and one wrong element
  // of a rank's block is counted (elements outside it are not looked at).
  constexpr uint32_t kWorld = 3;
  std::vector<float> sum(kBlock * kWorld, 0), in(kBlock * kWorld);
  for (uint32_t r = 0; r < kWorld; ++r) {
    FillBlockwiseInput(common::DataType::kFloat32, BenchOp::kReduceScatter, r, kWorld, in.data(),
                       kBlock);
    for (size_t i = 0; i < in.size(); ++i) sum[i] += in[i];
  }
  for (uint32_t r = 0; r < kWorld; ++r) {
    EXPECT_EQ(CountWrongBlockwise(common::DataType::kFloat32, BenchOp::kReduceScatter, r, kWorld,
                                  sum.data(), kBlock),
              0u);
  }
  sum[kBlock + 3] += 1;  // rank 1's block
  EXPECT_EQ(CountWrongBlockwise(common::DataType::kFloat32, BenchOp::kReduceScatter, 1, kWorld,
                                sum.data(), kBlock),
            1u);
  EXPECT_EQ(CountWrongBlockwise(common::DataType::kFloat32, BenchOp::kReduceScatter, 0, kWorld,
                                sum.data(), kBlock),
            0u);
}

// --- plan view -------------------------------------------------------------------------------

v1::Job ExampleJob() {
  v1::Job job;
  job.set_job_id("resnet");
  v1::JobPlan* plan = job.mutable_plan();
  plan->set_version(3);
  plan->set_procs_per_node(2);
  plan->set_partition_bytes(4 << 20);
  plan->set_credit_bytes(16 << 20);
  plan->set_model_bytes(64 << 20);
  plan->set_predicted_seconds_per_byte(1e-10);
  plan->set_ring_seconds_per_byte(1.5e-10);
  for (const char* node : {"w0", "w1"}) plan->add_workers()->set_node_id(node);
  auto* s0 = plan->add_servers();
  s0->set_node_id("w0");
  s0->set_is_worker(true);
  s0->set_share(0.25);
  s0->set_weight(1ull << 30);
  s0->set_nic_bytes_per_s(12.5e9);
  auto* s1 = plan->add_servers();
  s1->set_node_id("cpu0");
  s1->set_share(0.75);
  s1->set_weight(3ull << 30);
  s1->set_nic_bytes_per_s(12.5e9);
  s1->set_sum_bytes_per_s(20e9);
  return job;
}

TEST(PlanViewTest, SplitAndPrediction) {
  const v1::Job job = ExampleJob();
  EXPECT_EQ(PlanModelBytes(job, std::nullopt), 64u << 20);
  EXPECT_EQ(PlanModelBytes(job, 1000), 1000u);
  EXPECT_EQ(ServerBytes(job.plan().servers(0), 64 << 20), 16u << 20);
  EXPECT_EQ(ServerBytes(job.plan().servers(1), 64 << 20), 48u << 20);

  const std::string text = RenderPlan(job, 1'000'000'000);
  EXPECT_THAT(text, HasSubstr("plan version 3"));
  EXPECT_THAT(text, HasSubstr("w0      worker  25.0%  250000000     12.50         -"));
  EXPECT_THAT(text, HasSubstr("cpu0    spare   75.0%  750000000     12.50     20.00"));
  EXPECT_THAT(text, HasSubstr("predicted 0.1 s vs ring all-reduce 0.15 s (speed-up 1.50 x)"));
  EXPECT_THAT(text, HasSubstr("credit 16.0 MiB, fusion off"));

  const nlohmann::json json = PlanToJson(job, 1'000'000'000);
  EXPECT_EQ(json["servers"][1]["role"], "spare");
  EXPECT_EQ(json["servers"][1]["bytes"], 750000000u);
  EXPECT_DOUBLE_EQ(json["speedup"].get<double>(), 1.5);
  EXPECT_EQ(json["fusion_bytes"], 0u);

  v1::Job fused = job;
  fused.mutable_plan()->set_fusion_bytes(256 << 10);
  EXPECT_THAT(RenderPlan(fused, 1'000'000'000), HasSubstr("fusion 256.0 KiB (cycle auto)"));
  fused.mutable_plan()->set_fusion_cycle_us(1500);
  EXPECT_THAT(RenderPlan(fused, 1'000'000'000), HasSubstr("fusion 256.0 KiB (cycle 1500 us)"));
  EXPECT_EQ(PlanToJson(fused, 1'000'000'000)["fusion_cycle_us"], 1500u);

  // An auto job names the NIC rate its nodes price the algorithms by; a fixed algorithm does not.
  v1::Job automatic = job;
  automatic.mutable_plan()->set_selector_nic_bytes_per_s(15.625e6);
  automatic.mutable_plan()->set_algorithm(v1::ALGORITHM_RING);
  EXPECT_THAT(RenderPlan(automatic, 1'000'000'000), Not(HasSubstr("slowest NIC")));
  automatic.mutable_plan()->set_algorithm(v1::ALGORITHM_AUTO);
  EXPECT_THAT(
      RenderPlan(automatic, 1'000'000'000),
      HasSubstr("algorithm per tensor by size, priced at the job's slowest NIC (0.02 GB/s)"));
  EXPECT_DOUBLE_EQ(PlanToJson(automatic, 1'000'000'000)["selector_nic_bytes_per_s"].get<double>(),
                   15.625e6);
}

}  // namespace
}  // namespace tributary::client::cli
