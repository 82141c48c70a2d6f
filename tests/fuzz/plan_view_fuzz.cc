// libFuzzer target: the plan decoder. Input: a serialized tributary.v1.JobPlan (the bytes of
// GetAssignments' reply, protobuf wire format). Every node the plan names, and one it does not,
// reads it with agent::ToJobView / ToAlgorithm; a view that is accepted goes where the agent
// sends it: DataPlaneNode::SetJob, the push/pull chunk map (ChunkMap over the server weights,
// chunk counts, send orders) -- none of it may crash, whatever the plan says.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "agent/plan_view.h"
#include "common/clock.h"
#include "dataplane/collectives/data_plane_node.h"
#include "dataplane/reduce/cpu/cpu_reducer.h"
#include "dataplane/schedule/chunk_map.h"
#include "dataplane/transport/inprocess/inprocess_transport.h"
#include "google/protobuf/stubs/logging.h"
#include "spdlog/spdlog.h"
#include "tributary/v1/controller.pb.h"

namespace {

using namespace tributary;

struct Fixture {
  common::FakeClock clock;
  dataplane::InProcessNetwork network;
  std::unique_ptr<dataplane::InProcessTransport> transport = network.CreateEndpoint("fuzz:0");
  dataplane::CpuReducer reducer{1};
  dataplane::DataPlaneNode node{transport.get(), &reducer, &clock};
};

Fixture& GetFixture() {
  static Fixture* f = [] {
    spdlog::set_level(spdlog::level::off);
    google::protobuf::SetLogHandler(nullptr);  // strings that are not UTF-8 are logged
    return new Fixture;
  }();
  return *f;
}

void Check(const dataplane::JobView& v, dataplane::Algorithm algorithm) {
  const int workers = v.num_workers();
  const int servers = static_cast<int>(v.server_addresses.size());
  if (v.my_worker_rank >= workers || v.my_server_index >= servers) __builtin_trap();
  if (v.server_weights.size() != v.server_addresses.size()) __builtin_trap();
  Fixture& f = GetFixture();
  f.node.SetJob(v, algorithm);
  f.node.RemoveJob(v.job_id);
  absl::StatusOr<dataplane::ChunkMap> map = dataplane::ChunkMap::Create(v.server_weights);
  if (!map.ok()) return;
  // Counts kept small: a plan without partition_bytes cuts one chunk per element (see README).
  for (uint64_t count : {uint64_t{1}, uint64_t{4099}, uint64_t{1} << 16}) {
    const uint32_t chunks =
        dataplane::PushPullChunks(count, sizeof(float), v.partition_bytes, map->num_servers());
    if (chunks == 0 || chunks > count) __builtin_trap();
    const std::vector<uint32_t> order =
        map->SendOrder(v.job_hash(), chunks, std::max(0, v.my_worker_rank));
    if (order.size() != chunks) __builtin_trap();
    uint64_t covered = 0;
    for (uint32_t c : order) {
      if (c >= chunks || map->ServerOf(v.job_hash(), chunks, c) >= map->num_servers()) {
        __builtin_trap();
      }
      covered += dataplane::GetChunk(count, chunks, c).count;
    }
    if (covered != count) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tributary::v1::JobPlan plan;
  if (!plan.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<dataplane::Algorithm> algorithm = agent::ToAlgorithm(plan.algorithm());
  std::vector<std::string> nodes = {"fuzz-not-in-plan"};
  for (const auto& w : plan.workers()) nodes.push_back(w.node_id());
  for (const auto& s : plan.servers()) nodes.push_back(s.node_id());
  if (nodes.size() > 64) nodes.resize(64);
  for (const std::string& node : nodes) {
    absl::StatusOr<dataplane::JobView> view = agent::ToJobView(plan, node);
    if (!view.ok()) {
      if (view.status().message().empty()) __builtin_trap();
      continue;
    }
    if (algorithm.ok()) Check(*view, *algorithm);
  }
  return 0;
}
