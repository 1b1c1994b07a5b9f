// TPU slice reservations on simulated slices (issue 4): node processes started with the TPU
// environment GKE gives each host (TPU_NAME, TPU_WORKER_ID, TPU_ACCELERATOR_TYPE, TPU_TOPOLOGY)
// and TORUS_TPU_CHIPS standing in for /dev/accel*.
#include <gtest/gtest.h>

#include <cstdlib>
#include <ray/api.h>
#include <set>
#include <string>
#include <thread>
#include <torus/api.h>
#include <torus/tpu.h>
#include <vector>

#include "cluster_fixture.h"

using namespace torus_test;
namespace tpu = torus::tpu;

namespace {

std::string SliceHost() {
  auto get = [](const char* k) {
    const char* v = std::getenv(k);
    return std::string(v ? v : "-");
  };
  return get("TPU_NAME") + "/" + get("TPU_WORKER_ID") + "/" + get("TORUS_NODE_ID");
}
RAY_REMOTE(SliceHost);

std::string SleepThenHost(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return SliceHost();
}
RAY_REMOTE(SleepThenHost);

// MEGASCALE_* as a process in a bundle sees them ("-" when unset).
std::string Megascale() {
  std::string out;
  for (const char* k : {"MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_PORT", "MEGASCALE_NUM_SLICES",
                        "MEGASCALE_SLICE_ID"}) {
    const char* v = std::getenv(k);
    out += std::string(v ? v : "-") + "|";
  }
  return out;
}
RAY_REMOTE(Megascale);

NodeSpec Host(const std::string& slice, int worker, const std::string& pod, const std::string& topo,
              int chips) {
  NodeSpec s;
  s.num_cpus = 2;
  s.env = {{"TPU_NAME", slice},           {"TPU_WORKER_ID", std::to_string(worker)},
           {"TPU_ACCELERATOR_TYPE", pod}, {"TPU_TOPOLOGY", topo},
           {"TORUS_TPU_CHIPS", std::to_string(chips)}, {"TORUS_TPU_METADATA_URL", "off"}};
  return s;
}

// Three intact v6e 4x4 slices: 12 hosts of 4 chips.
struct ThreeV6eSlices : ClusterTest<ThreeV6eSlices> {
  static constexpr const char* kName = "slices";
  static void Build(TestCluster& c) {
    c.StartHead(1);
    for (int s = 0; s < 3; ++s) {
      for (int w = 0; w < 4; ++w) c.AddNode(Host("v6e-slice-" + std::to_string(s), w, "v6e-16", "4x4", 4));
    }
  }
};

tpu::SliceOptions V6e4x4() {
  tpu::SliceOptions o;
  o.topology = "4x4";
  o.accelerator_version = "v6e";
  return o;
}

TEST_F(ThreeV6eSlices, TwentyRequestsGetExactlyThreeSlicesAndRemovalAdmitsOne) {
  EXPECT_EQ(tpu::GetNumIntactSlices("4x4", "v6e"), 3);
  EXPECT_EQ(tpu::GetNumReadySlices("4x4", "v6e"), 3);
  std::vector<tpu::SlicePlacementGroup> reqs(20);
  std::vector<std::thread> threads;
  for (int i = 0; i < 20; ++i) threads.emplace_back([&, i] { reqs[i] = tpu::CreateSlicePlacementGroup(V6e4x4()); });
  for (auto& t : threads) t.join();
  auto ready = [&] {
    int n = 0;
    for (auto& r : reqs) n += r.Wait(0);
    return n;
  };
  ASSERT_TRUE(WaitUntil([&] { return ready() == 3; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(ready(), 3);
  EXPECT_EQ(tpu::GetNumReadySlices("4x4", "v6e"), 0);
  // The waiting 17 hold nothing: no bundle of theirs is placed anywhere.
  std::set<std::string> granted;
  for (auto& r : reqs) {
    if (!r.Wait(0)) {
      for (const auto& name : r.SliceNames()) EXPECT_EQ(name, "");
      continue;
    }
    auto names = r.SliceNames();
    ASSERT_EQ(names.size(), 1u);
    EXPECT_TRUE(granted.insert(names[0]).second) << "slice granted twice: " << names[0];
  }
  EXPECT_EQ(granted.size(), 3u);
  // Every bundle lies on a distinct host of one slice; a task in bundle i sees that host's
  // TPU_NAME and TPU_WORKER_ID.
  for (auto& r : reqs) {
    if (!r.Wait(0)) continue;
    std::string slice = r.SliceNames()[0];
    std::set<std::string> nodes;
    for (int i = 0; i < r.NumBundles(); ++i) {
      auto h = *ray::Get(ray::Task(SliceHost)
                             .SetResources({{"TPU", 4}, {"CPU", 1}})
                             .SetPlacementGroup(r.GetPlacementGroup(), i)
                             .Remote(),
                         kGetTimeoutMs);
      EXPECT_EQ(h.substr(0, h.rfind('/')), slice + "/" + std::to_string(i));
      nodes.insert(h.substr(h.rfind('/') + 1));
    }
    EXPECT_EQ(nodes.size(), 4u);
    break;
  }
  // Removing one admits exactly one waiter.
  for (auto& r : reqs) {
    if (r.Wait(0)) {
      r.Remove();
      break;
    }
  }
  EXPECT_TRUE(WaitUntil([&] {
    int n = 0;
    for (auto& r : reqs) {
      try {
        n += r.Wait(0);
      } catch (const ray::internal::RayException&) {  // the removed one
      }
    }
    return n == 3;
  }));
  for (auto& r : reqs) r.Remove();
}

TEST_F(ThreeV6eSlices, BusyChipMakesSliceNotReadyAndRequestsAvoidIt) {
  // Start from three ready slices (the previous test's reservations are released by their
  // handles' destructors), or "2 ready" below could be a leftover, not our busy chip.
  ASSERT_TRUE(WaitUntil([&] { return tpu::GetNumReadySlices("4x4", "v6e") == 3; }));
  // Hold 1 chip on host 2 of slice 0 with a long task pinned by label selector.
  auto busy = ray::Task(SleepThenHost)
                  .SetResources({{"TPU", 1}, {"CPU", 1}})
                  .SetLabelSelector({{"ray.io/tpu-slice-name", "v6e-slice-0"}, {"torus.io/tpu-worker-id", "2"}})
                  .Remote(4000);
  ASSERT_TRUE(WaitUntil([&] { return tpu::GetNumReadySlices("4x4", "v6e") == 2; }));
  EXPECT_EQ(tpu::GetNumIntactSlices("4x4", "v6e"), 3);
  auto a = tpu::CreateSlicePlacementGroup(V6e4x4());
  auto b = tpu::CreateSlicePlacementGroup(V6e4x4());
  ASSERT_TRUE(a.Wait(30));
  ASSERT_TRUE(b.Wait(30));
  std::set<std::string> names = {a.SliceNames()[0], b.SliceNames()[0]};
  EXPECT_EQ(names, (std::set<std::string>{"v6e-slice-1", "v6e-slice-2"}));
  EXPECT_EQ(ray::Get(busy, kGetTimeoutMs)->substr(0, 14), "v6e-slice-0/2/");
  a.Remove();
  b.Remove();
}

TEST_F(ThreeV6eSlices, DroppingTheLastHandleFreesTheSlice) {
  ASSERT_TRUE(WaitUntil([&] { return tpu::GetNumReadySlices("4x4", "v6e") == 3; }));
  {
    auto a = tpu::CreateSlicePlacementGroup(V6e4x4());
    ASSERT_TRUE(a.Wait(30));
    auto copy = a;
    EXPECT_EQ(tpu::GetNumReadySlices("4x4", "v6e"), 2);
  }
  EXPECT_TRUE(WaitUntil([&] { return tpu::GetNumReadySlices("4x4", "v6e") == 3; }));
}

TEST_F(ThreeV6eSlices, InvalidOptionsThrowTheSpecsMessages) {
  auto expect_msg = [](tpu::SliceOptions o, const std::string& part) {
    try {
      tpu::CreateSlicePlacementGroup(o);
      ADD_FAILURE() << "no exception for " << o.topology << " " << o.accelerator_version;
    } catch (const ray::internal::RayException& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  auto o = V6e4x4();
  o.topology = "4x16";
  expect_msg(o, "Invalid accelerator topology: '4x16' for accelerator version: 'v6e'");
  o = V6e4x4();
  o.accelerator_version = "A100";
  expect_msg(o, "Invalid accelerator_type");
  o = V6e4x4();
  o.resources_per_bundle = {{"TPU", 3}};
  expect_msg(o, "uneven distribution");
  o = V6e4x4();
  o.bundle_label_selectors = {{{"torus.io/tpu-worker-id", "1"}}};
  expect_msg(o, "tpu-worker-id");
  EXPECT_THROW(ray::Task(SliceHost).SetResource("TPU", 3).Remote(), ray::internal::RayException);
}

TEST_F(ThreeV6eSlices, MultisliceIsAllOrNothing) {
  auto o = V6e4x4();
  o.num_slices = 2;
  auto two = tpu::CreateSlicePlacementGroup(o);
  ASSERT_TRUE(two.Wait(30));
  auto names = two.SliceNames();
  ASSERT_EQ(names.size(), 2u);
  EXPECT_NE(names[0], names[1]);
  EXPECT_EQ(two.NumBundles(), 8);
  // Spec section 7 "Multislice": every process in a bundle gets MEGASCALE_* naming host 0 of
  // slice 0, port 8081, the number of slices and its bundle's slice index.
  auto pg = two.GetPlacementGroup();
  std::string node0, coordinator;
  for (const auto& p : cluster().ListJson("placement-groups")) {
    if (p.value("placement_group_id", "") == pg.GetID()) node0 = p["bundles"][0].value("node_id", "");
  }
  for (const auto& n : cluster().ListJson("nodes")) {
    if (!node0.empty() && n.value("node_id", "") == node0) {
      std::string addr = n.value("address", "");
      coordinator = addr.substr(0, addr.rfind(':'));
    }
  }
  ASSERT_FALSE(coordinator.empty());
  for (int b : {0, 5}) {
    auto env = ray::Task(Megascale).SetPlacementGroup(pg, b).SetResource("TPU", 4).Remote();
    EXPECT_EQ(*env.Get(kGetTimeoutMs), coordinator + "|8081|2|" + std::to_string(b / 4) + "|")
        << "bundle " << b;
  }
  // Only one slice is left: a second 2-slice request holds nothing while it waits.
  auto more = tpu::CreateSlicePlacementGroup(o);
  EXPECT_FALSE(more.Wait(1));
  EXPECT_EQ(tpu::GetNumReadySlices("4x4", "v6e"), 1);
  two.Remove();
  EXPECT_TRUE(more.Wait(30));
  more.Remove();
}

// Two v4 2x2x2 slices (2 hosts each): losing a host of a reserved slice fails its work with the
// slice-lost error and re-reserves the whole slice on the other one.
struct TwoV4Slices : ClusterTest<TwoV4Slices> {
  static constexpr const char* kName = "v4slices";
  static void Build(TestCluster& c) {
    c.StartHead(1);
    for (int s = 0; s < 2; ++s) {
      for (int w = 0; w < 2; ++w) {
        NodeSpec spec = Host("v4-s" + std::to_string(s), w, "v4-16", "2x2x2", 4);
        spec.block = true;  // ours to kill
        c.AddNode(spec);
      }
    }
  }
};

TEST_F(TwoV4Slices, LosingAHostFailsWorkWithSliceLostAndRegrantsElsewhere) {
  tpu::SliceOptions o;
  o.topology = "2x2x2";
  o.accelerator_version = "TPU-V4";
  auto r = tpu::CreateSlicePlacementGroup(o);
  ASSERT_TRUE(r.Wait(30));
  EXPECT_EQ(r.NumBundles(), 2);
  EXPECT_EQ(r.ChipsPerHost(), 4);
  EXPECT_EQ(r.PodType(), "v4-16");
  std::string first = r.SliceNames()[0];
  EXPECT_EQ(r.Epoch(), 0);
  // A long task on host 0 of the slice; then host 1 dies.
  auto running = ray::Task(SleepThenHost)
                     .SetResources({{"TPU", 4}, {"CPU", 1}})
                     .SetPlacementGroup(r.GetPlacementGroup(), 0)
                     .SetMaxRetries(0)
                     .Remote(20000);
  ASSERT_TRUE(WaitUntil([&] {
    for (const auto& w : cluster().ListJson("workers")) {
      if (w.value("state", "") == "leased") return true;
    }
    return false;
  }));
  auto victim_ids = tpu::GetSliceNodes(first);
  ASSERT_EQ(victim_ids.size(), 2u);
  for (const auto& n : cluster().nodes()) {
    if (n.node_id == victim_ids[1]) cluster().KillNode(n);
  }
  try {
    ray::Get(running, kGetTimeoutMs);
    ADD_FAILURE() << "work on a lost slice must fail";
  } catch (const ray::internal::RaySliceLostException& e) {
    EXPECT_NE(std::string(e.what()).find(first), std::string::npos) << e.what();
  }
  ASSERT_TRUE(WaitUntil([&] { return r.Wait(0) && r.SliceNames()[0] != "" && r.SliceNames()[0] != first; },
                        std::chrono::seconds(30)));
  EXPECT_EQ(r.Epoch(), 1);
  auto h = *ray::Get(ray::Task(SliceHost)
                         .SetResources({{"TPU", 4}, {"CPU", 1}})
                         .SetPlacementGroup(r.GetPlacementGroup(), 1)
                         .Remote(),
                     kGetTimeoutMs);
  EXPECT_EQ(h.substr(0, h.rfind('/')), r.SliceNames()[0] + "/1");
  r.Remove();
}

// Single-host (v6e 2x4 as one 8-chip VM) and 3D (v7x 2x2x2) slices.
struct SmallSlices : ClusterTest<SmallSlices> {
  static constexpr const char* kName = "smallslices";
  static void Build(TestCluster& c) {
    c.StartHead(1);
    c.AddNode(Host("single", 0, "v6e-8", "2x4", 8));
    c.AddNode(Host("x7", 0, "tpu7x-16", "2x2x2", 4));
    c.AddNode(Host("x7", 1, "tpu7x-16", "2x2x2", 4));
  }
};

TEST_F(SmallSlices, SingleHostAnd3DSlicesWork) {
  tpu::SliceOptions a;
  a.topology = "2x4";
  a.accelerator_version = "v6e";
  auto one = tpu::CreateSlicePlacementGroup(a);
  ASSERT_TRUE(one.Wait(30));
  EXPECT_EQ(one.NumBundles(), 1);
  EXPECT_EQ(one.ChipsPerHost(), 8);
  EXPECT_EQ(one.SliceNames()[0], "single");
  a.chips_per_vm = 4;  // two 4-chip VMs: no such hosts here
  a.timeout_s = 1;
  auto never = tpu::CreateSlicePlacementGroup(a);
  EXPECT_THROW(never.Wait(10), ray::internal::RayException);
  tpu::SliceOptions x;
  x.topology = "2x2x2";
  x.accelerator_version = "tpu7x";
  auto three_d = tpu::CreateSlicePlacementGroup(x);
  ASSERT_TRUE(three_d.Wait(30));
  EXPECT_EQ(three_d.NumBundles(), 2);
  EXPECT_EQ(three_d.PodType(), "v7x-16");
  EXPECT_EQ(tpu::GetSliceNodes("x7").size(), 2u);
  EXPECT_TRUE(tpu::GetSliceNodes("nope").empty());
  one.Remove();
  three_d.Remove();
}

}  // namespace
