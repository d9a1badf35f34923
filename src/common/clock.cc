#include "src/common/clock.h"

namespace tandem {

SystemClock& SystemClock::instance() {
  static SystemClock clock;
  return clock;
}

}  // namespace tandem
