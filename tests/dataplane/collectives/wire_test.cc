#include "dataplane/collectives/wire.h"

#include <cstring>
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
  EXPECT_EQ(sizeof(WireHeader), 120u);  // 104 + the 16-byte job MAC
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

// Found by tests/fuzz/wire_header_fuzz.cc under UBSan: the version 2 layout put the 64-bit
// fields at offset 12, so every reference bound to one (StrCat, std::max, fmt) was misaligned.
// Now each field is at a multiple of its size (the static_asserts in wire.h) and a header from
// any byte position of a message parses and is described into an aligned copy.
TEST(WireTest, HeaderAtAnyOffsetParsesIntoAnAlignedCopy) {
  EXPECT_EQ(alignof(WireHeader), 8u);
  const WireHeader h = Push();
  std::vector<std::byte> buffer(sizeof(WireHeader) + 8);
  for (size_t at = 0; at < 8; ++at) {
    std::memcpy(buffer.data() + at, &h, sizeof(h));
    absl::StatusOr<WireHeader> parsed = ParseHeader({buffer.data() + at, sizeof(h)}, 40);
    ASSERT_TRUE(parsed.ok()) << at << ": " << parsed.status();
    EXPECT_EQ(parsed->tensor_count, h.tensor_count);
    EXPECT_THAT(Describe(*parsed), HasSubstr("chunk 0/"));
  }
}

}  // namespace
}  // namespace tributary::dataplane
