#include "common/thread_name.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace tributary::common {
namespace {

std::string CurrentThreadName() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

TEST(ThreadNameTest, NamesTheCallingThreadOnly) {
  const std::string before = CurrentThreadName();
  std::string inside;
  std::string comm;
  std::thread t([&] {
    SetCurrentThreadName("trib-test");
    inside = CurrentThreadName();
    std::ifstream in("/proc/self/task/" + std::to_string(syscall(SYS_gettid)) + "/comm");
    std::getline(in, comm);
  });
  t.join();
  EXPECT_EQ(inside, "trib-test");
  EXPECT_EQ(comm, "trib-test");  // what top -H and perf show
  EXPECT_EQ(CurrentThreadName(), before);
}

TEST(ThreadNameTest, LongNamesAreCutToFifteenBytes) {
  std::string inside;
  std::thread t([&] {
    SetCurrentThreadName("trib-a-name-longer-than-the-kernel-keeps");
    inside = CurrentThreadName();
  });
  t.join();
  EXPECT_EQ(inside, "trib-a-name-lon");
}

TEST(ThreadNameTest, NamesARunningThreadFromOutside) {
  std::mutex mu;
  std::condition_variable cv;
  bool named = false;
  std::string inside;
  std::thread t([&] {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return named; });
    inside = CurrentThreadName();
  });
  SetThreadName(t, "trib-outside");
  {
    std::lock_guard lock(mu);
    named = true;
  }
  cv.notify_one();
  t.join();
  EXPECT_EQ(inside, "trib-outside");
}

}  // namespace
}  // namespace tributary::common
