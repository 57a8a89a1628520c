#include "common/clock.h"

namespace launch {

double SecondsBetween(Clock::TimePoint a, Clock::TimePoint b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace launch
