#include "head/head_store.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace torus {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/torus-store-XXXXXX";
  return mkdtemp(tmpl);
}

TEST(HeadStoreTest, WritesSurviveReopeningAndDeletesToo) {
  std::string dir = TempDir();
  std::string path = HeadStore::PathIn(dir);
  {
    auto s = HeadStore::Open(path);
    ASSERT_TRUE(s.ok()) << s.status().message();
    ASSERT_TRUE((*s)->Put(StoreKind::kActor, "a1", std::string("v\0one", 5)).ok());
    ASSERT_TRUE((*s)->Put(StoreKind::kActor, "a2", "two").ok());
    ASSERT_TRUE((*s)->Put(StoreKind::kActor, "a2", "two again").ok());  // replaces
    ASSERT_TRUE((*s)->Put(StoreKind::kKv, std::string("ns\0key", 6), "kv").ok());
    ASSERT_TRUE((*s)->Put(StoreKind::kPlacementGroup, "p1", "pg").ok());
    ASSERT_TRUE((*s)->Delete(StoreKind::kPlacementGroup, "p1").ok());
    ASSERT_TRUE((*s)->Delete(StoreKind::kPlacementGroup, "never there").ok());
  }
  auto s = HeadStore::Open(path);
  ASSERT_TRUE(s.ok());
  auto actors = (*s)->LoadAll(StoreKind::kActor);
  ASSERT_TRUE(actors.ok());
  ASSERT_EQ(actors->size(), 2u);
  EXPECT_EQ((*actors)[0].first, "a1");
  EXPECT_EQ((*actors)[0].second, std::string("v\0one", 5));  // bytes, not C strings
  EXPECT_EQ((*actors)[1].second, "two again");
  auto kv = (*s)->LoadAll(StoreKind::kKv);
  ASSERT_TRUE(kv.ok());
  ASSERT_EQ(kv->size(), 1u);
  EXPECT_EQ((*kv)[0].first, std::string("ns\0key", 6));
  EXPECT_EQ(*(*s)->Count(StoreKind::kPlacementGroup), 0u);
  EXPECT_EQ(*(*s)->Count(StoreKind::kActor), 2u);
  std::system(("rm -rf " + dir).c_str());
}

TEST(HeadStoreTest, AFileThatIsNotADatabaseIsAClearError) {
  std::string dir = TempDir();
  std::string path = HeadStore::PathIn(dir);
  std::ofstream(path) << "this is not an SQLite database, just text that is long enough to look at";
  auto s = HeadStore::Open(path);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find(path), std::string::npos) << s.status().message();
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace torus
