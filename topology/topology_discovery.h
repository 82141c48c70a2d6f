// Live discovery of the local node: the sysfs PCI tree (GPUs, PCIe switches, NICs, NUMA nodes)
// plus NVLink through NVML, which is loaded at run time (dlopen "libnvidia-ml.so.1"): no GPU, no
// NVML and no NVLink are normal results, not errors.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tributary/v1/topology.pb.h"

namespace tributary::topology {

// What NVML says about one GPU.
struct NvmlGpu {
  int index = 0;       // NVML device index
  std::string bus_id;  // normalized "0000:06:00.0"
  std::string name;    // "Tesla V100-SXM2-16GB"
  // The PCI bus id at the far end of each active NVLink, one entry per link (an NVSwitch's or
  // a GPU's).
  std::vector<std::string> link_remote_bus_ids;
};

// Source of NVLink data; the NVML one below, or a fake in tests.
class NvLinkSource {
 public:
  virtual ~NvLinkSource() = default;
  // UNAVAILABLE when there is no NVML / no driver (the caller treats that as "no NVLink").
  virtual absl::StatusOr<std::vector<NvmlGpu>> Gpus() = 0;
};

// NVML through dlopen; no link-time dependency on the driver.
std::unique_ptr<NvLinkSource> MakeNvmlNvLinkSource();

// Walks `sys_root` (normally "/sys"): bus/pci/devices (class, vendor, numa_node; the symlink
// targets give the bridge chain: the first bridge is the root port, then upstream/downstream
// port pairs, each upstream port a PCIe switch), class/net/<if>/speed (Mbit/s),
// devices/system/node/node<N>/cpulist. GPUs are NVIDIA (0x10de) devices of class 0x0300/0x0302,
// numbered like NVML when `nvlink` knows them, else in bus order. `nvlink` may be null (no NVLink
// data). NOT_FOUND if sys_root has no bus/pci/devices.
absl::StatusOr<tributary::v1::Topology> DiscoverTopology(const std::string& sys_root,
                                                         NvLinkSource* nvlink);

// DiscoverTopology("/sys", NVML).
absl::StatusOr<tributary::v1::Topology> DiscoverLocalTopology();

}  // namespace tributary::topology
