#include "core/reference_counter.h"

#include <gtest/gtest.h>

namespace torus::core {
namespace {

constexpr const char* kSelf = "10.0.0.1:100";
constexpr const char* kOther = "10.0.0.2:200";

// A counter whose hooks record what it decided to free and release.
class ReferenceCounterTest : public ::testing::Test {
 protected:
  ReferenceCounterTest()
      : refs_(ReferenceCounter::Hooks{
            [this](ReferenceCounter::FreeRequest r) { freed_.push_back(std::move(r)); },
            [this] { wakes_++; }}) {
    refs_.SetIdentity(kSelf, "node-a", "node-a:1");
  }

  // An owned object held by one local reference, its value in our node's store under `key`.
  ObjectEntry& Owned(const std::string& id, const std::string& key = "") {
    ObjectEntry& e = refs_.Entry(id);
    e.owned = true;
    e.ready = true;
    e.local_refs = 1;
    if (!key.empty()) {
      e.in_shm = true;
      e.shm = StoreLocation(key, "node-a", "node-a:1");
    }
    return e;
  }

  ReferenceCounter refs_;
  std::vector<ReferenceCounter::FreeRequest> freed_;
  int wakes_ = 0;
};

std::string Mine(const std::string& hex) { return hex + "@" + kSelf; }
std::string Theirs(const std::string& hex) { return hex + "@" + kOther; }

TEST(ObjectIdTest, OwnerAndHex) {
  EXPECT_EQ(OwnerOf("ab12@host:5"), "host:5");
  EXPECT_EQ(OwnerOf("ab12"), "");
  EXPECT_EQ(HexOf("ab12@host:5"), "ab12");
  EXPECT_EQ(HexOf("ab12"), "ab12");
}

TEST(ObjectIdTest, ReturnIdsFollowTheFirstWithTheSameOwner) {
  const std::string first = "0123456789abcdef00000000000000ff@10.0.0.1:7000";
  EXPECT_EQ(ReturnIdOf(first, 0), first);
  EXPECT_EQ(ReturnIdOf(first, 1), "0123456789abcdef0000000000000100@10.0.0.1:7000");
  EXPECT_EQ(ReturnIdOf(first, 17), "0123456789abcdef0000000000000110@10.0.0.1:7000");
  EXPECT_EQ(OwnerOf(ReturnIdOf(first, 3)), "10.0.0.1:7000");
  // The counter carries across digits and never touches the worker part.
  EXPECT_EQ(ReturnIdOf("ffffffffffffffff0fffffffffffffff@h:1", 1), "ffffffffffffffff1000000000000000@h:1");
}

TEST_F(ReferenceCounterTest, LastLocalReferenceFreesTheSegment) {
  Owned(Mine("a"), "seg-a");
  refs_.AddLocal(Mine("a"));
  refs_.RemoveLocal(Mine("a"));
  EXPECT_NE(refs_.Find(Mine("a")), nullptr);
  EXPECT_TRUE(freed_.empty());
  refs_.RemoveLocal(Mine("a"));
  EXPECT_EQ(refs_.Find(Mine("a")), nullptr);
  ASSERT_EQ(freed_.size(), 1u);
  EXPECT_EQ(freed_[0].node_address, "node-a:1");
  EXPECT_EQ(freed_[0].keys, std::vector<std::string>{"seg-a"});
}

TEST_F(ReferenceCounterTest, InlineValueFreesNoSegment) {
  Owned(Mine("a"));
  refs_.RemoveLocal(Mine("a"));
  EXPECT_EQ(refs_.Find(Mine("a")), nullptr);
  EXPECT_TRUE(freed_.empty());
}

TEST_F(ReferenceCounterTest, RemoteSegmentIsFreedAtItsNode) {
  ObjectEntry& e = Owned(Mine("a"));
  e.in_shm = true;
  e.shm = StoreLocation("seg-a", "node-b", "node-b:1");
  refs_.RemoveLocal(Mine("a"));
  ASSERT_EQ(freed_.size(), 1u);
  EXPECT_EQ(freed_[0].node_address, "node-b:1");
  EXPECT_EQ(freed_[0].keys, std::vector<std::string>{"seg-a"});
}

TEST_F(ReferenceCounterTest, PinKeepsTheObjectUntilUnpinned) {
  Owned(Mine("a"));
  refs_.Pin(Mine("a"));
  refs_.RemoveLocal(Mine("a"));
  EXPECT_NE(refs_.Find(Mine("a")), nullptr);
  refs_.Unpin(Mine("a"));
  EXPECT_EQ(refs_.Find(Mine("a")), nullptr);
}

TEST_F(ReferenceCounterTest, ReleaseIfUnusedLeavesHeldEntries) {
  Owned(Mine("a"));
  refs_.ReleaseIfUnused(Mine("a"));
  EXPECT_NE(refs_.Find(Mine("a")), nullptr);
  refs_.Entry(Mine("a")).local_refs = 0;
  refs_.ReleaseIfUnused(Mine("a"));
  EXPECT_EQ(refs_.Find(Mine("a")), nullptr);
}

TEST_F(ReferenceCounterTest, BorrowerKeepsOwnedObjectUntilItGivesItBack) {
  Owned(Mine("a"));
  std::vector<std::string> unknown;
  refs_.BorrowObjects(kOther, 2, {Mine("a"), Mine("gone")}, &unknown);
  EXPECT_EQ(unknown, std::vector<std::string>{Mine("gone")});
  ASSERT_NE(refs_.FindBorrower(kOther), nullptr);
  EXPECT_EQ(refs_.FindBorrower(kOther)->regs, 2);
  refs_.RemoveLocal(Mine("a"));
  EXPECT_NE(refs_.Find(Mine("a")), nullptr);  // still borrowed
  unknown.clear();
  refs_.BorrowObjects(kOther, -1, {Mine("a")}, &unknown);
  EXPECT_NE(refs_.Find(Mine("a")), nullptr);  // one registration left
  refs_.BorrowObjects(kOther, -1, {Mine("a")}, &unknown);
  EXPECT_EQ(refs_.Find(Mine("a")), nullptr);
  EXPECT_EQ(refs_.FindBorrower(kOther), nullptr);
}

TEST_F(ReferenceCounterTest, BorrowCountNeverGoesNegative) {
  ObjectEntry& e = Owned(Mine("a"));
  EXPECT_FALSE(refs_.AdjustBorrower(e, kOther, -3));
  EXPECT_FALSE(e.HasBorrowers());
  EXPECT_FALSE(refs_.AdjustBorrower(e, kOther, 1));
  EXPECT_TRUE(refs_.AdjustBorrower(e, kOther, -5));
}

TEST_F(ReferenceCounterTest, FreeingABorrowedEntryQueuesItsRelease) {
  ObjectEntry& e = refs_.Entry(Theirs("x"));
  e.local_refs = 1;
  e.borrow_regs = 2;
  refs_.RemoveLocal(Theirs("x"));
  EXPECT_EQ(refs_.Find(Theirs("x")), nullptr);
  EXPECT_EQ(wakes_, 1);
  ASSERT_TRUE(refs_.HasPendingReleases());
  auto releases = refs_.TakePendingReleases();
  ASSERT_EQ(releases.count(kOther), 1u);
  EXPECT_EQ(releases[kOther], (std::vector<std::pair<std::string, int>>{{Theirs("x"), 2}}));
  EXPECT_FALSE(refs_.HasPendingReleases());
}

TEST_F(ReferenceCounterTest, RegistrationOrFetchInFlightKeepsBorrowedEntry) {
  ObjectEntry& e = refs_.Entry(Theirs("x"));
  e.registering = true;
  refs_.MaybeFree(Theirs("x"));
  EXPECT_NE(refs_.Find(Theirs("x")), nullptr);
  e.registering = false;
  e.fetching = true;
  refs_.MaybeFree(Theirs("x"));
  EXPECT_NE(refs_.Find(Theirs("x")), nullptr);
  e.fetching = false;
  refs_.MaybeFree(Theirs("x"));
  EXPECT_EQ(refs_.Find(Theirs("x")), nullptr);
}

TEST_F(ReferenceCounterTest, FreeingAValueReleasesTheRefsInsideIt) {
  Owned(Mine("inner"), "seg-inner");
  ObjectEntry& outer = Owned(Mine("outer"));
  refs_.AddLocal(Mine("inner"));  // the value's hold
  outer.L().nested.push_back(Mine("inner"));
  refs_.RemoveLocal(Mine("inner"));  // the user's own reference
  EXPECT_NE(refs_.Find(Mine("inner")), nullptr);
  refs_.RemoveLocal(Mine("outer"));
  EXPECT_EQ(refs_.Find(Mine("outer")), nullptr);
  EXPECT_EQ(refs_.Find(Mine("inner")), nullptr);
  ASSERT_EQ(freed_.size(), 1u);
  EXPECT_EQ(freed_[0].keys, std::vector<std::string>{"seg-inner"});
}

TEST_F(ReferenceCounterTest, AdoptNestedHoldsOrGivesBack) {
  // Ours, registered by the executor with us: becomes the outer value's local reference.
  ObjectEntry& mine = Owned(Mine("m"));
  refs_.AdjustBorrower(mine, kSelf, 1);
  ObjectEntry& outer = Owned(Mine("outer"));
  std::vector<std::string> nested = {Mine("m"), Theirs("t")};
  refs_.AdoptNested(&outer, nested);
  EXPECT_EQ(refs_.Find(Mine("m"))->local_refs, 2);
  EXPECT_FALSE(refs_.Find(Mine("m"))->HasBorrowers());
  EXPECT_EQ(refs_.Find(Theirs("t"))->borrow_regs, 1);
  EXPECT_EQ(refs_.Find(Theirs("t"))->local_refs, 1);
  // Nobody holds the result: a foreign registration is given back at once.
  refs_.AdoptNested(nullptr, nested);
  auto releases = refs_.TakePendingReleases();
  EXPECT_EQ(releases[kOther], (std::vector<std::pair<std::string, int>>{{Theirs("t"), 1}}));
}

TEST_F(ReferenceCounterTest, ProbesDropABorrowerThatIsGone) {
  Owned(Mine("a"));
  std::vector<std::string> unknown;
  refs_.BorrowObjects(kOther, 1, {Mine("a")}, &unknown);
  refs_.RemoveLocal(Mine("a"));
  int regs = 0;
  using P = ReferenceCounter::ProbeOutcome;
  EXPECT_FALSE(refs_.OnProbe(kOther, P::kRefused, &regs));
  EXPECT_FALSE(refs_.OnProbe(kOther, P::kAnswered, &regs));  // resets the count
  EXPECT_FALSE(refs_.OnProbe(kOther, P::kRefused, &regs));
  EXPECT_NE(refs_.Find(Mine("a")), nullptr);
  EXPECT_TRUE(refs_.OnProbe(kOther, P::kRefused, &regs));
  EXPECT_EQ(regs, 1);
  EXPECT_EQ(refs_.Find(Mine("a")), nullptr);
  EXPECT_FALSE(refs_.OnProbe(kOther, P::kRefused, &regs));  // unknown by now
}

TEST_F(ReferenceCounterTest, TenTimeoutsDropABorrower) {
  Owned(Mine("a"));
  std::vector<std::string> unknown;
  refs_.BorrowObjects(kOther, 1, {Mine("a")}, &unknown);
  int regs = 0;
  for (int i = 0; i < 9; ++i) {
    EXPECT_FALSE(refs_.OnProbe(kOther, ReferenceCounter::ProbeOutcome::kTimedOut, &regs));
  }
  EXPECT_TRUE(refs_.OnProbe(kOther, ReferenceCounter::ProbeOutcome::kTimedOut, &regs));
}

TEST_F(ReferenceCounterTest, ReleaseAllAndClear) {
  ObjectEntry& b = refs_.Entry(Theirs("x"));
  b.local_refs = 1;
  b.borrow_regs = 3;
  Owned(Mine("a"), "seg-a");
  EXPECT_TRUE(refs_.OwnsLiveObjects());
  refs_.QueueAllBorrowReleases();
  EXPECT_EQ(refs_.Find(Theirs("x"))->borrow_regs, 0);
  EXPECT_EQ(refs_.TakePendingReleases()[kOther].at(0).second, 3);
  EXPECT_EQ(refs_.Clear(), std::vector<std::string>{"seg-a"});
  EXPECT_FALSE(refs_.OwnsLiveObjects());
}

}  // namespace
}  // namespace torus::core

