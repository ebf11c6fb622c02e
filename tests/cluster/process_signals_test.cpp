// cluster/process.h's stop signals: each SIGINT/SIGTERM sets the stop flag and is counted, so
// that a second one during a drain stops at once (cluster/launch_lifecycle.cpp shut_down).
#include <gtest/gtest.h>

#include <csignal>

#include "cluster/process.h"

namespace specserve {
namespace {

TEST(StopSignals, EachSignalIsCountedAndSetsTheFlag) {
  install_stop_signals();
  const int before = stop_signal_count();
  ASSERT_EQ(::raise(SIGTERM), 0);
  EXPECT_TRUE(stop_requested());
  EXPECT_EQ(stop_signal_count(), before + 1);
  ASSERT_EQ(::raise(SIGINT), 0);
  EXPECT_EQ(stop_signal_count(), before + 2) << "a second signal (the one that cuts a drain short) is seen";
}

}  // namespace
}  // namespace specserve
