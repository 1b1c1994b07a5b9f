#include "head/slice_idle.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "head/slice_index.h"
#include "head/slices.h"
#include "tpu/topology.h"

namespace torus {
namespace {

const std::string kPod = "v6e-16";  // 4 hosts of 4 chips
const std::string kHead = "TPU-v6e-16-head";

NodeView Host(int worker) {
  NodeView n;
  n.id = "s-n" + std::to_string(worker);
  n.total = {{"TPU", 4}, {"CPU", 8}};
  if (worker == 0) n.total[kHead] = 1;
  n.available = n.total;
  n.labels = {{std::string(tpu::kLabelPodType), kPod},
              {std::string(tpu::kLabelSliceName), "s"},
              {std::string(tpu::kLabelTopology), "4x4"},
              {std::string(tpu::kLabelWorkerId), std::to_string(worker)}};
  return n;
}

std::vector<NodeView> Slice() { return {Host(0), Host(1), Host(2), Host(3)}; }

// Idle as the slice query sees it (FindSlices over a node view).
bool QueryIdle(const std::vector<NodeView>& nodes) {
  auto shape = tpu::ComputeSliceShape("v6e", "4x4", std::nullopt);
  EXPECT_TRUE(shape.ok());
  auto slices = FindSlices(nodes, *shape, std::nullopt);
  EXPECT_EQ(slices.size(), 1u);
  return !slices.empty() && slices[0].idle;
}

// Idle as placement sees it (the head's live SliceIndex, fed as the head feeds it).
bool IndexIdle(const std::vector<NodeView>& nodes) {
  static std::set<std::string> ids;  // the index views node ids: they outlive it
  SliceIndex idx;
  for (const auto& n : nodes) {
    SliceHostInfo info = MakeSliceHostInfo(n.labels.at(std::string(tpu::kLabelPodType)),
                                           n.labels.at(std::string(tpu::kLabelSliceName)),
                                           n.labels.at(std::string(tpu::kLabelTopology)),
                                           n.labels.at(std::string(tpu::kLabelWorkerId)),
                                           SliceHostUseOf(n, kPod));
    idx.Upsert(*ids.insert(n.id).first, info);
  }
  bool idle = idx.FirstIdle(kPod, "", [](const SliceIndex::Slice&) { return true; }) != nullptr;
  const SliceIndex::Slice* s = idx.Find("s");
  EXPECT_EQ(idle, s && s->idle);
  return idle;
}

TEST(SliceIdleRuleTest, PlacementAndQueryAgreeOnEveryCase) {
  struct Case {
    const char* what;
    std::vector<NodeView> nodes;
    bool idle;
  };
  std::vector<Case> cases;
  cases.push_back({"all free", Slice(), true});
  auto chip = Slice();
  chip[2].available["TPU"] = 3;
  cases.push_back({"one chip in use on worker 2", chip, false});
  auto head = Slice();
  head[0].available[kHead] = 0;
  cases.push_back({"head unit taken on worker 0", head, false});
  auto other_head = Slice();
  other_head[1].total[kHead] = 1;
  other_head[1].available[kHead] = 0;
  cases.push_back({"a head unit on worker 1 does not count", other_head, true});
  auto dust = Slice();
  dust[3].available["TPU"] = 4 - 1e-12;
  cases.push_back({"rounding dust is free", dust, true});
  auto cpu = Slice();
  cpu[1].available["CPU"] = 0;
  cases.push_back({"CPU in use does not make a host busy", cpu, true});
  for (const auto& c : cases) {
    EXPECT_EQ(QueryIdle(c.nodes), c.idle) << c.what;
    EXPECT_EQ(IndexIdle(c.nodes), c.idle) << c.what;
  }
}

TEST(SliceIdleRuleTest, HostBusyCountsTheHeadUnitOnlyOnWorkerZero) {
  SliceHostUse u{4, 4, 1, 0};
  EXPECT_TRUE(SliceIdleRule::ChipsFree(u));
  EXPECT_FALSE(SliceIdleRule::HeadFree(u));
  EXPECT_TRUE(SliceIdleRule::HostBusy(0, u));
  EXPECT_FALSE(SliceIdleRule::HostBusy(1, u));
  EXPECT_TRUE(SliceIdleRule::HeadFree({4, 4, 0, 0}));  // no head unit at all
  EXPECT_TRUE(SliceIdleRule::HostBusy(2, {4, 3.5, 0, 0}));
  EXPECT_FALSE(SliceIdleRule::SliceIdle(false, 0));
  EXPECT_FALSE(SliceIdleRule::SliceIdle(true, 1));
  EXPECT_TRUE(SliceIdleRule::SliceIdle(true, 0));
  EXPECT_EQ(SliceIdleRule::HeadUnit("v5p-64"), "TPU-v5p-64-head");
}

}  // namespace
}  // namespace torus
