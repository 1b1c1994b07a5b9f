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


// Issue 41 #6: a head that could not start on a full disk left its log empty, and the command
// that started it said only "did not come up within 5 s". The daemon's own words reach it
// through the report pipe; one that dies without a word is described with the end of its log.
TEST_F(SessionDaemonsTest, TheDaemonsReportReachesTheCommandThatStartedIt) {
  fs::create_directories(session_ + "/logs");
  // argv gets "--ready-fd N" appended: $2 is the descriptor in the script.
  auto run = [&](const std::string& name, const std::string& script) {
    int report = -1;
    auto pid = SpawnReportingSessionDaemon(session_, name, {"/bin/bash", "-c", script, "sh"}, &report);
    EXPECT_TRUE(pid.ok()) << pid.status().message();
    if (!pid.ok()) return StatusOr<std::string>(pid.status());
    EXPECT_TRUE(fs::exists(Pid(name)));
    auto r = WaitForDaemonReport(report, *pid, session_ + "/logs/" + name + ".err", std::chrono::seconds(60));
    close(report);
    return r;
  };
  auto ok = run("good", "printf 'ok 127.0.0.1:7379' >&$2; sleep 0.2");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(*ok, "127.0.0.1:7379");
  auto failed = run("full", "printf 'error no space left on device writing /s/head_address' >&$2; exit 1");
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().message(), "no space left on device writing /s/head_address");
  auto silent = run("silent", "echo 'the last words of its log' >&2; exit 3");
  ASSERT_FALSE(silent.ok());
  EXPECT_NE(silent.status().message().find("exited with status 3"), std::string::npos) << silent.status().message();
  EXPECT_NE(silent.status().message().find("the last words of its log"), std::string::npos)
      << silent.status().message();
}

TEST_F(SessionDaemonsTest, ADaemonWhosePidFileCannotBeWrittenIsNotLeftRunning) {
  // pids/ is a file: no pid file can be written under it.
  fs::remove_all(session_ + "/pids");
  ASSERT_TRUE(WriteFile(session_ + "/pids", "in the way").ok());
  fs::create_directories(session_ + "/logs");
  const std::string arg = "60.4141" + std::to_string(getpid());  // names this test's sleep
  auto pid = SpawnSessionDaemon(session_, "orphan", {"/bin/sleep", arg});
  ASSERT_FALSE(pid.ok());
  EXPECT_NE(pid.status().message().find("cannot start orphan: cannot write " + session_ + "/pids/orphan.pid"),
            std::string::npos)
      << pid.status().message();
  for (const auto& p : fs::directory_iterator("/proc")) {
    auto cmdline = ReadFile(p.path().string() + "/cmdline");
    if (cmdline.ok()) EXPECT_EQ(cmdline->find(arg), std::string::npos) << "left running: pid " << p.path();
  }
}

}  // namespace
}  // namespace torus
