#include "topology/topology_discovery.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "topology/sysfs.h"
#include "topology/topology_parsers.h"
#include "topology/topology_util.h"

namespace tributary::topology {
namespace {

namespace fs = std::filesystem;
using tributary::v1::Topology;

uint32_t ReadHex(const fs::path& p) {
  std::string text = ReadSysfsText(p);
  absl::string_view s = text;
  absl::ConsumePrefix(&s, "0x");
  uint32_t v = 0;
  return absl::SimpleHexAtoi(s, &v) ? v : 0;
}

int ReadInt(const fs::path& p, int fallback) {
  std::optional<int64_t> v = ReadSysfsInt(p);
  return v ? static_cast<int>(*v) : fallback;
}

// "0-3,8-11" -> 8.
int CountCpuList(const std::string& list) {
  int n = 0;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    std::vector<std::string> ends = absl::StrSplit(part, '-');
    int a = 0, b = 0;
    if (ends.size() == 1 && absl::SimpleAtoi(ends[0], &a)) {
      ++n;
    } else if (ends.size() == 2 && absl::SimpleAtoi(ends[0], &a) && absl::SimpleAtoi(ends[1], &b) &&
               b >= a) {
      n += b - a + 1;
    }
  }
  return n;
}

struct PciDevice {
  std::string bus_id;
  uint32_t cls = 0;
  uint32_t vendor = 0;
  uint32_t device = 0;
  int numa = -1;
  std::vector<std::string> bridges;  // bus ids of the bridges above, root first
  fs::path dir;
};

// ---- NVML ----

// The few NVML declarations we use (nvml.h, API v2+/v3 structures).
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlPciInfo_t {
  char bus_id_legacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pci_device_id;
  unsigned int pci_sub_system_id;
  char bus_id[32];
};
constexpr int kNvmlMaxLinks = 18;

class NvmlNvLinkSource : public NvLinkSource {
 public:
  absl::StatusOr<std::vector<NvmlGpu>> Gpus() override {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      return absl::UnavailableError(absl::StrCat("dlopen libnvidia-ml.so.1: ", dlerror()));
    }
    auto sym = [&](const char* name) { return dlsym(lib, name); };
    auto init = reinterpret_cast<nvmlReturn_t (*)()>(sym("nvmlInit_v2"));
    auto shutdown = reinterpret_cast<nvmlReturn_t (*)()>(sym("nvmlShutdown"));
    auto count = reinterpret_cast<nvmlReturn_t (*)(unsigned*)>(sym("nvmlDeviceGetCount_v2"));
    auto handle = reinterpret_cast<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>(
        sym("nvmlDeviceGetHandleByIndex_v2"));
    auto pci = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, nvmlPciInfo_t*)>(
        sym("nvmlDeviceGetPciInfo_v3"));
    auto name =
        reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned)>(sym("nvmlDeviceGetName"));
    auto state = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, unsigned, int*)>(
        sym("nvmlDeviceGetNvLinkState"));
    auto remote = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, unsigned, nvmlPciInfo_t*)>(
        sym("nvmlDeviceGetNvLinkRemotePciInfo_v2"));
    if (!init || !shutdown || !count || !handle || !pci) {
      dlclose(lib);
      return absl::UnavailableError("libnvidia-ml.so.1 lacks the NVML v2 entry points");
    }
    if (nvmlReturn_t rc = init(); rc != 0) {
      dlclose(lib);
      return absl::UnavailableError(absl::StrCat("nvmlInit_v2 failed with NVML error ", rc));
    }
    std::vector<NvmlGpu> out;
    unsigned n = 0;
    if (count(&n) == 0) {
      for (unsigned i = 0; i < n; ++i) {
        nvmlDevice_t dev = nullptr;
        nvmlPciInfo_t info{};
        if (handle(i, &dev) != 0 || pci(dev, &info) != 0) continue;
        NvmlGpu gpu;
        gpu.index = static_cast<int>(i);
        gpu.bus_id = NormalizeBusId(info.bus_id);
        char buf[96] = {0};
        if (name != nullptr && name(dev, buf, sizeof(buf)) == 0) gpu.name = buf;
        for (unsigned link = 0; state != nullptr && remote != nullptr && link < kNvmlMaxLinks;
             ++link) {
          int active = 0;
          if (state(dev, link, &active) != 0 || active != 1) continue;
          nvmlPciInfo_t far{};
          if (remote(dev, link, &far) != 0) continue;
          gpu.link_remote_bus_ids.push_back(NormalizeBusId(far.bus_id));
        }
        out.push_back(std::move(gpu));
      }
    }
    shutdown();
    dlclose(lib);
    return out;
  }
};

}  // namespace

