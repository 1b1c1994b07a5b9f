// The one rule for resource amounts (common/resources.h) and the byte formatting of `status`.
#include "common/resources.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <vector>

#include "common/node_table.h"
#include "common/placement_index.h"

namespace torus {
namespace {

std::string Message(const ResourceDoubles& m, const char* where = "--resources") {
  Status s = ValidateResources(m, where);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  return s.message();
}

TEST(ResourcesTest, AcceptsOrdinaryAmounts) {
  EXPECT_TRUE(ValidateResources({{"CPU", 0}, {"GPU", 0.5}, {"custom", 1e9}}, "x").ok());
  // Valid as in Ray (merely infeasible on any real node): the int64 fixed point holds it.
  EXPECT_TRUE(ValidateResources({{"CPU", 1e10}}, "x").ok());
  EXPECT_TRUE(ValidateResourceRequest({{"CPU", 1e10}}, "x").ok());
  EXPECT_TRUE(ValidateResources({{"memory", 256.0 * (1ull << 40)}}, "x").ok());  // 256 TiB
  EXPECT_TRUE(ValidateResources({{"memory", 64.0 * (1ull << 30)}}, "x").ok());
  EXPECT_TRUE(ValidateResources({}, "x").ok());
}

TEST(ResourcesTest, RefusesNegativeNanInfiniteAndAbsurdNamingWhereAndValue) {
  std::string m = Message({{"CPU", -3}}, "--num-cpus");
  EXPECT_NE(m.find("--num-cpus"), std::string::npos) << m;
  EXPECT_NE(m.find("CPU = -3"), std::string::npos) << m;
  EXPECT_NE(m.find("negative"), std::string::npos) << m;
  EXPECT_NE(Message({{"GPU", std::nan("")}}).find("not a number"), std::string::npos);
  EXPECT_NE(Message({{"GPU", std::numeric_limits<double>::infinity()}}).find("infinite"),
            std::string::npos);
  EXPECT_NE(Message({{"custom", 2e14}}).find("too large"), std::string::npos);
  EXPECT_NE(Message({{"memory", 1e18}}).find("too large"), std::string::npos);
  EXPECT_NE(Message({{"", 1}}).find("name"), std::string::npos);
}

TEST(ResourcesTest, RequestsArePositiveAndWholeAboveOne) {
  EXPECT_TRUE(ValidateResourceRequest({{"CPU", 0.5}, {"GPU", 2}}, "resources").ok());
  EXPECT_FALSE(ValidateResourceRequest({{"CPU", 0}}, "resources").ok());
  Status s = ValidateResourceRequest({{"GPU", 2.5}}, "resources");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("whole numbers"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("GPU"), std::string::npos) << s.message();
  EXPECT_FALSE(ValidateResourceRequest({{"CPU", -1}}, "resources").ok());
}

TEST(ResourcesTest, ParsesAmountFlags) {
  auto ok = ParseResourceAmount("CPU", "4", "--num-cpus");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 4);
  for (const char* bad : {"-3", "nan", "inf", "abc", "4x", "", "1e15"}) {
    auto r = ParseResourceAmount("CPU", bad, "--num-cpus");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--num-cpus"), std::string::npos) << r.status().message();
  }
}

TEST(ResourcesTest, RequestsFinerThanOneUnitAreRefused) {
  Status s = ValidateResourceRequest({{"CPU", 0.00001}}, "resources");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("0.0001"), std::string::npos) << s.message();
  EXPECT_TRUE(ValidateResourceRequest({{"CPU", 0.0001}}, "resources").ok());
}

TEST(ResourcesTest, AmountsRoundToTheNearestTenThousandth) {
  EXPECT_EQ(ResourceAmount(0.1).units(), 1000);
  EXPECT_EQ(ResourceAmount(1.0 / 3).units(), 3333);
  EXPECT_EQ(ResourceAmount(0.1 + 0.2).units(), 3000);  // 0.30000000000000004
  EXPECT_EQ(ResourceAmount(2.99999999).units(), 30000);
  EXPECT_EQ(ResourceAmount(-0.25).units(), -2500);
  EXPECT_EQ(ResourceAmount(1e10).units(), 100000000000000);
  EXPECT_EQ(ResourceAmount(std::nan("")).units(), 0);
  EXPECT_EQ(ResourceAmount(1e300).units(), INT64_MAX);  // saturates, never wraps
  EXPECT_EQ(ResourceAmount(-1e300).units(), INT64_MIN);
  EXPECT_EQ(ResourceAmount(0.5).ToDouble(), 0.5);
  EXPECT_EQ(ResourceAmount(1.0 / 3).ToDouble(), 0.3333);
}

TEST(ResourcesTest, SumsSaturateInsteadOfOverflowing) {
  ResourceAmount big = ResourceAmount::FromUnits(INT64_MAX - 5);
  EXPECT_EQ((big + ResourceAmount(1.0)).units(), INT64_MAX);
  EXPECT_EQ((ResourceAmount::FromUnits(INT64_MIN + 5) - ResourceAmount(1.0)).units(), INT64_MIN);
  ResourceMap sum;
  for (int i = 0; i < 20; ++i) Add(sum, {{"memory", MaxResourceAmount("memory")}});
  EXPECT_FALSE(Fits(sum, {{"memory", MaxResourceAmount("memory")}}));
}

