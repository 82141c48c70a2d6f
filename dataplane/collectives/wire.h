// The data plane's one message header, for every algorithm and every message: push/pull pushes
// and results, ring / halving-doubling sub-chunks, errors and aborts. Fixed layout, little-endian
// hosts only, validated on receipt by ParseHeader: a malformed or truncated message from a peer
// is rejected, never trusted. DataPlaneNode routes a parsed message by its `algorithm`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "dataplane/collectives/algorithm_selector.h"
#include "dataplane/collectives/operation.h"
#include "dataplane/transport/transport.h"

namespace tributary::dataplane {

enum class MessageKind : uint8_t {
  kPush = 1,    // push/pull, worker -> server: this worker's contribution to one chunk
  kResult = 2,  // push/pull, server -> worker: the reduced chunk
  kError = 3,   // the collective failed at the sender (push/pull server -> worker, or ring /
                // halving-doubling rank -> every other rank); payload: the reason (text)
  kData = 4,    // ring / halving-doubling, rank -> rank: one sub-chunk of one step
  kAbort = 5,   // a participant gives up on the collective (push/pull: worker -> the tensor's
                // home server, which fails it for every worker; ring / halving-doubling: rank ->
                // every other rank); payload: the reason (text)
  kPull = 6,    // parameter server, worker -> server: send me this chunk's parameters; no payload
  // Push/pull peer recovery (PushPullWorker, "fan-out hole"): a worker that lost a summation
  // server, or waited out its deadline, with every chunk pushed asks the job's other workers
  // whether they completed the collective (a server may have sent some workers the sum before
  // it died). No payloads but kPeerFetch's; `plan_version` is the asker's attempt.
  kPeerQuery = 7,   // worker -> worker: did you complete (tensor, iteration)?
  kPeerAnswer = 8,  // worker -> worker: error_code 0: yes, I keep its result; NOT_FOUND: no
  kPeerFetch = 9,   // worker -> worker that answered yes: send me these chunks' sums as kResult
                    // (sender = the peer's rank); payload: uint32 chunk indices, ascending
};
inline constexpr uint8_t kMaxMessageKind = 9;

// Parameter-server messages (algorithm kParameterServer, parameter_server.h) use the push/pull
// chunk fields and: reduce = kPsInit / kPsDelta / kPsPull; root = the worker's global rank (in
// both directions); world_size = the job's training processes; sender = root, or kFromServer
// from the server; iteration = the worker's request id (echoed); step = kPsDelta's clock
// (1-based); reserved1 = kPsDelta's scale as float32 bits (0: the job's). Payloads: kPush the
// chunk's values; kPull none; kResult none (acknowledges a push) or 8 bytes of version then the
// chunk's values (answers a pull); kError the reason.

// Every field sits at a multiple of its size and the struct is 8-aligned: code binds references
// to the fields (StrCat, std::max, fmt), and a reference to a misaligned field is undefined
// behaviour (UBSan -fsanitize=alignment, found by tests/fuzz/wire_header_fuzz.cc). Version 3:
// reserved0 grew from 3 to 7 bytes to put `job` at offset 16; the 16-byte job MAC ends it. Its
// last 4 bytes then became `sender_instance` (0 from senders that do not stamp it).
#pragma pack(push, 1)
struct alignas(8) WireHeader {
  static constexpr uint32_t kMagic = 0x42495254;  // "TRIB"
  static constexpr uint8_t kVersion = 3;
  static constexpr size_t kMacBytes = 16;
  static constexpr uint32_t kFromServer = UINT32_MAX;

