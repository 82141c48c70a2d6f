// What an agent finds out about its node from sysfs and procfs.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "tributary/v1/controller.pb.h"

namespace tributary::agent {

// Reads CPU cores, memory, NICs (name, link speed) and the number of NVIDIA GPUs from
// `sys_root` (normally "/sys") and `proc_root` ("/proc"). Missing files give zeros, not errors:
// containers often hide them. nic_bytes_per_s is the fastest NIC's line rate (0 if unknown).
tributary::v1::NodeInventory DiscoverNode(const std::string& sys_root = "/sys",
                                          const std::string& proc_root = "/proc");

// Samples whole-node CPU and NIC use between calls.
class LoadMonitor {
 public:
  LoadMonitor(std::string sys_root = "/sys", std::string proc_root = "/proc");
  // Load since the previous call (the first call measures since construction).
  tributary::v1::NodeLoad Sample(double elapsed_seconds);

 private:
  struct Counters {
    uint64_t cpu_busy = 0, cpu_total = 0, tx = 0, rx = 0, mem_used = 0;
  };
  Counters Read() const;
  std::string sys_root_, proc_root_;
  Counters last_;
};

}  // namespace tributary::agent
