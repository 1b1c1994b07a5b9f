// Actors: submission order, named actors and namespaces, Kill, restarts after SIGKILL,
// concurrency, ExitActor, placement by resources, and handles passed to and returned from tasks.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ray/api.h>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cluster_fixture.h"

class TestCounter {
 public:
  explicit TestCounter(int start) : count_(start) {}
  static TestCounter* Create(int start) { return new TestCounter(start); }
  int Add(int x) { return count_ += x; }
  int Value() { return count_; }
  bool WasRestarted() { return ray::WasCurrentActorRestarted(); }
  int Pid() { return static_cast<int>(getpid()); }
  std::string NodeId() {
    const char* v = std::getenv("TORUS_NODE_ID");
    return v ? v : "";
  }
  int Exit() {
    ray::ExitActor();
    return -1;
  }
  // Sleeps; returns [start, end] in steady-clock microseconds of this (the actor's) process.
  std::pair<int64_t, int64_t> SlowSpan(int sleep_ms) {
    auto now = [] {
      return std::chrono::duration_cast<std::chrono::microseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
    int64_t start = now();
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    return {start, now()};
  }

 private:
  int count_;
};

RAY_REMOTE(TestCounter::Create, &TestCounter::Add, &TestCounter::Value, &TestCounter::WasRestarted,
           &TestCounter::Pid, &TestCounter::NodeId, &TestCounter::Exit, &TestCounter::SlowSpan);

int ActSlowValue(int x, int sleep_ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  return x;
}

// Handles as task arguments and results.
int ActUseCounter(ray::ActorHandle<TestCounter> counter, int x) {
  return *counter.Task(&TestCounter::Add).Remote(x).Get();
}
ray::ActorHandle<TestCounter> ActMakeCounter(int start) {
  return ray::Actor(TestCounter::Create).Remote(start);
}

RAY_REMOTE(ActSlowValue, ActUseCounter, ActMakeCounter);

// A second driver (another job) looking up a named actor: TEST_ACTOR_NAME in namespace
// TEST_NAMESPACE, joining the cluster at TORUS_ADDRESS. Prints found=0, or found=1 and the result
// of Add(100).
TORUS_TEST_CHILD_SCENARIO(named_actor_lookup) {
  ray::RayConfig cfg;
  cfg.ray_namespace = std::getenv("TEST_NAMESPACE");
  ray::Init(cfg);
  auto handle = ray::GetActor<TestCounter>(std::getenv("TEST_ACTOR_NAME"));
  if (!handle) {
    std::printf("found=0\n");
  } else {
    int v = *handle->Task(&TestCounter::Add).Remote(100).Get(30000);
    std::printf("found=1 value=%d\n", v);
  }
  ray::Shutdown();
  return 0;
}

namespace torus_test {
namespace {

struct ActorTest : ClusterTest<ActorTest> {
  static constexpr const char* kName = "actor";
  static inline ThreeNodes shape;
  static void Build(TestCluster& c) { shape.Build(c); }
};

// Waits until `torus list actors` shows the actor in `state` (and, when >= 0, with that many
// restarts); returns the last entry seen.
nlohmann::json WaitForActorState(const TestCluster& c, const std::string& id,
                                 const std::string& state, int restarts = -1) {
  nlohmann::json last;
  WaitUntil([&] {
    last = ActorEntry(c, id);
    return !last.is_null() && last.value("state", "") == state &&
           (restarts < 0 || last.value("num_restarts", -1) == restarts);
  });
  return last;
}

TEST_F(ActorTest, CallsRunInSubmissionOrder) {
  auto counter = ray::Actor(TestCounter::Create).Remote(0);
  std::vector<ray::ObjectRef<int>> results;
  for (int i = 0; i < 1000; ++i) results.push_back(counter.Task(&TestCounter::Add).Remote(1));
  auto values = ray::Get(results, kGetTimeoutMs);
  ASSERT_EQ(values.size(), 1000u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(*values[i], i + 1) << "call " << i;
}

// Synchronous calls (the caller reads its reply off the stream itself, docs/threads.md) from
// several threads on one actor, mixed with waits and with calls whose argument is another
// call's pending result: every call completes, none twice.
TEST_F(ActorTest, SynchronousCallsFromManyThreadsMixedWithOtherWaits) {
  auto counter = ray::Actor(TestCounter::Create).Remote(0);
  auto other = ray::Actor(TestCounter::Create).Remote(0);
  constexpr int kThreads = 4, kCalls = 200, kWaits = 100, kChained = 50;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < kCalls; ++j) counter.Task(&TestCounter::Add).Remote(1).Get(kGetTimeoutMs);
    });
  }
  threads.emplace_back([&] {
    for (int j = 0; j < kWaits; ++j) {
      auto r = counter.Task(&TestCounter::Add).Remote(1);
      auto ready = ray::Wait(std::vector<ray::ObjectRef<int>>{r}, 1, kGetTimeoutMs);
      ASSERT_EQ(ready.ready.size(), 1u);
    }
  });
  for (auto& t : threads) t.join();
  // A call whose argument is a synchronous call's pending result, on another actor.
  for (int j = 0; j < kChained; ++j) {
    auto x = counter.Task(&TestCounter::Add).Remote(0);
    EXPECT_EQ(*other.Task(&TestCounter::Add).Remote(x).Get(kGetTimeoutMs),
              (j + 1) * (kThreads * kCalls + kWaits));
  }
  EXPECT_EQ(*counter.Task(&TestCounter::Value).Remote().Get(kGetTimeoutMs),
            kThreads * kCalls + kWaits);
}

