// Ray C++ compatibility: behaviour a Ray program relies on beyond compiling (hardening issue
// #13, item 11): WasCurrentActorRestarted in a restarted constructor, actor calls across a
// restart, RayConfig::default_actor_lifetime, runtime_env env_vars, program flags, local mode,
// RuntimeEnv with JSON-convertible user types, std::any values.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <any>
#include <dirent.h>
#include <map>
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

std::string CompatEnv(std::string name) { return EnvOr(name.c_str()); }
int CompatPid() { return static_cast<int>(getpid()); }
// A task that submits CompatEnv: what a nested task of this task's job sees.
std::string CompatNestedEnv(std::string name) {
  return *ray::Task(CompatEnv).Remote(name).Get(30000);
}
// Creates a named actor in namespace "compat" from inside a task (no lifetime chosen).
std::string CompatMakeNamedActor(std::string name) {
  auto a = ray::Actor(CompatActor::Create).SetName(name, "compat").Remote();
  a.Task(&CompatActor::Echo).Remote(1).Get(30000);
  return a.ID();
}
int CompatUsesResource() { return 1; }
std::any CompatAnyEcho(std::any v) { return v; }
std::vector<std::any> CompatAnyList(std::vector<std::any> v) {
  v.push_back(std::any(std::string("tail")));
  return v;
}
RAY_REMOTE(CompatEnv, CompatPid, CompatNestedEnv, CompatMakeNamedActor, CompatUsesResource,
           CompatAnyEcho, CompatAnyList);

// A driver joining TORUS_ADDRESS that creates, in namespace "compat", actors TEST_PREFIX-default
// (no lifetime chosen), TEST_PREFIX-nondetached (SetLifetime(NON_DETACHED)) and
// TEST_PREFIX-nested (created by a task), and exits. The default lifetime is DETACHED, from
// RayConfig or, with TEST_FLAG_FORM set, from the flag --ray_default_actor_lifetime in that
// form ("eq": --flag=value, "space": --flag value).
TORUS_TEST_CHILD_SCENARIO(compat_default_lifetime) {
  ray::RayConfig cfg;
  std::string prefix = std::getenv("TEST_PREFIX");
  std::string form = EnvOr("TEST_FLAG_FORM", "");
  std::vector<std::string> args = {"driver", "--unrelated-program-flag"};
  if (form == "eq") args.push_back("--ray_default_actor_lifetime=DETACHED");
  if (form == "space") {
    args.push_back("--ray_default_actor_lifetime");
    args.push_back("detached");
  }
  if (form.empty()) cfg.default_actor_lifetime = ray::ActorLifetime::DETACHED;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ray::Init(cfg, static_cast<int>(argv.size()), argv.data());
  auto d = ray::Actor(CompatActor::Create).SetName(prefix + "-default", "compat").Remote();
  auto n = ray::Actor(CompatActor::Create)
               .SetName(prefix + "-nondetached", "compat")
               .SetLifetime(ray::ActorLifetime::NON_DETACHED)
               .Remote();
  d.Task(&CompatActor::Echo).Remote(1).Get(30000);
  n.Task(&CompatActor::Echo).Remote(1).Get(30000);
  ray::Task(CompatMakeNamedActor).Remote(prefix + "-nested").Get(30000);
  ray::Shutdown();
  return 0;
}

// A driver joining TORUS_ADDRESS with RayConfig::runtime_env env_vars COMPAT_JOB=job and
// COMPAT_VAR=job; prints what its tasks and actors see.
TORUS_TEST_CHILD_SCENARIO(compat_job_env) {
  ray::RayConfig cfg;
  ray::RuntimeEnv job;
  job.Set("env_vars", std::map<std::string, std::string>{{"COMPAT_JOB", "job"},
                                                         {"COMPAT_VAR", "job"}});
  cfg.runtime_env = job;
  ray::Init(cfg);
  ray::RuntimeEnv own;
  own.Set("env_vars", std::map<std::string, std::string>{{"COMPAT_VAR", "task"}});
  std::printf("task_job=%s\n", ray::Task(CompatEnv).Remote("COMPAT_JOB").Get(30000)->c_str());
  std::printf("task_var=%s\n", ray::Task(CompatEnv).Remote("COMPAT_VAR").Get(30000)->c_str());
  std::printf("own_var=%s\n",
              ray::Task(CompatEnv).SetRuntimeEnv(own).Remote("COMPAT_VAR").Get(30000)->c_str());
  std::printf("own_job=%s\n",
              ray::Task(CompatEnv).SetRuntimeEnv(own).Remote("COMPAT_JOB").Get(30000)->c_str());
  std::printf("nested_job=%s\n",
              ray::Task(CompatNestedEnv).Remote("COMPAT_JOB").Get(30000)->c_str());
  auto actor = ray::Actor(CompatActor::Create).Remote();
  std::printf("actor_job=%s\n",
              actor.Task(&CompatActor::Env).Remote("COMPAT_JOB").Get(30000)->c_str());
  ray::Shutdown();
  return 0;
}

