#include "common/head_addresses.h"

#include <gtest/gtest.h>

namespace torus {
namespace {

TEST(HeadAddressesTest, GivenListIsSplitDedupedAndRotatedOnFailure) {
  HeadAddresses h("a:1,b:2,,a:1");
  EXPECT_EQ(h.current(), "a:1");
  EXPECT_EQ(h.joined(), "a:1,b:2");
  EXPECT_EQ(h.Failed("a:1"), "b:2");
  // A failure of an address that is no longer current moves nothing (two callers saw it fail).
  EXPECT_EQ(h.Failed("a:1"), "b:2");
  EXPECT_EQ(h.Failed("b:2"), "a:1");  // wraps around
  EXPECT_EQ(h.joined(), "a:1,b:2");
}

TEST(HeadAddressesTest, LearntListPutsTheActiveFirstAndKeepsTheGivenOnes) {
  HeadAddresses h("b:2");
  EXPECT_EQ(h.version(), 0u);
  std::vector<std::string> heads = {"c:3", "b:2"};
  h.Learn(heads, HeadAddresses::VersionOf(heads));
  EXPECT_EQ(h.current(), "c:3");
  EXPECT_EQ(h.version(), HeadAddresses::VersionOf(heads));
  EXPECT_EQ(h.joined(), "c:3,b:2");
  h.Learn({"d:4"}, 7);
  EXPECT_EQ(h.joined(), "d:4,c:3,b:2");
  h.Learn({}, 9);  // an empty list teaches nothing
  EXPECT_EQ(h.version(), 7u);
}

TEST(HeadAddressesTest, VersionsDifferWithTheListAndAreNeverZero) {
  EXPECT_NE(HeadAddresses::VersionOf({"a:1", "b:2"}), HeadAddresses::VersionOf({"b:2", "a:1"}));
  EXPECT_EQ(HeadAddresses::VersionOf({"a:1"}), HeadAddresses::VersionOf({"a:1"}));
  EXPECT_NE(HeadAddresses::VersionOf({}), 0u);
}

}  // namespace
}  // namespace torus
