#include "tpu/chip_visibility.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace torus::tpu {
namespace {

using Env = std::map<std::string, std::string>;

// §7 table, "4-chip host, chips [0] / [0,1] / [2,3]".
TEST(ChipVisibilityTest, OneChipOfFour) {
  EnvChanges c = ComputeChipVisibility(4, {0}, false);
  EXPECT_EQ(c.set, (Env{{"TPU_VISIBLE_CHIPS", "0"},
                        {"TPU_CHIPS_PER_HOST_BOUNDS", "1,1,1"},
                        {"TPU_HOST_BOUNDS", "1,1,1"}}));
  EXPECT_TRUE(c.unset.empty());
}

TEST(ChipVisibilityTest, TwoChipsOfFour) {
  EnvChanges c = ComputeChipVisibility(4, {0, 1}, false);
  EXPECT_EQ(c.set, (Env{{"TPU_VISIBLE_CHIPS", "0,1"},
                        {"TPU_CHIPS_PER_HOST_BOUNDS", "1,2,1"},
                        {"TPU_HOST_BOUNDS", "1,1,1"}}));
  c = ComputeChipVisibility(4, {3, 2}, false);  // ascending regardless of grant order
  EXPECT_EQ(c.set, (Env{{"TPU_VISIBLE_CHIPS", "2,3"},
                        {"TPU_CHIPS_PER_HOST_BOUNDS", "1,2,1"},
                        {"TPU_HOST_BOUNDS", "1,1,1"}}));
  EXPECT_TRUE(c.unset.empty());
}

// "4-chip host, all 4; 8-chip host, all 8": none of the three set, bounds removed if inherited.
TEST(ChipVisibilityTest, WholeHostRemovesBoundsAndSetsNothing) {
  for (int n : {4, 8}) {
    std::vector<int> all;
    for (int i = 0; i < n; ++i) all.push_back(i);
    EnvChanges c = ComputeChipVisibility(n, all, false);
    EXPECT_TRUE(c.set.empty()) << n;
    EXPECT_EQ(c.unset,
              (std::vector<std::string>{"TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS"}));
    Env env = {{"TPU_CHIPS_PER_HOST_BOUNDS", "1,1,1"},
               {"TPU_HOST_BOUNDS", "1,1,1"},
               {"TPU_NAME", "s"}};
    c.ApplyTo(&env);
    EXPECT_EQ(env, (Env{{"TPU_NAME", "s"}})) << n;
  }
}

TEST(ChipVisibilityTest, WholeHostKeepsTheNodesOwnVisibleChips) {
  // A node capped by TPU_VISIBLE_CHIPS=4,5 has 2 chips; a worker holding both inherits the list.
  Env env = {{"TPU_VISIBLE_CHIPS", "4,5"}};
  ComputeChipVisibility(2, {4, 5}, false).ApplyTo(&env);
  EXPECT_EQ(env, (Env{{"TPU_VISIBLE_CHIPS", "4,5"}}));
}

// "any grant with the opt-out set": nothing set or removed.
TEST(ChipVisibilityTest, OptOutChangesNothing) {
  EXPECT_TRUE(ComputeChipVisibility(4, {0}, true).empty());
  EXPECT_TRUE(ComputeChipVisibility(4, {0, 1}, true).empty());
  EXPECT_TRUE(ComputeChipVisibility(4, {0, 1, 2, 3}, true).empty());
  EXPECT_TRUE(ComputeChipVisibility(8, {0, 1, 2, 3}, true).empty());
}

TEST(ChipVisibilityTest, OptOutVariablesAndTruthyParsing) {
  EXPECT_TRUE(VisibilityOptOut({{"TORUS_NOSET_TPU_VISIBLE_CHIPS", "1"}}));
  EXPECT_TRUE(VisibilityOptOut({{"RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS", "true"}}));
  EXPECT_TRUE(VisibilityOptOut({{"TORUS_NOSET_TPU_VISIBLE_CHIPS", "0"},
                                {"RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS", "yes"}}));
  EXPECT_FALSE(VisibilityOptOut({}));
  EXPECT_FALSE(VisibilityOptOut({{"TORUS_NOSET_TPU_VISIBLE_CHIPS", "0"}}));
  EXPECT_FALSE(VisibilityOptOut({{"OTHER", "1"}}));
  for (const char* yes : {"1", "true", "TRUE", "True", "yes", "on", " 1 ", "On"}) {
    EXPECT_TRUE(IsTruthy(yes)) << yes;
  }
  for (const char* no : {"", "0", "false", "no", "off", "2", "garbage", "  "}) {
    EXPECT_FALSE(IsTruthy(no)) << no;
  }
}

// "8-chip host, chips [0,1,2,3]": VISIBLE only.
TEST(ChipVisibilityTest, OtherPartialGrantSetsOnlyVisibleChips) {
  EnvChanges c = ComputeChipVisibility(8, {0, 1, 2, 3}, false);
  EXPECT_EQ(c.set, (Env{{"TPU_VISIBLE_CHIPS", "0,1,2,3"}}));
  EXPECT_TRUE(c.unset.empty());
  c = ComputeChipVisibility(8, {7, 1, 5}, false);
  EXPECT_EQ(c.set, (Env{{"TPU_VISIBLE_CHIPS", "1,5,7"}}));
}

TEST(ChipVisibilityTest, NoChipsGrantedChangesNothing) {
  EXPECT_TRUE(ComputeChipVisibility(4, {}, false).empty());
  EXPECT_TRUE(ComputeChipVisibility(0, {}, false).empty());
}

TEST(ChipVisibilityTest, ApplyToOverwritesInheritedValues) {
  Env env = {{"TPU_VISIBLE_CHIPS", "0,1,2,3"}, {"TPU_HOST_BOUNDS", "2,2,1"}};
  ComputeChipVisibility(4, {2}, false).ApplyTo(&env);
  EXPECT_EQ(env, (Env{{"TPU_VISIBLE_CHIPS", "2"},
                      {"TPU_CHIPS_PER_HOST_BOUNDS", "1,1,1"},
                      {"TPU_HOST_BOUNDS", "1,1,1"}}));
}

// "task asks TPU 1, 2, 4, 8 / 0.5, 3": accepted / InvalidArgument.
TEST(ValidateTaskTpuRequestTest, AllowedAmounts) {
  for (double ok : {0.0, 1.0, 2.0, 4.0, 8.0}) {
    EXPECT_TRUE(ValidateTaskTpuRequest(ok).ok()) << ok;
  }
  for (double bad : {0.5, 3.0, -1.0, 16.0, 6.0, 1.5, std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity()}) {
    Status s = ValidateTaskTpuRequest(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("TPU request must be 1, 2, 4 or 8"), std::string::npos);
  }
}

}  // namespace
}  // namespace torus::tpu
