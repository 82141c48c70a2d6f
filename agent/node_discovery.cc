#include "agent/node_discovery.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "topology/sysfs.h"

namespace tributary::agent {
namespace {

namespace fs = std::filesystem;

uint64_t MemInfo(const std::string& proc_root, const std::string& key) {
  std::ifstream f(proc_root + "/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream in(line.substr(key.size() + 1));
      uint64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

}  // namespace

tributary::v1::NodeInventory DiscoverNode(const std::string& sys_root,
                                          const std::string& proc_root) {
  tributary::v1::NodeInventory inv;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) inv.set_hostname(host);
  inv.set_cpu_cores(std::thread::hardware_concurrency());
  inv.set_memory_bytes(MemInfo(proc_root, "MemTotal"));
  std::error_code ec;
  double fastest = 0;
  for (const auto& entry : fs::directory_iterator(sys_root + "/class/net", ec)) {
    const std::string name = entry.path().filename();
    if (name == "lo") continue;
    auto* nic = inv.add_nics();
    nic->set_name(name);
    const int64_t bits = topology::NicSpeedBitsPerSecond(sys_root, name);
    if (bits > 0) {
      nic->set_speed_bits_per_s(static_cast<double>(bits));
      fastest = std::max(fastest, nic->speed_bits_per_s());
    }
  }
  inv.set_nic_bytes_per_s(fastest / 8);
  uint32_t gpus = 0;
  for (const auto& entry : fs::directory_iterator(proc_root + "/driver/nvidia/gpus", ec)) {
    (void)entry;
    gpus++;
  }
  inv.set_gpu_count(gpus);
  return inv;
}

LoadMonitor::LoadMonitor(std::string sys_root, std::string proc_root)
    : sys_root_(std::move(sys_root)), proc_root_(std::move(proc_root)), last_(Read()) {}

LoadMonitor::Counters LoadMonitor::Read() const {
  Counters c;
  std::ifstream stat(proc_root_ + "/stat");
  std::string cpu;
  uint64_t v[10] = {};
  if (stat >> cpu) {
    for (uint64_t& x : v) stat >> x;
    // user nice system idle iowait irq softirq steal guest guest_nice
    c.cpu_total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    c.cpu_busy = c.cpu_total - v[3] - v[4];
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(sys_root_ + "/class/net", ec)) {
    if (entry.path().filename() == "lo") continue;
    c.tx += topology::ReadSysfsInt(entry.path() / "statistics" / "tx_bytes").value_or(0);
    c.rx += topology::ReadSysfsInt(entry.path() / "statistics" / "rx_bytes").value_or(0);
  }
  c.mem_used = MemInfo(proc_root_, "MemTotal") - MemInfo(proc_root_, "MemAvailable");
  return c;
}

tributary::v1::NodeLoad LoadMonitor::Sample(double elapsed_seconds) {
  const Counters now = Read();
  tributary::v1::NodeLoad load;
  if (now.cpu_total > last_.cpu_total) {
    load.set_cpu_busy_fraction(static_cast<double>(now.cpu_busy - last_.cpu_busy) /
                               static_cast<double>(now.cpu_total - last_.cpu_total));
  }
  if (elapsed_seconds > 0) {
    load.set_nic_tx_bytes_per_s(static_cast<double>(now.tx - last_.tx) / elapsed_seconds);
    load.set_nic_rx_bytes_per_s(static_cast<double>(now.rx - last_.rx) / elapsed_seconds);
  }
  load.set_memory_used_bytes(now.mem_used);
  last_ = now;
  return load;
}

}  // namespace tributary::agent
