#include "head/head_store.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
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

TEST(HeadStoreTest, AFileCutShortAnywhereIsRefusedAsDamaged) {
  // A state file cut short (a full disk, a partial copy) meets SQLite's checks at different
  // steps depending on where the cut falls; every cut past the first page must read as damaged.
  std::string dir = TempDir();
  std::string path = HeadStore::PathIn(dir);
  {
    auto s = HeadStore::Open(path);
    ASSERT_TRUE(s.ok()) << s.status().message();
    for (int i = 0; i < 300; ++i) {
      ASSERT_TRUE((*s)->Put(StoreKind::kActor, "actor-" + std::to_string(i), std::string(300, 'a' + i % 26)).ok());
    }
  }  // the last connection closed: the log is folded into the file
  auto size = std::filesystem::file_size(path);
  ASSERT_GT(size, 60000u);
  int cuts = 0;
  for (uintmax_t cut = 4096; cut < size; cut += 2731) {
    std::string copy_dir = TempDir();
    std::string copy = HeadStore::PathIn(copy_dir);
    std::filesystem::copy_file(path, copy);
    ASSERT_EQ(truncate(copy.c_str(), static_cast<off_t>(cut)), 0);
    auto s = HeadStore::Open(copy);
    ASSERT_FALSE(s.ok()) << "a file cut at " << cut << " of " << size << " bytes was loaded";
    EXPECT_NE(s.status().message().find("is damaged"), std::string::npos)
        << "cut at " << cut << ": " << s.status().message();
    EXPECT_NE(s.status().message().find(copy), std::string::npos) << s.status().message();
    std::filesystem::remove_all(copy_dir);
    ++cuts;
  }
  EXPECT_GT(cuts, 20);
  std::filesystem::remove_all(dir);
}

// Issue 41 #5: SQLite reads an empty state file as a new database and deletes the write-ahead
// log beside it, so a head restarted on an emptied file started a new session without a word,
// its actors, groups and KV gone. It is refused as damaged, and the log is left where it was.
TEST(HeadStoreTest, AnEmptyFileIsRefusedAsDamagedAndItsLogIsKept) {
  std::string dir = TempDir();
  std::string path = HeadStore::PathIn(dir);
  {
    auto s = HeadStore::Open(path);
    ASSERT_TRUE(s.ok()) << s.status().message();
    ASSERT_TRUE((*s)->Put(StoreKind::kActor, "a1", "one").ok());
    // Copied while the store is open: the log as a head killed with -9 leaves it (closing
    // folds it into the file and removes it).
    std::filesystem::copy_file(path + "-wal", dir + "/copy-wal");
  }
  for (bool with_log : {true, false}) {
    SCOPED_TRACE(with_log ? "beside its log" : "alone");
    std::filesystem::remove(path + "-wal");
    if (with_log) std::filesystem::copy_file(dir + "/copy-wal", path + "-wal");
    ASSERT_EQ(truncate(path.c_str(), 0), 0);
    auto s = HeadStore::Open(path);
    ASSERT_FALSE(s.ok()) << "an empty state file was opened as a new database";
    EXPECT_NE(s.status().message().find("the head's state " + path + " is damaged (the file is empty"),
              std::string::npos)
        << s.status().message();
    EXPECT_NE(s.status().message().find("refusing to load it"), std::string::npos) << s.status().message();
    EXPECT_EQ(std::filesystem::file_size(path), 0u);
    if (with_log) {
      ASSERT_TRUE(std::filesystem::exists(path + "-wal")) << "the write-ahead log was removed";
      EXPECT_EQ(std::filesystem::file_size(path + "-wal"), std::filesystem::file_size(dir + "/copy-wal"));
    }
  }
  // A log whose file is gone is refused too (SQLite would create the file and drop the log).
  std::filesystem::remove(path);
  std::filesystem::copy_file(dir + "/copy-wal", path + "-wal", std::filesystem::copy_options::overwrite_existing);
  auto s = HeadStore::Open(path);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("is damaged (the file is missing, but its write-ahead log"), std::string::npos)
      << s.status().message();
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::exists(path + "-wal"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace torus
