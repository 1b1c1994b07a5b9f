// Ray C++ compatibility: behaviour a Ray program relies on beyond compiling (hardening issue
// #13, item 11): WasCurrentActorRestarted in a restarted constructor, actor calls across a
// restart, RayConfig::default_actor_lifetime, runtime_env env_vars, program flags, local mode,
// RuntimeEnv with JSON-convertible user types, std::any values.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ray/api.h>
#include <string>
#include <thread>
#include <vector>

#include "cluster_fixture.h"

namespace {
std::string EnvOr(const char* name, const char* fallback = "<unset>") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}
}  // namespace

// An actor that remembers what WasCurrentActorRestarted() said in its constructor.
class CompatActor {
 public:
  CompatActor() : restarted_in_ctor_(ray::WasCurrentActorRestarted()) {}
  static CompatActor* Create() { return new CompatActor(); }
  bool RestartedInCtor() { return restarted_in_ctor_; }
  bool RestartedNow() { return ray::WasCurrentActorRestarted(); }
  int Pid() { return static_cast<int>(getpid()); }
  int Echo(int x) { return x; }
  // Sleeps, then ends the process without a goodbye (a crash as far as the runtime can tell).
  int CrashAfter(int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    _exit(3);
  }
  std::string Env(std::string name) { return EnvOr(name.c_str()); }

 private:
  bool restarted_in_ctor_;
};

RAY_REMOTE(CompatActor::Create, &CompatActor::RestartedInCtor, &CompatActor::RestartedNow,
           &CompatActor::Pid, &CompatActor::Echo, &CompatActor::CrashAfter, &CompatActor::Env);

namespace torus_test {
namespace {

struct CompatTest : ClusterTest<CompatTest> {
  static constexpr const char* kName = "compat";
  static void Build(TestCluster& c) { c.StartHead(2); }
};

// ---- g: WasCurrentActorRestarted() in the constructor of a restarted instance

TEST_F(CompatTest, RestartedActorKnowsItInItsConstructor) {
  auto actor = ray::Actor(CompatActor::Create).SetMaxRestarts(1).Remote();
  EXPECT_FALSE(*actor.Task(&CompatActor::RestartedInCtor).Remote().Get(kGetTimeoutMs));
  int pid = *actor.Task(&CompatActor::Pid).Remote().Get(kGetTimeoutMs);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_TRUE(WaitUntil([&] {
    auto e = ActorEntry(cluster(), actor.ID());
    return !e.is_null() && e.value("state", "") == "ALIVE" && e.value("num_restarts", 0) == 1;
  }));
  EXPECT_TRUE(*actor.Task(&CompatActor::RestartedInCtor).Remote().Get(kGetTimeoutMs));
  EXPECT_TRUE(*actor.Task(&CompatActor::RestartedNow).Remote().Get(kGetTimeoutMs));
}

}  // namespace
}  // namespace torus_test
