// Which malloc this process runs on: the agent and the controller link jemalloc
// (TRIBUTARY_JEMALLOC in the top-level CMakeLists.txt), every other binary and the training
// processes keep glibc's. The daemons log it at start.
#pragma once

#include <string>

namespace tributary::common {

// "jemalloc <version>" when jemalloc serves this process's malloc, else "glibc malloc".
std::string AllocatorName();

}  // namespace tributary::common
