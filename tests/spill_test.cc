// Spilling (docs/object_store.md): a node whose object store (--object-store-memory) is full
// moves values nobody is reading to disk and brings them back when they are read, so Puts and
// large task results beyond the store's size succeed and every value reads back intact, on its
// own node and from other nodes; dropping the references removes the spill files; with the spill
// disk full too, Put fails and says so, and the cluster keeps serving.
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <ray/api.h>
#include <string>
#include <vector>

#include "cluster_fixture.h"
#include "test_values.h"

std::vector<uint8_t> SpillMakeBytes(int64_t n, int seed) { return torus_test::Pattern(n, seed); }
uint64_t SpillChecksum(std::vector<uint8_t> v) { return torus_test::Fnv(v); }

RAY_REMOTE(SpillMakeBytes, SpillChecksum);

namespace torus_test {
namespace {

namespace fs = std::filesystem;

constexpr int64_t k16MiB = 16ll << 20;
const std::string kStore = std::to_string(64ll << 20);  // 64 MiB: three 16 MiB values fit

// Spill files (*.spill) under `dir`.
size_t SpillFiles(const std::string& dir) {
  size_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->path().extension() == ".spill") ++n;
  }
  return n;
}

// Objects `torus list objects` reports spilled.
size_t ListedSpilled(const TestCluster& c) {
  size_t n = 0;
  for (const auto& o : c.ListJson("objects")) n += o.value("spilled", false) ? 1 : 0;
  return n;
}

struct SpillTest : ClusterTest<SpillTest> {
  static constexpr const char* kName = "spill";
  static inline NodeInfo other;
  static inline std::string head_spill, other_spill;
  static void Build(TestCluster& c) {
    head_spill = c.tmpdir() + "/spill-head";
    other_spill = c.tmpdir() + "/spill-other";
    c.StartHead(2, {{"head_res", 100}}, {},
                {"--object-store-memory", kStore, "--object-spilling-directory", head_spill});
    NodeSpec s;
    s.num_cpus = 2;
    s.resources = {{"other_node", 100}};
    s.flags = {"--object-store-memory", kStore, "--spill-dir", other_spill};
    other = c.AddNode(s);
  }
};

TEST_F(SpillTest, PutsBeyondTheStoreSpillAndReadBackIntact) {
  constexpr int kN = 10;  // 160 MiB into a 64 MiB store
  {
    std::vector<ray::ObjectRef<std::vector<uint8_t>>> refs;
    for (int i = 0; i < kN; ++i) refs.push_back(ray::Put(Pattern(k16MiB, i)));
    EXPECT_GE(SpillFiles(head_spill), static_cast<size_t>(kN - 3));
    EXPECT_GE(ListedSpilled(cluster()), static_cast<size_t>(kN - 3));
    std::string status = cluster().Status();
    EXPECT_NE(status.find("spilled"), std::string::npos) << status;
    EXPECT_EQ(status.find(" 0 B spilled"), std::string::npos) << status;
    // Read every one back on this node (restored), twice, in an order that makes them trade places.
    for (int round = 0; round < 2; ++round) {
      for (int i = kN - 1; i >= 0; --i) {
        EXPECT_EQ(Fnv(*refs[i].Get(kGetTimeoutMs)), Fnv(Pattern(k16MiB, i))) << "value " << i;
      }
    }
    // And on the other node, by tasks (pulled from the head node's store or its spill files).
    for (int i = 0; i < kN; ++i) {
      auto sum = ray::Task(SpillChecksum).SetResource("other_node", 1).Remote(refs[i]);
      EXPECT_EQ(*sum.Get(kGetTimeoutMs), Fnv(Pattern(k16MiB, i))) << "value " << i;
    }
  }
  // References gone: the spill files go too.
  EXPECT_TRUE(WaitUntil([&] { return SpillFiles(head_spill) == 0 && SpillFiles(other_spill) == 0; },
                        std::chrono::seconds(15)))
      << SpillFiles(head_spill) << " + " << SpillFiles(other_spill) << " spill files left";
  EXPECT_TRUE(WaitUntil([&] { return ListedSpilled(cluster()) == 0; }, std::chrono::seconds(15)));
}

