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

// A valid parameter-server delta: chunk 1/2 [5, +5) of 10 float32 from worker 2 of 4, clock 3.
WireHeader Delta() {
  WireHeader h;
  h.kind = static_cast<uint8_t>(MessageKind::kPush);
  h.algorithm = static_cast<uint8_t>(Algorithm::kParameterServer);
  h.dtype = static_cast<uint8_t>(common::DataType::kFloat32);
  h.reduce = static_cast<uint8_t>(Reduction::kPsDelta);
  h.tensor_count = 10;
  h.num_chunks = 2;
  h.chunk = 1;
  h.chunk_offset = 5;
  h.chunk_count = 5;
  h.world_size = 4;
  h.sender = 2;
  h.root = 2;
  h.step = 3;
  return h;
}

TEST(WireTest, ParameterServerMessages) {
  EXPECT_TRUE(ParseHeader(AsBytes(Delta()), 20).ok());
  WireHeader pull = Delta();
  pull.kind = static_cast<uint8_t>(MessageKind::kPull);
  pull.reduce = static_cast<uint8_t>(Reduction::kPsPull);
  pull.step = 0;
  EXPECT_TRUE(ParseHeader(AsBytes(pull), 0).ok());
  WireHeader init_pull = pull;  // init on a rank other than 0 waits for the values
  init_pull.reduce = static_cast<uint8_t>(Reduction::kPsInit);
  EXPECT_TRUE(ParseHeader(AsBytes(init_pull), 0).ok());
  WireHeader values = pull;  // the answer to a pull: 8 bytes of version, then the values
  values.kind = static_cast<uint8_t>(MessageKind::kResult);
  values.sender = WireHeader::kFromServer;
  EXPECT_TRUE(ParseHeader(AsBytes(values), 28).ok());
  WireHeader ack = Delta();  // the acknowledgement of a delta: no payload
  ack.kind = static_cast<uint8_t>(MessageKind::kResult);
  ack.sender = WireHeader::kFromServer;
  EXPECT_TRUE(ParseHeader(AsBytes(ack), 0).ok());
  WireHeader error = ack;
  error.kind = static_cast<uint8_t>(MessageKind::kError);
  error.error_code = 9;
  EXPECT_TRUE(ParseHeader(AsBytes(error), 17).ok());

  struct Row {
    std::string what;
    WireHeader h;
    size_t payload;
    std::string error;
  };
  std::vector<Row> rows;
  auto add = [&](std::string what, auto mutate, size_t payload, std::string error) {
    WireHeader h = Delta();
    mutate(h);
    rows.push_back({std::move(what), h, payload, std::move(error)});
  };
  add(
      "truncated delta", [](WireHeader&) {}, 19, "payload of 19 bytes");
  add(
      "pull with values",
      [](WireHeader& h) {
        h.kind = static_cast<uint8_t>(MessageKind::kPull);
        h.reduce = static_cast<uint8_t>(Reduction::kPsPull);
      },
      20, "payload of 20 bytes");
  add(
      "pull answer without version",
      [](WireHeader& h) {
        h.kind = static_cast<uint8_t>(MessageKind::kResult);
        h.reduce = static_cast<uint8_t>(Reduction::kPsPull);
        h.sender = WireHeader::kFromServer;
      },
      20, "payload of 20 bytes");
  add(
      "empty pull answer",
      [](WireHeader& h) {
        h.kind = static_cast<uint8_t>(MessageKind::kResult);
        h.reduce = static_cast<uint8_t>(Reduction::kPsPull);
        h.sender = WireHeader::kFromServer;
      },
      0, "payload of 0 bytes");
  add(
      "clock 0", [](WireHeader& h) { h.step = 0; }, 20, "clock 0");
  add(
      "worker outside the world", [](WireHeader& h) { h.root = h.sender = 4; }, 20,
      "worker 4 (sender 4) of a world of 4");
  add(
      "sender is not the worker", [](WireHeader& h) { h.sender = 1; }, 20, "sender 1");
  add(
      "empty world", [](WireHeader& h) { h.world_size = 0; }, 20, "of a world of 0");
  add(
      "result from a worker", [](WireHeader& h) { h.kind = 2; }, 0, "only the server answers");
  add(
      "push from the server", [](WireHeader& h) { h.sender = WireHeader::kFromServer; }, 20,
      "only the server answers");
  add(
      "a pull as a push", [](WireHeader& h) { h.reduce = 9; }, 20, "does not carry pull_params");
  add(
      "a delta as a pull", [](WireHeader& h) { h.kind = 6; }, 0, "does not carry push_delta");
  add(
      "a sum on the parameter server", [](WireHeader& h) { h.reduce = 1; }, 20,
      "does not run on the parameter server");
  add(
      "ring data", [](WireHeader& h) { h.kind = 4; }, 20, "does not belong to parameter_server");
  add(
      "an abort", [](WireHeader& h) { h.kind = 5; }, 0, "does not belong to parameter_server");
  add(
      "chunk out of range", [](WireHeader& h) { h.chunk = 2; }, 20, "out of range");
  add(
      "chunk range shifted", [](WireHeader& h) { h.chunk_offset = 4; }, 20, "expected [5, +5)");
  add(
      "bad dtype", [](WireHeader& h) { h.dtype = 77; }, 20, "unknown dtype 77");
  add(
      "bad error code", [](WireHeader& h) { h.kind = 3; }, 3, "bad error code 0");
  add(
      "a pull on push/pull",
      [](WireHeader& h) {
        h.kind = 6;
        h.algorithm = static_cast<uint8_t>(Algorithm::kPushPull);
      },
      0, "belongs to parameter_server only");
  add(
      "a delta on push/pull",
      [](WireHeader& h) { h.algorithm = static_cast<uint8_t>(Algorithm::kPushPull); }, 20,
      "unknown reduction 8");
  add(
      "algorithm 6", [](WireHeader& h) { h.algorithm = 6; }, 20, "unknown algorithm 6");
  for (const Row& row : rows) {
    absl::StatusOr<WireHeader> parsed = ParseHeader(AsBytes(row.h), row.payload);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << row.what;
    EXPECT_THAT(parsed.status().message(), HasSubstr(row.error)) << row.what;
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
  h.kind = 10;
  EXPECT_THAT(Error(h, 40), HasSubstr("unknown message kind 10"));
  // A ring sub-chunk of 2^63 bf16 elements: 2^64 bytes would wrap to an empty payload (found by
  // wire_header_fuzz, seed 2).
  h = Data();
  h.dtype = static_cast<uint8_t>(common::DataType::kBFloat16);
  h.tensor_count = UINT64_MAX;
  h.chunk_offset = 0;
  h.chunk_count = uint64_t{1} << 63;
  EXPECT_THAT(Error(h, 0), HasSubstr("is too large"));
  h = Push();
  h.tensor_count = uint64_t{1} << 63;
  h.chunk_count = uint64_t{1} << 63;
  EXPECT_THAT(Error(h, 0), HasSubstr("is too large"));
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
TEST(WireTest, PeerRecoveryMessages) {
  auto parse = [](WireHeader h, size_t payload) {
    return ParseHeader(std::as_bytes(std::span(&h, 1)), payload);
  };
  WireHeader query = Push();
  query.kind = static_cast<uint8_t>(MessageKind::kPeerQuery);
  query.chunk_count = 0;
  EXPECT_TRUE(parse(query, 0).ok());
  EXPECT_THAT(parse(query, 4).status().message(), HasSubstr("expected 0"));
  WireHeader fetch = query;
  fetch.kind = static_cast<uint8_t>(MessageKind::kPeerFetch);
  EXPECT_TRUE(parse(fetch, 4).ok());
  EXPECT_THAT(parse(fetch, 0).status().message(), HasSubstr("chunk list"));
  EXPECT_THAT(parse(fetch, 6).status().message(), HasSubstr("chunk list"));
  EXPECT_THAT(parse(fetch, 8).status().message(), HasSubstr("chunk list"));  // 2 of 1 chunk
  WireHeader answer;
  answer.kind = static_cast<uint8_t>(MessageKind::kPeerAnswer);
  answer.algorithm = static_cast<uint8_t>(Algorithm::kPushPull);
  answer.sender = 2;
  EXPECT_TRUE(parse(answer, 0).ok());
  answer.error_code = static_cast<uint32_t>(absl::StatusCode::kNotFound);
  EXPECT_TRUE(parse(answer, 0).ok());
  answer.error_code = static_cast<uint32_t>(absl::StatusCode::kInternal);
  EXPECT_THAT(parse(answer, 0).status().message(), HasSubstr("bad peer answer"));
  // Push/pull only, from a worker.
  query.algorithm = static_cast<uint8_t>(Algorithm::kRing);
  query.world_size = 4;
  EXPECT_THAT(parse(query, 0).status().message(), HasSubstr("push_pull only"));
  query.algorithm = static_cast<uint8_t>(Algorithm::kPushPull);
  query.sender = WireHeader::kFromServer;
  EXPECT_THAT(parse(query, 0).status().message(), HasSubstr("worker rank"));
  query.kind = 10;
  EXPECT_THAT(parse(query, 0).status().message(), HasSubstr("unknown message kind"));
}

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
