// One N-node data plane in one process: every test (and the collectives bench) that runs
// collectives among several nodes builds it here instead of copying the setup. Each node is a
// DataPlaneNode on its own endpoint of one InProcessNetwork, sharing one reducer and one clock
// (a FakeClock unless another is given), with one job set on every node. Header-only and free of
// GoogleTest, so that the bench can use it too.
//
// Layout: nodes 0..workers-1 are the job's worker nodes (ring / halving-doubling ranks); every
// node, the `spare_servers` extra ones included, is also a summation server (server index =
// node index).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "dataplane/collectives/data_plane_node.h"
#include "dataplane/collectives/dataplane_metrics.h"
#include "dataplane/reduce/cpu/cpu_reducer.h"
#include "dataplane/schedule/chunk_map.h"
#include "dataplane/transport/bundling/bundling_transport.h"
#include "dataplane/transport/inprocess/inprocess_transport.h"
#include "prometheus/registry.h"

namespace tributary::testing {

struct ClusterOptions {
  int workers = 2;        // worker nodes (ranks 0..workers-1)
  int spare_servers = 0;  // server-only nodes after the workers
  uint32_t procs_per_node = 1;
  std::string job_id = "job";
  uint64_t plan_version = 1;
  dataplane::Algorithm algorithm = dataplane::Algorithm::kAuto;  // the job's choice
  uint64_t partition_bytes = 1024;
  // JobView::tune_partition: off here so that tests keep the plan's exact chunking.
  bool tune_partition = false;
  uint64_t credit_bytes = 4096;
  std::chrono::milliseconds op_timeout{5000};
  // Server weights proportional to index + 1 (uneven on purpose) instead of equal shares.
  bool uneven_weights = false;
  // Node i listens on address_prefix + i; with node_ids, its metric label is "node-i".
  std::string address_prefix = "node-";
  bool node_ids = false;
  // A prometheus registry and DataPlaneMetrics per node, attached before the job is set.
  bool metrics = false;
  int reducer_threads = 1;
  size_t reducer_min_bytes_per_thread = size_t{1} << 20;
  // The nodes' clock; nullptr: the cluster's FakeClock.
  const common::Clock* clock = nullptr;
  // Put a BundlingTransport (fusion on the wire) between each node and its endpoint.
  bool bundling = false;
};

// Waits for a collective's future, bounded so that a hang fails instead of blocking the test.
inline absl::Status Await(std::future<absl::Status>& f,
                          std::chrono::seconds guard = std::chrono::seconds(20)) {
  if (f.wait_for(guard) != std::future_status::ready) {
    return absl::InternalError("test guard: the collective neither finished nor failed");
  }
  return f.get();
}

// An operation on `buffers` (one per local process), without a done callback.
inline dataplane::Operation MakeOp(const std::string& name, uint64_t iteration,
                                   common::DataType dtype, uint64_t count,
                                   dataplane::Reduction reduction,
                                   std::vector<std::vector<std::byte>>& buffers) {
  dataplane::Operation op;
  op.tensor_name = name;
  op.iteration = iteration;
  op.dtype = dtype;
  op.count = count;
  op.reduction = reduction;
  for (auto& b : buffers) op.buffers.push_back(b.data());
  return op;
}

class Cluster {
 public:
  explicit Cluster(ClusterOptions options)
      : options_(std::move(options)),
        reducer_(options_.reducer_threads, options_.reducer_min_bytes_per_thread) {
    const common::Clock* clock = options_.clock != nullptr ? options_.clock : &fake_clock_;
    view_.job_id = options_.job_id;
    view_.plan_version = options_.plan_version;
    view_.procs_per_node = options_.procs_per_node;
    view_.partition_bytes = options_.partition_bytes;
    view_.tune_partition = options_.tune_partition;
    view_.credit_bytes = options_.credit_bytes;
    view_.op_timeout = options_.op_timeout;
    const int size = options_.workers + options_.spare_servers;
    for (int i = 0; i < size; ++i) {
      const std::string addr = absl::StrCat(options_.address_prefix, i);
      if (i < options_.workers) view_.worker_addresses.push_back(addr);
      view_.server_addresses.push_back(addr);
      if (options_.node_ids) {
        if (i < options_.workers) view_.worker_node_ids.push_back(absl::StrCat("node-", i));
        view_.server_node_ids.push_back(absl::StrCat("node-", i));
      }
    }
    view_.server_weights = Weights(size, options_.uneven_weights);
    for (int i = 0; i < size; ++i) {
      auto node = std::make_unique<Node>();
      node->transport = network_.CreateEndpoint(view_.server_addresses[i]);
      dataplane::Transport* transport = node->transport.get();
      if (options_.bundling) {
        // The bundling layer borrows the endpoint (tests still reach it for fault injection).
        node->bundling = std::make_unique<dataplane::BundlingTransport>(
            std::make_unique<Borrowed>(transport), dataplane::BundlingOptions{});
        transport = node->bundling.get();
      }
      node->data_plane = std::make_unique<dataplane::DataPlaneNode>(transport, &reducer_, clock);
      if (options_.metrics) {
        node->registry = std::make_unique<prometheus::Registry>();
        node->metrics = std::make_unique<dataplane::DataPlaneMetrics>(*node->registry);
        node->data_plane->SetMetrics(node->metrics.get(), clock);
      }
      nodes_.push_back(std::move(node));
    }
    for (int i = 0; i < size; ++i) SetJob(i, ViewOf(i));
  }

