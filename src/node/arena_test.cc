#include "node/arena.h"

#include <gtest/gtest.h>

namespace torus {
namespace {

TEST(ArenaAllocator, AllocatesAlignedAndReusesFreedRanges) {
  ArenaAllocator a(1 << 20, 1 << 20);
  auto x = a.Allocate(100);
  auto y = a.Allocate(1000);
  ASSERT_TRUE(x && y);
  EXPECT_EQ(*x % ArenaAllocator::kAlign, 0u);
  EXPECT_EQ(*y % ArenaAllocator::kAlign, 0u);
  EXPECT_NE(*x, *y);
  EXPECT_EQ(a.used(), 128u + 1024u);
  a.Free(*x);
  auto z = a.Allocate(64);
  ASSERT_TRUE(z);
  EXPECT_EQ(*z, *x);  // first fit reuses the lowest free range
}

TEST(ArenaAllocator, CoalescesNeighboursAndReportsFull) {
  ArenaAllocator a(4096, 1 << 20);
  auto p = a.Allocate(1024), q = a.Allocate(1024), r = a.Allocate(2048);
  ASSERT_TRUE(p && q && r);
  EXPECT_FALSE(a.Allocate(1));
  a.Free(*q);
  a.Free(*p);
  EXPECT_EQ(a.largest_free(), 2048u);  // p and q merged
  a.Free(*r);
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.largest_free(), 4096u);
  a.Free(12345);  // unknown offsets are ignored
  EXPECT_EQ(a.used(), 0u);
}

TEST(ArenaAllocator, ReleasesPagesOnlyBeyondTheResidentBudget) {
  ArenaAllocator a(1 << 20, 4096);
  auto p = a.Allocate(4096);
  ASSERT_TRUE(p);
  a.Free(*p);
  EXPECT_TRUE(a.TakeRangesToRelease().empty());  // within budget
  auto q = a.Allocate(8192);
  ASSERT_TRUE(q);
  a.Free(*q);
  auto ranges = a.TakeRangesToRelease();
  ASSERT_FALSE(ranges.empty());
  EXPECT_TRUE(a.TakeRangesToRelease().empty());  // budget reset after a release
}

}  // namespace
}  // namespace torus
