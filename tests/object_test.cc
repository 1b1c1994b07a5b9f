// Objects: Put/Get (one, many, timeouts), Wait, large values (shared memory, moved between nodes
// in chunks), and memory being returned when the last reference is gone.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <ray/api.h>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cluster_fixture.h"
#include "test_values.h"

namespace {

using torus_test::Fnv;
using torus_test::Pattern;

using torus_test::ThisNode;

}  // namespace

std::vector<uint8_t> ObjMakeBytes(int64_t n, int seed) { return Pattern(n, seed); }

// (node that ran it, checksum)
std::pair<std::string, uint64_t> ObjChecksum(std::vector<uint8_t> v) { return {ThisNode(), Fnv(v)}; }

int ObjSleepReturn(int x, int sleep_ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  return x;
}

int ObjFail(int) { throw std::runtime_error("object test failure"); }

RAY_REMOTE(ObjMakeBytes, ObjChecksum, ObjSleepReturn, ObjFail);

namespace torus_test {
namespace {

constexpr int64_t k8MiB = 8ll << 20;

struct ObjectTest : ClusterTest<ObjectTest> {
  static constexpr const char* kName = "object";
  static inline ThreeNodes shape;
  static void Build(TestCluster& c) { shape.Build(c); }
};

TEST_F(ObjectTest, PutGetOne) {
  EXPECT_EQ(*ray::Get(ray::Put(42)), 42);
  EXPECT_EQ(*ray::Put(std::string("hello")).Get(), "hello");
  std::vector<int> v = {1, 2, 3};
  EXPECT_EQ(*ray::Get(ray::Put(v), kGetTimeoutMs), v);
}

TEST_F(ObjectTest, GetMany) {
  std::vector<ray::ObjectRef<std::string>> refs;
  for (int i = 0; i < 50; ++i) refs.push_back(ray::Put("value-" + std::to_string(i)));
  auto values = ray::Get(refs);
  ASSERT_EQ(values.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(*values[i], "value-" + std::to_string(i));
  auto again = ray::Get(refs, kGetTimeoutMs);
  EXPECT_EQ(*again[49], "value-49");
}

TEST_F(ObjectTest, GetWithTimeoutThrowsRayTimeoutException) {
  ray::ObjectRef<int> slow = ray::Task(ObjSleepReturn).Remote(1, 3000);
  EXPECT_THROW(slow.Get(200), ray::internal::RayTimeoutException);
  EXPECT_THROW(ray::Get(slow, 100), ray::internal::RayTimeoutException);
  std::vector<ray::ObjectRef<int>> both = {ray::Put(5), slow};
  EXPECT_THROW(ray::Get(both, 100), ray::internal::RayTimeoutException);
  // The message names what is not ready, and why.
  try {
    (void)ray::Get(both, 100);
    ADD_FAILURE() << "no timeout";
  } catch (const ray::internal::RayTimeoutException& e) {
    EXPECT_NE(std::string(e.what()).find("not ready: " + slow.ID() + ": ours, its task has not finished"), std::string::npos)
        << e.what();
  }
  // A timed-out Get leaves the object alone: it is delivered once ready.
  EXPECT_EQ(*slow.Get(kGetTimeoutMs), 1);
  EXPECT_EQ(*ray::Get(both, kGetTimeoutMs)[0], 5);
}

TEST_F(ObjectTest, WaitReturnsReadyAndUnreadyInOrder) {
  ray::ObjectRef<int> fast1 = ray::Put(1);
  ray::ObjectRef<int> slow = ray::Task(ObjSleepReturn).Remote(2, 2500);
  ray::ObjectRef<int> fast2 = ray::Task(ObjSleepReturn).Remote(3, 0);
  std::vector<ray::ObjectRef<int>> refs = {fast1, slow, fast2};

  ray::WaitResult<int> two = ray::Wait(refs, 2, kGetTimeoutMs);
  ASSERT_EQ(two.ready.size(), 2u);
  ASSERT_EQ(two.unready.size(), 1u);
  EXPECT_EQ(two.ready.front(), fast1);
  EXPECT_EQ(two.ready.back(), fast2);
  EXPECT_EQ(two.unready.front(), slow);

  // Asking for all three with a short timeout: returns at the timeout with the same split.
  ray::WaitResult<int> timed_out = ray::Wait(refs, 3, 300);
  EXPECT_EQ(timed_out.ready.size(), 2u);
  ASSERT_EQ(timed_out.unready.size(), 1u);
  EXPECT_EQ(timed_out.unready.front(), slow);

  // No limit: returns when the slow one is done.
  ray::WaitResult<int> all = ray::Wait(refs, 3, -1);
  EXPECT_EQ(all.ready.size(), 3u);
  EXPECT_TRUE(all.unready.empty());
  EXPECT_EQ(*slow.Get(kGetTimeoutMs), 2);
}

TEST_F(ObjectTest, WaitCountsFailedObjectsAsReady) {
  ray::ObjectRef<int> failed = ray::Task(ObjFail).Remote(0);
  ray::WaitResult<int> r = ray::Wait(std::vector<ray::ObjectRef<int>>{failed}, 1, kGetTimeoutMs);
  EXPECT_EQ(r.ready.size(), 1u);
  EXPECT_THROW(failed.Get(kGetTimeoutMs), ray::internal::RayTaskException);
}

TEST_F(ObjectTest, WaitRejectsMoreObjectsThanGiven) {
  std::vector<ray::ObjectRef<int>> refs = {ray::Put(1)};
  EXPECT_THROW(ray::Wait(refs, 2, 100), ray::internal::RayException);
}

TEST_F(ObjectTest, LargeValueOnTheSameNode) {
  // Produced and consumed on node A: the consumer reads it from the node's shared memory.
  ray::ObjectRef<std::vector<uint8_t>> big =
      ray::Task(ObjMakeBytes).SetResource("node_a", 1).Remote(k8MiB, 1);
  auto [where, sum] =
      *ray::Task(ObjChecksum).SetResource("node_a", 1).Remote(big).Get(kGetTimeoutMs);
  EXPECT_EQ(where, shape.a.node_id);
  EXPECT_EQ(sum, Fnv(Pattern(k8MiB, 1)));
  // While referenced it is listed in node A's object store.
  bool listed = false;
  for (const auto& o : cluster().ListJson("objects")) {
    if (o.value("node_id", "") == shape.a.node_id && o.value("size_bytes", 0ll) >= k8MiB) {
      listed = true;
    }
  }
  EXPECT_TRUE(listed) << cluster().Torus({"list", "objects"}).out;
}

TEST_F(ObjectTest, LargeValueAcrossNodes) {
  ray::ObjectRef<std::vector<uint8_t>> big =
      ray::Task(ObjMakeBytes).SetResource("node_a", 1).Remote(k8MiB, 2);
  auto [where_b, sum_b] =
      *ray::Task(ObjChecksum).SetResource("node_b", 1).Remote(big).Get(kGetTimeoutMs);
  EXPECT_EQ(where_b, shape.b.node_id);
  EXPECT_EQ(sum_b, Fnv(Pattern(k8MiB, 2)));
  auto [where_h, sum_h] =
      *ray::Task(ObjChecksum).SetResource("head_res", 1).Remote(big).Get(kGetTimeoutMs);
  EXPECT_EQ(where_h, shape.head.node_id);
  EXPECT_EQ(sum_h, sum_b);
  // And into the driver.
  std::shared_ptr<std::vector<uint8_t>> local = big.Get(kGetTimeoutMs);
  ASSERT_EQ(local->size(), static_cast<size_t>(k8MiB));
  EXPECT_EQ(Fnv(*local), sum_b);
}

TEST_F(ObjectTest, LargePutReadByTasksOnEveryNode) {
  std::vector<uint8_t> data = Pattern(k8MiB, 3);
  ray::ObjectRef<std::vector<uint8_t>> ref = ray::Put(data);
  for (const char* res : {"head_res", "node_a", "node_b"}) {
    auto [where, sum] = *ray::Task(ObjChecksum).SetResource(res, 1).Remote(ref).Get(kGetTimeoutMs);
    EXPECT_EQ(sum, Fnv(data)) << "on " << res << " (" << where << ")";
  }
  EXPECT_EQ(Fnv(*ref.Get()), Fnv(data));
}

TEST_F(ObjectTest, LargeArgumentByValue) {
  std::vector<uint8_t> data = Pattern(300 << 10, 4);
  auto [where, sum] =
      *ray::Task(ObjChecksum).SetResource("node_b", 1).Remote(data).Get(kGetTimeoutMs);
  EXPECT_EQ(where, shape.b.node_id);
  EXPECT_EQ(sum, Fnv(data));
}

TEST_F(ObjectTest, ValuesAroundTheSharedMemoryThreshold) {
  // 100 KiB is where values move from inline to shared memory; both sides must round-trip.
  for (int64_t n : {int64_t{100 << 10} - 64, int64_t{100 << 10} - 1, int64_t{100 << 10},
                    int64_t{100 << 10} + 1}) {
    auto made = ray::Task(ObjMakeBytes).SetResource("node_a", 1).Remote(n, 5);
    auto [where, sum] =
        *ray::Task(ObjChecksum).SetResource("node_b", 1).Remote(made).Get(kGetTimeoutMs);
    EXPECT_EQ(sum, Fnv(Pattern(n, 5))) << "size " << n;
    EXPECT_EQ(made.Get(kGetTimeoutMs)->size(), static_cast<size_t>(n));
    auto put = ray::Put(Pattern(n, 6));
    EXPECT_EQ(Fnv(*put.Get()), Fnv(Pattern(n, 6))) << "size " << n;
  }
}

// ------------------------------------------------------------------------------- shared memory

// Bytes of this cluster's nodes' object stores as `torus list objects` reports them.
uint64_t ListedObjectBytes(const TestCluster& c) {
  uint64_t total = 0;
  for (const auto& o : c.ListJson("objects")) total += o.value("size_bytes", 0ull);
  return total;
}

struct ShmUsage {
  size_t segments = 0;     // /dev/shm files of the cluster's nodes
  uint64_t resident = 0;   // bytes they occupy (allocated blocks, not apparent size)
};

ShmUsage ClusterShm(const TestCluster& c) {
  ShmUsage u;
  for (const auto& n : c.nodes()) {
    for (const auto& seg : ShmSegments("torus." + n.node_id.substr(0, 12) + ".")) {
      struct stat st;
      if (stat(("/dev/shm/" + seg).c_str(), &st) != 0) continue;
      ++u.segments;
      u.resident += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  return u;
}

struct SharedMemoryTest : ClusterTest<SharedMemoryTest> {
  static constexpr const char* kName = "shm";
  static inline NodeInfo other;
  static void Build(TestCluster& c) {
    c.StartHead(2, {{"head_res", 100}});
    NodeSpec s;
    s.num_cpus = 1;
    s.resources = {{"other_node", 100}};
    other = c.AddNode(s);
  }
};

constexpr int64_t k64MiB = 64ll << 20;
constexpr int kPieces = 16;  // 16 x 64 MiB = 1 GiB

// Counts only this cluster's segments (/dev/shm/torus.<its node ids>.*): a machine-wide count of
// /dev/shm/torus.* also sees the clusters of whatever else runs on the machine meanwhile (another
// test run, a developer's cluster), which made an earlier version of this test flaky.
TEST_F(SharedMemoryTest, OneGibibytePutAndReleasedListingAndSegmentsReturn) {
  const uint64_t listed_before = ListedObjectBytes(cluster());
  const size_t segments_before = ClusterShm(cluster()).segments;
  {
    std::vector<ray::ObjectRef<std::vector<uint8_t>>> refs;
    std::vector<uint8_t> piece(static_cast<size_t>(k64MiB), 7);
    for (int i = 0; i < kPieces; ++i) {
      piece[0] = static_cast<uint8_t>(i);
      refs.push_back(ray::Put(piece));
    }
    EXPECT_GE(ListedObjectBytes(cluster()), listed_before + kPieces * k64MiB);
    EXPECT_EQ(refs[5].Get(kGetTimeoutMs)->at(0), 5);
  }
  // All references dropped: within a few seconds the store is back where it started.
  uint64_t listed_after = 0;
  EXPECT_TRUE(WaitUntil(
      [&] { return (listed_after = ListedObjectBytes(cluster())) == listed_before; },
      std::chrono::seconds(10)))
      << "listed object bytes " << listed_after << ", before " << listed_before;
  EXPECT_EQ(ClusterShm(cluster()).segments, segments_before);
}

// Its own cluster, so that "before" is a fresh node's store; its node keeps no freed pages
// resident (TORUS_OBJECT_STORE_RESIDENT_FREE_BYTES=0; by default freed ranges stay resident up
// to min(capacity/4, 2 GiB) so that large Puts do not page-fault, docs/object_store.md).
struct SharedMemoryResidentTest : ClusterTest<SharedMemoryResidentTest> {
  static constexpr const char* kName = "shmresident";
  static void Build(TestCluster& c) {
    setenv("TORUS_OBJECT_STORE_RESIDENT_FREE_BYTES", "0", 1);  // inherited by the daemons
    c.StartHead(1);
    unsetenv("TORUS_OBJECT_STORE_RESIDENT_FREE_BYTES");
  }
};

TEST_F(SharedMemoryResidentTest, OneGibibytePutAndReleasedResidentMemoryReturns) {
  // What the machine sees: bytes of /dev/shm the cluster's nodes occupy.
  const uint64_t resident_before = ClusterShm(cluster()).resident;
  {
    std::vector<ray::ObjectRef<std::vector<uint8_t>>> refs;
    std::vector<uint8_t> piece(static_cast<size_t>(k64MiB), 9);
    for (int i = 0; i < kPieces; ++i) refs.push_back(ray::Put(piece));
    EXPECT_GE(ClusterShm(cluster()).resident, uint64_t{kPieces} * k64MiB);
  }
  uint64_t resident_after = 0;
  EXPECT_TRUE(WaitUntil(
      [&] {
        resident_after = ClusterShm(cluster()).resident;
        return resident_after <= resident_before + (1 << 20);
      },
      std::chrono::seconds(10)))
      << "shared memory of the cluster's nodes: " << resident_after << " bytes resident, "
      << resident_before << " before 1 GiB was put and released";
}

TEST_F(SharedMemoryTest, TaskResultsPulledAcrossNodesAreReleased) {
  const uint64_t listed_before = ListedObjectBytes(cluster());
  {
    std::vector<ray::ObjectRef<std::vector<uint8_t>>> refs;
    for (int i = 0; i < 4; ++i) {
      refs.push_back(ray::Task(ObjMakeBytes).SetResource("other_node", 1).Remote(k64MiB, i));
    }
    // Pull each into the driver's node, and read each on the head's node by a task.
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(refs[i].Get(kGetTimeoutMs)->size(), static_cast<size_t>(k64MiB));
      auto r = ray::Task(ObjChecksum).SetResource("head_res", 1).Remote(refs[i]);
      EXPECT_EQ(r.Get(kGetTimeoutMs)->second, Fnv(Pattern(k64MiB, i)));
    }
    EXPECT_GE(ListedObjectBytes(cluster()), listed_before + 4 * k64MiB);
  }
  uint64_t listed_after = 0;
  EXPECT_TRUE(WaitUntil(
      [&] { return (listed_after = ListedObjectBytes(cluster())) == listed_before; },
      std::chrono::seconds(10)))
      << "listed object bytes " << listed_after << ", before " << listed_before << "\n"
      << cluster().Torus({"list", "objects"}).out;
}

}  // namespace
}  // namespace torus_test