  uint32_t magic = kMagic;
  uint8_t version = kVersion;
  uint8_t kind = 0;       // MessageKind
  uint8_t dtype = 0;      // common::DataType
  uint8_t reduce = 0;     // Reduction
  uint8_t algorithm = 0;  // Algorithm, never kAuto
  uint8_t reserved0[3] = {0, 0, 0};
  // The sending agent process's incarnation (InstanceTag of its agent_instance), stamped by
  // AuthenticatingTransport and covered by the MAC: a message of an agent process the job's
  // plan no longer names (it was restarted, or frozen and resumed after its replacement) is
  // dropped and counted, never summed. 0 = not stamped.
  uint32_t sender_instance = 0;
  uint64_t job = 0;        // StableHash64(job id)
  uint64_t tensor = 0;     // StableHash64(tensor name)
  uint64_t iteration = 0;  // n-th submission of this tensor name in the job
  uint64_t plan_version = 0;
  uint64_t tensor_count = 0;  // elements in the whole tensor
  uint32_t world_size = 0;    // ring / halving-doubling: ranks in the collective
  uint32_t sender = 0;        // worker rank, or kFromServer (push/pull server)
  uint32_t root = 0;          // broadcast: worker rank of the root node; 0 otherwise
  // Ring / halving-doubling: index into the receiver's schedule. Push/pull, push of chunk 0
  // only: the sender's measured throughput of the previous iteration of this tensor, KiB/s
  // (tensor bytes / (completion - start) on its clock); 0 = no report.
  uint32_t step = 0;
  uint32_t num_chunks = 0;    // push/pull: chunks of the tensor; else sub-chunks of the step
  uint32_t chunk = 0;         // index of this chunk (sub-chunk)
  uint64_t chunk_offset = 0;  // first element of this chunk in the tensor
  uint64_t chunk_count = 0;   // elements in this chunk (ring / HD: 0 when the step's range is)
  uint32_t error_code = 0;    // absl::StatusCode, kError and kAbort only
  // Push/pull, result of chunk 0 only: the home server's current partition decision for this
  // tensor, KiB; workers apply it from iteration + 2 on. 0 = no decision (plan's partition).
  uint32_t reserved1 = 0;
  // Proof of job membership: HMAC-SHA256 over this header (with `mac` zeroed) under the job's
  // secret, first 16 bytes. Filled and checked by AuthenticatingTransport (message_auth.h);
  // zero where no authenticator runs (in-process tests).
  uint8_t mac[kMacBytes] = {};
};
#pragma pack(pop)
static_assert(sizeof(WireHeader) <= Transport::kMaxHeaderBytes);
static_assert(sizeof(WireHeader) == 120 && offsetof(WireHeader, mac) == 104 &&
              offsetof(WireHeader, sender_instance) == 12 && offsetof(WireHeader, job) == 16 &&
              offsetof(WireHeader, world_size) == 56 && offsetof(WireHeader, chunk_offset) == 80);

// Identifies one collective: sums never mix jobs, tensors or iterations.
struct CollectiveKey {
  uint64_t job = 0;
  uint64_t tensor = 0;
  uint64_t iteration = 0;
  friend bool operator==(const CollectiveKey&, const CollectiveKey&) = default;
  friend auto operator<=>(const CollectiveKey&, const CollectiveKey&) = default;
};

// The 32-bit incarnation tag of an agent process (RegisterNodeRequest.agent_instance, random per
// process) carried in WireHeader::sender_instance; never 0 for a non-zero instance.
inline uint32_t InstanceTag(uint64_t agent_instance) {
  if (agent_instance == 0) return 0;
  const uint32_t tag = static_cast<uint32_t>(agent_instance ^ (agent_instance >> 32));
  return tag != 0 ? tag : 1;
}

inline CollectiveKey KeyOf(const WireHeader& h) { return {h.job, h.tensor, h.iteration}; }

inline std::span<const std::byte> AsBytes(const WireHeader& h) {
  return {reinterpret_cast<const std::byte*>(&h), sizeof(h)};
}

// Parses and validates a header against the payload that came with it: size, magic, version,
// kind, algorithm (and that the kind belongs to it), error code, dtype, reduction, ranks, chunk
// index and range, payload length. INVALID_ARGUMENT naming the field otherwise.
absl::StatusOr<WireHeader> ParseHeader(std::span<const std::byte> header, size_t payload_bytes);

// "tensor 0x.. iteration 3 chunk 2/5" for messages.
std::string Describe(const WireHeader& h);

}  // namespace tributary::dataplane
