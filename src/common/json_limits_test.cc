// The one depth limit for JSON read from outside the process (common/json_limits.h).
#include "common/json_limits.h"

#include <gtest/gtest.h>

#include <string>

namespace torus {
namespace {

// [[[...]]]
std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// Objects nested as Ray's Jobs API metadata would be: {"a": {"a": ... {} ...}}.
std::string NestedObjects(int depth) {
  std::string s;
  for (int i = 1; i < depth; ++i) s += "{\"a\": ";
  s += "{}";
  s.append(depth - 1, '}');
  return s;
}

TEST(JsonLimitsTest, AcceptsDocumentsUpToTheLimit) {
  EXPECT_TRUE(ParseJson("1", "x").ok());
  EXPECT_TRUE(ParseJson(R"({"a": [1, {"b": "c"}]})", "x").ok());
  auto deepest = ParseJson(Nested(kMaxJsonDepth), "x");
  ASSERT_TRUE(deepest.ok()) << deepest.status().message();
  EXPECT_TRUE(deepest->is_array());
}

TEST(JsonLimitsTest, DeeplyNestedJobMetadataIsRefusedBeforeAnythingIsBuilt) {
  // 100000 levels: building, copying or dumping it recursively overflows a thread's stack.
  for (const std::string& text : {Nested(100000), NestedObjects(100000), Nested(kMaxJsonDepth + 1)}) {
    auto j = ParseJson(text, "the request body");
    ASSERT_FALSE(j.ok());
    EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(j.status().message(),
              "the request body: JSON nested deeper than 64 levels (the limit for any JSON Torus reads)");
  }
  EXPECT_FALSE(CheckJsonDepth(R"({"metadata": )" + NestedObjects(65) + "}", "x").ok());
}

TEST(JsonLimitsTest, BracketsInStringsDoNotCount) {
  const std::string brackets(1000, '[');
  EXPECT_TRUE(ParseJson("\"" + brackets + "\"", "x").ok());
  EXPECT_TRUE(ParseJson(R"({"k\"[[[": ")" + brackets + R"(\\", "v": []})", "x").ok());
  // An escaped quote does not end the string: the brackets after it are still inside it.
  EXPECT_TRUE(CheckJsonDepth(R"(["\")" + brackets + "\"]", "x").ok());
}

TEST(JsonLimitsTest, SyntaxErrorsNameWhatWasRead) {
  auto j = ParseJson("{not json", "--resources");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().message().rfind("--resources is not valid JSON (", 0), 0u) << j.status().message();
  EXPECT_FALSE(ParseJson("", "x").ok());
  EXPECT_FALSE(ParseJson("[1] [2]", "x").ok());
}

}  // namespace
}  // namespace torus
