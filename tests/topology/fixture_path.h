// Where the topology fixtures live (tests/topology/fixtures; the test's CMake target defines
// TRIBUTARY_TOPOLOGY_FIXTURES).
#pragma once

#include <string>

namespace tributary::topology {

inline std::string FixturePath(const std::string& name) {
  return std::string(TRIBUTARY_TOPOLOGY_FIXTURES) + "/" + name;
}

}  // namespace tributary::topology
