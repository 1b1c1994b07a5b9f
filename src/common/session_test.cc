// The session's records (common/session.h): written by replacing them whole.
#include "common/session.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>

namespace torus {
namespace {

namespace fs = std::filesystem;

// Issue 41 #6: a record written in place on a full disk was left empty ("had its head at ;"),
// and the session could not be resumed. A failed write leaves the old record whole.
TEST(SessionRecordTest, AFailedWriteLeavesTheOldRecordWhole) {
  char tmpl[] = "/tmp/torus_session_record_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, path = dir + "/head_address";
  ASSERT_TRUE(WriteFile(path, "127.0.0.1:7379").ok());
  ASSERT_TRUE(WriteFile(path, "127.0.0.1:7380", 0600).ok());
  EXPECT_EQ(*ReadFile(path), "127.0.0.1:7380");
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  // Files of this process may not grow past 4 bytes (a portable stand-in for a full disk: the
  // write fails, EFBIG instead of ENOSPC); SIGXFSZ ignored so that it fails, not kills.
  rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  rlimit tiny = old;
  tiny.rlim_cur = 4;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &tiny), 0);
  Status s = WriteFile(path, "127.0.0.1:7381");
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot write " + path + ": File too large"), std::string::npos) << s.message();
  EXPECT_EQ(*ReadFile(path), "127.0.0.1:7380");
  size_t files = 0;
  for (const auto& f : fs::directory_iterator(dir)) files += f.path() != path;
  EXPECT_EQ(files, 0u) << "the new file was left behind";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace torus
