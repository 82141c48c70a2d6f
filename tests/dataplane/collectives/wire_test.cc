#include "dataplane/collectives/wire.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tributary::dataplane {
namespace {

using ::testing::HasSubstr;

// A valid push/pull push of chunk 0/1 of 10 float32 from worker 1.
WireHeader Push() {
  WireHeader h;
  h.kind = static_cast<uint8_t>(MessageKind::kPush);
  h.algorithm = static_cast<uint8_t>(Algorithm::kPushPull);
  h.dtype = static_cast<uint8_t>(common::DataType::kFloat32);
  h.reduce = static_cast<uint8_t>(Reduction::kSum);
  h.tensor_count = 10;
  h.num_chunks = 1;
  h.chunk_count = 10;
  h.sender = 1;
  return h;
}

// A valid ring sub-chunk [4, +3) of a 10-element float32 tensor from rank 2 of 4.
WireHeader Data() {
  WireHeader h;
  h.kind = static_cast<uint8_t>(MessageKind::kData);
  h.algorithm = static_cast<uint8_t>(Algorithm::kRing);
  h.dtype = static_cast<uint8_t>(common::DataType::kFloat32);
  h.reduce = static_cast<uint8_t>(Reduction::kAverage);
  h.tensor_count = 10;
  h.world_size = 4;
  h.sender = 2;
  h.num_chunks = 2;
  h.chunk = 1;
  h.chunk_offset = 4;
  h.chunk_count = 3;
  return h;
}

std::string Error(const WireHeader& h, size_t payload) {
  return std::string(ParseHeader(AsBytes(h), payload).status().message());
}

TEST(WireTest, OneHeaderForEveryMessage) {
  EXPECT_EQ(sizeof(WireHeader), 116u);  // 100 + the 16-byte job MAC
  EXPECT_TRUE(ParseHeader(AsBytes(Push()), 40).ok());
  EXPECT_TRUE(ParseHeader(AsBytes(Data()), 12).ok());
  // Results come from a server; errors and aborts carry a code, whatever their algorithm.
  WireHeader result = Push();
  result.kind = static_cast<uint8_t>(MessageKind::kResult);
  result.sender = WireHeader::kFromServer;
  EXPECT_TRUE(ParseHeader(AsBytes(result), 40).ok());
  for (Algorithm a : {Algorithm::kPushPull, Algorithm::kRing, Algorithm::kHalvingDoubling}) {
    for (MessageKind k : {MessageKind::kError, MessageKind::kAbort}) {
      WireHeader e;
      e.kind = static_cast<uint8_t>(k);
      e.algorithm = static_cast<uint8_t>(a);
      e.world_size = 4;
      e.sender = 3;
      e.error_code = static_cast<uint32_t>(absl::StatusCode::kAborted);
      EXPECT_TRUE(ParseHeader(AsBytes(e), 7).ok()) << AlgorithmName(a);
      e.error_code = 0;
      EXPECT_THAT(Error(e, 7), HasSubstr("bad error code 0"));
    }
  }
}

TEST(WireTest, RejectsWhatDoesNotFit) {
  EXPECT_THAT(Error(Push(), 36), HasSubstr("payload of 36 bytes, expected 40"));
  EXPECT_THAT(std::string(ParseHeader(AsBytes(Push()).first(99), 40).status().message()),
              HasSubstr("header of 99 bytes"));
  WireHeader h = Push();
  h.version = 1;
  EXPECT_THAT(Error(h, 40), HasSubstr("unsupported version 1"));
  h = Push();
  h.algorithm = static_cast<uint8_t>(Algorithm::kAuto);
  EXPECT_THAT(Error(h, 40), HasSubstr("unknown algorithm 0"));
  h = Push();
  h.algorithm = static_cast<uint8_t>(Algorithm::kHalvingDoubling);
  EXPECT_THAT(Error(h, 40), HasSubstr("does not belong to halving_doubling"));
  h = Data();
  h.algorithm = static_cast<uint8_t>(Algorithm::kPushPull);
  EXPECT_THAT(Error(h, 12), HasSubstr("does not belong to push_pull"));
  h = Data();
  h.reduce = 7;
  EXPECT_THAT(Error(h, 12), HasSubstr("unknown reduction 7"));
  h = Push();
  h.reduce = static_cast<uint8_t>(Reduction::kAllGather);
  EXPECT_THAT(Error(h, 40), HasSubstr("allgather does not run on push/pull"));
  h = Data();
  h.sender = 4;
  EXPECT_THAT(Error(h, 12), HasSubstr("sender 4 of a world of 4"));
  h = Data();
  h.chunk_count = 7;
  EXPECT_THAT(Error(h, 28), HasSubstr("out of range"));
  h = Push();
  h.chunk_offset = 1;
  EXPECT_THAT(Error(h, 40), HasSubstr("expected [0, +10)"));
  h = Push();
  h.kind = 6;
  EXPECT_THAT(Error(h, 40), HasSubstr("unknown message kind 6"));
}

TEST(WireTest, BroadcastPushesFromOtherWorkersAreEmpty) {
  WireHeader h = Push();
  h.reduce = static_cast<uint8_t>(Reduction::kBroadcast);
  h.root = 0;
  EXPECT_TRUE(ParseHeader(AsBytes(h), 0).ok());
  EXPECT_THAT(Error(h, 40), HasSubstr("expected 0"));
  h.sender = 0;
  EXPECT_TRUE(ParseHeader(AsBytes(h), 40).ok());
}

}  // namespace
}  // namespace tributary::dataplane
