// A code search path of shared libraries, as in Ray: workers are `torus worker` processes that
// load the remote functions from the .so files named in RayConfig::code_search_path, not copies
// of the driver's executable.
#include <gtest/gtest.h>

#include <filesystem>
#include <ray/api.h>
#include <string>

#include "cluster_fixture.h"
#include "code_path_lib.h"  // linked into this driver, loaded by the workers

namespace torus_test {
namespace {

struct CodeSearchPathTest : ClusterTest<CodeSearchPathTest> {
  static constexpr const char* kName = "codepath";
  static constexpr bool kConnectDriver = false;
  static void Build(TestCluster& c) {
    c.StartHead(2);
    NodeSpec s;
    s.num_cpus = 1;
    s.resources = {{"second", 10}};
    c.AddNode(s);
  }
};

void RunWithCodePath(const TestCluster& cluster, const std::string& path) {
  ray::RayConfig cfg;
  cfg.address = cluster.address();
  cfg.code_search_path = {path};
  ray::Init(cfg);
  EXPECT_EQ(*ray::Task(CodePathPlus).Remote(2, 3).Get(kGetTimeoutMs), 5);
  std::string exe = *ray::Task(CodePathWhoAmI).Remote().Get(kGetTimeoutMs);
  EXPECT_EQ(std::filesystem::path(exe).filename(), "torus")
      << "the task ran in " << exe << ", not in a `torus worker`";
  std::string exe2 = *ray::Task(CodePathWhoAmI).SetResource("second", 1).Remote().Get(kGetTimeoutMs);
  EXPECT_EQ(std::filesystem::path(exe2).filename(), "torus") << exe2;
  auto counter = ray::Actor(CodePathCounter::Create).Remote(10);
  EXPECT_EQ(*counter.Task(&CodePathCounter::Add).Remote(5).Get(kGetTimeoutMs), 15);
  EXPECT_EQ(std::filesystem::path(*counter.Task(&CodePathCounter::WhoAmI).Remote().Get(kGetTimeoutMs))
                .filename(),
            "torus");
  ray::Shutdown();
}

TEST_F(CodeSearchPathTest, SharedLibraryFile) { RunWithCodePath(cluster(), CODE_PATH_LIB); }

TEST_F(CodeSearchPathTest, DirectoryOfSharedLibraries) {
  RunWithCodePath(cluster(), std::filesystem::path(CODE_PATH_LIB).parent_path().string());
}

}  // namespace
}  // namespace torus_test
