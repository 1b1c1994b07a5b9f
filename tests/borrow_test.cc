// Borrowed references (docs/objects.md): an object lives while any process holds a reference
// to it, not only its owner. References travel inside task arguments, task results, Put values
// and actor state; each test checks the values read and that the nodes' object stores return
// to the byte count they started from once every reference is gone.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <ray/api.h>
#include <string>
#include <thread>
#include <vector>

#include "cluster_fixture.h"
#include "test_values.h"

namespace {

using Bytes = std::vector<uint8_t>;
using BytesRef = ray::ObjectRef<Bytes>;
constexpr int64_t k4MiB = 4 << 20;  // large: lives in shared memory, shows in `torus list objects`

}  // namespace

// Puts a large value in this worker (the worker owns it) and returns the reference.
BytesRef BorPutLarge(int seed) { return ray::Put(torus_test::Pattern(k4MiB, seed)); }

uint64_t BorChecksum(Bytes v) { return torus_test::Fnv(v); }

// Reads nested references after a pause (by then the caller may have dropped its own).
uint64_t BorSumLater(std::vector<BytesRef> refs, int sleep_ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  uint64_t h = 0;
  for (auto& r : refs) h ^= torus_test::Fnv(*r.Get());
  return h;
}

int BorSumSmall(std::vector<ray::ObjectRef<int>> refs) {
  int sum = 0;
  for (auto& r : refs) sum += *r.Get();
  return sum;
}

// Hands the references on to a task of its own and returns that task's result reference.
ray::ObjectRef<uint64_t> BorForward(std::vector<BytesRef> refs) {
  return ray::Task(BorSumLater).Remote(refs, 500);
}

// A task result holding two references of its own making.
std::vector<BytesRef> BorPutTwo(int seed) {
  return {ray::Put(torus_test::Pattern(k4MiB, seed)), ray::Put(torus_test::Pattern(k4MiB, seed + 1))};
}

class BorKeeper {
 public:
  static BorKeeper* Create() { return new BorKeeper(); }
  int Keep(std::vector<BytesRef> refs) {
    for (auto& r : refs) kept_.push_back(r);
    return static_cast<int>(kept_.size());
  }
  uint64_t Sum() {
    uint64_t h = 0;
    for (auto& r : kept_) h ^= torus_test::Fnv(*r.Get());
    return h;
  }
  int Clear() {
    kept_.clear();
    return 0;
  }
  int Pid() { return static_cast<int>(getpid()); }

 private:
  std::vector<BytesRef> kept_;
};

RAY_REMOTE(BorPutLarge, BorChecksum, BorSumSmall, BorSumLater, BorForward, BorPutTwo, BorKeeper::Create,
           &BorKeeper::Keep, &BorKeeper::Sum, &BorKeeper::Clear, &BorKeeper::Pid);

namespace torus_test {
namespace {

uint64_t StoreBytes(const TestCluster& c) {
  uint64_t total = 0;
  for (const auto& o : c.ListJson("objects")) total += o.value("size_bytes", 0ull);
  return total;
}

struct BorrowTest : ClusterTest<BorrowTest> {
  static constexpr const char* kName = "borrow";
  static inline ThreeNodes shape;
  static void Build(TestCluster& c) { shape.Build(c); }