TEST_F(SpillTest, TaskResultsBeyondTheStoreSpillOnTheirNode) {
  constexpr int kN = 8;  // 128 MiB of results made on the other node (64 MiB store)
  std::vector<ray::ObjectRef<std::vector<uint8_t>>> refs;
  for (int i = 0; i < kN; ++i) {
    refs.push_back(ray::Task(SpillMakeBytes).SetResource("other_node", 1).Remote(k16MiB, 100 + i));
  }
  for (int i = 0; i < kN; ++i) ray::Wait(std::vector<ray::ObjectRef<std::vector<uint8_t>>>{refs[i]}, 1, kGetTimeoutMs);
  EXPECT_GE(SpillFiles(other_spill), 1u);
  for (int i = 0; i < kN; ++i) {
    // Read on the other node (restored there) and pulled to this one.
    auto sum = ray::Task(SpillChecksum).SetResource("other_node", 1).Remote(refs[i]);
    EXPECT_EQ(*sum.Get(kGetTimeoutMs), Fnv(Pattern(k16MiB, 100 + i))) << "result " << i;
    EXPECT_EQ(Fnv(*refs[i].Get(kGetTimeoutMs)), Fnv(Pattern(k16MiB, 100 + i))) << "result " << i;
  }
}

// The spill directory on a 40 MiB tmpfs: once it is full as well, Put fails naming the disk;
// the values stored before read back once room is made.
struct SpillDiskFullTest : ClusterTest<SpillDiskFullTest> {
  static constexpr const char* kName = "spillfull";
  static inline std::string spill;
  static inline bool mounted = false;
  static void Build(TestCluster& c) {
    spill = c.tmpdir() + "/small-disk";
    mkdir(spill.c_str(), 0700);
    mounted = geteuid() == 0 && mount("tmpfs", spill.c_str(), "tmpfs", 0, "size=40m") == 0;
    c.StartHead(1, {}, {}, {"--object-store-memory", kStore, "--object-spilling-directory", spill});
  }
  static void TearDownTestSuite() {
    ClusterTest<SpillDiskFullTest>::TearDownTestSuite();
    if (mounted) umount2(spill.c_str(), MNT_DETACH);
  }
};

TEST_F(SpillDiskFullTest, PutFailsOnlyWhenTheDiskIsFullTooAndSaysSo) {
  if (!mounted) GTEST_SKIP() << "needs root to mount a small tmpfs";
  std::vector<ray::ObjectRef<std::vector<uint8_t>>> refs;
  std::string error;
  for (int i = 0; i < 12 && error.empty(); ++i) {  // 64 MiB store + 40 MiB disk < 12 x 16 MiB
    try {
      refs.push_back(ray::Put(Pattern(k16MiB, i)));
    } catch (const ray::internal::RayException& e) {
      error = e.what();
    }
  }
  ASSERT_FALSE(error.empty()) << "every Put succeeded";
  EXPECT_GE(refs.size(), 5u) << "spilling should have made room for more than the store holds";
  EXPECT_NE(error.find("spill"), std::string::npos) << error;
  EXPECT_NE(error.find("No space left on device"), std::string::npos) << error;
  // The newest values are the resident ones; with memory and disk both full a spilled value can
  // only come back once room is made, so drop those and read every other value back.
  ASSERT_GE(refs.size(), 4u);
  refs.resize(refs.size() - 3);
  for (size_t i = 0; i < refs.size(); ++i) {
    EXPECT_EQ(Fnv(*refs[i].Get(kGetTimeoutMs)), Fnv(Pattern(k16MiB, static_cast<int>(i)))) << i;
  }
  refs.clear();
  // Room again once those are gone.
  EXPECT_TRUE(WaitUntil([&] {
    try {
      auto r = ray::Put(Pattern(k16MiB, 99));
      return Fnv(*r.Get(kGetTimeoutMs)) == Fnv(Pattern(k16MiB, 99));
    } catch (const ray::internal::RayException&) {
      return false;
    }
  }));
}

}  // namespace
}  // namespace torus_test
