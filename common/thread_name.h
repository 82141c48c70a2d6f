// Names the calling thread, so that `top -H`, `perf` and /proc/PID/task/TID/comm tell the
// process's threads apart.
#pragma once

#include <pthread.h>

#include <string>
#include <string_view>
#include <thread>

namespace tributary::common {

// Sets the calling thread's name to `name`, cut to the kernel's 15 bytes. Best effort: a
// failure leaves the inherited name.
inline void SetCurrentThreadName(std::string_view name) {
  std::string cut(name.substr(0, 15));
  pthread_setname_np(pthread_self(), cut.c_str());
}

// Names `thread` (running), cut the same way; done from the thread that started it, the name is
// in place when this returns.
inline void SetThreadName(std::thread& thread, std::string_view name) {
  std::string cut(name.substr(0, 15));
  pthread_setname_np(thread.native_handle(), cut.c_str());
}

}  // namespace tributary::common
