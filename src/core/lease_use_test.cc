#include "core/lease_use.h"

#include <gtest/gtest.h>

#include <string>

namespace torus {
namespace {

TEST(LeaseUseTest, ANamedLeaseIsInUseUntilItsStreamCloses) {
  LeaseUse u;
  u.StreamOpened();
  ASSERT_TRUE(u.Named("a"));
  EXPECT_EQ(u.Check("a"), LeaseUse::Use::kInUse);
  u.StreamClosed("a");
  // Closed: the worker returned it; a later question revokes (the node no longer holds it).
  EXPECT_EQ(u.Check("a"), LeaseUse::Use::kRevoked);
}

TEST(LeaseUseTest, AnUnnamedOpenStreamLeavesTheQuestionOpen) {
  LeaseUse u;
  u.StreamOpened();
  EXPECT_EQ(u.Check("b"), LeaseUse::Use::kUndecided);
  ASSERT_TRUE(u.Named("b"));
  EXPECT_EQ(u.Check("b"), LeaseUse::Use::kInUse);
}

TEST(LeaseUseTest, ARevokedLeaseIsRefusedWhenItsStreamArrivesLate) {
  LeaseUse u;
  EXPECT_EQ(u.Check("c"), LeaseUse::Use::kRevoked);
  u.StreamOpened();
  EXPECT_FALSE(u.Named("c"));
  u.StreamClosed("");
  // Nothing open any more: other leases are decided at once.
  EXPECT_EQ(u.Check("d"), LeaseUse::Use::kRevoked);
  u.StreamOpened();
  EXPECT_TRUE(u.Named("e"));
  EXPECT_EQ(u.Check("e"), LeaseUse::Use::kInUse);
}

TEST(LeaseUseTest, StreamsClosedWithoutANameDoNotUnderflow) {
  LeaseUse u;
  u.StreamClosed("");
  u.StreamClosed("never-named");
  u.StreamOpened();
  EXPECT_EQ(u.Check("f"), LeaseUse::Use::kUndecided);
  u.StreamClosed("");
  EXPECT_EQ(u.Check("f"), LeaseUse::Use::kRevoked);
}

TEST(LeaseUseTest, RevokedIdsAreBounded) {
  LeaseUse u;
  for (size_t i = 0; i < LeaseUse::kRevokedKept + 10; ++i) u.Check("r" + std::to_string(i));
  u.StreamOpened();
  // The oldest were forgotten (a stream naming one is accepted); the newest are still refused.
  EXPECT_TRUE(u.Named("r0"));
  u.StreamOpened();
  EXPECT_FALSE(u.Named("r" + std::to_string(LeaseUse::kRevokedKept + 9)));
}

}  // namespace
}  // namespace torus
