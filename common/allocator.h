// Which malloc this process runs on: the agent and the controller link jemalloc
// (TRIBUTARY_JEMALLOC in the top-level CMakeLists.txt), every other binary and the training
// processes keep glibc's. The daemons log it at start.
#pragma once

#include <string>

namespace tributary::common {

// "jemalloc <version>" when jemalloc's mallctl is linked into the process (the daemons: it then
// serves their malloc), else "system malloc" (the C library's, or a sanitizer's).
std::string AllocatorName();

}  // namespace tributary::common
