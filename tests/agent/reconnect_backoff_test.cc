// The agent's reconnection schedule to the controller, with an injected random source.
#include <cmath>
#include <vector>

#include "agent/grpc_controller_client.h"
#include "gtest/gtest.h"

namespace tributary::agent {
namespace {

using std::chrono::milliseconds;

TEST(ReconnectBackoffTest, DoublesFromTheInitialDelayUpToTheCap) {
  ReconnectBackoff backoff({milliseconds(100), milliseconds(5000), 2, 0.2}, [] { return 0.5; });
  std::vector<int64_t> delays;
  for (int i = 0; i < 9; ++i) delays.push_back(backoff.Next().count());
  // u = 0.5 is the middle of the jitter band: the base delays themselves.
  EXPECT_EQ(delays, (std::vector<int64_t>{100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000}));
}

TEST(ReconnectBackoffTest, JitterSpreadsEachDelayOverPlusMinusTwentyPercent) {
  std::vector<double> draws = {0.0, 0.999999, 0.25};
  size_t next = 0;
  ReconnectBackoff backoff({milliseconds(1000), milliseconds(1000), 2, 0.2},
                           [&] { return draws[next++ % draws.size()]; });
  EXPECT_EQ(backoff.Next().count(), 800);   // -20%
  EXPECT_EQ(backoff.Next().count(), 1200);  // +20%
  EXPECT_EQ(backoff.Next().count(), 900);   // -10%
}

TEST(ReconnectBackoffTest, EveryDelayStaysWithinTheBoundsWithARealRandomSource) {
  const ReconnectBackoff::Options options;  // the agent's defaults
  ReconnectBackoff backoff(options);
  for (int i = 0; i < 1000; ++i) {
    const milliseconds base = backoff.base();
    const milliseconds d = backoff.Next();
    EXPECT_GE(d.count(), std::llround(base.count() * (1 - options.jitter)));
    EXPECT_LE(d.count(), std::llround(base.count() * (1 + options.jitter)));
    // The bound the controller-restart test relies on: all agents back within 5 s.
    EXPECT_LT(d, milliseconds(5000));
  }
  EXPECT_EQ(backoff.base(), options.max);
}

TEST(ReconnectBackoffTest, ResetStartsOverAfterASuccess) {
  ReconnectBackoff backoff({milliseconds(100), milliseconds(5000), 2, 0.2}, [] { return 0.5; });
  for (int i = 0; i < 5; ++i) backoff.Next();
  EXPECT_EQ(backoff.base(), milliseconds(3200));
  backoff.Reset();
  EXPECT_EQ(backoff.Next(), milliseconds(100));
}

TEST(ReconnectBackoffTest, OutOfRangeDrawsAreClamped) {
  ReconnectBackoff backoff({milliseconds(100), milliseconds(100), 2, 0.2}, [] { return 7.0; });
  EXPECT_EQ(backoff.Next(), milliseconds(120));
}

}  // namespace
}  // namespace tributary::agent
