#include "common/clock.h"

namespace tributary::common {

SystemClock* SystemClock::Get() {
  static SystemClock clock;
  return &clock;
}

}  // namespace tributary::common
