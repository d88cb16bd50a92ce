// shm/flag_sync.h: how a device service decides the epoch it runs a step under.
#include "shm/flag_sync.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/base/error.h"

namespace duet::shm {
namespace {

TEST(EpochForStep, AStepIssuedUnderAnOlderEpochIsRefusedNotWaitedOn) {
  // A device that picks up a RunStep after a restart moved the epoch on must not wait out the
  // step's deadline for flags of an abandoned step: the frontend's re-run queues behind it.
  struct alignas(64) Line {
    uint8_t bytes[64];
  };
  std::vector<Line> memory(FlagTable::bytes_for(4) / sizeof(Line) + 1);
  FlagTable table =
      FlagTable::format(reinterpret_cast<uint8_t*>(memory.data()), memory.size() * sizeof(Line), 4);
  const uint64_t issued = table.epoch();
  EXPECT_EQ(epoch_for_step(table, issued), issued);
  EXPECT_EQ(epoch_for_step(table, 0), issued) << "0: no epoch given, use the current one";
  table.bump_epoch();
  try {
    epoch_for_step(table, issued);
    FAIL() << "a stale step was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unavailable);
    EXPECT_NE(std::string(e.what()).find("stack epoch"), std::string::npos) << e.what();
  }
  EXPECT_EQ(epoch_for_step(table, issued + 1), issued + 1);
}

}  // namespace
}  // namespace duet::shm
