// The processes of a `torus up` cluster (launcher/cluster_processes.h) and its host table
// (launcher/netns.h).
#include "launcher/cluster_processes.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/session.h"
#include "launcher/netns.h"

namespace torus::launcher {
namespace {

TEST(ClusterProcessesTest, MarkerNamesTheSession) {
  EXPECT_EQ(Marker("/tmp/s/session_1"), "TORUS_UP_SESSION=/tmp/s/session_1");
}

TEST(ClusterProcessesTest, ReadPidTakesTheLeadingNumberElseZero) {
  char tmpl[] = "/tmp/torus_cluster_processes_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_TRUE(WriteFile(dir + "/a.pid", "1234\n").ok());
  ASSERT_TRUE(WriteFile(dir + "/b.pid", "nonsense").ok());
  EXPECT_EQ(ReadPid(dir + "/a.pid"), 1234);
  EXPECT_EQ(ReadPid(dir + "/b.pid"), 0);
  EXPECT_EQ(ReadPid(dir + "/missing.pid"), 0);
  std::filesystem::remove_all(dir);
}

TEST(ClusterProcessesTest, AliveSeesThisProcessAndNotAnImpossiblePid) {
  EXPECT_TRUE(Alive(getpid()));
  EXPECT_FALSE(Alive(0));
  EXPECT_FALSE(Alive(2147483000));
  EXPECT_FALSE(HasEnvEntry(getpid(), "TORUS_UP_SESSION=/no/such/session"));
}

TEST(ClusterProcessesTest, HostsTableListsLocalhostThenEachHost) {
  nlohmann::json state;
  state["hosts"] = nlohmann::json::array(
      {{{"ip", "10.1.2.1"}, {"fqdn", "c-head.c-headless"}, {"name", "c-head"}},
       {{"ip", "10.1.2.2"}, {"fqdn", "g-0-0.c-headless"}, {"name", "g-0-0"}}});
  EXPECT_EQ(HostsTable(state),
            "127.0.0.1 localhost\n::1 localhost\n10.1.2.1 c-head.c-headless c-head\n"
            "10.1.2.2 g-0-0.c-headless g-0-0\n");
  EXPECT_EQ(Trim("10.0.0.1:7379 \n\n"), "10.0.0.1:7379");
}

}  // namespace
}  // namespace torus::launcher