TEST(ResourcesTest, ToStringShowsExactAmounts) {
  EXPECT_EQ(ResourcesToString({{"CPU", 2}, {"GPU", 0.25}, {"x", 1.0 / 3}, {"y", -0.5}, {"z", -1.5}}),
            "{CPU: 2, GPU: 0.25, x: 0.3333, y: -0.5, z: -1.5}");
  EXPECT_EQ(ResourcesToString({{"memory", 1e9}}), "{memory: 1000000000}");
}

// Issue 41: amounts were doubles; a node whose CPUs went out and came back a few thousand times
// in fractions, several held at once, ended at 1.9999999999999998 (or 2.000000000000166) CPUs,
// and the placement index, which compares exactly, never found room for 2 CPUs again.
TEST(ResourcesTest, FractionalTakesAndReturnsComeBackExactlyToTheStart) {
  const ResourceMap start{{"CPU", 2}, {"GPU", 1}};
  const std::vector<ResourceMap> takes = {
      {{"CPU", 0.1}}, {{"CPU", 0.3}, {"GPU", 0.1}}, {{"CPU", 1.0 / 3}}, {{"CPU", 0.7}, {"GPU", 0.3}},
      {{"CPU", 0.2}}, {{"CPU", 0.25}, {"GPU", 1.0 / 3}}};
  const double cpu[] = {0.1, 0.3, 1.0 / 3, 0.7, 0.2, 0.25};  // the CPUs above, as given
  ResourceMap avail = start;
  double doubles = 2;  // the same CPU arithmetic in doubles, as before, for the figure printed
  std::deque<size_t> held;
  for (int depth = 1; depth <= 5; ++depth) {
    for (int i = 0; i < 3000; ++i) {
      const size_t k = i % takes.size();
      ASSERT_TRUE(Fits(takes[k], avail));
      Subtract(avail, takes[k]);
      doubles -= cpu[k];
      held.push_back(k);
      if (static_cast<int>(held.size()) > depth) {  // the oldest holder gives back first
        Add(avail, takes[held.front()]);
        doubles += cpu[held.front()];
        held.pop_front();
      }
    }
    while (!held.empty()) {
      Add(avail, takes[held.front()]);
      doubles += cpu[held.front()];
      held.pop_front();
    }
    EXPECT_EQ(avail, start) << "after 3000 takes with " << depth << " held at once: " << ResourcesToString(avail);
    std::printf("%d takes so far (%d held at once now): fixed point %s; the same in doubles: %.17g CPU\n",
                3000 * depth, depth, ResourcesToString(avail).c_str(), doubles);
  }
  // The exact comparisons of the placement index find room for the whole node again.
  NamePool pool;
  CompactResources need, free;
  SetResources(pool, ResourceMap{{"CPU", 2}}, &need);
  SetResources(pool, ResourceMap{{"CPU", avail.at("CPU")}}, &free);
  EXPECT_TRUE(PlacementIndex::FitsIn(need, free));
  EXPECT_TRUE(Fits({{"CPU", 2}, {"GPU", 1}}, avail));
}

TEST(ResourcesTest, SetsOnTheWireAreUnitsAndOlderDoublesStillRead) {
  rpc::ResourceSet set;
  ToProto({{"CPU", 1.5}, {"memory", 1e9}}, &set);
  EXPECT_TRUE(set.legacy_amounts().empty());
  EXPECT_EQ(set.units().at("CPU"), 15000);
  EXPECT_EQ(FromProto(set), (ResourceMap{{"CPU", 1.5}, {"memory", 1e9}}));
  // A set written by a version before fixed point (a head state file, an older client).
  rpc::ResourceSet old;
  (*old.mutable_legacy_amounts())["CPU"] = 0.1 + 0.2;
  (*old.mutable_legacy_amounts())["TPU"] = 4;
  (*old.mutable_units())["TPU"] = 80000;  // units win over a double for the same name
  EXPECT_EQ(FromProto(old), (ResourceMap{{"CPU", 0.3}, {"TPU", 8}}));
  EXPECT_EQ(AmountIn(old, "CPU").units(), 3000);
  EXPECT_EQ(AmountIn(old, "TPU").units(), 80000);
  EXPECT_EQ(AmountIn(old, "GPU").units(), 0);
  // Validated as what they say: negative units, a NaN double.
  rpc::ResourceSet bad;
  (*bad.mutable_units())["CPU"] = -10000;
  EXPECT_NE(ValidateResourceSet(bad, "w").message().find("negative"), std::string::npos);
  rpc::ResourceSet nan;
  (*nan.mutable_legacy_amounts())["CPU"] = std::nan("");
  EXPECT_NE(ValidateResourceSet(nan, "w").message().find("not a number"), std::string::npos);
  rpc::ResourceSet empty;
  (*empty.mutable_units())["CPU"] = 0;
  EXPECT_FALSE(ValidateResourceSetRequest(empty, "w").ok());
}

TEST(ResourcesTest, HumanBytes) {
  EXPECT_EQ(HumanBytes(12), "12 B");
  EXPECT_EQ(HumanBytes(1536), "1.50 KiB");
  EXPECT_EQ(HumanBytes(15.8 * (1ull << 30)), "15.8 GiB");
  EXPECT_EQ(HumanBytes(512.0 * (1 << 20)), "512 MiB");
}

}  // namespace
}  // namespace torus
