#include "node/peer_view.h"

#include <gtest/gtest.h>

#include <thread>

namespace torus {
namespace {

rpc::NodeRecord Record(const std::string& id, double cpu_total, double cpu_free,
                       std::map<std::string, std::string> labels = {}, bool alive = true) {
  rpc::NodeRecord r;
  r.set_node_id(id);
  r.set_address(id + ":7000");
  r.set_alive(alive);
  (*r.mutable_total()->mutable_units())["CPU"] = ResourceAmount(cpu_total).units();
  (*r.mutable_available()->mutable_units())["CPU"] = ResourceAmount(cpu_free).units();
  for (const auto& [k, v] : labels) (*r.mutable_labels())[k] = v;
  return r;
}

std::string Pick(const PeerView& v, double cpu, LabelSelectorTerms sel = {}, bool or_capacity = false) {
  auto t = v.Pick({{"CPU", cpu}}, sel, or_capacity);
  return t ? t->node_id + "@" + t->address : "";
}

TEST(PeerViewTest, PicksTheLeastLoadedOtherNodeAndSpreadsABurst) {
  PeerView v("self");
  rpc::ListReply snap;
  *snap.add_nodes() = Record("self", 8, 8);
  *snap.add_nodes() = Record("a", 8, 2);
  *snap.add_nodes() = Record("b", 8, 3);
  *snap.add_nodes() = Record("dead", 8, 8, {}, /*alive=*/false);
  v.ApplySnapshot(snap);
  EXPECT_EQ(v.size(), 2u);  // neither itself nor a dead node
  EXPECT_EQ(Pick(v, 1), "b@b:7000");
  v.Charge("b", {{"CPU", 2}});  // b now has 1 free, a 2
  EXPECT_EQ(Pick(v, 1), "a@a:7000");
  EXPECT_EQ(Pick(v, 3), "");
  EXPECT_EQ(Pick(v, 3, {}, /*or_capacity=*/true), "a@a:7000");
  EXPECT_TRUE(v.AnyCouldFit({{"CPU", 8}}, {}));
  EXPECT_FALSE(v.AnyCouldFit({{"CPU", 9}}, {}));
}

TEST(PeerViewTest, SpreadGoesToARoomierNodeOnlyWhenItHasMoreRoomThanThisOne) {
  PeerView v("self");
  rpc::ListReply snap;
  *snap.add_nodes() = Record("a", 4, 4);
  *snap.add_nodes() = Record("b", 4, 2);
  v.ApplySnapshot(snap);
  auto roomier = [&](double local_free, double cpu = 1) {
    auto t = v.PickRoomier({{"CPU", cpu}}, {}, {{"CPU", local_free}});
    return t ? t->node_id : "";
  };
  EXPECT_EQ(roomier(4), "");   // a tie: it stays here
  EXPECT_EQ(roomier(3), "a");  // a has room for 4 such tasks, this node for 3
  EXPECT_EQ(roomier(0), "a");
  v.Charge("a", {{"CPU", 3}});  // a: 1 free, b: 2
  EXPECT_EQ(roomier(1), "b");
  EXPECT_EQ(roomier(0, 3), "");  // no other node can run it now
  // Room is the least over the request's resources: b has CPU but no GPU.
  EXPECT_EQ(v.PickRoomier({{"CPU", 1}, {"GPU", 1}}, {}, {{"CPU", 0}}).has_value(), false);
}

TEST(PeerViewTest, DeltasReplaceDropAndRelabelNodesAndASnapshotForgetsTheRest) {
  PeerView v("self");
  rpc::ListReply snap;
  *snap.add_nodes() = Record("a", 4, 4, {{"zone", "x"}});
  *snap.add_nodes() = Record("b", 4, 4, {{"zone", "y"}});
  v.ApplySnapshot(snap);
  auto zone_y = ParseLabelSelector({{"zone", "y"}});
  ASSERT_TRUE(zone_y.ok());
  EXPECT_EQ(Pick(v, 1, *zone_y), "b@b:7000");
  rpc::HeartbeatReply delta;
  delta.set_view_delta(true);
  *delta.add_nodes() = Record("a", 4, 4, {{"zone", "y"}});  // a registered again elsewhere
  delta.add_removed_node_ids("b");
  v.ApplyDelta(delta);
  EXPECT_EQ(Pick(v, 1, *zone_y), "a@a:7000");
  auto zone_x = ParseLabelSelector({{"zone", "x"}});
  ASSERT_TRUE(zone_x.ok());
  EXPECT_EQ(Pick(v, 1, *zone_x), "");  // a's old label is gone from the index
  rpc::ListReply only_c;
  *only_c.add_nodes() = Record("c", 2, 2);
  v.ApplySnapshot(only_c);
  EXPECT_EQ(v.size(), 1u);
  EXPECT_EQ(Pick(v, 1), "c@c:7000");
}

TEST(PeerViewTest, AChargeOutlivesAViewOfTheNodeFromBeforeTheLeaseWasGranted) {
  PeerView v("self");
  rpc::HeartbeatReply delta;
  *delta.add_nodes() = Record("a", 4, 4);
  *delta.add_nodes() = Record("b", 4, 4);
  v.ApplyDelta(delta);
  auto roomier = [&](double local_free) {
    auto t = v.PickRoomier({{"CPU", 1}}, {}, {{"CPU", local_free}});
    return t ? t->node_id : "";
  };
  EXPECT_EQ(roomier(3), "a");
  v.Charge("a", {{"CPU", 1}});
  v.ApplyDelta(delta);  // a's state as the head had it before the spilled lease got there
  EXPECT_EQ(roomier(3), "b");  // a: 3 free, charged still; b: 4
  v.Charge("b", {{"CPU", 1}});
  EXPECT_EQ(roomier(3), "");
  std::this_thread::sleep_for(PeerView::kChargeHold + std::chrono::milliseconds(20));
  rpc::HeartbeatReply later;  // the head's views after both grants
  *later.add_nodes() = Record("a", 4, 3);
  *later.add_nodes() = Record("b", 4, 3);
  v.ApplyDelta(later);
  EXPECT_NE(roomier(2), "");  // the charges expired: each grant counted once, not twice
}

}  // namespace
}  // namespace torus