namespace torus::core {
namespace {

// Lineage: x = f(), y = g(x). A task record stands in for each (the counter never looks inside).
TEST_F(ReferenceCounterTest, AnArgumentOfKeptLineageIsEvictedNotFreedAndGoesWithIt) {
  Owned(Mine("x"), "seg-x");
  Owned(Mine("y"), "seg-y");
  ASSERT_TRUE(refs_.SetLineage(Mine("x"), nullptr, {}, 100));
  ASSERT_TRUE(refs_.SetLineage(Mine("y"), nullptr, {Mine("x"), Theirs("b")}, 50));
  EXPECT_EQ(refs_.lineage_bytes(), 150u);
  EXPECT_EQ(refs_.Find(Mine("x"))->lineage_refs, 1);
  refs_.RemoveLocal(Mine("x"));  // the user drops x: its value goes, the entry stays for y
  ObjectEntry* x = refs_.Find(Mine("x"));
  ASSERT_NE(x, nullptr);
  EXPECT_TRUE(x->evicted);
  EXPECT_FALSE(x->ready);
  EXPECT_FALSE(x->in_shm);
  ASSERT_EQ(freed_.size(), 1u);
  EXPECT_EQ(freed_[0].keys, std::vector<std::string>{"seg-x"});
  refs_.RemoveLocal(Mine("y"));  // y goes, and x with it
  EXPECT_EQ(refs_.Find(Mine("y")), nullptr);
  EXPECT_EQ(refs_.Find(Mine("x")), nullptr);
  EXPECT_EQ(refs_.lineage_bytes(), 0u);
  EXPECT_EQ(freed_.size(), 2u);  // seg-y; the evicted x had nothing left to free
}

TEST_F(ReferenceCounterTest, AnArgumentWithoutLineageIsFreedEvenIfLineageNamesIt) {
  Owned(Mine("p"), "seg-p");  // a Put: nothing makes it again
  Owned(Mine("y"));
  ASSERT_TRUE(refs_.SetLineage(Mine("y"), nullptr, {Mine("p")}, 10));
  refs_.RemoveLocal(Mine("p"));
  EXPECT_EQ(refs_.Find(Mine("p")), nullptr);
  refs_.RemoveLocal(Mine("y"));  // releasing y's lineage skips the freed p
  EXPECT_EQ(refs_.Find(Mine("y")), nullptr);
  EXPECT_EQ(refs_.lineage_bytes(), 0u);
}

TEST_F(ReferenceCounterTest, ASmallArgumentOfKeptLineageKeepsItsValue) {
  ObjectEntry& x = Owned(Mine("x"));  // inline: held by us, it cannot be lost
  x.inline_data = std::make_shared<const std::string>("small");
  Owned(Mine("y"), "seg-y");
  ASSERT_TRUE(refs_.SetLineage(Mine("x"), nullptr, {}, 10));
  ASSERT_TRUE(refs_.SetLineage(Mine("y"), nullptr, {Mine("x")}, 10));
  refs_.RemoveLocal(Mine("x"));
  ObjectEntry* kept = refs_.Find(Mine("x"));
  ASSERT_NE(kept, nullptr);
  EXPECT_FALSE(kept->evicted);
  EXPECT_TRUE(kept->ready);
  EXPECT_EQ(*kept->inline_data, "small");
  refs_.RemoveLocal(Mine("y"));
  EXPECT_TRUE(refs_.objects().empty());
}

TEST_F(ReferenceCounterTest, LineagePastTheBudgetIsNotKept) {
  refs_.set_lineage_budget(100);
  Owned(Mine("a"));
  Owned(Mine("b"));
  EXPECT_TRUE(refs_.SetLineage(Mine("a"), nullptr, {}, 80));
  EXPECT_FALSE(refs_.SetLineage(Mine("b"), nullptr, {}, 30));
  EXPECT_EQ(refs_.Find(Mine("b"))->lineage, nullptr);
  refs_.RemoveLocal(Mine("a"));
  EXPECT_TRUE(refs_.SetLineage(Mine("b"), nullptr, {}, 30));
}

TEST_F(ReferenceCounterTest, ALongChainOfLineageIsFreedWithoutRecursion) {
  // x0 <- x1 <- ... <- xN, each dropped by the user once the next exists: all but the last are
  // evicted; dropping the last frees the whole chain (deep enough to overflow a recursive free).
  constexpr int kN = 200000;
  Owned(Mine("0"), "seg-0");
  ASSERT_TRUE(refs_.SetLineage(Mine("0"), nullptr, {}, 1));
  for (int i = 1; i <= kN; ++i) {
    Owned(Mine(std::to_string(i)), "seg-" + std::to_string(i));
    ASSERT_TRUE(refs_.SetLineage(Mine(std::to_string(i)), nullptr, {Mine(std::to_string(i - 1))}, 1));
    refs_.RemoveLocal(Mine(std::to_string(i - 1)));
  }
  EXPECT_TRUE(refs_.Find(Mine("0"))->evicted);
  refs_.RemoveLocal(Mine(std::to_string(kN)));
  EXPECT_TRUE(refs_.objects().empty());
  EXPECT_EQ(refs_.lineage_bytes(), 0u);
}

}  // namespace
}  // namespace torus::core
