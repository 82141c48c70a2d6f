#include "topology/experimental/schedule_executor.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace tributary::topology {
namespace {

constexpr uint32_t kMagic = 0x54524545;  // "TREE"
enum class Kind : uint32_t { kReduce = 1, kBroadcast = 2 };

struct Header {
  uint32_t magic;
  uint32_t kind;
  uint32_t chunk;
  uint32_t from;
};
static_assert(sizeof(Header) == 16);

// Shared state of one run. Per-position counters are touched only on that position's endpoint
// thread (after the start, which happens before any message can arrive).
class Run {
 public:
  Run(const Schedule& schedule, dataplane::CpuReducer& reducer,
      std::vector<std::vector<float>>& buffers)
      : schedule_(schedule), reducer_(reducer), buffers_(buffers) {}

  void Start(const ExecutorOptions& options, dataplane::InProcessNetwork& network) {
    const int n = schedule_.num_positions;
    pending_.assign(n, std::vector<int>(schedule_.chunks.size(), 0));
    for (int p = 0; p < n; ++p) {
      addresses_.push_back(absl::StrCat(options.address_prefix, p));
      for (size_t c = 0; c < schedule_.chunks.size(); ++c) {
        pending_[p][c] =
            static_cast<int>(schedule_.trees[schedule_.chunks[c].tree].children[p].size());
      }
    }
    for (int p = 0; p < n; ++p) endpoints_.push_back(network.CreateEndpoint(addresses_[p]));
    for (int p = 0; p < n; ++p) {
      endpoints_[p]->SetReceiveHandler(
          [this, p](std::span<const std::byte> header, std::span<const std::byte> payload) {
            OnMessage(p, header, payload);
          });
    }
    // Leaves start every chunk's reduce; a root without children is done at once. The list is
    // taken before the first send, since handlers then start changing pending_.
    std::vector<std::pair<int, size_t>> ready;
    for (size_t c = 0; c < schedule_.chunks.size(); ++c) {
      for (int p = 0; p < n; ++p) {
        if (pending_[p][c] == 0) ready.push_back({p, c});
      }
    }
    for (const auto& [p, c] : ready) ReduceDone(p, c);
  }

  absl::Status Wait(std::chrono::milliseconds timeout) {
    const size_t expected = schedule_.chunks.size() * schedule_.num_positions;
    std::unique_lock lock(mu_);
    const bool finished =
        cv_.wait_for(lock, timeout, [&] { return done_ == expected || !status_.ok(); });
    absl::Status status = status_;
    const size_t done = done_;
    lock.unlock();
    for (auto& endpoint : endpoints_) endpoint->Shutdown();
    if (!status.ok()) return status;
    if (!finished) {
      return absl::DeadlineExceededError(
          absl::StrCat("tree all-reduce: ", done, " of ", expected, " chunk deliveries done"));
    }
    return absl::OkStatus();
  }

 private:
  float* Data(int p, size_t c) { return buffers_[p].data() + schedule_.chunks[c].offset; }

  void Send(int from, int to, Kind kind, size_t c) {
    Header header{kMagic, static_cast<uint32_t>(kind), static_cast<uint32_t>(c),
                  static_cast<uint32_t>(from)};
    const auto* bytes = reinterpret_cast<const std::byte*>(Data(from, c));
    endpoints_[from]->Send(addresses_[to], std::as_bytes(std::span(&header, 1)),
                           std::span(bytes, schedule_.chunks[c].count * sizeof(float)),
                           [this](absl::Status status) {
                             if (!status.ok()) Fail(status);
                           });
  }

  // Position p holds the sum of its subtree for chunk c.
  void ReduceDone(int p, size_t c) {
    const ScheduleTree& tree = schedule_.trees[schedule_.chunks[c].tree];
    if (p != tree.root) {
      Send(p, tree.parent[p], Kind::kReduce, c);
      return;
    }
    BroadcastFrom(p, c);
  }

