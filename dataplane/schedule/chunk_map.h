// Pure index math: how a tensor is cut into chunks and which summation server owns each chunk.
// Every worker computes the same map from the same plan; nothing here does I/O.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace tributary::dataplane {

struct ChunkRange {
  uint32_t index = 0;
  uint64_t offset = 0;  // first element
  uint64_t count = 0;   // elements
};

// Number of chunks for `count` elements of `element_size` bytes, each at most `partition_bytes`
// (but never fewer elements than 1 per chunk). count, element_size, partition_bytes > 0.
uint32_t NumChunks(uint64_t count, size_t element_size, uint64_t partition_bytes);

// Chunks for one push/pull tensor. Push/pull is store-and-forward per chunk: a server sums a
// chunk once every worker's copy has arrived, so an all-reduce cut into G "groups" (one chunk per
// server) takes about (G + 1) group times, not G. The tensor is therefore cut into at most
// `partition_bytes` per chunk and, where chunks stay >= kMinPipelineChunkBytes, into at least
// kPipelineChunksPerServer chunks per server, which keeps the fill within ~1.6% (1/64; with 16,
// 16 MiB over 4 spare servers in 256 KiB chunks ran at 0.88 of the plain-TCP ceiling in the main
// job, and in 128 KiB chunks at 0.95 against 0.99 in 64 KiB ones, bench/results/
// pipeline_chunks_125mbit/). A tensor
// too small for that is still spread over every server in chunks of >= kMinSpreadChunkBytes:
// one server taking a whole tensor from every worker would see n times the traffic.
//
// A lone collective (Operation::lone: nothing else of its job in flight) pays the fill and the
// drain in full: a server can return its first chunk only after every worker has pushed it,
// about n x chunk / B after the start, and the last sums leave as long after the last push. With
// 64 KiB chunks, BERT-large's 243 small tensors fused into one 1.29 MB collective took 158 ms
// where its model is 83 ms (4 spares, 125 Mbit/s). With `lone` its chunks go down to
// kMinLoneChunkBytes: 4 KiB took 102 ms, 8 KiB 106 ms, 16 KiB 117 ms. Busy tensors keep 64 KiB:
// there the fill hides behind the other tensors, and 8 KiB chunks throughout cost ResNet-50's
// worker hosts 1.6x the CPU for the same time (bench/results/lone_chunks_125mbit_s27/). An
// all-reduce under 4 MiB that runs unfused is lone too (agent/tensor_fusion.h
// IsLonePassThrough): one 1.23 MiB tensor took 145 ms in 64 KiB chunks and 93 ms lone.
//
// A lone collective large enough to give every server kLoneBulkChunksPerServer chunks of
// kLoneBulkChunkBytes goes down to those only: a 4 KiB chunk fills half a 9000-byte frame, and
// the messages, not the bytes, were the CPU. BERT-large's fused 1.29 MB over 4 servers in 157
// chunks of 8 KiB instead of 256 of 5 KiB took the same time (98-100 ms against 99-100) at
// 0.75x the worker hosts' CPU (18-19 core-ms per iteration against 24-25) and 0.63x the
// spares'; 1 MiB took 77 ms against 79, 2 MiB 148 against 154. Smaller collectives have fewer
// chunks per server to pipeline and keep 4 KiB: 128 KiB in 8 KiB chunks took 15.8 ms against
// 12.9-13.0 (bench/results/lone_bulk_chunks_125mbit_s44/; both with 4 chunks per server ahead
// of their sums, before kLonePushPullAhead).
inline constexpr uint64_t kMinPipelineChunkBytes = 64 << 10;
inline constexpr uint64_t kMinLoneChunkBytes = 4 << 10;
inline constexpr uint64_t kLoneBulkChunkBytes = 8 << 10;
inline constexpr uint64_t kLoneBulkChunksPerServer = 16;
inline constexpr uint32_t kPipelineChunksPerServer = 64;
inline constexpr uint64_t kMinSpreadChunkBytes = 8 << 10;
uint32_t PushPullChunks(uint64_t count, size_t element_size, uint64_t partition_bytes,
                        size_t num_servers, bool lone = false);

// Chunk `index` of `num_chunks` near-equal chunks over `count` elements: elements
// [floor(index*count/num_chunks), floor((index+1)*count/num_chunks)).
ChunkRange GetChunk(uint64_t count, uint32_t num_chunks, uint32_t index);

// Maps chunks to summation servers by weight. Server s owns the arc [W_s, W_s + w_s) of a circle
// of circumference 2^32 (W_s = sum of earlier weights); chunk i of c sits at position
// h/2^32 + i/c (mod 1), where h is the tensor's hash. Positions are evenly spaced, so over c
// chunks server s owns floor(c*w_s/2^32) or ceil(c*w_s/2^32) of them (within one chunk of its
// share), and chunk 0 of a tensor lands on the same server whatever the tensor's size — the
// server that sees every worker's descriptor first.
class ChunkMap {
 public:
  static constexpr uint64_t kWeightTotal = uint64_t{1} << 32;

  // `weights` must be positive and sum to exactly kWeightTotal.
  static absl::StatusOr<ChunkMap> Create(std::span<const uint64_t> weights);

  // Index of the server that owns chunk `index` of `num_chunks` of the tensor hashed `tensor_hash`.
  uint32_t ServerOf(uint64_t tensor_hash, uint32_t num_chunks, uint32_t index) const;

  size_t num_servers() const { return cumulative_.size() - 1; }

  // The order in which to push a tensor's chunks: each server's chunks spread evenly over the
  // whole sequence (chunk j of the c_s owned by server s sits at (j + 1/2) / c_s), so that every
  // server receives work from the start instead of the last server's chunks all coming last.
  // Chunks at the same position (servers with equal counts) are taken in server order rotated
  // by `rotation` (the worker's rank): worker r starts with the r-th of them, so that n workers
  // start on n different servers instead of all on the first one. Deterministic. Returns chunk
  // indices.
  std::vector<uint32_t> SendOrder(uint64_t tensor_hash, uint32_t num_chunks,
                                  uint32_t rotation = 0) const;

 private:
  explicit ChunkMap(std::vector<uint64_t> cumulative) : cumulative_(std::move(cumulative)) {}
  std::vector<uint64_t> cumulative_;  // cumulative_[0] = 0, back() = kWeightTotal
};

}  // namespace tributary::dataplane
