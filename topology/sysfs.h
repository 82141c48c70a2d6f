// Reading Linux sysfs attributes: the one place that knows their text formats. Used by topology
// discovery and by the agent's node inventory and load sampling.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace tributary::topology {

// The attribute's text without surrounding whitespace; "" when it is missing or unreadable
// (containers often hide sysfs files: that is "unknown", not an error).
std::string ReadSysfsText(const std::filesystem::path& path);

// The attribute as a decimal integer (a leading "0x" reads it as hex); nullopt when missing or
// not a number.
std::optional<int64_t> ReadSysfsInt(const std::filesystem::path& path);

// Line rate of network interface `name` under `sys_root` (normally "/sys") in bits/s: Ethernet's
// class/net/<name>/speed (Mbit/s), else InfiniBand's class/infiniband/<name>/ports/1/rate
// ("100 Gb/sec (4X EDR)"). 0 when unknown (virtual interfaces report -1 or refuse the read).
int64_t NicSpeedBitsPerSecond(const std::filesystem::path& sys_root, const std::string& name);

}  // namespace tributary::topology