std::unique_ptr<NvLinkSource> MakeNvmlNvLinkSource() {
  return std::make_unique<NvmlNvLinkSource>();
}

absl::StatusOr<Topology> DiscoverTopology(const std::string& sys_root, NvLinkSource* nvlink) {
  const fs::path root(sys_root);
  const fs::path devices_dir = root / "bus/pci/devices";
  std::error_code ec;
  if (!fs::is_directory(devices_dir, ec)) {
    return absl::NotFoundError(absl::StrCat("no PCI devices under ", devices_dir.string()));
  }
  std::map<std::string, PciDevice> pci;
  for (const auto& entry : fs::directory_iterator(devices_dir, ec)) {
    PciDevice d;
    d.bus_id = NormalizeBusId(entry.path().filename().string());
    if (d.bus_id.empty()) continue;
    d.dir = entry.path();
    d.cls = ReadHex(d.dir / "class");
    d.vendor = ReadHex(d.dir / "vendor");
    d.device = ReadHex(d.dir / "device");
    d.numa = ReadInt(d.dir / "numa_node", -1);
    fs::path real = fs::canonical(entry.path(), ec);
    if (!ec) {
      for (const auto& part : real.parent_path()) {
        std::string bus = NormalizeBusId(part.string());
        if (!bus.empty() && !absl::StartsWith(part.string(), "pci")) d.bridges.push_back(bus);
      }
    }
    pci[d.bus_id] = std::move(d);
  }
  Topology t;
  t.set_source(absl::StrCat("sysfs:", sys_root));
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) t.set_hostname(host);

  // Sockets from the NUMA nodes.
  std::map<int, int> cores;
  for (const auto& entry : fs::directory_iterator(root / "devices/system/node", ec)) {
    std::string file = entry.path().filename().string();
    absl::string_view name = file;
    int id = 0;
    if (absl::ConsumePrefix(&name, "node") && absl::SimpleAtoi(name, &id)) {
      cores[id] = CountCpuList(ReadSysfsText(entry.path() / "cpulist"));
    }
  }
  for (const auto& [bus, d] : pci) {
    if (d.numa >= 0) cores.emplace(d.numa, 0);
  }
  for (const auto& [id, n] : cores) {
    auto* s = t.add_sockets();
    s->set_id(id);
    s->set_cpu_cores(n);
  }

  // Switches: above an endpoint, bridges[0] is the root port; then (upstream, downstream) port
  // pairs, each upstream port one switch whose parent is the previous switch.
  std::set<std::string> made;
  auto nearest_switch = [&](const PciDevice& d) -> std::string {
    std::string parent;
    for (size_t k = 1; k < d.bridges.size(); k += 2) {
      const std::string& id = d.bridges[k];
      if (made.insert(id).second) {
        auto* s = t.add_pcie_switches();
        s->set_id(id);
        s->set_bus_id(id);
        s->set_parent_id(parent);
        auto it = pci.find(id);
        s->set_socket_id(it != pci.end() ? it->second.numa : d.numa);
      }
      parent = id;
    }
    return parent;
  };

  // GPUs, numbered by NVML when it knows them.
  std::vector<NvmlGpu> nvml;
  if (nvlink != nullptr) {
    absl::StatusOr<std::vector<NvmlGpu>> got = nvlink->Gpus();
    if (got.ok()) nvml = std::move(*got);
  }
  std::map<std::string, const NvmlGpu*> nvml_by_bus;
  for (const auto& g : nvml) nvml_by_bus[g.bus_id] = &g;
  std::map<std::string, int> gpu_by_bus;
  int next_index = 0;
  for (const auto& g : nvml) next_index = std::max(next_index, g.index + 1);
  for (const auto& [bus, d] : pci) {  // bus order
    const uint32_t base = d.cls >> 8;
    if (d.vendor != 0x10de || (base != 0x0300 && base != 0x0302)) continue;
    auto* gpu = t.add_gpus();
    auto it = nvml_by_bus.find(bus);
    gpu->set_index(it != nvml_by_bus.end() ? it->second->index : next_index++);
    gpu->set_pci_bus_id(bus);
    gpu->set_numa_node(d.numa);
    gpu->set_parent_switch_id(nearest_switch(d));
    gpu->set_name(it != nvml_by_bus.end() && !it->second->name.empty()
                      ? it->second->name
                      : absl::StrCat("NVIDIA 0x", absl::Hex(d.device, absl::kZeroPad4)));
    gpu_by_bus[bus] = gpu->index();
  }

  // NICs: Ethernet (0x0200) and InfiniBand (0x0207) functions with their interfaces.
  for (const auto& [bus, d] : pci) {
    const uint32_t base = d.cls >> 8;
    if (base != 0x0200 && base != 0x0207) continue;
    std::vector<std::string> names;
    for (const char* sub : {"net", "infiniband"}) {
      for (const auto& e : fs::directory_iterator(d.dir / sub, ec)) {
        names.push_back(e.path().filename().string());
      }
    }
    std::sort(names.begin(), names.end());
    const std::string sw = nearest_switch(d);
    for (const std::string& name : names) {
      auto* nic = t.add_nics();
      nic->set_name(name);
      nic->set_pci_bus_id(bus);
      nic->set_numa_node(d.numa);
      nic->set_parent_switch_id(sw);
      const int64_t bits = NicSpeedBitsPerSecond(root, name);
      if (bits > 0) nic->set_speed_bits_per_s(bits);
    }
  }

  // NVLink: GPU-to-GPU bundles, and links into an NVSwitch (a remote end that is no GPU).
  std::map<std::pair<int, int>, int> bundles;
  std::map<int, int> to_switch;
  for (const auto& g : nvml) {
    auto self = gpu_by_bus.find(g.bus_id);
    if (self == gpu_by_bus.end()) continue;
    for (const std::string& far : g.link_remote_bus_ids) {
      auto other = gpu_by_bus.find(far);
      if (other == gpu_by_bus.end()) {
        ++to_switch[self->second];
      } else if (self->second < other->second) {
        ++bundles[{self->second, other->second}];
      }
    }
  }
  for (const auto& [pair, count] : bundles) {
    auto* l = t.add_nvlinks();
    l->set_gpu_a(pair.first);
    l->set_gpu_b(pair.second);
    l->set_link_count(count);
  }
  if (!to_switch.empty()) {
    int links = 0;
    for (const auto& [gpu, count] : to_switch) {
      t.mutable_nvswitch()->add_gpus(gpu);
      links = links == 0 ? count : std::min(links, count);
    }
    t.mutable_nvswitch()->set_links_per_gpu(links);
  }
  FillDefaultBandwidths(t);
  SortTopology(t);
  if (absl::Status s = ValidateTopology(t, t.source()); !s.ok()) return s;
  return t;
}

absl::StatusOr<Topology> DiscoverLocalTopology() {
  std::unique_ptr<NvLinkSource> nvml = MakeNvmlNvLinkSource();
  return DiscoverTopology("/sys", nvml.get());
}

}  // namespace tributary::topology