  // Position p holds the full sum of chunk c: pass it down and count it done.
  void BroadcastFrom(int p, size_t c) {
    const ScheduleTree& tree = schedule_.trees[schedule_.chunks[c].tree];
    for (int child : tree.children[p]) Send(p, child, Kind::kBroadcast, c);
    std::lock_guard lock(mu_);
    ++done_;
    cv_.notify_all();
  }

  void OnMessage(int p, std::span<const std::byte> header_bytes,
                 std::span<const std::byte> payload) {
    Header header;
    if (header_bytes.size() != sizeof(Header)) return Fail(absl::InternalError("bad header size"));
    std::memcpy(&header, header_bytes.data(), sizeof(Header));
    if (header.magic != kMagic || header.chunk >= schedule_.chunks.size() ||
        header.from >= static_cast<uint32_t>(schedule_.num_positions)) {
      return Fail(absl::InternalError(absl::StrCat("position ", p, ": malformed header")));
    }
    const size_t c = header.chunk;
    const ScheduleChunk& chunk = schedule_.chunks[c];
    const ScheduleTree& tree = schedule_.trees[chunk.tree];
    if (payload.size() != chunk.count * sizeof(float)) {
      return Fail(absl::InternalError(
          absl::StrCat("position ", p, ": chunk ", c, " payload of ", payload.size(), " bytes")));
    }
    const int from = static_cast<int>(header.from);
    if (header.kind == static_cast<uint32_t>(Kind::kReduce)) {
      if (tree.parent[from] != p || pending_[p][c] <= 0) {
        return Fail(absl::InternalError(
            absl::StrCat("position ", p, ": unexpected reduce of chunk ", c, " from ", from)));
      }
      reducer_.Sum(common::DataType::kFloat32, Data(p, c), payload.data(), chunk.count);
      if (--pending_[p][c] == 0) ReduceDone(p, c);
    } else if (header.kind == static_cast<uint32_t>(Kind::kBroadcast)) {
      if (tree.parent[p] != from) {
        return Fail(absl::InternalError(
            absl::StrCat("position ", p, ": unexpected broadcast of chunk ", c, " from ", from)));
      }
      std::memcpy(Data(p, c), payload.data(), payload.size());
      BroadcastFrom(p, c);
    } else {
      Fail(absl::InternalError(absl::StrCat("position ", p, ": unknown message kind")));
    }
  }

  void Fail(absl::Status status) {
    std::lock_guard lock(mu_);
    if (status_.ok()) status_ = std::move(status);
    cv_.notify_all();
  }

  const Schedule& schedule_;
  dataplane::CpuReducer& reducer_;
  std::vector<std::vector<float>>& buffers_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<dataplane::InProcessTransport>> endpoints_;
  std::vector<std::vector<int>> pending_;  // [position][chunk]: children still to report

  std::mutex mu_;
  std::condition_variable cv_;
  size_t done_ = 0;
  absl::Status status_;
};

}  // namespace

absl::Status ExecuteAllReduce(const Schedule& schedule, dataplane::InProcessNetwork& network,
                              dataplane::CpuReducer& reducer,
                              std::vector<std::vector<float>>& buffers,
                              const ExecutorOptions& options) {
  if (static_cast<int>(buffers.size()) != schedule.num_positions) {
    return absl::InvalidArgumentError(absl::StrCat("got ", buffers.size(), " buffers for ",
                                                   schedule.num_positions, " positions"));
  }
  for (const auto& buffer : buffers) {
    if (buffer.size() != schedule.num_elements) {
      return absl::InvalidArgumentError(absl::StrCat(
          "buffer of ", buffer.size(), " elements, schedule has ", schedule.num_elements));
    }
  }
  Run run(schedule, reducer, buffers);
  run.Start(options, network);
  return run.Wait(options.timeout);
}

}  // namespace tributary::topology
