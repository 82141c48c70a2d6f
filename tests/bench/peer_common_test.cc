// The suite's peer programs share peer_common.h: its DDP-style bucketing and the exact input
// pattern must be right for the Gloo and MPI numbers to mean anything.
#include "bench/suite/peer_common.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "gtest/gtest.h"

namespace tributary::bench {
namespace {

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST(PeerCommon, BucketsPackTensorsInOrderUpToTheCap) {
  // 25 MiB cap = 6,553,600 floats.
  const std::string path =
      WriteFile("peer_common_buckets.tensors",
                "# backward order\nfc.bias 1000\nfc.weight 2048000\nbig 5000000\nsmall 10\n"
                "huge 9000000\nlast 7\n");
  size_t tensors = 0;
  const std::vector<size_t> buckets = ReadBuckets(path, 25ull << 20, &tensors);
  EXPECT_EQ(tensors, 6u);
  // fc.bias + fc.weight fit; big would overflow -> new bucket with small; huge is alone (it is
  // larger than the cap); last starts the next bucket.
  EXPECT_EQ(buckets, (std::vector<size_t>{2049000, 5000010, 9000000, 7}));
  EXPECT_EQ(std::accumulate(buckets.begin(), buckets.end(), size_t{0}),
            size_t{1000 + 2048000 + 5000000 + 10 + 9000000 + 7});
}

TEST(PeerCommon, BadWorkloadFilesGiveNoBuckets) {
  size_t tensors = 0;
  EXPECT_TRUE(
      ReadBuckets(WriteFile("peer_common_bad.tensors", "a 3\nb -1\n"), 1 << 20, &tensors).empty());
  EXPECT_TRUE(ReadBuckets("/nonexistent/peer_common.tensors", 1 << 20, &tensors).empty());
}

TEST(PeerCommon, BucketedWorkloadRunsEveryBucketInOrderAndChecks) {
  PeerFlags f;
  f.tensors = WriteFile("peer_common_run.tensors", "a 10\nb 20\nc 7\n");
  f.bucket_bytes = 30 * sizeof(float);  // buckets of 30 and 7
  f.iters = 2;
  f.warmup = 1;
  std::vector<size_t> prepared, reduced;
  int barriers = 0;
  // Two "ranks" simulated in one: the all-reduce adds rank 1's input, so every sum is exact.
  const WorkloadResult r = RunBucketedWorkload(
      f, /*rank=*/0, /*world=*/2, [&](size_t i, float*, size_t) { prepared.push_back(i); },
      [&] { ++barriers; },
      [&](size_t i, float* data, size_t count) {
        std::vector<float> other(count);
        Fill(other.data(), count, 1);
        for (size_t e = 0; e < count; ++e) data[e] += other[e];
        reduced.push_back(i);
      });
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.tensors, 3u);
  EXPECT_EQ(r.buckets, 2u);
  EXPECT_EQ(r.bytes, 37 * sizeof(float));
  EXPECT_EQ(r.wrong, 0u);
  EXPECT_EQ(prepared, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(reduced, (std::vector<size_t>{0, 1, 0, 1, 0, 1}));  // warm-up + 2 timed
  EXPECT_EQ(barriers, 3);
  // A missing sum is counted.
  const WorkloadResult bad = RunBucketedWorkload(
      f, 0, 2, [](size_t, float*, size_t) {}, [] {}, [](size_t, float*, size_t) {});
  EXPECT_EQ(bad.wrong, 2u * 37);
  f.tensors = "/nonexistent/peer_common.tensors";
  EXPECT_FALSE(RunBucketedWorkload(
                   f, 0, 2, [](size_t, float*, size_t) {}, [] {}, [](size_t, float*, size_t) {})
                   .ok);
}

TEST(PeerCommon, InputSumsAreExactAndChecked) {
  const int world = 4;
  std::vector<float> sum(1000, 0), one(1000);
  for (int r = 0; r < world; ++r) {
    Fill(one.data(), one.size(), r);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += one[i];
  }
  EXPECT_EQ(CountWrong(sum.data(), sum.size(), world), 0u);
  sum[17] += 1;
  sum[999] = 0;
  EXPECT_EQ(CountWrong(sum.data(), sum.size(), world), 2u);
}

// argv for ParsePeerFlags: program name first.
bool Parse(std::vector<std::string> args, PeerFlags& f) {
  args.insert(args.begin(), "peer");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return ParsePeerFlags(static_cast<int>(argv.size()), argv.data(), f,
                        [](const std::string&, const std::string&) { return false; });
}

TEST(PeerCommon, FlagsParseSizesAsTheCliDoes) {
  PeerFlags f;
  ASSERT_TRUE(Parse({"--sizes", "4K:16K,1MiB", "--large-from", "16M", "--bucket-bytes", "1m",
                     "--iters", "3", "--no-check"},
                    f));
  EXPECT_EQ(f.size_list, (std::vector<uint64_t>{4096, 8192, 16384, 1 << 20}));
  EXPECT_EQ(f.large_from, 16ull << 20);
  EXPECT_EQ(f.bucket_bytes, 1ull << 20);
  EXPECT_EQ(f.iters, 3);
  EXPECT_FALSE(f.check);
  PeerFlags defaults;
  ASSERT_TRUE(Parse({}, defaults));
  EXPECT_EQ(defaults.size_list.size(), 17u);  // 4K:256M.
  // What the old hand-written parser let through as garbage is rejected now.
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--sizes", "4Q"},
                                              {"--sizes", "64M:4K"},
                                              {"--sizes", "0"},
                                              {"--large-from", "1.5M"},
                                              {"--bucket-bytes", "x"},
                                              {"--unknown", "1"},
                                              {"--sizes"}}) {
    PeerFlags g;
    EXPECT_FALSE(Parse(bad, g)) << bad[0];
  }
}

TEST(PeerCommon, SizeSweepTimesChecksAndReportsEverySize) {
  PeerFlags f;
  f.size_list = {16, 2, 64};  // 2 bytes hold no float: skipped.
  f.iters = 3;
  f.warmup = 1;
  f.large_from = 64;
  f.large_iters = 2;
  std::vector<size_t> setups, reduced;
  int after = 0;
  // Two "ranks" simulated in one, as above; the sum is wrong for the 64-byte size's last element.
  const size_t wrong = RunSizeSweep(
      f, /*rank=*/0, /*world=*/2, "Test", [&](float*, size_t count) { setups.push_back(count); },
      [&](float* data, size_t count) {
        std::vector<float> other(count);
        Fill(other.data(), count, 1);
        for (size_t e = 0; e < count; ++e) data[e] += other[e];
        if (count == 16) data[15] = -1;
        reduced.push_back(count);
      },
      [](size_t w) { return 10 * w; }, [&] { ++after; });
  EXPECT_EQ(setups, (std::vector<size_t>{4, 16}));
  // 4 floats: 1 warm-up + 3 timed; 16 floats (from large_from): 1 warm-up + 2 timed.
  EXPECT_EQ(reduced, (std::vector<size_t>{4, 4, 4, 4, 16, 16, 16}));
  EXPECT_EQ(after, 2);
  EXPECT_EQ(wrong, 10u * 2);  // One wrong element per timed iteration, as reported.
}

}  // namespace
}  // namespace tributary::bench