  ~Cluster() {
    for (auto& n : nodes_) n->transport->Shutdown();
  }

  // Returns true once every node's transport has run what was queued on it, twice over (a
  // completion on one node may still deliver to another), or false after `timeout` per flush.
  // After a collective completed everywhere, its last send completions have then released their
  // state.
  bool Settle(std::chrono::milliseconds timeout) {
    for (int round = 0; round < 2; ++round) {
      for (auto& n : nodes_) {
        if (!n->transport->Flush(timeout)) return false;
      }
    }
    return true;
  }

  // The job's view as node `i` holds it.
  dataplane::JobView ViewOf(int i) const {
    dataplane::JobView v = view_;
    v.my_worker_rank = i < options_.workers ? i : -1;
    v.my_server_index = i;
    return v;
  }
  void SetJob(int i, const dataplane::JobView& v) {
    nodes_[i]->data_plane->SetJob(v, options_.algorithm);
  }

  // Starts `op` on worker node `rank` through its DataPlaneNode (the job's algorithm, with
  // fallback); the future resolves with its result, or with the refusal.
  std::future<absl::Status> Start(int rank, dataplane::Operation op) {
    return Run(std::move(op), [&](dataplane::Operation o) {
      return node(rank).Start(view_.job_id, std::move(o));
    });
  }
  // Posts `op` on worker node `rank` straight to the implementation of `algorithm` (no
  // selection, no fallback).
  std::future<absl::Status> Post(int rank, dataplane::Algorithm algorithm,
                                 dataplane::Operation op) {
    return Run(std::move(op), [&](dataplane::Operation o) {
      dataplane::CollectiveAlgorithm& impl =
          algorithm == dataplane::Algorithm::kPushPull
              ? static_cast<dataplane::CollectiveAlgorithm&>(node(rank).push_pull())
              : node(rank).engine();
      return impl.Post(view_.job_id, algorithm, std::move(o));
    });
  }

  dataplane::DataPlaneNode& node(int i) { return *nodes_[i]->data_plane; }
  prometheus::Registry& registry(int i) { return *nodes_[i]->registry; }
  dataplane::InProcessNetwork& network() { return network_; }
  common::FakeClock& clock() { return fake_clock_; }
  dataplane::CpuReducer& reducer() { return reducer_; }
  const dataplane::JobView& view() const { return view_; }
  const std::string& address(int i) const { return view_.server_addresses[i]; }
  int workers() const { return options_.workers; }
  const dataplane::BundlingTransport* bundling(int i) const { return nodes_[i]->bundling.get(); }
  int size() const { return static_cast<int>(nodes_.size()); }

 private:
  // A Transport forwarding to one it does not own.
  class Borrowed final : public dataplane::Transport {
   public:
    explicit Borrowed(dataplane::Transport* t) : t_(t) {}
    std::string Address() const override { return t_->Address(); }
    void SetReceiveHandler(ReceiveHandler h) override { t_->SetReceiveHandler(std::move(h)); }
    void Send(const std::string& peer, std::span<const std::byte> header,
              std::span<const std::byte> payload, SendCallback done) override {
      t_->Send(peer, header, payload, std::move(done));
    }
    void Shutdown() override { t_->Shutdown(); }

   private:
    dataplane::Transport* t_;
  };

  struct Node {
    std::unique_ptr<dataplane::InProcessTransport> transport;
    std::unique_ptr<dataplane::BundlingTransport> bundling;  // over `transport`, or null
    std::unique_ptr<prometheus::Registry> registry;
    std::unique_ptr<dataplane::DataPlaneMetrics> metrics;
    std::unique_ptr<dataplane::DataPlaneNode> data_plane;
  };

  static std::vector<uint64_t> Weights(int servers, bool uneven) {
    std::vector<uint64_t> w;
    if (!uneven) {
      for (int s = 0; s < servers; ++s) {
        w.push_back(dataplane::ChunkMap::kWeightTotal / servers +
                    (s == 0 ? dataplane::ChunkMap::kWeightTotal % servers : 0));
      }
      return w;
    }
    uint64_t total = 0;
    for (int s = 0; s < servers; ++s) total += s + 1;
    uint64_t assigned = 0;
    for (int s = 0; s < servers; ++s) {
      const uint64_t x = s + 1 == servers ? dataplane::ChunkMap::kWeightTotal - assigned
                                          : dataplane::ChunkMap::kWeightTotal / total * (s + 1);
      w.push_back(x);
      assigned += x;
    }
    return w;
  }

  template <typename StartFn>
  static std::future<absl::Status> Run(dataplane::Operation op, StartFn&& start) {
    auto promise = std::make_shared<std::promise<absl::Status>>();
    auto future = promise->get_future();
    op.done = [promise](absl::Status s) { promise->set_value(std::move(s)); };
    absl::Status started = start(std::move(op));
    if (!started.ok()) promise->set_value(started);
    return future;
  }

  ClusterOptions options_;
  common::FakeClock fake_clock_;
  dataplane::CpuReducer reducer_;
  dataplane::InProcessNetwork network_;
  dataplane::JobView view_;
  std::vector<std::unique_ptr<Node>> nodes_;
};

}  // namespace tributary::testing