TEST_F(ActorTest, OrderHoldsWhenAnEarlierCallWaitsForItsArgument) {
  auto counter = ray::Actor(TestCounter::Create).Remote(0);
  ray::ObjectRef<int> slow = ray::Task(ActSlowValue).Remote(5, 500);
  auto first = counter.Task(&TestCounter::Add).Remote(slow);  // argument ready in 0.5 s
  auto second = counter.Task(&TestCounter::Add).Remote(1);    // argument ready now
  EXPECT_EQ(*first.Get(kGetTimeoutMs), 5);
  EXPECT_EQ(*second.Get(kGetTimeoutMs), 6);
}

TEST_F(ActorTest, CancelWithForceIsRefusedForActorCalls) {
  auto counter = ray::Actor(TestCounter::Create).Remote(0);
  auto call = counter.Task(&TestCounter::SlowSpan).Remote(300);
  EXPECT_THROW(ray::Cancel(call, /*force=*/true), ray::internal::RayInvalidArgumentException);
  call.Get(kGetTimeoutMs);  // refused, not done: the call runs to its end
  EXPECT_EQ(*counter.Task(&TestCounter::Add).Remote(1).Get(kGetTimeoutMs), 1);
}

TEST_F(ActorTest, ConstructorArgumentByReference) {
  auto counter = ray::Actor(TestCounter::Create).Remote(ray::Put(41));
  EXPECT_EQ(*counter.Task(&TestCounter::Add).Remote(1).Get(kGetTimeoutMs), 42);
}

TEST_F(ActorTest, NamedActorIsFoundInItsNamespaceOnly) {
  auto counter = ray::Actor(TestCounter::Create).SetName("named_counter", "ns_a").Remote(10);
  EXPECT_EQ(*counter.Task(&TestCounter::Add).Remote(1).Get(kGetTimeoutMs), 11);

  auto found = ray::GetActor<TestCounter>("named_counter", "ns_a");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->ID(), counter.ID());
  EXPECT_EQ(*found->Task(&TestCounter::Add).Remote(1).Get(kGetTimeoutMs), 12);
  EXPECT_FALSE(ray::GetActor<TestCounter>("named_counter", "ns_b").has_value());
  EXPECT_FALSE(ray::GetActor<TestCounter>("named_counter").has_value())
      << "found in this job's own namespace " << ray::GetNamespace();
  EXPECT_FALSE(ray::GetActor<TestCounter>("no_such_actor", "ns_a").has_value());

  // Another job (a second driver process) finds it in ns_a, and not in ns_b.
  std::map<std::string, std::string> env = {{"TORUS_ADDRESS", cluster().address()},
                                            {"TEST_ACTOR_NAME", "named_counter"},
                                            {"TEST_NAMESPACE", "ns_a"}};
  RunResult in_a = RunChild("named_actor_lookup", env);
  EXPECT_EQ(in_a.exit_code, 0) << in_a.Describe();
  EXPECT_NE(in_a.out.find("found=1 value=112"), std::string::npos) << in_a.Describe();
  env["TEST_NAMESPACE"] = "ns_b";
  RunResult in_b = RunChild("named_actor_lookup", env);
  EXPECT_EQ(in_b.exit_code, 0) << in_b.Describe();
  EXPECT_NE(in_b.out.find("found=0"), std::string::npos) << in_b.Describe();
}

