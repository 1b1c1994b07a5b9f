#include "head/kv_store.h"

#include <gtest/gtest.h>

namespace torus {
namespace {

TEST(KvStoreTest, PutGetOverwriteDelete) {
  KvStore kv;
  auto a = kv.Put("fn", "k", "v1", /*overwrite=*/false);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(*a);
  auto b = kv.Put("fn", "k", "v2", /*overwrite=*/false);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(*b);
  EXPECT_EQ(kv.Get("fn", "k").value(), "v1");  // kept without overwrite
  ASSERT_TRUE(kv.Put("fn", "k", "v3", /*overwrite=*/true).ok());
  EXPECT_EQ(kv.Get("fn", "k").value(), "v3");
  EXPECT_FALSE(kv.Get("other", "k").has_value());  // namespaces are separate
  EXPECT_TRUE(kv.Del("fn", "k"));
  EXPECT_FALSE(kv.Del("fn", "k"));
  EXPECT_FALSE(kv.Get("fn", "k").has_value());
  EXPECT_EQ(kv.Bytes(), 0u);
}

TEST(KvStoreTest, KeysByPrefixStayInTheirNamespace) {
  KvStore kv;
  for (const char* k : {"a1", "a2", "b1"}) ASSERT_TRUE(kv.Put("n", k, "x", false).ok());
  ASSERT_TRUE(kv.Put("m", "a3", "x", false).ok());
  EXPECT_EQ(kv.Keys("n", "a"), (std::vector<std::string>{"a1", "a2"}));
  EXPECT_EQ(kv.Keys("n", ""), (std::vector<std::string>{"a1", "a2", "b1"}));
  EXPECT_TRUE(kv.Keys("z", "").empty());
}

TEST(KvStoreTest, RefusesOversizedValuesNamingTheKey) {
  KvStore kv;
  auto r = kv.Put("n", "big", std::string(KvStore::kMaxValueBytes + 1, 'x'), true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("big"), std::string::npos);
  EXPECT_FALSE(kv.Get("n", "big").has_value());
}

}  // namespace
}  // namespace torus
