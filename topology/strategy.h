// The intra-node aggregation strategy for the GPUs a job holds on one node (DESIGN.md §1.2):
// how the local GPUs are reduced before bytes cross the NIC and broadcast back after. Pure.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tributary/v1/topology.pb.h"

namespace tributary::topology {

struct IntraNodeStrategy {
  enum Kind {
    kDirect,                        // one GPU: it copies to and from host memory itself
    kCpuAssistedPerSwitch,          // PCIe: reduce inside each switch group, the CPU sums groups
    kNvLinkRootedOutsideNicSwitch,  // NVLink ring: reduce/broadcast over NVLink at root_gpu
    kPackedTrees,                   // NVLink-connected fragment without a ring: packed trees
    kHostStaging,                   // no GPU-to-GPU path: every GPU stages through host memory
    kCpuOnly,                       // no GPU: summation service only
  };
  Kind kind = kCpuOnly;
  // Why this strategy, in words a user can check against the topology.
  std::string reason;
  // The GPU that exchanges with host memory (device index); -1 if none.
  int root_gpu = -1;
  // kCpuAssistedPerSwitch / kHostStaging: the GPUs reduced together before the CPU sums the
  // groups' partials (GPUs under one top-level PCIe switch or joined by NVLink), each sorted.
  std::vector<std::vector<int>> switch_groups;
  // The NIC the node's traffic uses (the fastest); "" if the topology lists none.
  std::string nic;
};

// "direct", "cpu-assisted-per-switch", "nvlink-rooted-outside-nic-switch", "packed-trees",
// "host-staging", "cpu-only".
const char* StrategyKindName(IntraNodeStrategy::Kind kind);

// Rules, in order:
// * no GPU in the topology (and none asked for) -> kCpuOnly; one GPU -> kDirect.
// * the chosen GPUs are connected by NVLink (direct links or an NVSwitch):
//   with an NVLink ring through all of them -> kNvLinkRootedOutsideNicSwitch, otherwise
//   (a fragment with no ring) -> kPackedTrees. The root is a GPU NOT below the NIC's top-level
//   PCIe switch (keep that switch free for the NIC), preferring the NIC's NUMA node, then the
//   most NVLink capacity inside the selection, then the lowest index.
// * otherwise GPUs are grouped by top-level PCIe switch and NVLink (never a GPU-to-GPU copy
//   across switches): some group with two or more GPUs -> kCpuAssistedPerSwitch; all groups
//   single -> kHostStaging.
// `gpus`: device indices (empty = all). INVALID_ARGUMENT for an unknown or repeated index.
absl::StatusOr<IntraNodeStrategy> ChooseStrategy(const tributary::v1::Topology& topology,
                                                 const std::vector<int>& gpus);

// True if the NVLink graph (direct links and NVSwitch) among `gpus` has a Hamiltonian cycle, i.e.
// a ring all-reduce can run over NVLink only. Two GPUs with a link count as a ring.
bool HasNvLinkRing(const tributary::v1::Topology& topology, const std::vector<int>& gpus);

}  // namespace tributary::topology
