#include "node/ledger.h"

#include <gtest/gtest.h>

namespace torus {
namespace {

double Get(const ResourceMap& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? 0 : it->second.ToDouble();
}

std::vector<Ledger::BundleSpec> Specs(std::vector<ResourceMap> bundles) {
  std::vector<Ledger::BundleSpec> out;
  for (size_t i = 0; i < bundles.size(); ++i) {
    Ledger::BundleSpec b;
    b.index = static_cast<int>(i);
    b.resources = bundles[i];
    out.push_back(b);
  }
  return out;
}

TEST(Ledger, GrantAndReturnRestoreAvailableAndChips) {
  Ledger l("n1", {});
  l.Reset({{"CPU", 4}, {"TPU", 4}}, {0, 1, 2, 3});
  Hold a, b;
  ASSERT_TRUE(l.TakeFromNode({{"CPU", 1}, {"TPU", 2}}, &a));
  EXPECT_EQ(a.chips, (std::vector<int>{0, 1}));
  ASSERT_TRUE(l.TakeFromNode({{"CPU", 2}, {"TPU", 2}}, &b));
  EXPECT_EQ(b.chips, (std::vector<int>{2, 3}));
  EXPECT_DOUBLE_EQ(Get(l.available(), "CPU"), 1);
  Hold c;
  EXPECT_FALSE(l.TakeFromNode({{"CPU", 2}}, &c));
  EXPECT_FALSE(c.held);
  l.Return(&a);
  EXPECT_FALSE(a.held);
  EXPECT_TRUE(a.chips.empty());
  EXPECT_DOUBLE_EQ(Get(l.available(), "CPU"), 2);
  // The chips given back are the ones handed out next.
  ASSERT_TRUE(l.TakeFromNode({{"TPU", 1}}, &c));
  EXPECT_EQ(c.chips, (std::vector<int>{0}));
}

TEST(Ledger, ReturnTwiceGivesBackOnce) {
  Ledger l("n1", {});
  l.Reset({{"CPU", 2}, {"TPU", 1}}, {7});
  Hold a;
  ASSERT_TRUE(l.TakeFromNode({{"CPU", 1}, {"TPU", 1}}, &a));
  l.Return(&a);
  l.Return(&a);  // a cancelled request given back again, a dead worker after its lease ended
  EXPECT_DOUBLE_EQ(Get(l.available(), "CPU"), 2);
  Hold b, c;
  ASSERT_TRUE(l.TakeFromNode({{"TPU", 1}}, &b));
  EXPECT_EQ(b.chips, (std::vector<int>{7}));
  EXPECT_FALSE(l.TakeFromNode({{"TPU", 1}}, &c));
}

TEST(Ledger, BlockedWorkerLendsItsCpuOnce) {
  Ledger l("n1", {{"CPU", 2}});
  Hold a;
  ASSERT_TRUE(l.TakeFromNode({{"CPU", 2}}, &a));
  l.Block(&a);
  l.Block(&a);
  EXPECT_DOUBLE_EQ(Get(l.available(), "CPU"), 2);
  l.Return(&a);  // the CPU lent while blocked is not returned again
  EXPECT_DOUBLE_EQ(Get(l.available(), "CPU"), 2);
  Hold b;
  ASSERT_TRUE(l.TakeFromNode({{"CPU", 2}}, &b));
  l.Block(&b);
  l.Unblock(&b);
  l.Unblock(&b);
  EXPECT_DOUBLE_EQ(Get(l.available(), "CPU"), 0);
}

TEST(Ledger, BundleLeasesComeFromTheBundleAndGoBackToIt) {
  Ledger l("n1", {{"CPU", 4}});
  std::string error;
  ASSERT_TRUE(l.Prepare("pg", Specs({{{"CPU", 2}}}), /*commit=*/false, {}, &error)) << error;
  EXPECT_EQ(l.seq(), 1u);
  EXPECT_DOUBLE_EQ(Get(l.available(), "CPU"), 2);
  Hold a;
  // Not committed yet: nothing is taken from it.
  EXPECT_NE(l.TakeFromBundle("pg", -1, {{"CPU", 1}}, &a, &error), Ledger::BundleTake::kTaken);
  EXPECT_FALSE(a.held);
  ASSERT_TRUE(l.Commit("pg", {0}));
  ASSERT_EQ(l.TakeFromBundle("pg", -1, {{"CPU", 1}}, &a, &error), Ledger::BundleTake::kTaken);
  EXPECT_EQ(a.pg_id, "pg");
  EXPECT_EQ(a.bundle, 0);
  EXPECT_DOUBLE_EQ(Get(l.FindBundle("pg", 0)->available, "CPU"), 1);
  EXPECT_DOUBLE_EQ(Get(l.available(), "CPU"), 2);  // the node's share is untouched
  Hold big;
  EXPECT_EQ(l.TakeFromBundle("pg", -1, {{"CPU", 3}}, &big, &error), Ledger::BundleTake::kTooBig);
  EXPECT_EQ(l.TakeFromBundle("pg", 5, {{"CPU", 1}}, &big, &error), Ledger::BundleTake::kMissing);
  EXPECT_NE(error.find("bundle 5"), std::string::npos);
  l.Return(&a);
  EXPECT_DOUBLE_EQ(Get(l.FindBundle("pg", 0)->available, "CPU"), 2);
  EXPECT_DOUBLE_EQ(Get(l.available(), "CPU"), 2);
}

TEST(Ledger, ReleasedBundleTakesItsWholeTotalBackAndLateReturnsAddNothing) {
  Ledger l("n1", {{"CPU", 4}});
  std::string error;
  ASSERT_TRUE(l.Prepare("pg", Specs({{{"CPU", 1}}, {{"CPU", 2}}}), true, {}, &error)) << error;
  Hold a;
  ASSERT_EQ(l.TakeFromBundle("pg", 1, {{"CPU", 2}}, &a, &error), Ledger::BundleTake::kTaken);
  EXPECT_EQ(l.Release("pg", {}), (std::vector<int>{0, 1}));
  EXPECT_FALSE(l.HasGroup("pg"));
  EXPECT_DOUBLE_EQ(Get(l.available(), "CPU"), 4);
  l.Return(&a);  // the bundle is gone: nothing comes back twice
  EXPECT_DOUBLE_EQ(Get(l.available(), "CPU"), 4);
  EXPECT_EQ(l.TakeFromBundle("pg", -1, {{"CPU", 1}}, &a, &error), Ledger::BundleTake::kMissing);
}

TEST(Ledger, PrepareIsAllOrNothing) {
  Ledger l("n1", {{"CPU", 2}});
  std::string error;
  EXPECT_FALSE(l.Prepare("pg", Specs({{{"CPU", 1}}, {{"CPU", 2}}}), true, {}, &error));
  EXPECT_NE(error.find("the bundles need"), std::string::npos);
  EXPECT_FALSE(l.HasGroup("pg"));
  EXPECT_DOUBLE_EQ(Get(l.available(), "CPU"), 2);
  EXPECT_EQ(l.seq(), 0u);
}

TEST(Ledger, ActorWithoutResourcesNeedsOneFreeCpuButHoldsNone) {
  Ledger l("n1", {{"CPU", 1}});
  Hold a, b;
  ASSERT_TRUE(l.TakeForActor("", -1, {}, &a).ok());
  EXPECT_DOUBLE_EQ(Get(l.available(), "CPU"), 1);
  ASSERT_TRUE(l.TakeFromNode({{"CPU", 1}}, &b));
  Hold c;
  Status s = l.TakeForActor("", -1, {}, &c);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(l.TakeForActor("nopg", -1, {{"CPU", 1}}, &c).code(), StatusCode::kResourceExhausted);
}

TEST(Ledger, BundleEnvKeySeparatesBundleEnvironments) {
  Ledger l("n1", {{"CPU", 4}});
  auto specs = Specs({{{"CPU", 1}}, {{"CPU", 1}}, {{"CPU", 1}}});
  specs[0].env["MEGASCALE_SLICE_ID"] = "0";
  specs[1].env["MEGASCALE_SLICE_ID"] = "1";
  specs[2].env_unset.push_back("MEGASCALE_SLICE_ID");
  std::string error;
  ASSERT_TRUE(l.Prepare("pg", specs, true, {}, &error)) << error;
  std::string k0 = l.BundleEnvKey("exe:a", "pg", 0);
  std::string k1 = l.BundleEnvKey("exe:a", "pg", 1);
  std::string k2 = l.BundleEnvKey("exe:a", "pg", 2);
  EXPECT_NE(k0, "exe:a");
  EXPECT_NE(k0, k1);
  EXPECT_NE(k2, "exe:a");
  EXPECT_NE(k2, k0);
  EXPECT_EQ(l.BundleEnvKey("exe:a", "other", 0), "exe:a");
}

TEST(Ledger, GpusAreGivenAsInstancesWholeOrAShareOfOne) {
  Ledger l("n1", {});
  l.Reset({{"CPU", 8}, {"GPU", 2}}, {});
  Hold a, b, c, d, e;
  ASSERT_TRUE(l.TakeFromNode({{"GPU", 0.5}}, &a));
  EXPECT_EQ(Ledger::GpuIds(a), (std::vector<int>{0}));
  ASSERT_TRUE(l.TakeFromNode({{"GPU", 0.25}}, &b));  // the fullest GPU with room: 0 again
  EXPECT_EQ(Ledger::GpuIds(b), (std::vector<int>{0}));
  ASSERT_TRUE(l.TakeFromNode({{"GPU", 1}}, &c));  // a whole one: 1, the only whole one free
  EXPECT_EQ(Ledger::GpuIds(c), (std::vector<int>{1}));
  // 0.25 of GPU 0 is left and the node's GPU total says 0.25: a whole GPU cannot be given.
  EXPECT_FALSE(l.TakeFromNode({{"GPU", 0.25}, {"CPU", 9}}, &d));
  ASSERT_TRUE(l.TakeFromNode({{"GPU", 0.25}}, &d));
  EXPECT_EQ(Ledger::GpuIds(d), (std::vector<int>{0}));
  l.Return(&a);
  l.Return(&b);
  l.Return(&d);
  EXPECT_TRUE(a.gpus.empty());
  ASSERT_TRUE(l.TakeFromNode({{"GPU", 1}}, &e));  // GPU 0 is whole again
  EXPECT_EQ(Ledger::GpuIds(e), (std::vector<int>{0}));
  l.Return(&c);
  l.Return(&e);
  Hold both;
  ASSERT_TRUE(l.TakeFromNode({{"GPU", 2}}, &both));
  EXPECT_EQ(Ledger::GpuIds(both), (std::vector<int>{0, 1}));
}

TEST(Ledger, FragmentedGpusMakeAWholeRequestWaitThoughTheTotalFits) {
  Ledger l("n1", {});
  l.Reset({{"GPU", 2}}, {});
  Hold a, b, c;
  ASSERT_TRUE(l.TakeFromNode({{"GPU", 0.5}}, &a));
  ASSERT_TRUE(l.TakeFromNode({{"GPU", 0.75}}, &b));  // 0 has 0.5 left, not 0.75: GPU 1
  EXPECT_EQ(Ledger::GpuIds(b), (std::vector<int>{1}));
  EXPECT_FALSE(l.TakeFromNode({{"GPU", 0.6}}, &c));  // 0.75 free in total, no GPU has 0.6
  EXPECT_FALSE(c.held);
}

}  // namespace
}  // namespace torus
