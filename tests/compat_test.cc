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

// ---- h: calls across a restart (Ray's C++ API: max_task_retries 0, at-most-once)

// Calls already sent to an instance that dies fail, including those still waiting behind the
// running call; a call made once the failure is known runs on the restarted instance.
TEST_F(CompatTest, CallsSentBeforeACrashFailAndLaterCallsReachTheNewInstance) {
  auto actor = ray::Actor(CompatActor::Create).SetMaxRestarts(1).Remote();
  int pid = *actor.Task(&CompatActor::Pid).Remote().Get(kGetTimeoutMs);
  auto crash = actor.Task(&CompatActor::CrashAfter).Remote(300);
  std::vector<ray::ObjectRef<int>> behind;
  for (int i = 0; i < 5; ++i) behind.push_back(actor.Task(&CompatActor::Echo).Remote(i));
  EXPECT_THROW(crash.Get(kGetTimeoutMs), ray::internal::RayActorException);
  for (auto& r : behind) EXPECT_THROW(r.Get(kGetTimeoutMs), ray::internal::RayActorException);
  // Straight after the failure, while the actor is restarting: waits for the new instance.
  EXPECT_EQ(*actor.Task(&CompatActor::Echo).Remote(7).Get(kGetTimeoutMs), 7);
  EXPECT_NE(*actor.Task(&CompatActor::Pid).Remote().Get(kGetTimeoutMs), pid);
  EXPECT_TRUE(*actor.Task(&CompatActor::RestartedNow).Remote().Get(kGetTimeoutMs));
}

// The same when the caller has not yet seen the failure: calls made right after the process
// died (and before any Get) are not lost to the dead instance more than once in a row.
TEST_F(CompatTest, CallsMadeWhileTheActorRestartsRunOnTheNewInstance) {
  auto actor = ray::Actor(CompatActor::Create).SetMaxRestarts(1).Remote();
  int pid = *actor.Task(&CompatActor::Pid).Remote().Get(kGetTimeoutMs);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_TRUE(WaitUntil([&] {
    auto e = ActorEntry(cluster(), actor.ID());
    return !e.is_null() && e.value("num_restarts", 0) == 1;
  }));
  // The head has seen the death; this caller's stream may not have broken yet.
  std::vector<ray::ObjectRef<int>> calls;
  for (int i = 0; i < 5; ++i) calls.push_back(actor.Task(&CompatActor::Echo).Remote(i));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(*calls[i].Get(kGetTimeoutMs), i) << "call " << i;
}

}  // namespace
}  // namespace torus_test
