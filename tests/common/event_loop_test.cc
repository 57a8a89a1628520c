// The event loop of handlers (common/event_loop.h), on simulated time: timers fire in order and
// at once, descriptors that are ready come first, and a handler may change the set it is in.
#include "common/event_loop.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace launch {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::seconds;

UniqueFd ReadyEventFd() { return UniqueFd(::eventfd(1, EFD_CLOEXEC | EFD_NONBLOCK)); }

std::unique_ptr<EventLoop> MakeLoop(const Clock* clock) {
  auto loop = EventLoop::Create(clock);
  EXPECT_TRUE(loop.ok()) << loop.status();
  return std::move(*loop);
}

TEST(EventLoop, TimersFireInOrderAtTheirTimeOnSimulatedTime) {
  SimulatedClock clock;
  auto loop = MakeLoop(&clock);
  std::vector<std::string> fired;
  std::vector<Clock::Duration> at;
  auto record = [&](const char* name) {
    return [&, name] {
      fired.push_back(name);
      at.push_back(clock.Now().time_since_epoch());
    };
  };
  auto grace = loop->MakeTimer(record("grace"));
  auto hang = loop->MakeTimer(record("hang"));
  auto never = loop->MakeTimer(record("never"));
  grace->Arm(seconds(30));
  hang->Arm(milliseconds(40));
  never->Arm(milliseconds(10));
  never->Disarm();
  while (grace->armed() || hang->armed()) ASSERT_TRUE(loop->RunOnce().ok());
  EXPECT_EQ(fired, (std::vector<std::string>{"hang", "grace"}));
  EXPECT_EQ(at, (std::vector<Clock::Duration>{milliseconds(40), seconds(30)}));
}

TEST(EventLoop, ReadyDescriptorsComeBeforeTimeMoves) {
  SimulatedClock clock;
  auto loop = MakeLoop(&clock);
  UniqueFd ready = ReadyEventFd();
  int handled = 0;
  loop->Watch(ready.get(), EPOLLIN, [&](uint32_t events) {
    EXPECT_TRUE(events & EPOLLIN);
    ++handled;
    uint64_t n;
    ASSERT_EQ(::read(ready.get(), &n, sizeof n), 8);
  });
  bool fired = false;
  auto timer = loop->MakeTimer([&] { fired = true; });
  timer->Arm(hours(1));
  ASSERT_TRUE(loop->RunOnce().ok());
  EXPECT_EQ(handled, 1);
  EXPECT_FALSE(fired);
  EXPECT_EQ(clock.Now().time_since_epoch(), Clock::Duration(0));
  ASSERT_TRUE(loop->RunOnce().ok());  // nothing ready: an hour passes
  EXPECT_TRUE(fired);
  EXPECT_EQ(clock.Now().time_since_epoch(), hours(1));
  EXPECT_EQ(handled, 1);
}

TEST(EventLoop, AHandlerMayUnwatchItselfAndOthersWhoseEventsAreThenDropped) {
  SystemClock clock;
  auto loop = MakeLoop(&clock);
  UniqueFd a = ReadyEventFd(), b = ReadyEventFd();
  std::vector<std::string> calls;
  // Whichever is handled first takes both out of the set: the other's event of this turn is not
  // delivered.
  loop->Watch(a.get(), EPOLLIN, [&](uint32_t) {
    calls.push_back("a");
    loop->Unwatch(a.get());
    loop->Unwatch(b.get());
  });
  loop->Watch(b.get(), EPOLLIN, [&](uint32_t) {
    calls.push_back("b");
    loop->Unwatch(a.get());
    loop->Unwatch(b.get());
  });
  ASSERT_TRUE(loop->RunOnce().ok());
  EXPECT_EQ(calls.size(), 1u);
  EXPECT_FALSE(loop->watching(a.get()));
  EXPECT_FALSE(loop->watching(b.get()));
}

TEST(EventLoop, ModifyToNoEventsKeepsADescriptorQuiet) {
  SimulatedClock clock;
  auto loop = MakeLoop(&clock);
  UniqueFd ready = ReadyEventFd();
  int handled = 0;
  loop->Watch(ready.get(), EPOLLIN, [&](uint32_t) { ++handled; });
  loop->Modify(ready.get(), 0);
  bool fired = false;
  auto timer = loop->MakeTimer([&] { fired = true; });
  timer->Arm(milliseconds(5));
  ASSERT_TRUE(loop->RunOnce().ok());
  EXPECT_TRUE(fired);
  EXPECT_EQ(handled, 0);
  loop->Modify(ready.get(), EPOLLIN);
  ASSERT_TRUE(loop->RunOnce().ok());
  EXPECT_EQ(handled, 1);
}

TEST(EventLoop, ADescriptorClosedWithoutUnwatchCanBeWatchedAgainByNumber) {
  SystemClock clock;
  auto loop = MakeLoop(&clock);
  UniqueFd first = ReadyEventFd();
  const int number = first.get();
  loop->Watch(number, EPOLLIN, [](uint32_t) { ADD_FAILURE() << "the closed descriptor's handler"; });
  first.Reset();  // the kernel drops it from the set; the loop still has its entry
  UniqueFd second = ReadyEventFd();
  ASSERT_EQ(second.get(), number);
  int handled = 0;
  loop->Watch(second.get(), EPOLLIN, [&](uint32_t) { ++handled; });
  ASSERT_TRUE(loop->RunOnce().ok());
  EXPECT_EQ(handled, 1);
}

TEST(EventLoop, ATimerRearmedOrDestroyedByAnEarlierCallbackIsNotFiredStale) {
  SimulatedClock clock;
  auto loop = MakeLoop(&clock);
  std::vector<std::string> fired;
  std::unique_ptr<EventLoop::Timer> second, third;
  auto first = loop->MakeTimer([&] {
    fired.push_back("first");
    second->Arm(seconds(10));  // moved later
    third.reset();             // gone
  });
  second = loop->MakeTimer([&] { fired.push_back("second"); });
  third = loop->MakeTimer([&] { fired.push_back("third"); });
  first->Arm(milliseconds(1));
  second->Arm(milliseconds(1));
  third->Arm(milliseconds(1));
  ASSERT_TRUE(loop->RunOnce().ok());
  EXPECT_EQ(fired, std::vector<std::string>{"first"});
  ASSERT_TRUE(loop->RunOnce().ok());
  EXPECT_EQ(fired, (std::vector<std::string>{"first", "second"}));
  EXPECT_EQ(clock.Now().time_since_epoch(), milliseconds(1) + seconds(10));
}

TEST(EventLoop, AZeroTimerOnTheSystemClockFiresOnTheNextTurn) {
  SystemClock clock;
  auto loop = MakeLoop(&clock);
  bool fired = false;
  auto timer = loop->MakeTimer([&] { fired = true; });
  timer->Arm(Clock::Duration(0));
  ASSERT_TRUE(loop->RunOnce().ok());
  EXPECT_TRUE(fired);
  EXPECT_FALSE(timer->armed());
}

}  // namespace
}  // namespace launch
