// One training process for the integration tests: joins a job through its node's agent, runs a
// scenario, checks every element, and exits non-zero on any wrong element or unexpected error.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "client/buffer_channel.h"
#include "client/client.h"
#include "common/hash.h"
#include "common/rpc/grpc_status.h"
#include "common/unix_fd.h"
#include "grpcpp/grpcpp.h"
#include "tests/util/typed_values.h"
#include "tributary/v1/agent.grpc.pb.h"

namespace {

using tributary::client::Client;
using tributary::client::ReduceOp;
using tributary::client::SharedBuffer;
using tributary::common::DataType;

int g_failures = 0;

void Fail(const std::string& what) {
  std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  g_failures++;
}

void Expect(bool ok, const std::string& what) {
  if (!ok) Fail(what);
}

void Put(DataType t, void* base, size_t i, double v) {
  tributary::testing::PutValue(t, base, i, v);
}

double Get(DataType t, const void* base, size_t i) {
  return tributary::testing::GetValue(t, base, i);
}

// Inputs whose sums are exact in every dtype, partial sums included.
double Input(DataType t, uint32_t rank, size_t i) {
  if (tributary::common::DataTypeSize(t) == 2) return (rank % 2 + 1) * (i % 3 + 1);
  return (rank + 1.0) * (i % 7 + 1);
}

double SumOf(DataType t, uint32_t world, size_t i) {
  double s = 0;
  for (uint32_t r = 0; r < world; ++r) s += Input(t, r, i);
  return s;
}

int64_t CountWrong(DataType t, const SharedBuffer& b, size_t count,
                   const std::function<double(size_t)>& want) {
  int64_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += Get(t, b.data(), i) != want(i);
  return wrong;
}

void Exact(Client& c) {
  const uint32_t world = c.world_size(), rank = c.global_rank();
  const size_t max_count = 70001;
  auto buf = c.AllocateBuffer(max_count * 8);
  if (!buf.ok()) return Fail(std::string(buf.status().message()));
  for (DataType t : tributary::common::kAllDataTypes) {
    for (size_t count : {size_t{1}, size_t{1021}, max_count}) {
      const std::string tag =
          absl::StrCat(std::string(tributary::common::DataTypeName(t)), "/", count);
      // Sum.
      for (size_t i = 0; i < count; ++i) Put(t, (*buf)->data(), i, Input(t, rank, i));
      absl::Status s = c.AllReduce("exact.sum", **buf, 0, count, t, ReduceOp::kSum);
      Expect(s.ok(), absl::StrCat("sum ", tag, ": ", s.ToString()));
      int64_t wrong = CountWrong(t, **buf, count, [&](size_t i) { return SumOf(t, world, i); });
      Expect(wrong == 0, absl::StrCat("sum ", tag, ": ", wrong, " wrong"));
      // Average of the same value on every rank (times world): exact.
      for (size_t i = 0; i < count; ++i) Put(t, (*buf)->data(), i, 2.0 * (i % 3 + 1));
      s = c.AllReduce("exact.avg", **buf, 0, count, t, ReduceOp::kAverage);
      Expect(s.ok(), absl::StrCat("average ", tag, ": ", s.ToString()));
      wrong = CountWrong(t, **buf, count, [&](size_t i) { return 2.0 * (i % 3 + 1); });
      Expect(wrong == 0, absl::StrCat("average ", tag, ": ", wrong, " wrong"));
      // Broadcast from the last rank and from rank 1.
      for (uint32_t root : {world - 1, 1u}) {
        for (size_t i = 0; i < count; ++i) Put(t, (*buf)->data(), i, Input(t, rank, i));
        s = c.Broadcast("exact.bcast", **buf, 0, count, t, root);
        Expect(s.ok(), absl::StrCat("broadcast ", tag, ": ", s.ToString()));
        wrong = CountWrong(t, **buf, count, [&](size_t i) { return Input(t, root, i); });
        Expect(wrong == 0, absl::StrCat("broadcast ", tag, " root ", root, ": ", wrong, " wrong"));
      }
    }
  }
}

void Iterations(Client& c, int iterations) {
  const uint32_t world = c.world_size(), rank = c.global_rank();
  const std::vector<size_t> counts = {1, 4099, 100003};
  std::vector<std::shared_ptr<SharedBuffer>> bufs;
  for (size_t n : counts) {
    auto b = c.AllocateBuffer(n * 4);
    if (!b.ok()) return Fail(std::string(b.status().message()));
    bufs.push_back(*b);
  }
  uint64_t digest = 0;
  for (int it = 0; it < iterations; ++it) {
    std::vector<tributary::client::Handle> handles;
    for (size_t t = 0; t < counts.size(); ++t) {
      float* f = static_cast<float*>(bufs[t]->data());
      for (size_t i = 0; i < counts[t]; ++i) f[i] = (rank + 1.0f) * ((i + it) % 5);
      // Mixed priorities: the big tensor first (0), the small ones later.
      auto h = c.AllReduceAsync(absl::StrCat("layer", t, ".grad"), *bufs[t], 0, counts[t],
                                DataType::kFloat32, ReduceOp::kSum,
                                static_cast<int32_t>(counts.size() - 1 - t));
      if (!h.ok()) return Fail(absl::StrCat("submit: ", h.status().ToString()));
      handles.push_back(*h);
    }
    for (size_t t = 0; t < counts.size(); ++t) {
      absl::Status s = handles[t].Wait(std::chrono::seconds(60));
      if (!s.ok()) return Fail(absl::StrCat("iteration ", it, " tensor ", t, ": ", s.ToString()));
      const float* f = static_cast<const float*>(bufs[t]->data());
      int64_t wrong = 0;
      for (size_t i = 0; i < counts[t]; ++i) {
        wrong += f[i] != world * (world + 1) / 2.0f * ((i + it) % 5);
      }
      Expect(wrong == 0, absl::StrCat("iteration ", it, " tensor ", t, ": ", wrong, " wrong"));
      digest ^= tributary::common::StableHash64(
                    std::string_view(reinterpret_cast<const char*>(f), counts[t] * 4)) +
                it;
    }
  }
  std::printf("digest=%016llx\n", static_cast<unsigned long long>(digest));
}

// One large tensor, all-reduced `warmup` + `iterations` times (the job-stats test's known
// traffic), every element checked each time. With `go_fifo`, waits after the warm-up until a
// byte arrives on it (the test snapshots the controller's figures meanwhile), so that every
// process starts the measured iterations at once.
void Bandwidth(Client& c, int warmup, int iterations, size_t count, const std::string& go_fifo) {
  const uint32_t world = c.world_size(), rank = c.global_rank();
  auto b = c.AllocateBuffer(count * 4);
  if (!b.ok()) return Fail(std::string(b.status().message()));
  float* f = static_cast<float*>((*b)->data());
  // Opened before the first iteration, read-write so that it never blocks: the test opens it
  // without blocking once the warm-up's collectives are counted, which must find a reader then
  // (Linux keeps a FIFO opened O_RDWR readable and blocking until a byte arrives).
  int go = -1;
  if (!go_fifo.empty()) {
    go = open(go_fifo.c_str(), O_RDWR);
    if (go < 0) return Fail("go fifo " + go_fifo + ": " + std::strerror(errno));
  }
  for (int it = 0; it < warmup + iterations; ++it) {
    if (it == warmup && go >= 0) {
      std::printf("warm-up done\n");
      std::fflush(stdout);
      char byte;
      const bool got = read(go, &byte, 1) == 1;
      close(go);
      if (!got) return Fail("go fifo " + go_fifo);
    }
    for (size_t i = 0; i < count; ++i) f[i] = (rank + 1.0f) * ((i + it) % 7);
    absl::Status s =
        c.AllReduce("bandwidth.grad", **b, 0, count, DataType::kFloat32, ReduceOp::kSum);
    if (!s.ok()) return Fail(absl::StrCat("iteration ", it, ": ", s.ToString()));
    int64_t wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += f[i] != world * (world + 1) / 2.0f * ((i + it) % 7);
    Expect(wrong == 0, absl::StrCat("iteration ", it, ": ", wrong, " wrong"));
  }
}

void ExpectCode(const absl::Status& s, absl::StatusCode code, const std::string& what,
                const std::string& must_mention = "") {
  Expect(s.code() == code,
         absl::StrCat(what, ": expected ", absl::StatusCodeToString(code), ", got ", s.ToString()));
  if (!must_mention.empty()) {
    Expect(s.message().find(must_mention) != absl::string_view::npos,
           absl::StrCat(what, ": message '", std::string(s.message()), "' does not name '",
                        must_mention, "'"));
  }
}

// All-gather and reduce-scatter (sum and average) of blocks of several sizes and every dtype, in
// place: every element of the region (all-gather) or of the own block (reduce-scatter) checked.
void GatherScatter(Client& c) {
  const uint32_t world = c.world_size(), rank = c.global_rank();
  const size_t max_block = 20011;  // several chunks of the job's partition per node
  auto buf = c.AllocateBuffer(max_block * world * 8);
  if (!buf.ok()) return Fail(std::string(buf.status().message()));
  void* data = (*buf)->data();
  for (DataType t : tributary::common::kAllDataTypes) {
    for (size_t block : {size_t{1}, size_t{333}, max_block}) {
      const std::string tag =
          absl::StrCat(std::string(tributary::common::DataTypeName(t)), "/", block);
      const size_t region = block * world;
      // All-gather: only the own block is input, the rest is overwritten.
      for (size_t i = 0; i < region; ++i) {
        Put(t, data, i, i / block == rank ? Input(t, rank, i) : -1.0);
      }
      absl::Status s = c.AllGather("gs.allgather", **buf, 0, block, t);
      Expect(s.ok(), absl::StrCat("allgather ", tag, ": ", s.ToString()));
      int64_t wrong = CountWrong(t, **buf, region, [&](size_t i) {
        return Input(t, static_cast<uint32_t>(i / block), i);
      });
      Expect(wrong == 0, absl::StrCat("allgather ", tag, ": ", wrong, " wrong"));
      // Reduce-scatter sum: the own block holds the sum of every rank's region there.
      for (size_t i = 0; i < region; ++i) Put(t, data, i, Input(t, rank, i));
      s = c.ReduceScatter("gs.rs", **buf, 0, block, t, ReduceOp::kSum);
      Expect(s.ok(), absl::StrCat("reduce-scatter sum ", tag, ": ", s.ToString()));
      wrong = 0;
      for (size_t i = rank * block; i < (rank + 1) * block; ++i) {
        wrong += Get(t, data, i) != SumOf(t, world, i);
      }
      Expect(wrong == 0, absl::StrCat("reduce-scatter sum ", tag, ": ", wrong, " wrong"));
      // Reduce-scatter average of world * (rank-dependent small integers): exact.
      for (size_t i = 0; i < region; ++i) Put(t, data, i, world * ((rank + i) % 3 + 1.0));
      s = c.ReduceScatter("gs.rs.avg", **buf, 0, block, t, ReduceOp::kAverage);
      Expect(s.ok(), absl::StrCat("reduce-scatter average ", tag, ": ", s.ToString()));
      wrong = 0;
      for (size_t i = rank * block; i < (rank + 1) * block; ++i) {
        double sum = 0;
        for (uint32_t r = 0; r < world; ++r) sum += world * ((r + i) % 3 + 1.0);
        wrong += Get(t, data, i) != sum / world;
      }
      Expect(wrong == 0, absl::StrCat("reduce-scatter average ", tag, ": ", wrong, " wrong"));
    }
  }
  // Mismatches under one name, both on the workers' ring: every process gets INVALID_ARGUMENT
  // from the data plane, long before the job's deadline.
  // The last node's processes disagree with the others (the data plane sees it).
  const bool odd = rank >= world - c.local_size();
  absl::Status s = c.AllGather("gs.count", **buf, 0, odd ? 63 : 64, DataType::kFloat32);
  ExpectCode(s, absl::StatusCode::kInvalidArgument, "all-gather count mismatch", "gs.count");
  s = odd ? c.ReduceScatter("gs.op", **buf, 0, 64, DataType::kFloat32, ReduceOp::kSum)
          : c.AllGather("gs.op", **buf, 0, 64, DataType::kFloat32);
  ExpectCode(s, absl::StatusCode::kInvalidArgument, "all-gather against reduce-scatter", "gs.op");
}

void Mismatch(Client& c, uint32_t procs_per_node) {
  const uint32_t rank = c.global_rank();
  const uint32_t node = rank / procs_per_node;
  auto buf = c.AllocateBuffer(4000 * 4);
  if (!buf.ok()) return Fail(std::string(buf.status().message()));
  const auto start = std::chrono::steady_clock::now();
  // Global rank 0 (local rank 0 of node 0) disagrees on the size: caught on its node.
  absl::Status s =
      c.AllReduce("m.size", **buf, 0, rank == 0 ? 1000 : 2000, DataType::kFloat32, ReduceOp::kSum);
  ExpectCode(s, absl::StatusCode::kInvalidArgument, "size mismatch", "m.size");
  // Every process of node 1 disagrees on the dtype: caught by a summation server.
  s = c.AllReduce("m.dtype", **buf, 0, 3000, node == 1 ? DataType::kInt32 : DataType::kFloat32,
                  ReduceOp::kSum);
  ExpectCode(s, absl::StatusCode::kInvalidArgument, "dtype mismatch", "disagree");
  // Node 2 believes the tensor is larger than everyone else: a different chunk layout.
  s = c.AllReduce("m.layout", **buf, 0, node == 2 ? 4000 : 100, DataType::kFloat32, ReduceOp::kSum);
  ExpectCode(s, absl::StatusCode::kInvalidArgument, "layout mismatch", "disagree");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Expect(seconds < 20, absl::StrCat("mismatches took ", seconds, " s: waited for a deadline?"));
  // The service goes on: the next collective with agreeing inputs is exact.
  for (size_t i = 0; i < 2000; ++i) Put(DataType::kFloat32, (*buf)->data(), i, 1);
  s = c.AllReduce("m.after", **buf, 0, 2000, DataType::kFloat32, ReduceOp::kSum);
  Expect(s.ok(), absl::StrCat("after mismatches: ", s.ToString()));
  Expect(CountWrong(DataType::kFloat32, **buf, 2000, [&](size_t) { return c.world_size(); }) == 0,
         "after mismatches: wrong sums");
}

void BadInput(Client& c, const std::string& agent) {
  auto buf = c.AllocateBuffer(1024);
  if (!buf.ok()) return Fail(std::string(buf.status().message()));
  auto stub =
      tributary::v1::Agent::NewStub(grpc::CreateChannel(agent, grpc::InsecureChannelCredentials()));
  auto submit = [&](auto mutate) {
    tributary::v1::SubmitRequest req;
    req.set_session_id(c.session_id());
    req.set_tensor_name("bad.tensor");
    req.set_buffer_id((*buf)->id());
    req.set_count(16);
    req.set_dtype(tributary::v1::DATA_TYPE_FLOAT32);
    req.set_op(tributary::v1::COLLECTIVE_OP_SUM);
    mutate(req);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    tributary::v1::SubmitResponse resp;
    grpc::Status g = stub->Submit(&ctx, req, &resp);
    return absl::Status(static_cast<absl::StatusCode>(g.error_code()), g.error_message());
  };
  using R = tributary::v1::SubmitRequest;
  ExpectCode(submit([](R& r) { r.set_session_id("no-such-session"); }), absl::StatusCode::kNotFound,
             "unknown session");
  ExpectCode(submit([](R& r) { r.set_buffer_id(999); }), absl::StatusCode::kInvalidArgument,
             "unregistered buffer", "bad.tensor");
  ExpectCode(submit([](R& r) { r.set_count(257); }), absl::StatusCode::kInvalidArgument,
             "too-small buffer", "bad.tensor");
  ExpectCode(submit([](R& r) { r.set_offset_bytes(1020); }), absl::StatusCode::kInvalidArgument,
             "region past the end", "bad.tensor");
  ExpectCode(submit([](R& r) { r.set_count(uint64_t{1} << 62); }),
             absl::StatusCode::kInvalidArgument, "absurd count", "bad.tensor");
  ExpectCode(submit([](R& r) { r.set_count(static_cast<uint64_t>(-5)); }),
             absl::StatusCode::kInvalidArgument, "negative count", "bad.tensor");
  ExpectCode(submit([](R& r) { r.set_count(0); }), absl::StatusCode::kInvalidArgument,
             "zero count");
  ExpectCode(submit([](R& r) { r.set_dtype(tributary::v1::DATA_TYPE_UNSPECIFIED); }),
             absl::StatusCode::kInvalidArgument, "no dtype");
  ExpectCode(submit([](R& r) { r.set_tensor_name(""); }), absl::StatusCode::kInvalidArgument,
             "empty name");
  ExpectCode(submit([](R& r) {
               r.set_op(tributary::v1::COLLECTIVE_OP_BROADCAST);
               r.set_root_rank(1000);
             }),
             absl::StatusCode::kInvalidArgument, "broadcast root out of range");
  {
    // Buffers arrive over the buffer socket as sealed memfds; the agent refuses the rest.
    auto channel = tributary::client::internal::BufferChannel::Connect(agent);
    Expect(channel.ok(), absl::StrCat("buffer socket: ", channel.status().ToString()));
    if (!channel.ok()) return;
    const auto memfd = [](size_t size, bool seal) {
      const int fd = memfd_create("bad-input", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (ftruncate(fd, static_cast<off_t>(size)) != 0) return -1;
      if (seal && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) return -1;
      return fd;
    };
    // An unsealed memfd could be shrunk after registration and kill the agent with SIGBUS.
    tributary::common::UniqueFd unsealed(memfd(64, false));
    ExpectCode(
        (*channel)->Register(c.session_id(), unsealed.get(), 64, std::chrono::seconds(5)).status(),
        absl::StatusCode::kInvalidArgument, "unsealed memfd", "must be sealed");
    tributary::common::UniqueFd small(memfd(64, true));
    ExpectCode((*channel)
                   ->Register(c.session_id(), small.get(), 1 << 20, std::chrono::seconds(5))
                   .status(),
               absl::StatusCode::kInvalidArgument, "memfd smaller than declared",
               "fewer than the 1048576 declared");
    ExpectCode(
        (*channel)->Register("no-such-session", small.get(), 64, std::chrono::seconds(5)).status(),
        absl::StatusCode::kNotFound, "unknown session", "no-such-session");
  }
  // Nothing was lost: rejected submissions used no iteration, the next one is exact.
  for (size_t i = 0; i < 256; ++i) Put(DataType::kFloat32, (*buf)->data(), i, 3);
  absl::Status s = c.AllReduce("bad.tensor", **buf, 0, 256, DataType::kFloat32, ReduceOp::kSum);
  Expect(s.ok(), absl::StrCat("after bad input: ", s.ToString()));
  Expect(
      CountWrong(DataType::kFloat32, **buf, 256, [&](size_t) { return 3.0 * c.world_size(); }) == 0,
      "after bad input: wrong sums");
}

// Reads one byte from `go_fifo`, waiting up to 60 s for it. The open returns once the test has
// the FIFO open to write (at once where it holds it open to read and write).
bool AwaitGo(const std::string& go_fifo) {
  const int go = open(go_fifo.c_str(), O_RDONLY);
  if (go < 0) return false;
  pollfd p{go, POLLIN, 0};
  char g = 0;
  const bool ok = poll(&p, 1, 60000) == 1 && read(go, &g, 1) == 1;
  close(go);
  return ok;
}

// A training loop that goes on through a lost or frozen summation server: every iteration
// all-reduces three tensors of exact sums, every element is checked, and no iteration may fail
// (the client retries transparently). Before submitting each iteration listed in `signal_at`,
// every rank writes one byte to `fifo` (it has finished the previous iteration) and global rank
// 0 then waits for one from `go_fifo`: the test injects its fault once every rank is there, so
// that the others are inside that iteration (submitted, unable to complete before rank 0 does)
// and no sum of the previous one is still on its way. Prints the slowest iteration and the
// retries.
void Failover(Client& c, int iterations, const std::string& fifo, const std::string& go_fifo,
              const std::vector<int>& signal_at) {
  const uint32_t world = c.world_size(), rank = c.global_rank();
  const std::vector<size_t> counts = {1, 4099, 262147};
  std::vector<std::shared_ptr<SharedBuffer>> bufs;
  for (size_t n : counts) {
    auto b = c.AllocateBuffer(n * 4);
    if (!b.ok()) return Fail(std::string(b.status().message()));
    bufs.push_back(*b);
  }
  int fd = -1;
  if (!fifo.empty()) {
    fd = open(fifo.c_str(), O_WRONLY);  // the test holds the read end open
    if (fd < 0) return Fail(absl::StrCat("open ", fifo, ": ", std::strerror(errno)));
  }
  double slowest = 0;
  int slowest_it = -1;
  uint32_t retries = 0;
  for (int it = 0; it < iterations; ++it) {
    if (fd >= 0 && std::find(signal_at.begin(), signal_at.end(), it) != signal_at.end()) {
      const char b = 1;
      Expect(write(fd, &b, 1) == 1, "signal the test");
      if (rank == 0) Expect(AwaitGo(go_fifo), "the test's go within 60 s");
    }
    const auto start = std::chrono::steady_clock::now();
    std::vector<tributary::client::Handle> handles;
    for (size_t t = 0; t < counts.size(); ++t) {
      float* f = static_cast<float*>(bufs[t]->data());
      for (size_t i = 0; i < counts[t]; ++i) f[i] = (rank + 1.0f) * ((i + it) % 5);
      auto h = c.AllReduceAsync(absl::StrCat("f", t, ".grad"), *bufs[t], 0, counts[t],
                                DataType::kFloat32, ReduceOp::kSum);
      if (!h.ok()) return Fail(absl::StrCat("submit: ", h.status().ToString()));
      handles.push_back(*h);
    }
    for (size_t t = 0; t < counts.size(); ++t) {
      absl::Status s = handles[t].Wait(std::chrono::seconds(90));
      retries += handles[t].retries();
      if (!s.ok()) return Fail(absl::StrCat("iteration ", it, " tensor ", t, ": ", s.ToString()));
      const float* f = static_cast<const float*>(bufs[t]->data());
      int64_t wrong = 0;
      for (size_t i = 0; i < counts[t]; ++i) {
        wrong += f[i] != world * (world + 1) / 2.0f * ((i + it) % 5);
      }
      Expect(wrong == 0, absl::StrCat("iteration ", it, " tensor ", t, ": ", wrong, " wrong"));
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (ms > slowest) {
      slowest = ms;
      slowest_it = it;
    }
  }
  if (fd >= 0) close(fd);
  std::printf("slowest_iteration_ms=%.0f at=%d retries=%u\n", slowest, slowest_it, retries);
}

void Disconnect(Client& c, uint32_t procs_per_node) {
  auto buf = c.AllocateBuffer(4096);
  if (!buf.ok()) return Fail(std::string(buf.status().message()));
  // One warm-up collective so every process is connected before the victim leaves.
  absl::Status s = c.AllReduce("d.warm", **buf, 0, 8, DataType::kFloat32, ReduceOp::kSum);
  Expect(s.ok(), absl::StrCat("warm-up: ", s.ToString()));
  if (c.global_rank() == 1) {
    std::fflush(stdout);
    _exit(3);  // dies without leaving the job or submitting "d.lost"
  }
  const auto start = std::chrono::steady_clock::now();
  s = c.AllReduce("d.lost", **buf, 0, 1000, DataType::kFloat32, ReduceOp::kSum);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ExpectCode(s, absl::StatusCode::kAborted, "peer disconnected", "local rank 1");
  Expect(seconds < 20, absl::StrCat("disconnect noticed after ", seconds, " s"));
  (void)procs_per_node;
}

// With `fifo` and `go_fifo`, every process writes one byte to `fifo` once connected and waits
// (up to 60 s) for one from `go_fifo` before it submits: the test lets them go together, so that
// every process's submission is inside the same operation on its agent. (Started unsynchronized
// on a loaded machine, a process could submit after its node-mate had hit the deadline and left
// the job, and get ABORTED for the missing node-mate instead.)
void Timeout(Client& c, const std::string& fifo, const std::string& go_fifo) {
  auto buf = c.AllocateBuffer(1 << 20);
  if (!buf.ok()) return Fail(std::string(buf.status().message()));
  if (!fifo.empty()) {
    const int fd = open(fifo.c_str(), O_WRONLY);  // the test holds the read end open
    if (fd < 0) return Fail(absl::StrCat("open ", fifo, ": ", std::strerror(errno)));
    const char b = 1;
    Expect(write(fd, &b, 1) == 1, "signal the test");
    close(fd);
    if (!AwaitGo(go_fifo)) return Fail("no go from the test within 60 s");
  }
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = c.AllReduce("t.frozen", **buf, 0, 200000, DataType::kFloat32, ReduceOp::kSum);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ExpectCode(s, absl::StatusCode::kDeadlineExceeded, "frozen summation server", "t.frozen");
  Expect(seconds < 15, absl::StrCat("deadline noticed after ", seconds, " s"));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tributary integration-test worker"};
  std::string agent, job, scenario;
  uint32_t local_rank = 0, local_size = 1;
  int iterations = 100;
  std::string signal_fifo, go_fifo;
  std::vector<int> signal_at;
  app.add_option("--agent", agent)->required();
  app.add_option("--job", job)->required();
  app.add_option("--local-rank", local_rank)->required();
  app.add_option("--local-size", local_size)->required();
  app.add_option("--scenario", scenario)->required();
  app.add_option("--iterations", iterations);
  size_t count = 1 << 21;
  int warmup = 0;
  app.add_option("--count", count, "bandwidth: floats in the tensor");
  app.add_option("--warmup", warmup, "bandwidth: iterations before --go-fifo");
  app.add_option("--signal-fifo", signal_fifo,
                 "failover: every rank writes a byte here and rank 0... (timeout: every rank...)");
  app.add_option("--go-fifo", go_fifo, "...waits for one from here before...");
  app.add_option("--signal-at", signal_at, "...each of these iterations");
  CLI11_PARSE(app, argc, argv);

  tributary::client::ClientOptions options;
  options.agent_address = agent;
  options.join_timeout = std::chrono::seconds(20);
  if (scenario == "unknown-job") {
    options.join_timeout = std::chrono::milliseconds(300);
    auto c = Client::Connect(options, "no-such-job", local_rank, local_size);
    ExpectCode(c.status(), absl::StatusCode::kFailedPrecondition, "unknown job", "no-such-job");
    return g_failures == 0 ? 0 : 1;
  }
  auto c = Client::Connect(options, job, local_rank, local_size);
  if (!c.ok()) {
    std::fprintf(stderr, "FAIL: connect: %s\n", c.status().ToString().c_str());
    return 1;
  }
  if (scenario == "exact") {
    Exact(**c);
  } else if (scenario == "gather-scatter") {
    GatherScatter(**c);
  } else if (scenario == "iterations") {
    Iterations(**c, iterations);
  } else if (scenario == "bandwidth") {
    Bandwidth(**c, warmup, iterations, count, go_fifo);
  } else if (scenario == "mismatch") {
    Mismatch(**c, local_size);
  } else if (scenario == "bad-input") {
    BadInput(**c, agent);
  } else if (scenario == "disconnect") {
    Disconnect(**c, local_size);
  } else if (scenario == "timeout") {
    Timeout(**c, signal_fifo, go_fifo);
  } else if (scenario == "failover") {
    Failover(**c, iterations, signal_fifo, go_fifo, signal_at);
  } else {
    Fail("unknown scenario " + scenario);
  }
  std::printf("rank=%u failures=%d\n", (*c)->global_rank(), g_failures);
  return g_failures == 0 ? 0 : 1;
}
