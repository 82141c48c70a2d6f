// What one node knows about a job from the job's current plan: the one view every algorithm of
// the data plane reads (push/pull uses workers and servers, ring and halving-doubling the
// workers as ranks).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tributary::dataplane {

struct JobPeerCounters;  // dataplane_metrics.h

struct JobView {
  std::string job_id;
  uint64_t plan_version = 0;
  // The job's membership generation (JobPlan.generation): when it moves, the processes count
  // their iterations from 0 again, so an (tensor, iteration) of an older generation is another
  // collective than the same numbers in this one.
  uint64_t generation = 0;
  std::vector<std::string> worker_addresses;  // data-plane address of each worker node, by rank
  std::vector<std::string> server_addresses;  // summation servers, by server index
  std::vector<uint64_t> server_weights;       // sum to exactly 2^32 (see ChunkMap)
  uint32_t procs_per_node = 1;                // training processes on each worker node
  uint64_t partition_bytes = 4 << 20;         // largest chunk (one message), bytes
  // Push/pull tunes each tensor's partition online (MIAD, decided by the tensor's home server;
  // see PushPullServer) starting from partition_bytes. Production plans set it (agent/
  // plan_view.cc); off, every tensor is cut by partition_bytes.
  bool tune_partition = false;
  uint64_t credit_bytes = 16 << 20;             // bytes a worker node may have being sent
  std::chrono::milliseconds op_timeout{30000};  // deadline of one collective
  int my_worker_rank = -1;                      // this node's worker rank, -1 if it is not a worker
  int my_server_index = -1;  // this node's server index, -1 if it is not a server
  // Node ids for metric labels, parallel to the address lists (may be empty: addresses are used).
  std::vector<std::string> worker_node_ids;
  std::vector<std::string> server_node_ids;
  // The job's data-plane secret (JobPlan.job_secret): AuthenticatingTransport signs and checks
  // every message of the job with it. Empty in-process (no authenticator runs there).
  std::string secret;
  // InstanceTag of the agent process of every node the plan names (workers and servers; nodes
  // of unknown instance left out): the only senders whose messages the job accepts (empty: not
  // checked; message_auth.h).
  std::vector<uint32_t> node_instances;
  // Asynchronous parameter-server training (JobPlan.mode JOB_MODE_ASYNC, parameter_server.h):
  // the kPs* operations run; `staleness` is the SSP bound (-1 unbounded, 0 synchronous) and
  // `delta_scale` the servers' default scale of a pushed delta.
  bool async_mode = false;
  int32_t staleness = -1;
  double delta_scale = 1.0;
  // Tensor fusion (agent/tensor_fusion.h): all-reduces smaller than this many bytes run fused,
  // up to this many bytes per fused collective; 0 = off. `fusion_cycle`: the longest a fused
  // group's first tensor may wait for its last (0 = measured by the job's worker rank 0).
  uint64_t fusion_bytes = 0;
  std::chrono::microseconds fusion_cycle{0};
  // JobPlan.selector_nic_bytes_per_s: the NIC rate of ALGORITHM_AUTO's cost model for this job,
  // the same on every node (DataPlaneNode::SetJob); 0 (or anything not finite and positive) =
  // the node's own (SetCostModel).
  double selector_nic_bytes_per_s = 0;
  // Per-peer byte counters (DataPlaneNode::SetJob fills them when metrics are attached).
  std::shared_ptr<const JobPeerCounters> counters;

  uint64_t job_hash() const;
  // Worker nodes: the ranks of ring and halving-doubling.
  int num_workers() const { return static_cast<int>(worker_addresses.size()); }
  // Summation servers that are not worker nodes: the spare hosts the plan uses (a plan may
  // leave some or all workers out of the servers, so this is not servers - workers).
  int num_spare_servers() const {
    int spares = 0;
    for (const std::string& s : server_addresses) {
      if (std::find(worker_addresses.begin(), worker_addresses.end(), s) ==
          worker_addresses.end()) {
        ++spares;
      }
    }
    return spares;
  }
  // Training processes in the job: what an average divides by.
  uint32_t world_size() const {
    return static_cast<uint32_t>(worker_addresses.size()) * procs_per_node;
  }
};

}  // namespace tributary::dataplane
