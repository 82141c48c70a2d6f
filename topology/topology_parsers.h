// Node topology sources: NCCL's topology XML (NCCL_TOPO_FILE), the `nvidia-smi topo -m` matrix,
// and our own JSON / YAML form, which mirrors tributary.v1.Topology field for field (see
// README_model.md). Every parser validates what it builds (ValidateTopology) and fails with
// INVALID_ARGUMENT naming the source and the element, field path or line at fault.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tributary/v1/topology.pb.h"

namespace tributary::topology {

// Defaults used where a source does not say (bytes/s per direction). NVLink 2 (V100) carries
// 25 GB/s per link and direction, NVLink 1 (P100) 20 GB/s; the PCIe figures are the BytePS
// paper's measurements on a PCIe 3.0 server (same-switch copy ~105 Gbps, cross-switch ~80 Gbps).
inline constexpr double kNvLink1BytesPerS = 20e9;
inline constexpr double kNvLink2BytesPerS = 25e9;
inline constexpr double kPcieSameSwitchBytesPerS = 105e9 / 8;
inline constexpr double kPcieCrossSwitchBytesPerS = 80e9 / 8;
inline constexpr double kPcieHostBytesPerS = 100e9 / 8;

// Fills every zero bandwidth with the defaults above (NVLink: 25 GB/s).
void FillDefaultBandwidths(tributary::v1::Topology& topology);

// Checks the references inside a topology: unique GPU indices, NIC names and switch ids; every
// parent switch, NVLink endpoint and NVSwitch GPU exists; no NVLink to self; positive link
// counts; an acyclic switch tree. `source` names the input in the message.
absl::Status ValidateTopology(const tributary::v1::Topology& topology, std::string_view source);

// NCCL's topology XML: <system><cpu numaid><pci busid class>…<gpu dev><nvlink target count
// tclass/></gpu>, <nic><net name speed/></nic>. PCI bridges (class 0x0604xx) become switches;
// NVLink targets are GPU bus ids, or an NVSwitch (tclass 0x068000). `source` names the input
// (usually the file path) in errors and in Topology.source.
absl::StatusOr<tributary::v1::Topology> ParseNcclTopoXml(std::string_view xml,
                                                         std::string_view source);

// The matrix printed by `nvidia-smi topo -m`: a header row of device names (GPU<n>, NIC names,
// optionally "CPU Affinity" / "NUMA Affinity"), one row per device with X, NV<n>, PIX, PXB, PHB,
// NODE, SYS cells; the legend after the matrix is ignored. PIX/PXB pairs share a PCIe switch;
// NODE/PHB pairs (or the NUMA Affinity column) share a socket. Errors name the line.
absl::StatusOr<tributary::v1::Topology> ParseNvidiaSmiTopo(std::string_view text,
                                                           std::string_view source);

// Our JSON / YAML form. Errors name the field path (`gpus[2].numa_node`) and, for YAML, the line.
absl::StatusOr<tributary::v1::Topology> ParseTopologyJson(std::string_view json,
                                                          std::string_view source);
absl::StatusOr<tributary::v1::Topology> ParseTopologyYaml(std::string_view yaml,
                                                          std::string_view source);
// Writers; the output parses back to an equal message.
std::string TopologyToJson(const tributary::v1::Topology& topology);
std::string TopologyToYaml(const tributary::v1::Topology& topology);

enum class TopologyFormat { kNcclXml, kNvidiaSmi, kJson, kYaml };

// The format of a file: by extension (.xml, .json, .yaml/.yml, .txt/.smi) and, failing that, by
// its first non-blank character ('<' XML, '{' JSON, a line starting with GPU0 / a tab: smi).
TopologyFormat DetectTopologyFormat(std::string_view path, std::string_view content);

}  // namespace tributary::topology
