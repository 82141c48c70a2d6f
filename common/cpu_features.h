// CPU features that __builtin_cpu_supports cannot report on every compiler we build with.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace tributary::common {

// F16C (the float16 <-> float32 conversion instructions): CPUID leaf 1, ECX bit 29. clang before
// 17 has no "f16c" for __builtin_cpu_supports. False on other architectures.
inline bool CpuHasF16c() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
#else
  return false;
#endif
}

}  // namespace tributary::common
