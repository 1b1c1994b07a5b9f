#include "head/slice_index.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <string_view>

namespace torus {
namespace {

SliceHostInfo Host(const std::string& slice, int worker, bool free = true, int chips = 4,
                   const std::string& pod = "v6e-16") {
  SliceHostInfo h;
  h.pod_type = pod;
  h.slice_name = slice;
  h.topology = "4x4";
  h.worker_id = worker;
  h.chips = chips;
  h.chips_free = free;
  h.head_free = true;
  return h;
}

// The index views node ids (SliceIndex::Upsert): they live here for the whole test binary.
std::string_view Id(const std::string& s) {
  static std::set<std::string> ids;
  return *ids.insert(s).first;
}

void AddSlice(SliceIndex& idx, const std::string& name) {
  for (int w = 0; w < 4; ++w) idx.Upsert(Id(name + "-n" + std::to_string(w)), Host(name, w));
}

auto kAny = [](const SliceIndex::Slice&) { return true; };

TEST(SliceIndexTest, WholeSliceIsIntactAndIdleOnlyWithEveryHost) {
  SliceIndex idx;
  for (int w = 0; w < 3; ++w) idx.Upsert(Id("a" + std::to_string(w)), Host("s", w));
  EXPECT_EQ(idx.NumIntact("v6e-16"), 0);
  EXPECT_EQ(idx.FirstIdle("v6e-16", "", kAny), nullptr);
  idx.Upsert(Id("a3"), Host("s", 3));
  EXPECT_EQ(idx.NumIntact("v6e-16"), 1);
  const auto* s = idx.FirstIdle("v6e-16", "", kAny);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->hosts, (std::vector<std::string_view>{"a0", "a1", "a2", "a3"}));
  idx.Remove("a2");  // a host lost: broken, neither intact nor idle
  EXPECT_EQ(idx.NumIntact("v6e-16"), 0);
  EXPECT_EQ(idx.FirstIdle("v6e-16", "", kAny), nullptr);
}

TEST(SliceIndexTest, OneBusyChipMakesTheSliceNotIdle) {
  SliceIndex idx;
  AddSlice(idx, "s1");
  AddSlice(idx, "s2");
  idx.Upsert(Id("s1-n2"), Host("s1", 2, /*free=*/false));
  EXPECT_EQ(idx.FirstIdle("v6e-16", "", kAny)->name, "s2");
  EXPECT_EQ(idx.NumIntact("v6e-16"), 2);
  idx.Upsert(Id("s1-n2"), Host("s1", 2, /*free=*/true));
  EXPECT_EQ(idx.FirstIdle("v6e-16", "", kAny)->name, "s1");
}

TEST(SliceIndexTest, DuplicateWorkerIdOrWrongChipsIsNotIntact) {
  SliceIndex idx;
  AddSlice(idx, "s");
  idx.Upsert(Id("intruder"), Host("s", 1));
  EXPECT_EQ(idx.NumIntact("v6e-16"), 0);
  idx.Remove("intruder");
  EXPECT_EQ(idx.NumIntact("v6e-16"), 1);
  idx.Upsert(Id("s-n0"), Host("s", 0, true, 2));  // chips no longer add up to 16
  EXPECT_EQ(idx.NumIntact("v6e-16"), 0);
}

TEST(SliceIndexTest, PinnedNameAcceptFilterAndAnonymousSingleHost) {
  SliceIndex idx;
  AddSlice(idx, "s1");
  AddSlice(idx, "s2");
  EXPECT_EQ(idx.FirstIdle("v6e-16", "s2", kAny)->name, "s2");
  EXPECT_EQ(idx.FirstIdle("v6e-16", "nope", kAny), nullptr);
  auto not_s1 = [](const SliceIndex::Slice& s) { return s.name != "s1"; };
  EXPECT_EQ(idx.FirstIdle("v6e-16", "", not_s1)->name, "s2");
  // A single-host v6e 2x4 (8 chips) with no slice name is a slice by itself.
  idx.Upsert(Id("solo"), Host("", -1, true, 8, "v6e-8"));
  const auto* s = idx.FirstIdle("v6e-8", "", kAny);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->name, "solo");
  idx.Remove("solo");
  EXPECT_EQ(idx.FirstIdle("v6e-8", "", kAny), nullptr);
  EXPECT_EQ(idx.size(), 2u);
}

// A host restarted at once (new node id, same slice and worker id) registers before the old one
// is declared dead: a duplicate until then, then the host of that slot (bench/chaos_repro/slicedup.py).
TEST(SliceIndexTest, AReplacementThatCameEarlyTakesTheSlotWhenTheOldHostGoes) {
  SliceIndex idx;
  AddSlice(idx, "s");
  idx.Upsert(Id("s-n1-new"), Host("s", 1, /*free=*/false));
  idx.Upsert(Id("other-new"), Host("s", 2, /*free=*/true, 4, "v5p-16"));  // never takes a slot
  EXPECT_EQ(idx.NumIntact("v6e-16"), 0);
  idx.Remove("s-n1");
  EXPECT_EQ(idx.NumIntact("v6e-16"), 0) << "a host of another pod type is still in the slice";
  idx.Remove("other-new");
  ASSERT_NE(idx.Find("s"), nullptr);
  EXPECT_EQ(idx.Find("s")->hosts[1], "s-n1-new");
  EXPECT_EQ(idx.NumIntact("v6e-16"), 1);
  EXPECT_EQ(idx.FirstIdle("v6e-16", "", kAny), nullptr) << "the new host's chips are in use";
  idx.Upsert(Id("s-n1-new"), Host("s", 1, /*free=*/true));
  ASSERT_NE(idx.FirstIdle("v6e-16", "", kAny), nullptr);
  idx.Remove("s-n1-new");
  EXPECT_EQ(idx.NumIntact("v6e-16"), 0);
}

TEST(SliceIndexTest, NodeMovingToAnotherSliceLeavesTheOldOne) {
  SliceIndex idx;
  AddSlice(idx, "s1");
  idx.Upsert(Id("s1-n3"), Host("s9", 3));
  EXPECT_EQ(idx.NumIntact("v6e-16"), 0);
  ASSERT_NE(idx.Find("s9"), nullptr);
  EXPECT_EQ(idx.Find("s9")->hosts[3], "s1-n3");
}

}  // namespace
}  // namespace torus
