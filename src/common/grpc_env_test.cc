#include "common/grpc_env.h"

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "common/process.h"
#include "common/rpc.h"

namespace torus {
namespace {

std::string ChildSees(const std::string& var, const std::string& dir) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "echo ${" + var + ":-unset}"};
  o.stdout_path = dir + "/out";
  auto pid = Spawn(o);
  EXPECT_TRUE(pid.ok());
  int status = 0;
  waitpid(*pid, &status, 0);
  std::ifstream in(o.stdout_path);
  std::string line;
  std::getline(in, line);
  return line;
}

TEST(GrpcEnvTest, TorusResolvesNamesThroughGlibcAndChildrenDoNotInheritIt) {
  if (GrpcEnvSetHere().empty()) GTEST_SKIP() << "GRPC_DNS_RESOLVER was set by the user";
  char tmpl[] = "/tmp/grpc-env-test.XXXXXX";
  std::string dir = mkdtemp(tmpl);
  // Before any channel: set for this process's gRPC, removed from a spawned child's environment.
  if (getenv("GRPC_DNS_RESOLVER")) EXPECT_STREQ(getenv("GRPC_DNS_RESOLVER"), "native");
  EXPECT_EQ(ChildSees("GRPC_DNS_RESOLVER", dir), "unset");
  // Once gRPC made a channel (its resolver chosen), gone from this process's environment too.
  auto ch = GetChannel("localhost:1");
  ASSERT_NE(ch, nullptr);
  EXPECT_EQ(getenv("GRPC_DNS_RESOLVER"), nullptr);
  EXPECT_EQ(ChildSees("GRPC_DNS_RESOLVER", dir), "unset");
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace torus