TEST_F(ActorTest, NameInTheJobNamespace) {
  auto counter = ray::Actor(TestCounter::Create).SetName("job_ns_counter").Remote(0);
  EXPECT_EQ(*counter.Task(&TestCounter::Add).Remote(2).Get(kGetTimeoutMs), 2);
  auto found = ray::GetActor<TestCounter>("job_ns_counter");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->ID(), counter.ID());
  auto explicit_ns = ray::GetActor<TestCounter>("job_ns_counter", ray::GetNamespace());
  ASSERT_TRUE(explicit_ns.has_value());
  EXPECT_FALSE(ray::GetActor<TestCounter>("job_ns_counter", "ns_other").has_value());
  nlohmann::json entry = WaitForActorState(cluster(), counter.ID(), "ALIVE");
  EXPECT_EQ(entry.value("name", ""), "job_ns_counter");
  EXPECT_EQ(entry.value("namespace", ""), ray::GetNamespace());
}

TEST_F(ActorTest, SameNameAllowedInAnotherNamespaceNotInTheSame) {
  auto a = ray::Actor(TestCounter::Create).SetName("dup", "ns_one").Remote(1);
  auto b = ray::Actor(TestCounter::Create).SetName("dup", "ns_two").Remote(2);
  EXPECT_NE(a.ID(), b.ID());
  EXPECT_EQ(*a.Task(&TestCounter::Value).Remote().Get(kGetTimeoutMs), 1);
  EXPECT_EQ(*b.Task(&TestCounter::Value).Remote().Get(kGetTimeoutMs), 2);
  EXPECT_THROW(ray::Actor(TestCounter::Create).SetName("dup", "ns_one").Remote(3),
               ray::internal::RayException);
  EXPECT_EQ(ray::GetActor<TestCounter>("dup", "ns_one")->ID(), a.ID());
}

TEST_F(ActorTest, KilledActorFailsLaterCalls) {
  auto counter = ray::Actor(TestCounter::Create).Remote(0);
  EXPECT_EQ(*counter.Task(&TestCounter::Add).Remote(1).Get(kGetTimeoutMs), 1);
  counter.Kill(true);
  nlohmann::json entry = WaitForActorState(cluster(), counter.ID(), "DEAD");
  EXPECT_EQ(entry.value("state", ""), "DEAD") << entry.dump();
  auto after = counter.Task(&TestCounter::Add).Remote(1);
  EXPECT_THROW(after.Get(kGetTimeoutMs), ray::internal::RayActorException);
  try {
    counter.Task(&TestCounter::Value).Remote().Get(kGetTimeoutMs);
    ADD_FAILURE() << "a call on a killed actor returned";
  } catch (const ray::internal::RayActorException& e) {
    EXPECT_NE(std::string(e.what()).find("kill"), std::string::npos) << e.what();
  }
  // Its worker process is gone.
  EXPECT_TRUE(WaitUntil([&] { return WorkerOfActor(cluster(), counter.ID()).is_null(); }));
}

TEST_F(ActorTest, KillWithRestartAllowedRestartsTheActor) {
  auto counter = ray::Actor(TestCounter::Create).SetMaxRestarts(1).Remote(0);
  EXPECT_EQ(*counter.Task(&TestCounter::Add).Remote(5).Get(kGetTimeoutMs), 5);
  counter.Kill(false);
  nlohmann::json entry = WaitForActorState(cluster(), counter.ID(), "ALIVE", 1);
  ASSERT_EQ(entry.value("num_restarts", -1), 1) << entry.dump();
  EXPECT_EQ(*counter.Task(&TestCounter::Add).Remote(1).Get(kGetTimeoutMs), 1);
  EXPECT_TRUE(*counter.Task(&TestCounter::WasRestarted).Remote().Get(kGetTimeoutMs));
}

