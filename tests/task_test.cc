// Tasks across processes and nodes: results, void tasks, arguments by value and by reference
// (including references produced on another node, nested in values, and in vectors), user types,
// and tasks that submit tasks and block in Get.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <ray/api.h>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cluster_fixture.h"

namespace {

std::string EnvOr(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

}  // namespace

int TaskPlus(int a, int b) { return a + b; }

void TaskTouch(std::string path) {
  std::ofstream out(path);
  out << "touched by " << getpid();
}

int TaskSlowValue(int x, int sleep_ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  return x;
}

// (node that ran it, x + 1)
std::pair<std::string, int> TaskAddOneWhere(int x) { return {EnvOr("TORUS_NODE_ID"), x + 1}; }

// Nested references: the refs arrive unresolved; this task gets them itself.
int TaskSumRefs(std::vector<ray::ObjectRef<int>> refs) {
  int sum = 0;
  for (auto& r : refs) sum += *r.Get();
  return sum;
}

// A single reference passed as a reference (parameter type ObjectRef<int>).
int TaskGetRef(ray::ObjectRef<int> ref) { return *ray::Get(ref) * 10; }

// Submits a task and blocks in Get on it, `depth` levels deep.
int TaskNested(int depth) {
  if (depth == 0) return 0;
  return *ray::Task(TaskNested).Remote(depth - 1).Get() + 1;
}

// Sleeps, then reads the references it was given (by then the caller may have dropped its own).
int TaskSumRefsLater(std::vector<ray::ObjectRef<int>> refs, int sleep_ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  return TaskSumRefs(std::move(refs));
}

// Returns a reference to a value this task put (the worker owns it).
ray::ObjectRef<int> TaskPutAndReturnRef(int x) { return ray::Put(x); }

struct Point {
  int x = 0;
  std::string label;
  std::vector<double> weights;
  MSGPACK_DEFINE(x, label, weights);
};

Point TaskMovePoint(Point p, int dx) {
  p.x += dx;
  p.label += "!";
  p.weights.push_back(0.5);
  return p;
}

// Overloads, registered and called with RAY_FUNC.
int TaskOverloaded(int x) { return x * 2; }
int TaskOverloaded(int x, int y) { return x * y; }

RAY_REMOTE(RAY_FUNC(TaskOverloaded, int), RAY_FUNC(TaskOverloaded, int, int));

RAY_REMOTE(TaskPlus, TaskTouch, TaskSlowValue, TaskAddOneWhere, TaskSumRefs, TaskGetRef,
           TaskNested, TaskMovePoint, TaskSumRefsLater, TaskPutAndReturnRef);

namespace torus_test {
namespace {

struct TaskTest : ClusterTest<TaskTest> {
  static constexpr const char* kName = "task";
  static inline ThreeNodes shape;
  static void Build(TestCluster& c) { shape.Build(c); }
};

// torus::Cancel (Torus extension; Python's ray.cancel). A task waiting for its argument never
// runs; a running one's worker is killed with force; the cluster keeps serving.
TEST_F(TaskTest, CancelledTasksFailAndTheClusterKeepsServing) {
  auto slow = ray::Task(TaskSlowValue).Remote(1, 60000);
  auto waiting = ray::Task(TaskPlus).Remote(slow, 1);  // queued until `slow` is done
  ray::Cancel(waiting);
  // It fails now, without waiting for its argument.
  EXPECT_THROW(waiting.Get(kGetTimeoutMs), ray::internal::TaskCancelledException);
  EXPECT_TRUE(ray::Wait(std::vector<ray::ObjectRef<int>>{slow}, 1, 0).ready.empty());
  auto running = ray::Task(TaskSlowValue).Remote(2, 600000);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ray::Cancel(running, /*force=*/true);
  EXPECT_THROW(running.Get(kGetTimeoutMs), ray::internal::RayException);
  ray::Cancel(slow);
  EXPECT_EQ(*ray::Task(TaskPlus).Remote(2, 3).Get(kGetTimeoutMs), 5);
  EXPECT_THROW(ray::Cancel(ray::ObjectRef<int>()), ray::internal::RayException);
}

TEST_F(TaskTest, PlusReturnsSum) {
  ray::ObjectRef<int> sum = ray::Task(TaskPlus).Remote(1, 2);
  EXPECT_EQ(*sum.Get(kGetTimeoutMs), 3);
  EXPECT_EQ(*ray::Get(ray::Task(TaskPlus).Remote(-7, 7), kGetTimeoutMs), 0);
}

TEST_F(TaskTest, VoidTaskRunsAndGetReturnsWhenDone) {
  std::string path = ScratchDir(cluster(), "void") + "/touched";
  ray::ObjectRef<void> done = ray::Task(TaskTouch).Remote(path);
  ray::Get(done, kGetTimeoutMs);
  EXPECT_NE(ReadFileOr(path).find("touched by"), std::string::npos)
      << "Get on a void task returned but the task's side effect is missing";
}

TEST_F(TaskTest, ArgumentsByValueAndByReference) {
  ray::ObjectRef<int> put = ray::Put(40);
  EXPECT_EQ(*ray::Task(TaskPlus).Remote(put, 2).Get(kGetTimeoutMs), 42);
  EXPECT_EQ(*ray::Task(TaskPlus).Remote(2, put).Get(kGetTimeoutMs), 42);
  EXPECT_EQ(*ray::Task(TaskPlus).Remote(put, put).Get(kGetTimeoutMs), 80);
  // The put value is still there after being used as an argument.
  EXPECT_EQ(*put.Get(kGetTimeoutMs), 40);
}

TEST_F(TaskTest, ReferenceToPendingResultIsResolvedBeforeTheTaskRuns) {
  // The dependency is still running when the dependent task is submitted.
  ray::ObjectRef<int> slow = ray::Task(TaskSlowValue).Remote(5, 700);
  ray::ObjectRef<int> chained = ray::Task(TaskPlus).Remote(slow, 6);
  ray::ObjectRef<int> chained2 = ray::Task(TaskPlus).Remote(chained, slow);
  EXPECT_EQ(*chained2.Get(kGetTimeoutMs), 16);
  EXPECT_EQ(*chained.Get(kGetTimeoutMs), 11);
}

TEST_F(TaskTest, ReferenceProducedOnAnotherNode) {
  // Produced by a task on node A, consumed by a task on node B and by the driver.
  ray::ObjectRef<int> on_a = ray::Task(TaskSlowValue).SetResource("node_a", 1).Remote(41, 50);
  auto [where, value] =
      *ray::Task(TaskAddOneWhere).SetResource("node_b", 1).Remote(on_a).Get(kGetTimeoutMs);
  EXPECT_EQ(where, shape.b.node_id);
  EXPECT_EQ(value, 42);
  // A value the driver put, consumed on both other nodes.
  ray::ObjectRef<int> put = ray::Put(99);
  auto on_node_a = *ray::Task(TaskAddOneWhere).SetResource("node_a", 1).Remote(put).Get(kGetTimeoutMs);
  auto on_node_b = *ray::Task(TaskAddOneWhere).SetResource("node_b", 1).Remote(put).Get(kGetTimeoutMs);
  EXPECT_EQ(on_node_a, std::make_pair(shape.a.node_id, 100));
  EXPECT_EQ(on_node_b, std::make_pair(shape.b.node_id, 100));
  EXPECT_EQ(*on_a.Get(kGetTimeoutMs), 41);
}

TEST_F(TaskTest, NestedReferencesInsideAVectorPassedByValue) {
  std::vector<ray::ObjectRef<int>> refs;
  refs.push_back(ray::Put(1));
  refs.push_back(ray::Put(2));
  refs.push_back(ray::Task(TaskSlowValue).SetResource("node_a", 1).Remote(3, 300));
  refs.push_back(ray::Task(TaskSlowValue).SetResource("node_b", 1).Remote(4, 10));
  // Runs on node B; two values live in the driver, one is produced on node A while it runs.
  int sum = *ray::Task(TaskSumRefs).SetResource("node_b", 1).Remote(refs).Get(kGetTimeoutMs);
  EXPECT_EQ(sum, 10);
  // Same on the driver's default placement.
  EXPECT_EQ(*ray::Task(TaskSumRefs).Remote(refs).Get(kGetTimeoutMs), 10);
  // The driver's references are still good.
  EXPECT_EQ(*refs[0].Get(kGetTimeoutMs), 1);
  EXPECT_EQ(*refs[2].Get(kGetTimeoutMs), 3);
}

// "Memory is returned when the last reference is gone": not before. A task holding nested
// references keeps the objects alive after the caller drops its own references.
TEST_F(TaskTest, NestedReferencesOutliveTheCallersReferences) {
  ray::ObjectRef<int> result;
  {
    std::vector<ray::ObjectRef<int>> refs = {ray::Put(20), ray::Put(22)};
    result = ray::Task(TaskSumRefsLater).SetResource("node_a", 1).Remote(refs, 500);
  }  // the driver's references are gone; the task has not read them yet
  EXPECT_EQ(*result.Get(kGetTimeoutMs), 42);
}

// A reference returned by a task points at a value the task's worker put: it must stay readable
// for as long as the caller holds the reference.
TEST_F(TaskTest, ReferenceReturnedFromATask) {
  ray::ObjectRef<ray::ObjectRef<int>> outer =
      ray::Task(TaskPutAndReturnRef).SetResource("node_b", 1).Remote(31);
  ray::ObjectRef<int> inner = *outer.Get(kGetTimeoutMs);
  EXPECT_EQ(*inner.Get(kGetTimeoutMs), 31);
  // Passed on to a task on another node.
  EXPECT_EQ(*ray::Task(TaskPlus).SetResource("node_a", 1).Remote(inner, 1).Get(kGetTimeoutMs), 32);
}

TEST_F(TaskTest, ObjectRefParameterReceivesTheReferenceItself) {
  ray::ObjectRef<int> pending = ray::Task(TaskSlowValue).SetResource("node_a", 1).Remote(7, 300);
  EXPECT_EQ(*ray::Task(TaskGetRef).SetResource("node_b", 1).Remote(pending).Get(kGetTimeoutMs),
            70);
}

TEST_F(TaskTest, VectorOfReferences) {
  std::vector<ray::ObjectRef<int>> refs;
  for (int i = 0; i < 100; ++i) refs.push_back(ray::Task(TaskPlus).Remote(i, 1));
  std::vector<std::shared_ptr<int>> values = ray::Get(refs, kGetTimeoutMs);
  ASSERT_EQ(values.size(), refs.size());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(*values[i], i + 1) << "result " << i;
  ray::WaitResult<int> waited = ray::Wait(refs, static_cast<int>(refs.size()), kGetTimeoutMs);
  EXPECT_EQ(waited.ready.size(), refs.size());
  EXPECT_TRUE(waited.unready.empty());
}

TEST_F(TaskTest, UserTypeWithMsgpackDefine) {
  Point p{3, "p", {1.5}};
  Point moved = *ray::Task(TaskMovePoint).Remote(p, 4).Get(kGetTimeoutMs);
  EXPECT_EQ(moved.x, 7);
  EXPECT_EQ(moved.label, "p!");
  EXPECT_EQ(moved.weights, (std::vector<double>{1.5, 0.5}));
  // And through Put plus a by-reference argument on another node.
  ray::ObjectRef<Point> ref = ray::Put(p);
  Point moved2 = *ray::Task(TaskMovePoint).SetResource("node_a", 1).Remote(ref, -3).Get(kGetTimeoutMs);
  EXPECT_EQ(moved2.x, 0);
}

TEST_F(TaskTest, OverloadsSelectedWithRayFunc) {
  EXPECT_EQ(*ray::Task(RAY_FUNC(TaskOverloaded, int)).Remote(21).Get(kGetTimeoutMs), 42);
  EXPECT_EQ(*ray::Task(RAY_FUNC(TaskOverloaded, int, int)).Remote(6, 7).Get(kGetTimeoutMs), 42);
}

TEST_F(TaskTest, TasksSubmittedFromTasks) {
  EXPECT_EQ(*ray::Task(TaskNested).Remote(3).Get(kGetTimeoutMs), 3);
}

// A task that submits a task and blocks in Get on it, three levels deep, on a cluster with one
// CPU: the blocked tasks must give their CPU back or this deadlocks.
struct NestedOneCpuTest : ClusterTest<NestedOneCpuTest> {
  static constexpr const char* kName = "nested";
  static void Build(TestCluster& c) { c.StartHead(1); }
};

TEST_F(NestedOneCpuTest, NestedDepthThreeDoesNotDeadlock) {
  EXPECT_EQ(*ray::Task(TaskNested).Remote(3).Get(kGetTimeoutMs), 3);
}

TEST_F(NestedOneCpuTest, TwoNestedChainsAtOnceDoNotDeadlock) {
  auto a = ray::Task(TaskNested).Remote(3);
  auto b = ray::Task(TaskNested).Remote(3);
  EXPECT_EQ(*a.Get(kGetTimeoutMs), 3);
  EXPECT_EQ(*b.Get(kGetTimeoutMs), 3);
}

}  // namespace
}  // namespace torus_test