  void SetUp() override {
    ClusterTest::SetUp();
    // Wait for anything an earlier test left to be released (frees are asynchronous).
    WaitUntil([&] { return StoreBytes(cluster()) == 0; });
    baseline_ = StoreBytes(cluster());
  }
  // Every reference is gone: the stores go back to where the test started.
  void ExpectStoresReleased() {
    bool back = WaitUntil([&] { return StoreBytes(cluster()) == baseline_; },
                          std::chrono::seconds(30));
    EXPECT_TRUE(back) << "object stores hold " << StoreBytes(cluster()) << " bytes, started at "
                      << baseline_ << "\n"
                      << cluster().Torus({"list", "objects"}).out;
  }
  uint64_t baseline_ = 0;
};

uint64_t FnvOf(int seed) { return Fnv(Pattern(k4MiB, seed)); }

TEST_F(BorrowTest, ReferenceReturnedByATaskOutlivesTheTaskAndIsPassedOn) {
  {
    ray::ObjectRef<BytesRef> outer = ray::Task(BorPutLarge).SetResource("node_a", 1).Remote(1);
    BytesRef inner = *outer.Get(kGetTimeoutMs);
    outer = ray::ObjectRef<BytesRef>();  // the result is gone; the reference inside stays good
    // Let the worker's own reference go out of any pipeline, then read it from here...
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(Fnv(*inner.Get(kGetTimeoutMs)), FnvOf(1));
    // ...pass it by value to a task on another node, and nested to one that reads it later.
    EXPECT_EQ(*ray::Task(BorChecksum).SetResource("node_b", 1).Remote(inner).Get(kGetTimeoutMs),
              FnvOf(1));
    EXPECT_GE(StoreBytes(cluster()), baseline_ + k4MiB) << "the value is not in shared memory";
    ray::ObjectRef<uint64_t> later =
        ray::Task(BorSumLater).SetResource("node_b", 1).Remote(std::vector<BytesRef>{inner}, 300);
    inner = BytesRef();  // the driver's last reference goes before the task reads it
    EXPECT_EQ(*later.Get(kGetTimeoutMs), FnvOf(1));
  }
  ExpectStoresReleased();
}

TEST_F(BorrowTest, AResultDroppedUnreadReleasesTheReferencesInsideIt) {
  {
    ray::ObjectRef<std::vector<BytesRef>> outer =
        ray::Task(BorPutTwo).SetResource("node_a", 1).Remote(10);
    auto waited = ray::Wait(std::vector<ray::ObjectRef<std::vector<BytesRef>>>{outer}, 1, kGetTimeoutMs);
    ASSERT_EQ(waited.ready.size(), 1u);
    EXPECT_GE(StoreBytes(cluster()), baseline_ + 2 * k4MiB);
  }  // never read
  ExpectStoresReleased();
}

TEST_F(BorrowTest, APutOfReferencesKeepsThemAlive) {
  {
    ray::ObjectRef<std::vector<BytesRef>> outer;
    {
      std::vector<BytesRef> refs = {ray::Put(Pattern(k4MiB, 20)),
                                    *ray::Task(BorPutLarge).SetResource("node_b", 1).Remote(21).Get(kGetTimeoutMs)};
      outer = ray::Put(refs);
    }  // only the Put value refers to them now
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    uint64_t expected = FnvOf(20) ^ FnvOf(21);
    EXPECT_EQ(*ray::Task(BorSumLater).SetResource("node_a", 1).Remote(*outer.Get(kGetTimeoutMs), 0)
                   .Get(kGetTimeoutMs),
              expected);
  }
  ExpectStoresReleased();
}

TEST_F(BorrowTest, ReferencesForwardedByATaskToItsOwnTask) {
  {
    ray::ObjectRef<ray::ObjectRef<uint64_t>> outer;
    {
      std::vector<BytesRef> refs = {ray::Put(Pattern(k4MiB, 30)), ray::Put(Pattern(k4MiB, 31))};
      outer = ray::Task(BorForward).SetResource("node_a", 1).Remote(refs);
    }  // the driver dropped its references; the task's task reads them 500 ms later
    ray::ObjectRef<uint64_t> inner = *outer.Get(kGetTimeoutMs);
    EXPECT_EQ(*inner.Get(kGetTimeoutMs), FnvOf(30) ^ FnvOf(31));
  }
  ExpectStoresReleased();
}

TEST_F(BorrowTest, AnActorKeepsBorrowedReferencesInItsState) {
  auto keeper = ray::Actor(BorKeeper::Create).SetResource("node_b", 1).Remote();
  {
    std::vector<BytesRef> refs = {ray::Put(Pattern(k4MiB, 40)),
                                  *ray::Task(BorPutLarge).SetResource("node_a", 1).Remote(41).Get(kGetTimeoutMs)};
    EXPECT_EQ(*keeper.Task(&BorKeeper::Keep).Remote(refs).Get(kGetTimeoutMs), 2);
  }  // the driver's references are gone
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(*keeper.Task(&BorKeeper::Sum).Remote().Get(kGetTimeoutMs), FnvOf(40) ^ FnvOf(41));
  EXPECT_GE(StoreBytes(cluster()), baseline_ + 2 * k4MiB);
  EXPECT_EQ(*keeper.Task(&BorKeeper::Clear).Remote().Get(kGetTimeoutMs), 0);
  ExpectStoresReleased();
  keeper.Kill(true);
}

// A thousand refs in one argument, half of them produced by tasks on another node: all are
// kept until the task has read them, after the driver dropped its own.
TEST_F(BorrowTest, AThousandReferencesInOneArgument) {
  ray::ObjectRef<int> sum;
  int expected = 0;
  {
    std::vector<ray::ObjectRef<int>> refs;
    for (int i = 0; i < 1000; ++i) {
      refs.push_back(i % 2 ? ray::Put(i) : ray::Task(BorSumSmall).SetResource("node_a", 1).Remote(
                                                std::vector<ray::ObjectRef<int>>{ray::Put(i)}));
      expected += i;
    }
    sum = ray::Task(BorSumSmall).SetResource("node_b", 1).Remote(refs);
  }
  EXPECT_EQ(*sum.Get(kGetTimeoutMs), expected);
}

TEST_F(BorrowTest, ABorrowerThatIsKilledNoLongerHoldsItsReferences) {
  auto keeper = ray::Actor(BorKeeper::Create).SetResource("node_a", 1).Remote();
  int pid = *keeper.Task(&BorKeeper::Pid).Remote().Get(kGetTimeoutMs);
  {
    std::vector<BytesRef> refs = {ray::Put(Pattern(k4MiB, 50))};
    EXPECT_EQ(*keeper.Task(&BorKeeper::Keep).Remote(refs).Get(kGetTimeoutMs), 1);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_GE(StoreBytes(cluster()), baseline_ + k4MiB) << "the actor's borrow did not keep it";
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  // The owner notices the borrower is gone (its port refuses connections) and frees the object.
  ExpectStoresReleased();
}

}  // namespace
}  // namespace torus_test
