#include "head/placement.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

namespace torus {
namespace {

NodeView Node(const std::string& id, double cpu, std::map<std::string, std::string> labels = {}) {
  return {id, {{"CPU", cpu}}, {{"CPU", cpu}}, std::move(labels)};
}

BundleDemand Cpu(double cpu, int fixed = -1) { return {{{"CPU", cpu}}, {}, fixed}; }

TEST(PlacementTest, ParsesTheFourStrategiesOnly) {
  PgStrategy s;
  EXPECT_TRUE(ParsePgStrategy("STRICT_SPREAD", &s));
  EXPECT_EQ(s, PgStrategy::kStrictSpread);
  EXPECT_TRUE(ParsePgStrategy("PACK", &s));
  EXPECT_EQ(s, PgStrategy::kPack);
  EXPECT_FALSE(ParsePgStrategy("pack", &s));
  EXPECT_FALSE(ParsePgStrategy("", &s));
}

TEST(PlacementTest, StrictPackPutsEverythingOnOneNodeAndChargesIt) {
  std::vector<NodeView> nodes = {Node("a", 2), Node("b", 4)};
  auto placed = PlaceBundles({Cpu(2), Cpu(2)}, nodes, PgStrategy::kStrictPack);
  ASSERT_TRUE(placed);
  EXPECT_EQ(*placed, (std::vector<int>{1, 1}));
  EXPECT_DOUBLE_EQ(nodes[1].available["CPU"], 0);
  EXPECT_DOUBLE_EQ(nodes[0].available["CPU"], 2);
  EXPECT_FALSE(PlaceBundles({Cpu(2), Cpu(2)}, nodes, PgStrategy::kStrictPack));
  EXPECT_DOUBLE_EQ(nodes[0].available["CPU"], 2);  // a failed placement charges nothing
}

TEST(PlacementTest, StrictPackStaysOnTheNodeOfAFixedBundle) {
  std::vector<NodeView> nodes = {Node("a", 8), Node("b", 1)};
  // Node "a" has room, but the group already has a bundle on "b", which has not.
  EXPECT_FALSE(PlaceBundles({Cpu(1, 1), Cpu(2)}, nodes, PgStrategy::kStrictPack));
  auto placed = PlaceBundles({Cpu(1, 0), Cpu(1)}, nodes, PgStrategy::kStrictPack);
  ASSERT_TRUE(placed);
  EXPECT_EQ(*placed, (std::vector<int>{0, 0}));
  EXPECT_DOUBLE_EQ(nodes[0].available["CPU"], 7);  // only the new bundle is charged
}

TEST(PlacementTest, StrictSpreadNeedsDistinctNodesAndPlacesTheMostConstrainedBundleFirst) {
  std::vector<NodeView> nodes = {Node("a", 4, {{"zone", "x"}}), Node("b", 4, {{"zone", "y"}})};
  EXPECT_FALSE(PlaceBundles({Cpu(1), Cpu(1), Cpu(1)}, nodes, PgStrategy::kStrictSpread));
  // The second bundle can only go to "a": the first must take "b" although "a" has as much room.
  auto zone_x = ParseLabelSelector({{"zone", "x"}});
  ASSERT_TRUE(zone_x.ok());
  std::vector<BundleDemand> demands = {Cpu(1), {{{"CPU", 1}}, *zone_x, -1}};
  auto placed = PlaceBundles(demands, nodes, PgStrategy::kStrictSpread);
  ASSERT_TRUE(placed);
  EXPECT_EQ(*placed, (std::vector<int>{1, 0}));
}

TEST(PlacementTest, PackPrefersOneNodeThenFillsTheFullestNode) {
  std::vector<NodeView> nodes = {Node("a", 2), Node("b", 3)};
  auto placed = PlaceBundles({Cpu(1), Cpu(1), Cpu(1)}, nodes, PgStrategy::kPack);
  ASSERT_TRUE(placed);
  EXPECT_EQ(*placed, (std::vector<int>{1, 1, 1}));
  std::vector<NodeView> small = {Node("a", 2), Node("b", 2)};
  placed = PlaceBundles({Cpu(1), Cpu(1), Cpu(1)}, small, PgStrategy::kPack);
  ASSERT_TRUE(placed);
  EXPECT_EQ(*placed, (std::vector<int>{0, 0, 1}));
}

TEST(PlacementTest, SpreadUsesTheLeastUsedNodeAndReusesWhenItMust) {
  std::vector<NodeView> nodes = {Node("a", 4), Node("b", 4)};
  auto placed = PlaceBundles({Cpu(1), Cpu(1), Cpu(1)}, nodes, PgStrategy::kSpread);
  ASSERT_TRUE(placed);
  EXPECT_EQ(*placed, (std::vector<int>{0, 1, 0}));
  EXPECT_DOUBLE_EQ(nodes[0].available["CPU"], 2);
  EXPECT_DOUBLE_EQ(nodes[1].available["CPU"], 3);
}

TEST(PlacementTest, UseTotalPlansOnCapacityAndChargesNothing) {
  std::vector<NodeView> nodes = {Node("a", 4)};
  nodes[0].available["CPU"] = 0;
  EXPECT_FALSE(PlaceBundles({Cpu(2)}, nodes, PgStrategy::kPack));
  auto placed = PlaceBundles({Cpu(2)}, nodes, PgStrategy::kPack, /*use_total=*/true);
  ASSERT_TRUE(placed);
  EXPECT_DOUBLE_EQ(nodes[0].available["CPU"], 0);
  EXPECT_FALSE(PlaceBundles({Cpu(5)}, nodes, PgStrategy::kSpread, /*use_total=*/true));
}


// The greedy rule of PACK and SPREAD written the plain way (every node checked for fit, then
// compared): PlaceBundles must choose exactly the same nodes on random clusters.
std::optional<std::vector<int>> PlainGreedy(const std::vector<BundleDemand>& bundles,
                                            std::vector<NodeView> nodes, PgStrategy strategy) {
  std::vector<int> out(bundles.size(), -1), used(nodes.size(), 0);
  for (size_t b = 0; b < bundles.size(); ++b) {
    if (bundles[b].fixed_node >= 0) out[b] = bundles[b].fixed_node, used[bundles[b].fixed_node]++;
  }
  for (size_t b = 0; b < bundles.size(); ++b) {
    if (bundles[b].fixed_node >= 0) continue;
    int best = -1;
    for (size_t n = 0; n < nodes.size(); ++n) {
      if (!Fits(bundles[b].resources, nodes[n].available)) continue;
      if (!MatchesLabels(bundles[b].selector, nodes[n].labels)) continue;
      if (best < 0 || (strategy == PgStrategy::kPack ? used[n] > used[best] : used[n] < used[best])) {
        best = static_cast<int>(n);
      }
    }
    if (best < 0) return std::nullopt;
    out[b] = best;
    used[best]++;
    Subtract(nodes[best].available, bundles[b].resources);
  }
  return out;
}

TEST(PlacementTest, GreedyMatchesThePlainRuleOnRandomClusters) {
  std::mt19937 rng(7);
  int placed_count = 0;
  for (int round = 0; round < 2000; ++round) {
    std::vector<NodeView> nodes;
    int n = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      nodes.push_back(Node("n" + std::to_string(i), static_cast<double>(rng() % 5),
                           {{"zone", rng() % 2 ? "a" : "b"}}));
    }
    std::vector<BundleDemand> bundles;
    int k = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < k; ++i) {
      BundleDemand d = Cpu(0.5 * static_cast<double>(rng() % 4));
      if (rng() % 4 == 0) d.selector = {{"zone", LabelCondition::Op::kEq, {rng() % 2 ? "a" : "b"}}};
      bundles.push_back(d);
    }
    // SPREAD only: PACK first tries one node for everything, which the plain rule leaves out.
    std::vector<NodeView> copy = nodes;
    auto want = PlainGreedy(bundles, nodes, PgStrategy::kSpread);
    auto got = PlaceBundles(bundles, copy, PgStrategy::kSpread);
    ASSERT_EQ(got.has_value(), want.has_value()) << "round " << round;
    if (got) {
      EXPECT_EQ(*got, *want) << "round " << round;
      ++placed_count;
    }
  }
  EXPECT_GT(placed_count, 200);  // the rounds exercise placements, not only failures
}

}  // namespace
}  // namespace torus
