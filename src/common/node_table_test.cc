// The compact node entry (common/node_table.h): interned totals, available kept only while it
// differs, and records built back from an entry.
#include "common/node_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

namespace torus {
namespace {

rpc::NodeRecord Record(const std::string& id, const ResourceMap& total, const ResourceMap& available) {
  rpc::NodeRecord rec;
  rec.set_node_id(id);
  rec.set_address("10.0.0.1:7000");
  rec.set_hostname("host-" + id);
  for (const auto& [k, v] : total) (*rec.mutable_total()->mutable_units())[k] = ResourceAmount(v).units();
  for (const auto& [k, v] : available) (*rec.mutable_available()->mutable_units())[k] = ResourceAmount(v).units();
  (*rec.mutable_labels())["torus.io/node-id"] = id;
  (*rec.mutable_labels())["torus.io/hostname"] = "host-" + id;
  (*rec.mutable_labels())["zone"] = "a";
  return rec;
}

TEST(NodeTableTest, NodesOfOneShapeShareTheirTotalsAndOthersDoNot) {
  NamePool pool;
  NodeEntry a, b, c, d;
  SetFromRecord(pool, Record("a", {{"CPU", 8}, {"TPU", 4}}, {{"CPU", 8}, {"TPU", 4}}), &a);
  SetFromRecord(pool, Record("b", {{"TPU", 4}, {"CPU", 8}}, {{"CPU", 8}, {"TPU", 4}}), &b);
  SetFromRecord(pool, Record("c", {{"CPU", 8}, {"TPU", 4}, {"TPU-v6e-16-head", 1}}, {}), &c);
  SetFromRecord(pool, Record("d", {{"CPU", 8}, {"TPU", 2}}, {}), &d);
  EXPECT_EQ(a.total, b.total);  // one copy, whatever order the record listed them in
  EXPECT_NE(a.total, c.total);
  EXPECT_NE(a.total, d.total);
  EXPECT_EQ(Amount(pool, a.Total(), "TPU"), 4);
  EXPECT_EQ(Amount(pool, c.Total(), "TPU-v6e-16-head"), 1);
  EXPECT_EQ(Amount(pool, d.Total(), "TPU"), 2);
  // Interning the same amounts again finds the same copy.
  CompactResources again;
  SetResources(pool, ResourceMap{{"CPU", 8}, {"TPU", 4}}, &again);
  EXPECT_EQ(pool.InternTotals(again), a.total);
  EXPECT_EQ(pool.InternTotals({}), pool.InternTotals({}));
}

TEST(NodeTableTest, TotalsNoNodeUsesAreFreedOnceThePoolDoubles) {
  NamePool pool;
  std::map<std::string, NodeEntry> nodes;
  size_t live = 0;
  // 200 hosts, each with totals of its own (say, a different memory size), come and go; one stays.
  SetFromRecord(pool, Record("keep", {{"CPU", 8}, {"memory", 1}}, {}), &nodes["keep"]);
  const CompactResources* kept = nodes["keep"].total;
  size_t most = 0;
  for (int i = 0; i < 200; ++i) {
    std::string id = "n" + std::to_string(i);
    SetFromRecord(pool, Record(id, {{"CPU", 8}, {"memory", 2.0 + i}}, {}), &nodes[id]);
    nodes.erase(id);
    SweepTotals(pool, nodes, &live);
    most = std::max(most, pool.TotalsSize());
  }
  EXPECT_LE(most, 2 * 1 + 64 + 1);  // bounded by the sweep's threshold, not by the 201 shapes seen
  EXPECT_EQ(nodes["keep"].total, kept);  // a shape in use is never freed
  EXPECT_EQ(Amount(pool, *kept, "memory"), 1);
  // A shape freed and seen again is interned afresh.
  NodeEntry again;
  SetFromRecord(pool, Record("again", {{"CPU", 8}, {"memory", 2}}, {}), &again);
  EXPECT_EQ(Amount(pool, again.Total(), "memory"), 2);
}

TEST(NodeTableTest, AvailableIsStoredOnlyWhileItDiffersFromTheTotals) {
  NamePool pool;
  NodeEntry n;
  SetFromRecord(pool, Record("n", {{"CPU", 8}}, {{"CPU", 8}}), &n);
  EXPECT_TRUE(n.AvailableIsTotal());
  EXPECT_EQ(&n.Available(), n.total);
  SetAvailable(pool, ResourceMap{{"CPU", 3}}, &n);
  ASSERT_FALSE(n.AvailableIsTotal());
  EXPECT_EQ(Amount(pool, n.Available(), "CPU"), 3);
  EXPECT_EQ(Amount(pool, n.Total(), "CPU"), 8);  // the shared totals are untouched
  SetAvailable(pool, ResourceMap{{"CPU", 5}}, &n);
  EXPECT_EQ(Amount(pool, n.Available(), "CPU"), 5);
  SetAvailable(pool, ResourceMap{{"CPU", 8}}, &n);
  EXPECT_TRUE(n.AvailableIsTotal());
}

TEST(NodeTableTest, RecordRoundTripsIdLabelsAndResources) {
  NamePool pool;
  NodeEntry n;
  rpc::NodeRecord in = Record("x1", {{"CPU", 8}, {"memory", 1e9}}, {{"CPU", 2}, {"memory", 1e9}});
  SetFromRecord(pool, in, &n);
  rpc::NodeRecord out;
  FillRecord(pool, "x1", n, /*full=*/true, &out);
  EXPECT_EQ(out.node_id(), "x1");
  EXPECT_EQ(out.address(), in.address());
  EXPECT_EQ(out.hostname(), in.hostname());
  EXPECT_EQ(out.labels().at("torus.io/node-id"), "x1");
  EXPECT_EQ(out.labels().at("torus.io/hostname"), "host-x1");
  EXPECT_EQ(out.labels().at("zone"), "a");
  EXPECT_EQ(out.total().units().at("CPU"), 8 * ResourceAmount::kUnitsPerWhole);
  EXPECT_EQ(out.total().units().at("memory"), ResourceAmount(1e9).units());
  EXPECT_EQ(out.available().units().at("CPU"), 2 * ResourceAmount::kUnitsPerWhole);
  EXPECT_TRUE(out.total().legacy_amounts().empty());
}

}  // namespace
}  // namespace torus
