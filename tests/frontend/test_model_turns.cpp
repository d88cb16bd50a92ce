// Whose step runs next among several models (model_turns.h): equal ranks take turns, the lower
// rank steps first while both are ready, and aging bounds how long a lower-priority model waits.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/base/error.h"
#include "services/frontend/model_turns.h"

namespace duet::frontend {
namespace {

// `steps` turns with every model ready throughout: the model that stepped at each turn.
std::vector<int> run_all_ready(ModelTurns& turns, int steps) {
  const std::vector<bool> ready(turns.size(), true);
  std::vector<int> order;
  for (int i = 0; i < steps; ++i) {
    const int m = turns.choose(ready);
    turns.record(static_cast<size_t>(m), ready);
    order.push_back(m);
  }
  return order;
}

std::string as_text(const std::vector<int>& order) {
  std::string s;
  for (int m : order) s += std::to_string(m);
  return s;
}

TEST(ModelTurns, EqualRanksTakeTurns) {
  ModelTurns turns({0, 0, 0}, 8);
  EXPECT_EQ(as_text(run_all_ready(turns, 7)), "0120120");
  for (size_t m = 0; m < 3; ++m) EXPECT_EQ(turns.stats(m).max_wait_steps, 2u) << m;
}

TEST(ModelTurns, TheLowerRankStepsFirstAndTheOtherAgesIntoATurn) {
  ModelTurns turns({0, 1}, 4);  // model 1 is one rank behind: one turn after 4 passed-over steps
  EXPECT_EQ(as_text(run_all_ready(turns, 15)), "000010000100001");
  EXPECT_EQ(turns.stats(0).steps, 12u);
  EXPECT_EQ(turns.stats(1).steps, 3u);
  EXPECT_EQ(turns.stats(1).contended_steps, 3u);
  EXPECT_EQ(turns.stats(1).max_wait_steps, 4u);
  EXPECT_LE(turns.stats(1).max_wait_steps, turns.wait_bound_steps(1));
  EXPECT_EQ(turns.wait_bound_steps(1), 1u * 4 + 1);
}

TEST(ModelTurns, ALowerPriorityModelAloneStepsEveryTurn) {
  ModelTurns turns({0, 3}, 8);
  const std::vector<bool> only_low = {false, true};
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(turns.choose(only_low), 1);
    turns.record(1, only_low);
  }
  EXPECT_EQ(turns.stats(1).steps, 5u);
  EXPECT_EQ(turns.stats(1).contended_steps, 0u);
  EXPECT_EQ(turns.choose({false, false}), -1) << "nothing ready: nothing steps";
}

TEST(ModelTurns, NoReadyModelWaitsLongerThanTheBound) {
  // Four models of spread ranks, readiness changing every turn (a fixed pseudo-random pattern):
  // every wait stays within (rank - best rank) x aging + models - 1.
  ModelTurns turns({2, 0, 5, 0}, 3);
  uint32_t x = 12345;
  for (int i = 0; i < 4000; ++i) {
    std::vector<bool> ready(4);
    for (size_t m = 0; m < 4; ++m) {
      x = x * 1103515245u + 12345u;
      ready[m] = ((x >> 16) % 10) < 8;  // each ready 80% of the turns
    }
    const int m = turns.choose(ready);
    if (m < 0) continue;
    ASSERT_TRUE(ready[static_cast<size_t>(m)]);
    turns.record(static_cast<size_t>(m), ready);
  }
  for (size_t m = 0; m < 4; ++m) {
    EXPECT_GT(turns.stats(m).steps, 0u) << m;
    EXPECT_LE(turns.stats(m).max_wait_steps, turns.wait_bound_steps(m)) << m;
  }
  EXPECT_GT(turns.stats(2).max_wait_steps, 5u * 3 - 4) << "the lowest rank did wait its ranks";
  EXPECT_GT(turns.stats(1).steps + turns.stats(3).steps, turns.stats(2).steps * 4);
}

TEST(ModelTurns, AModelThatStopsBeingReadyStartsItsWaitAfresh) {
  ModelTurns turns({0, 1}, 4);
  (void)run_all_ready(turns, 3);   // model 1 waits 3
  turns.record(0, {true, false});  // model 1 has no work for a turn
  EXPECT_EQ(turns.status(1)["waiting_steps"], 0);
  EXPECT_EQ(as_text(run_all_ready(turns, 5)), "00001");
}

TEST(ModelTurns, BadArgumentsAreRefused) {
  EXPECT_THROW(ModelTurns({0, 1}, 0), Error);
  ModelTurns turns({0, 1}, 2);
  EXPECT_THROW((void)turns.choose({true}), Error);
}

}  // namespace
}  // namespace duet::frontend