// A driver asking for local mode: prints how Init refused it.
TORUS_TEST_CHILD_SCENARIO(compat_local_mode) {
  ray::RayConfig cfg;
  cfg.local_mode = true;
  try {
    ray::Init(cfg);
    std::printf("accepted\n");
  } catch (const ray::internal::RayException& e) {
    std::printf("refused: %s\n", e.what());
  }
  std::printf("initialized=%d\n", ray::IsInitialized() ? 1 : 0);
  return 0;
}

// A driver on the embedded default cluster given --ray_logs_dir TEST_LOGS_DIR and
// --ray_head_args "--num-cpus 3 --resources {...compat_res...}" (plus an ignored
// --ray_job_id): runs a task that needs the resource; prints done=1.
TORUS_TEST_CHILD_SCENARIO(compat_embedded_flags) {
  ray::RayConfig cfg;
  std::string logs = std::string("--ray_logs_dir=") + std::getenv("TEST_LOGS_DIR");
  std::vector<std::string> args = {"driver", logs, "--ray_head_args",
                                   R"(--num-cpus 3 --resources {"compat_res":2})",
                                   "--ray_job_id=01000000"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ray::Init(cfg, static_cast<int>(argv.size()), argv.data());
  int v = *ray::Task(CompatUsesResource).SetResource("compat_res", 1).Remote().Get(30000);
  std::printf("done=%d\n", v);
  ray::Shutdown();
  return 0;
}

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

// ---- b: local mode is refused at Init, naming the option and what to do instead

TEST_F(CompatTest, LocalModeIsRefusedClearly) {
  RunResult r = RunChild("compat_local_mode", {}, {"TORUS_ADDRESS", "RAY_ADDRESS"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.out.find("refused: RayConfig::local_mode"), std::string::npos) << r.Describe();
  EXPECT_NE(r.out.find("Leave it false"), std::string::npos) << r.Describe();
  EXPECT_NE(r.out.find("initialized=0"), std::string::npos) << r.Describe();
}

// ---- a: RayConfig::default_actor_lifetime (and c: the flag, both forms)

std::string Field(const std::string& out, const std::string& key) {
  size_t at = out.find(key + "=");
  if (at == std::string::npos) return "<missing>";
  size_t end = out.find('\n', at);
  return out.substr(at + key.size() + 1, end - at - key.size() - 1);
}

void ExpectDetachedByDefault(const TestCluster& c, const std::string& prefix,
                             const std::string& form) {
  std::map<std::string, std::string> env = {{"TORUS_ADDRESS", c.address()},
                                            {"TEST_PREFIX", prefix}};
  if (!form.empty()) env["TEST_FLAG_FORM"] = form;
  RunResult r = RunChild("compat_default_lifetime", env);
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  // The job is over: the explicitly non-detached actor dies with it, the others live on.
  EXPECT_TRUE(WaitUntil([&] {
    return !ray::GetActor<CompatActor>(prefix + "-nondetached", "compat").has_value();
  })) << "an actor with SetLifetime(NON_DETACHED) outlived its driver";
  for (const char* which : {"-default", "-nested"}) {
    auto a = ray::GetActor<CompatActor>(prefix + which, "compat");
    ASSERT_TRUE(a.has_value()) << prefix << which << " died with its driver (" << form << ")";
    EXPECT_EQ(*a->Task(&CompatActor::Echo).Remote(5).Get(kGetTimeoutMs), 5);
    a->Kill();
  }
}

TEST_F(CompatTest, DefaultActorLifetimeDetachedFromRayConfig) {
  ExpectDetachedByDefault(cluster(), "cfg", "");
}

TEST_F(CompatTest, DefaultActorLifetimeFromTheFlagInBothForms) {
  ExpectDetachedByDefault(cluster(), "eq", "eq");
  ExpectDetachedByDefault(cluster(), "space", "space");
}

// ---- e: runtime_env env_vars

ray::RuntimeEnv EnvVars(std::map<std::string, std::string> vars) {
  ray::RuntimeEnv env;
  env.Set("env_vars", vars);
  return env;
}

TEST_F(CompatTest, TaskEnvVarsAreSetAndWorkersAreNotShared) {
  for (int round = 0; round < 3; ++round) {
    auto a = ray::Task(CompatEnv).SetRuntimeEnv(EnvVars({{"COMPAT_VAR", "a"}})).Remote("COMPAT_VAR");
    auto b = ray::Task(CompatEnv).SetRuntimeEnv(EnvVars({{"COMPAT_VAR", "b"}})).Remote("COMPAT_VAR");
    auto none = ray::Task(CompatEnv).Remote("COMPAT_VAR");
    EXPECT_EQ(*a.Get(kGetTimeoutMs), "a");
    EXPECT_EQ(*b.Get(kGetTimeoutMs), "b");
    EXPECT_EQ(*none.Get(kGetTimeoutMs), "<unset>") << "a worker with env_vars ran a plain task";
  }
  // The runtime's own variables cannot be overridden.
  auto id = ray::Task(CompatEnv)
                .SetRuntimeEnv(EnvVars({{"TORUS_WORKER_MODE", "x"}, {"COMPAT_VAR", "c"}}))
                .Remote("TORUS_WORKER_MODE");
  EXPECT_EQ(*id.Get(kGetTimeoutMs), "1");
}

TEST_F(CompatTest, ActorEnvVarsAreSet) {
  auto actor = ray::Actor(CompatActor::Create)
                   .SetRuntimeEnv(EnvVars({{"COMPAT_VAR", "actor"}}))
                   .Remote();
  EXPECT_EQ(*actor.Task(&CompatActor::Env).Remote("COMPAT_VAR").Get(kGetTimeoutMs), "actor");
  auto plain = ray::Actor(CompatActor::Create).Remote();
  EXPECT_EQ(*plain.Task(&CompatActor::Env).Remote("COMPAT_VAR").Get(kGetTimeoutMs), "<unset>");
}

TEST_F(CompatTest, UnsupportedRuntimeEnvFieldsAreRefused) {
  ray::RuntimeEnv env;
  env.SetJsonStr("pip", R"({"packages":["requests"]})");
  try {
    ray::Task(CompatEnv).SetRuntimeEnv(env);
    FAIL() << "a pip runtime_env was accepted";
  } catch (const ray::internal::RayRuntimeEnvException& e) {
    EXPECT_NE(std::string(e.what()).find("pip"), std::string::npos) << e.what();
  }
}

TEST_F(CompatTest, JobEnvVarsApplyToTheWholeJob) {
  RunResult r = RunChild("compat_job_env", {{"TORUS_ADDRESS", cluster().address()}});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(Field(r.out, "task_job"), "job") << r.Describe();
  EXPECT_EQ(Field(r.out, "task_var"), "job") << r.Describe();
  EXPECT_EQ(Field(r.out, "own_var"), "task") << r.Describe();
  EXPECT_EQ(Field(r.out, "own_job"), "job") << "task env_vars are merged over the job's";
  EXPECT_EQ(Field(r.out, "nested_job"), "job") << r.Describe();
  EXPECT_EQ(Field(r.out, "actor_job"), "job") << r.Describe();
}

// ---- c: flags for the embedded cluster, and a warning for each ignored one

TEST_F(CompatTest, LogsDirAndHeadArgsShapeTheEmbeddedCluster) {
  std::string logs = ScratchDir(cluster(), "logs");
  RunResult r = RunChild("compat_embedded_flags", {{"TEST_LOGS_DIR", logs}},
                         {"TORUS_ADDRESS", "RAY_ADDRESS"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(Field(r.out, "done"), "1") << r.Describe();
  EXPECT_NE(r.err.find("--ray_job_id"), std::string::npos) << "no warning\n" << r.Describe();
  int worker_logs = 0;
  if (DIR* d = opendir(logs.c_str())) {
    while (dirent* e = readdir(d)) worker_logs += std::string(e->d_name).rfind("worker-", 0) == 0;
    closedir(d);
  }
  EXPECT_GT(worker_logs, 0) << "no worker log in " << logs;
}

// ---- d: std::any arguments and results, as in Ray

TEST_F(CompatTest, AnyValuesAsArgumentsAndResults) {
  std::any r = *ray::Task(CompatAnyEcho).Remote(5).Get(kGetTimeoutMs);
  ASSERT_EQ(r.type(), typeid(uint64_t));
  EXPECT_EQ(std::any_cast<uint64_t>(r), 5u);
  r = *ray::Task(CompatAnyEcho).Remote(std::any(int64_t{-3})).Get(kGetTimeoutMs);
  EXPECT_EQ(std::any_cast<int64_t>(r), -3);
  r = *ray::Task(CompatAnyEcho).Remote(std::string("text")).Get(kGetTimeoutMs);
  EXPECT_EQ(std::any_cast<std::string>(r), "text");
  std::vector<std::any> list = {std::any(true), std::any(2.5)};
  auto out = *ray::Task(CompatAnyList).Remote(list).Get(kGetTimeoutMs);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(std::any_cast<bool>(out[0]));
  EXPECT_EQ(std::any_cast<double>(out[1]), 2.5);
  EXPECT_EQ(std::any_cast<std::string>(out[2]), "tail");
  // As in Ray, a std::any holding a type msgpack has no fixed form for is refused.
  EXPECT_THROW(ray::Task(CompatAnyEcho).Remote(std::any(3)), ray::internal::RayException);
}

}  // namespace
}  // namespace torus_test
