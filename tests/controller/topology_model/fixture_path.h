// Where the topology fixtures live, found from this file's path (CMake compiles with absolute
// paths).
#pragma once

#include <filesystem>
#include <string>

namespace tributary::controller::topology {

inline std::string FixturePath(const std::string& name) {
  return (std::filesystem::path(__FILE__).parent_path() / "fixtures" / name).string();
}

}  // namespace tributary::controller::topology