TEST_F(ActorTest, RestartedAfterSigkillOfItsWorker) {
  auto counter = ray::Actor(TestCounter::Create).SetMaxRestarts(1).Remote(100);
  EXPECT_EQ(*counter.Task(&TestCounter::Add).Remote(1).Get(kGetTimeoutMs), 101);
  EXPECT_FALSE(*counter.Task(&TestCounter::WasRestarted).Remote().Get(kGetTimeoutMs));
  int pid = *counter.Task(&TestCounter::Pid).Remote().Get(kGetTimeoutMs);

  nlohmann::json worker = WorkerOfActor(cluster(), counter.ID());
  ASSERT_FALSE(worker.is_null()) << "no worker with actor_id " << counter.ID() << " in\n"
                                 << cluster().ListJson("workers").dump(2);
  ASSERT_EQ(worker.value("pid", 0), pid);
  ASSERT_EQ(kill(pid, SIGKILL), 0);

  nlohmann::json entry = WaitForActorState(cluster(), counter.ID(), "ALIVE", 1);
  ASSERT_EQ(entry.value("num_restarts", -1), 1) << entry.dump();
  // A new process, a fresh instance built by the same factory call, that knows it restarted.
  EXPECT_EQ(*counter.Task(&TestCounter::Add).Remote(1).Get(kGetTimeoutMs), 101);
  EXPECT_TRUE(*counter.Task(&TestCounter::WasRestarted).Remote().Get(kGetTimeoutMs));
  int new_pid = *counter.Task(&TestCounter::Pid).Remote().Get(kGetTimeoutMs);
  EXPECT_NE(new_pid, pid);

  // No restarts left: the next SIGKILL is final.
  ASSERT_EQ(kill(new_pid, SIGKILL), 0);
  entry = WaitForActorState(cluster(), counter.ID(), "DEAD");
  EXPECT_EQ(entry.value("state", ""), "DEAD") << entry.dump();
  EXPECT_THROW(counter.Task(&TestCounter::Add).Remote(1).Get(kGetTimeoutMs),
               ray::internal::RayActorException);
}

TEST_F(ActorTest, WithoutRestartsSigkillIsFinal) {
  auto counter = ray::Actor(TestCounter::Create).Remote(0);
  int pid = *counter.Task(&TestCounter::Pid).Remote().Get(kGetTimeoutMs);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  nlohmann::json entry = WaitForActorState(cluster(), counter.ID(), "DEAD");
  EXPECT_EQ(entry.value("state", ""), "DEAD") << entry.dump();
  EXPECT_NE(entry.value("death_cause", "").find("SIGKILL"), std::string::npos) << entry.dump();
  EXPECT_THROW(counter.Task(&TestCounter::Add).Remote(1).Get(kGetTimeoutMs),
               ray::internal::RayActorException);
}

TEST_F(ActorTest, MaxConcurrencyRunsCallsAtOnce) {
  auto actor = ray::Actor(TestCounter::Create).SetMaxConcurrency(4).Remote(0);
  ray::Get(actor.Task(&TestCounter::Value).Remote(), kGetTimeoutMs);  // created
  std::vector<ray::ObjectRef<std::pair<int64_t, int64_t>>> spans;
  for (int i = 0; i < 4; ++i) spans.push_back(actor.Task(&TestCounter::SlowSpan).Remote(1000));
  auto values = ray::Get(spans, kGetTimeoutMs);
  int64_t latest_start = 0, earliest_end = INT64_MAX;
  for (const auto& s : values) {
    latest_start = std::max(latest_start, s->first);
    earliest_end = std::min(earliest_end, s->second);
  }
  // All four were running at the same moment.
  EXPECT_LT(latest_start, earliest_end) << "the 4 calls did not overlap";
}

TEST_F(ActorTest, DefaultConcurrencyIsOneCallAtATime) {
  auto actor = ray::Actor(TestCounter::Create).Remote(0);
  std::vector<ray::ObjectRef<std::pair<int64_t, int64_t>>> spans;
  for (int i = 0; i < 3; ++i) spans.push_back(actor.Task(&TestCounter::SlowSpan).Remote(200));
  auto values = ray::Get(spans, kGetTimeoutMs);
  for (size_t i = 1; i < values.size(); ++i) {
    EXPECT_LE(values[i - 1]->second, values[i]->first) << "calls " << i - 1 << " and " << i
                                                       << " overlapped";
  }
}

