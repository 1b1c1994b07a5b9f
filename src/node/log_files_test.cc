#include "node/log_files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <sys/stat.h>

namespace torus {
namespace {

namespace fs = std::filesystem;

class LogFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("torus-logfiles-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_ / "logs");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& rel, const std::string& text) {
    std::ofstream(dir_ / rel) << text;
    return (dir_ / rel).string();
  }
  std::string Read(const LogFiles& f, const std::string& name, int64_t offset, int tail = 0, int max = 0) {
    rpc::ReadLogRequest req;
    req.set_name(name);
    req.set_offset(offset);
    req.set_tail_lines(tail);
    req.set_max_bytes(max);
    rpc::ReadLogReply r;
    auto s = f.Read(req, &r);
    return s.ok() ? r.data() : "ERR " + s.message();
  }
  fs::path dir_;
};

TEST_F(LogFilesTest, ListsOnlyClaimedFilesAndReadsThemByName) {
  LogFiles f;
  const std::string w = Write("logs/worker-abc.out", "one\ntwo\n");
  Write("logs/worker-other.out", "not ours");
  Write("logs/head.err", "head");
  f.Claim(w, "worker", "abc123");
  auto list = f.List();
  ASSERT_EQ(list.files_size(), 1);
  EXPECT_EQ(list.files(0).name(), "worker-abc.out");
  EXPECT_EQ(list.files(0).kind(), "worker");
  EXPECT_EQ(list.files(0).worker_id(), "abc123");
  EXPECT_EQ(list.files(0).size(), 8);
  EXPECT_EQ(Read(f, "worker-abc.out", 0), "one\ntwo\n");
  EXPECT_EQ(Read(f, "worker-abc.out", 4), "two\n");
  EXPECT_EQ(Read(f, "worker-abc.out", 100), "");  // past the end: nothing, no error
  // Not claimed, not a session file here, or a path: not found, whatever the disk holds.
  EXPECT_EQ(Read(f, "worker-other.out", 0).rfind("ERR no log file named", 0), 0u);
  EXPECT_EQ(Read(f, "head.err", 0).rfind("ERR", 0), 0u);
  EXPECT_EQ(Read(f, "../logs/worker-abc.out", 0).rfind("ERR", 0), 0u);
  EXPECT_EQ(Read(f, w, 0).rfind("ERR", 0), 0u);
}

TEST_F(LogFilesTest, SessionFilesOnlyOnTheNodeServingThemAndNeverOutsideTheDirectory) {
  LogFiles f((dir_ / "logs").string());
  Write("logs/head.err", "head says");
  Write("logs/worker-x.out", "some other node's worker");
  Write("logs/node-h2.out", "some other node");
  Write("secret", "token");
  auto list = f.List();
  ASSERT_EQ(list.files_size(), 1);
  EXPECT_EQ(list.files(0).name(), "head.err");
  EXPECT_EQ(list.files(0).kind(), "session");
  EXPECT_EQ(Read(f, "head.err", 0), "head says");
  EXPECT_EQ(Read(f, "worker-x.out", 0).rfind("ERR", 0), 0u);
  EXPECT_EQ(Read(f, "../secret", 0).rfind("ERR", 0), 0u);
  EXPECT_EQ(Read(f, "..", 0).rfind("ERR", 0), 0u);
  EXPECT_EQ(Read(f, "", 0).rfind("ERR", 0), 0u);
}

TEST_F(LogFilesTest, TailStartsAtTheLastLines) {
  LogFiles f;
  f.Claim(Write("logs/node-a.out", "a\nb\nc\nd\n"), "node");
  EXPECT_EQ(Read(f, "node-a.out", -1, 2), "c\nd\n");
  EXPECT_EQ(Read(f, "node-a.out", -1, 10), "a\nb\nc\nd\n");
  EXPECT_EQ(Read(f, "node-a.out", -1, 0), "");  // follow from the end
  f.Claim(Write("logs/node-b.out", "a\nb\npartial"), "node");
  EXPECT_EQ(Read(f, "node-b.out", -1, 1), "partial");
  EXPECT_EQ(Read(f, "node-b.out", -1, 2), "b\npartial");
  // Lines longer than the 64 KiB block of the backwards scan.
  std::string big(200000, 'x');
  f.Claim(Write("logs/node-c.out", "first\n" + big + "\n" + big + "\n"), "node");
  EXPECT_EQ(Read(f, "node-c.out", -1, 1, 4 << 20), big + "\n");
  EXPECT_EQ(Read(f, "node-c.out", -1, 3, 4 << 20), "first\n" + big + "\n" + big + "\n");
  // A read is bounded by max_bytes.
  EXPECT_EQ(Read(f, "node-c.out", 0, 0, 3), "fir");
}

TEST_F(LogFilesTest, ClaimsAreBounded) {
  LogFiles f;
  for (size_t i = 0; i < LogFiles::kMaxClaims + 10; ++i) {
    f.Claim((dir_ / "logs" / ("worker-" + std::to_string(i) + ".out")).string(), "worker");
  }
  Write("logs/worker-0.out", "old");
  Write("logs/worker-10.out", "kept");
  EXPECT_EQ(Read(f, "worker-0.out", 0).rfind("ERR", 0), 0u);  // the oldest claims are gone
  EXPECT_EQ(Read(f, "worker-10.out", 0), "kept");
}

TEST_F(LogFilesTest, NeverThroughALinkOrAPipe) {
  LogFiles f((dir_ / "logs").string());
  Write("secret", "token");
  fs::create_symlink(dir_ / "secret", dir_ / "logs" / "head.out");
  ASSERT_EQ(::mkfifo((dir_ / "logs" / "pipe.err").c_str(), 0600), 0);
  f.Claim((dir_ / "logs" / "worker-link.out").string(), "worker");
  fs::create_symlink(dir_ / "secret", dir_ / "logs" / "worker-link.out");
  EXPECT_EQ(f.List().files_size(), 0);
  EXPECT_EQ(Read(f, "head.out", 0).rfind("ERR", 0), 0u);
  EXPECT_EQ(Read(f, "worker-link.out", 0).rfind("ERR", 0), 0u);
  EXPECT_EQ(Read(f, "pipe.err", 0).rfind("ERR", 0), 0u);  // and it returned: no blocking open
}

TEST_F(LogFilesTest, TheNodesOwnFilesOutliveTheBound) {
  LogFiles f;
  f.Claim(Write("logs/node-me.out", "me"), "node");
  for (size_t i = 0; i < LogFiles::kMaxClaims + 10; ++i) {
    f.Claim((dir_ / "logs" / ("worker-" + std::to_string(i) + ".out")).string(), "worker");
  }
  EXPECT_EQ(Read(f, "node-me.out", 0), "me");
}

}  // namespace
}  // namespace torus
