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

}  // namespace
}  // namespace tributary::bench
