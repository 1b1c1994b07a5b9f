// The daemons of a session by their pid files (common/session_daemons.h): which pid files are
// trusted, which are removed silently, which are reported.
#include "common/session_daemons.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "common/session.h"

namespace torus {
namespace {

namespace fs = std::filesystem;

class SessionDaemonsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/torus_session_daemons_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    session_ = tmpl;
    fs::create_directories(session_ + "/pids");
  }
  void TearDown() override { fs::remove_all(session_); }
  std::string Pid(const std::string& name) const { return session_ + "/pids/" + name + ".pid"; }
  std::string session_;
};

TEST_F(SessionDaemonsTest, GarbageAndForeignPidFilesAreReportedAndRemovedStaleOnesSilently) {
  ASSERT_TRUE(WriteFile(Pid("garbage"), "not a pid").ok());
  // This test process is alive but has no --session-dir of this session: never signalled.
  ASSERT_TRUE(WriteFile(Pid("foreign"), PidFileContent(getpid())).ok());
  // A pid that cannot exist (above pid_max): stale.
  ASSERT_TRUE(WriteFile(Pid("stale"), "2147483000 5\n").ok());
  ASSERT_TRUE(WriteFile(session_ + "/pids/notes.txt", "kept").ok());
  std::vector<std::string> refused;
  auto live = LiveSessionDaemons(session_, &refused);
  EXPECT_TRUE(live.empty());
  ASSERT_EQ(refused.size(), 2u);
  for (const auto& r : refused) {
    EXPECT_EQ(r.rfind("not signalling anything for " + session_ + "/pids/", 0), 0u) << r;
    EXPECT_NE(r.find("; removed it"), std::string::npos) << r;
  }
  EXPECT_FALSE(fs::exists(Pid("garbage")));
  EXPECT_FALSE(fs::exists(Pid("foreign")));
  EXPECT_FALSE(fs::exists(Pid("stale")));
  EXPECT_TRUE(fs::exists(session_ + "/pids/notes.txt"));  // not a pid file
}

TEST_F(SessionDaemonsTest, NoPidsDirectoryMeansNoDaemons) {
  fs::remove_all(session_ + "/pids");
  std::vector<std::string> refused;
  EXPECT_TRUE(LiveSessionDaemons(session_, &refused).empty());
  EXPECT_TRUE(refused.empty());
  EXPECT_EQ(TerminateSessionDaemons({}, std::chrono::milliseconds(10)), 0);
}

}  // namespace
}  // namespace torus
