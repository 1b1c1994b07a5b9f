// The one rule for resource amounts (common/resources.h) and the byte formatting of `status`.
#include "common/resources.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace torus {
namespace {

std::string Message(const ResourceMap& m, const char* where = "--resources") {
  Status s = ValidateResources(m, where);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  return s.message();
}

TEST(ResourcesTest, AcceptsOrdinaryAmounts) {
  EXPECT_TRUE(ValidateResources({{"CPU", 0}, {"GPU", 0.5}, {"custom", 1e9}}, "x").ok());
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
  EXPECT_NE(Message({{"custom", 2e9}}).find("too large"), std::string::npos);
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
  for (const char* bad : {"-3", "nan", "inf", "abc", "4x", "", "1e12"}) {
    auto r = ParseResourceAmount("CPU", bad, "--num-cpus");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--num-cpus"), std::string::npos) << r.status().message();
  }
}

TEST(ResourcesTest, HumanBytes) {
  EXPECT_EQ(HumanBytes(12), "12 B");
  EXPECT_EQ(HumanBytes(1536), "1.50 KiB");
  EXPECT_EQ(HumanBytes(15.8 * (1ull << 30)), "15.8 GiB");
  EXPECT_EQ(HumanBytes(512.0 * (1 << 20)), "512 MiB");
}

}  // namespace
}  // namespace torus