TEST_F(ActorTest, ExitActorEndsTheActor) {
  auto actor = ray::Actor(TestCounter::Create).Remote(0);
  EXPECT_EQ(*actor.Task(&TestCounter::Add).Remote(1).Get(kGetTimeoutMs), 1);
  EXPECT_THROW(actor.Task(&TestCounter::Exit).Remote().Get(kGetTimeoutMs),
               ray::internal::RayActorException);
  nlohmann::json entry = WaitForActorState(cluster(), actor.ID(), "DEAD");
  EXPECT_EQ(entry.value("state", ""), "DEAD") << entry.dump();
  EXPECT_THROW(actor.Task(&TestCounter::Add).Remote(1).Get(kGetTimeoutMs),
               ray::internal::RayActorException);
  EXPECT_TRUE(WaitUntil([&] { return WorkerOfActor(cluster(), actor.ID()).is_null(); }));
}

TEST_F(ActorTest, ExitActorOutsideAnActorThrows) {
  EXPECT_THROW(ray::ExitActor(), ray::internal::RayException);
}

TEST_F(ActorTest, PlacedOnTheNodeWithItsResource) {
  auto on_b = ray::Actor(TestCounter::Create).SetResource("node_b", 1).Remote(0);
  EXPECT_EQ(*on_b.Task(&TestCounter::NodeId).Remote().Get(kGetTimeoutMs), shape.b.node_id);
  auto on_a = ray::Actor(TestCounter::Create).SetResource("node_a", 1).Remote(0);
  EXPECT_EQ(*on_a.Task(&TestCounter::NodeId).Remote().Get(kGetTimeoutMs), shape.a.node_id);
  nlohmann::json entry = WaitForActorState(cluster(), on_a.ID(), "ALIVE");
  EXPECT_EQ(entry.value("node_id", ""), shape.a.node_id);
}

TEST_F(ActorTest, HandlePassedToATask) {
  auto counter = ray::Actor(TestCounter::Create).Remote(10);
  EXPECT_EQ(*ray::Task(ActUseCounter).SetResource("node_b", 1).Remote(counter, 5).Get(kGetTimeoutMs),
            15);
  EXPECT_EQ(*ray::Task(ActUseCounter).SetResource("node_a", 1).Remote(counter, 5).Get(kGetTimeoutMs),
            20);
  EXPECT_EQ(*counter.Task(&TestCounter::Value).Remote().Get(kGetTimeoutMs), 20);
}

TEST_F(ActorTest, HandleReturnedFromATask) {
  ray::ActorHandle<TestCounter> made =
      *ray::Task(ActMakeCounter).SetResource("node_a", 1).Remote(7).Get(kGetTimeoutMs);
  ASSERT_FALSE(made.ID().empty());
  EXPECT_EQ(*made.Task(&TestCounter::Add).Remote(1).Get(kGetTimeoutMs), 8);
  EXPECT_EQ(*made.Task(&TestCounter::Add).Remote(1).Get(kGetTimeoutMs), 9);
}

// An actor created while a task of the same program waits for a worker on the same node must
// start: the worker the node starts for the actor is reserved for it, so the task's lease
// cannot take it (it once did, and StartActor then waited 60 s for another idle worker).
struct ActorStartTest : ClusterTest<ActorStartTest> {
  static constexpr const char* kName = "actorstart";
  static void Build(TestCluster& c) { c.StartHead(2); }
};

TEST_F(ActorStartTest, ActorCreatedWhileATaskWaitsForAWorkerStarts) {
  auto counter = ray::Actor(TestCounter::Create).Remote(1);
  // The node is starting the actor's worker (a fresh process takes ~100 ms to register): ask
  // for a task worker of the same executable meanwhile.
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(*ray::Task(ActSlowValue).Remote(7, 300).Get(kGetTimeoutMs), 7);
  EXPECT_EQ(*counter.Task(&TestCounter::Add).Remote(1).Get(20000), 2);
}

}  // namespace
}  // namespace torus_test
