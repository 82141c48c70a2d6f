#include "common/allocator.h"

// jemalloc's control entry point, resolved at run time: null unless jemalloc is loaded. Debian's
// libjemalloc exports it unprefixed, with malloc itself.
extern "C" int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen)
    __attribute__((weak));

namespace tributary::common {

std::string AllocatorName() {
  if (mallctl != nullptr) {
    const char* version = nullptr;
    size_t length = sizeof(version);
    if (mallctl("version", &version, &length, nullptr, 0) == 0 && version != nullptr) {
      return std::string("jemalloc ") + version;
    }
    return "jemalloc";
  }
  return "system malloc";
}

}  // namespace tributary::common
