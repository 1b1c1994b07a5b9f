// PlaceBundles and the PlacementIndex: the strategies on small clusters, and the index pinned
// against a brute-force scan (every node checked with plain maps, then sorted) on random
// clusters, random changes and random requests.
#include "head/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <set>

#include "common/placement_index.h"

namespace torus {
namespace {

// A head-like node table with its placement index, kept current as the head keeps it.
class Cluster {
 public:
  Cluster() : index_(pool_, [this](std::string_view id) -> const NodeEntry* {
    auto it = nodes_.find(std::string(id));
    return it == nodes_.end() ? nullptr : &it->second;
  }) {}

  void Add(const std::string& id, ResourceMap total, std::map<std::string, std::string> labels = {}) {
    rpc::NodeRecord rec;
    rec.set_node_id(id);
    rec.set_address(id + ":1");
    rec.set_hostname("host-" + id);
    for (const auto& [k, v] : total) {
      (*rec.mutable_total()->mutable_units())[k] = ResourceAmount(v).units();
      (*rec.mutable_available()->mutable_units())[k] = ResourceAmount(v).units();
    }
    labels[std::string(kLabelNodeId)] = id;
    for (const auto& [k, v] : labels) (*rec.mutable_labels())[k] = v;
    auto [it, fresh] = nodes_.try_emplace(id);
    index_.Remove(it->second);
    SetFromRecord(pool_, rec, &it->second);
    it->second.alive = true;
    index_.Upsert(it->first, it->second);
    if (fresh) order_.push_back(id);
  }
  void SetAvailable(const std::string& id, const ResourceMap& avail) {
    auto& e = nodes_.at(id);
    torus::SetAvailable(pool_, avail, &e);
    index_.Upsert(nodes_.find(id)->first, e);
  }
  void Kill(const std::string& id) {
    nodes_.at(id).alive = false;
    index_.Remove(nodes_.at(id));
  }
  ResourceMap Available(const std::string& id) const { return ToResourceMap(pool_, nodes_.at(id).Available()); }
  ResourceMap Total(const std::string& id) const { return ToResourceMap(pool_, *nodes_.at(id).total); }
  std::map<std::string, std::string> Labels(const std::string& id) const {
    return LabelsOf(pool_, id, nodes_.at(id));
  }
  int Slot(const std::string& id) const { return static_cast<int>(index_.SlotOf(id)); }
  const std::string& IdOf(int slot) const { return index_.Id(static_cast<uint32_t>(slot)); }
  std::vector<std::string> Alive() const {
    std::vector<std::string> out;
    for (const auto& [id, e] : nodes_) {
      if (e.alive) out.push_back(id);
    }
    return out;
  }
  const PlacementIndex& index() const { return index_; }
  const NamePool& pool() const { return pool_; }

  std::optional<std::vector<std::string>> Place(const std::vector<BundleDemand>& b, PgStrategy s,
                                                bool use_total = false) const {
    auto placed = PlaceBundles(b, index_, s, use_total);
    if (!placed) return std::nullopt;
    std::vector<std::string> ids;
    for (int slot : *placed) ids.push_back(IdOf(slot));
    return ids;
  }

  // The candidate order written the plain way: every alive node checked with maps, then sorted
  // by the key resource (the one the fewest nodes have some of available; ties: lowest name id),
  // most first (of the free amounts asked for: available or total), then slot.
  std::vector<std::string> ScanCandidates(const ResourceMap& demand, const LabelSelectorTerms& selector,
                                          bool use_total) const {
    std::vector<std::string> alive = Alive();
    auto free = [&](const std::string& id) { return use_total ? Total(id) : Available(id); };
    std::string key;
    size_t fewest = 0;
    uint32_t key_id = 0;
    for (const auto& [name, amount] : demand) {
      if (amount <= 0) continue;
      auto id = pool_.Find(name);
      if (!id) return {};
      size_t holders = 0;
      for (const auto& n : alive) holders += Available(n).count(name) && Available(n).at(name) > 0;
      if (key.empty() || holders < fewest || (holders == fewest && *id < key_id)) {
        key = name, fewest = holders, key_id = *id;
      }
    }
    std::vector<std::string> out;
    for (const auto& n : alive) {
      if (Fits(demand, free(n)) && MatchesLabels(selector, Labels(n))) out.push_back(n);
    }
    std::stable_sort(out.begin(), out.end(), [&](const std::string& a, const std::string& b) {
      ResourceAmount x = key.empty() || !free(a).count(key) ? ResourceAmount() : free(a).at(key);
      ResourceAmount y = key.empty() || !free(b).count(key) ? ResourceAmount() : free(b).at(key);
      return x != y ? x > y : Slot(a) < Slot(b);
    });
    return out;
  }

  std::vector<std::string> IndexCandidates(const ResourceMap& demand, const LabelSelectorTerms& selector,
                                           bool use_total) const {
    std::vector<std::string> out;
    index_.ForEach(index_.Compile(demand, selector), use_total, [&](uint32_t slot) {
      out.push_back(index_.Id(slot));
      return true;
    });
    return out;
  }

 private:
  NamePool pool_;
  std::map<std::string, NodeEntry> nodes_;
  PlacementIndex index_;
  std::vector<std::string> order_;
};

BundleDemand Cpu(double cpu, int fixed = -1) { return {{{"CPU", cpu}}, {}, fixed}; }

LabelSelectorTerms Selector(std::map<std::string, std::string> s) {
  auto parsed = ParseLabelSelector(s);
  EXPECT_TRUE(parsed.ok());
  return parsed.ok() ? *parsed : LabelSelectorTerms{};
}

using Ids = std::vector<std::string>;

TEST(PlacementTest, ParsesTheFourStrategiesOnly) {
  PgStrategy s;
  EXPECT_TRUE(ParsePgStrategy("STRICT_SPREAD", &s));
  EXPECT_EQ(s, PgStrategy::kStrictSpread);
  EXPECT_TRUE(ParsePgStrategy("PACK", &s));
  EXPECT_EQ(s, PgStrategy::kPack);
  EXPECT_FALSE(ParsePgStrategy("pack", &s));
  EXPECT_FALSE(ParsePgStrategy("", &s));
}

TEST(PlacementTest, StrictPackPutsEverythingOnOneNode) {
  Cluster c;
  c.Add("a", {{"CPU", 2}});
  c.Add("b", {{"CPU", 4}});
  EXPECT_EQ(c.Place({Cpu(2), Cpu(2)}, PgStrategy::kStrictPack), (Ids{"b", "b"}));
  c.SetAvailable("b", {{"CPU", 0}});
  EXPECT_FALSE(c.Place({Cpu(2), Cpu(2)}, PgStrategy::kStrictPack));
  EXPECT_TRUE(c.Place({Cpu(2), Cpu(2)}, PgStrategy::kStrictPack, /*use_total=*/true));
}

TEST(PlacementTest, StrictPackStaysOnTheNodeOfAFixedBundle) {
  Cluster c;
  c.Add("a", {{"CPU", 8}});
  c.Add("b", {{"CPU", 1}});
  // Node "a" has room, but the group already has a bundle on "b", which has not.
  EXPECT_FALSE(c.Place({Cpu(1, c.Slot("b")), Cpu(2)}, PgStrategy::kStrictPack));
  EXPECT_EQ(c.Place({Cpu(1, c.Slot("a")), Cpu(1)}, PgStrategy::kStrictPack), (Ids{"a", "a"}));
}

TEST(PlacementTest, StrictSpreadNeedsDistinctNodesAndPlacesTheMostConstrainedBundleFirst) {
  Cluster c;
  c.Add("a", {{"CPU", 4}}, {{"zone", "x"}});
  c.Add("b", {{"CPU", 4}}, {{"zone", "y"}});
  EXPECT_FALSE(c.Place({Cpu(1), Cpu(1), Cpu(1)}, PgStrategy::kStrictSpread));
  // The second bundle can only go to "a": the first must take "b" although "a" comes first.
  std::vector<BundleDemand> demands = {Cpu(1), {{{"CPU", 1}}, Selector({{"zone", "x"}}), -1}};
  EXPECT_EQ(c.Place(demands, PgStrategy::kStrictSpread), (Ids{"b", "a"}));
}

TEST(PlacementTest, PackPrefersOneNodeThenFillsTheFullestNode) {
  Cluster c;
  c.Add("a", {{"CPU", 2}});
  c.Add("b", {{"CPU", 3}});
  EXPECT_EQ(c.Place({Cpu(1), Cpu(1), Cpu(1)}, PgStrategy::kPack), (Ids{"b", "b", "b"}));
  Cluster small;
  small.Add("a", {{"CPU", 2}});
  small.Add("b", {{"CPU", 2}});
  EXPECT_EQ(small.Place({Cpu(1), Cpu(1), Cpu(1)}, PgStrategy::kPack), (Ids{"a", "a", "b"}));
}

TEST(PlacementTest, SpreadUsesTheLeastUsedNodeAndReusesWhenItMust) {
  Cluster c;
  c.Add("a", {{"CPU", 4}});
  c.Add("b", {{"CPU", 4}});
  EXPECT_EQ(c.Place({Cpu(1), Cpu(1), Cpu(1)}, PgStrategy::kSpread), (Ids{"a", "b", "a"}));
  // The least loaded node comes first.
  c.SetAvailable("a", {{"CPU", 2}});
  EXPECT_EQ(c.Place({Cpu(1), Cpu(1), Cpu(1)}, PgStrategy::kSpread), (Ids{"b", "a", "b"}));
}

TEST(PlacementTest, UseTotalPlansOnCapacity) {
  Cluster c;
  c.Add("a", {{"CPU", 4}});
  c.SetAvailable("a", {{"CPU", 0}});
  EXPECT_FALSE(c.Place({Cpu(2)}, PgStrategy::kPack));
  EXPECT_TRUE(c.Place({Cpu(2)}, PgStrategy::kPack, /*use_total=*/true));
  EXPECT_FALSE(c.Place({Cpu(5)}, PgStrategy::kSpread, /*use_total=*/true));
}

TEST(PlacementTest, UnknownResourcesAndLabelsAreNeverPlacedAndDeadNodesAreNotCandidates) {
  Cluster c;
  c.Add("a", {{"CPU", 4}}, {{"zone", "x"}});
  c.Add("b", {{"CPU", 4}, {"TPU", 4}}, {{"zone", "y"}});
  EXPECT_FALSE(c.Place({{{{"GPU", 1}}, {}, -1}}, PgStrategy::kSpread));
  EXPECT_FALSE(c.Place({{{{"CPU", 1}}, Selector({{"rack", "r1"}}), -1}}, PgStrategy::kSpread));
  EXPECT_EQ(c.Place({{{{"TPU", 4}}, {}, -1}}, PgStrategy::kSpread), (Ids{"b"}));
  // A node-id selector reads that node only.
  EXPECT_EQ(c.Place({{{{"CPU", 1}}, Selector({{std::string(kLabelNodeId), "b"}}), -1}}, PgStrategy::kSpread),
            (Ids{"b"}));
  c.Kill("b");
  EXPECT_FALSE(c.Place({{{{"TPU", 4}}, {}, -1}}, PgStrategy::kSpread));
  EXPECT_FALSE(c.Place({{{{"TPU", 4}}, {}, -1}}, PgStrategy::kSpread, /*use_total=*/true));
  EXPECT_EQ(c.index().SlotOf("b"), PlacementIndex::kNoSlot);
  c.Add("c", {{"CPU", 1}});  // takes b's freed slot
  EXPECT_EQ(c.Slot("c"), 1);
}

// ------------------------------------------------------------------ pinned against a scan

struct Rng {
  std::mt19937 gen;
  int Int(int n) { return static_cast<int>(gen() % static_cast<unsigned>(n)); }
  bool Chance(int one_in) { return Int(one_in) == 0; }
};

const char* kZones[] = {"a", "b", "c"};

// A random cluster of up to 30 nodes: CPU on most, TPU and a custom resource on some, zone and
// slice labels, some nodes partly used, some dead (and some slots reused).
void RandomCluster(Rng& r, Cluster& c) {
  int n = 1 + r.Int(30);
  for (int i = 0; i < n; ++i) {
    ResourceMap total;
    if (!r.Chance(6)) total["CPU"] = 1 + r.Int(8);
    if (r.Chance(3)) total["TPU"] = 4;
    if (r.Chance(5)) total["disk"] = 0.5 * (1 + r.Int(4));
    std::map<std::string, std::string> labels = {{"zone", kZones[r.Int(3)]}};
    if (total.count("TPU")) labels["slice"] = "s" + std::to_string(r.Int(4));
    std::string id = "n" + std::to_string(i);
    c.Add(id, total, labels);
    if (r.Chance(3)) {
      ResourceMap avail = total;
      for (auto& [k, v] : avail) v = std::max(ResourceAmount(), v - ResourceAmount(0.5 * r.Int(5)));
      c.SetAvailable(id, avail);
      if (r.Chance(4)) c.SetAvailable(id, total);  // busy, then idle again
    }
  }
  for (int i = 0; i < n / 5; ++i) c.Kill("n" + std::to_string(r.Int(n)));
  if (r.Chance(2)) c.Add("late", {{"CPU", 2}}, {{"zone", "a"}});  // may reuse a freed slot
}

BundleDemand RandomDemand(Rng& r) {
  BundleDemand d;
  if (!r.Chance(5)) d.resources["CPU"] = 0.5 * r.Int(6);
  if (r.Chance(4)) d.resources["TPU"] = 4;
  if (r.Chance(8)) d.resources["disk"] = 0.5;
  if (r.Chance(30)) d.resources["GPU"] = 1;
  std::map<std::string, std::string> sel;
  switch (r.Int(6)) {
    case 0: sel["zone"] = kZones[r.Int(3)]; break;
    case 1: sel["zone"] = std::string("in(") + kZones[r.Int(3)] + "," + kZones[r.Int(3)] + ")"; break;
    case 2: sel["zone"] = std::string("!") + kZones[r.Int(3)]; break;
    case 3: sel["slice"] = "s" + std::to_string(r.Int(4)); break;
    case 4: sel[std::string(kLabelNodeId)] = "n" + std::to_string(r.Int(30)); break;
    default: break;
  }
  d.selector = Selector(sel);
  return d;
}

TEST(PlacementIndexTest, CandidatesAreExactlyTheScanInCandidateOrder) {
  Rng r{std::mt19937(11)};
  int nonempty = 0;
  for (int round = 0; round < 3000; ++round) {
    Cluster c;
    RandomCluster(r, c);
    BundleDemand d = RandomDemand(r);
    for (bool use_total : {false, true}) {
      auto want = c.ScanCandidates(d.resources, d.selector, use_total);
      ASSERT_EQ(c.IndexCandidates(d.resources, d.selector, use_total), want) << "round " << round;
      nonempty += !want.empty();
    }
  }
  EXPECT_GT(nonempty, 1500);  // the requests mostly have candidates, not only empty answers
}

// The strategies written the plain way over the scan's candidate order.
// Bundles already placed (fixed_node, as rescheduling keeps them) count as used and are not
// charged again; with use_total the plan reads the nodes' totals.
std::optional<Ids> PlainPlace(const Cluster& c, const std::vector<BundleDemand>& bundles, PgStrategy s,
                              bool use_total = false) {
  Ids out(bundles.size());
  std::map<std::string, ResourceMap> free;
  for (const auto& n : c.Alive()) free[n] = use_total ? c.Total(n) : c.Available(n);
  std::map<std::string, int> used;
  auto fits = [&](const BundleDemand& b, const std::string& n) {
    return Fits(b.resources, free[n]) && MatchesLabels(b.selector, c.Labels(n));
  };
  std::string fixed;  // the node of the last fixed bundle
  for (size_t b = 0; b < bundles.size(); ++b) {
    if (bundles[b].fixed_node < 0) continue;
    fixed = out[b] = c.index().Id(static_cast<uint32_t>(bundles[b].fixed_node));
    used[fixed]++;
  }
  if (s == PgStrategy::kStrictPack || s == PgStrategy::kPack) {
    ResourceMap sum;
    LabelSelectorTerms all;
    for (const auto& b : bundles) {
      if (b.fixed_node < 0) Add(sum, b.resources), all.insert(all.end(), b.selector.begin(), b.selector.end());
    }
    if (!fixed.empty()) {
      if (Fits(sum, free[fixed]) && MatchesLabels(all, c.Labels(fixed))) return Ids(bundles.size(), fixed);
    } else {
      auto one = c.ScanCandidates(sum, all, use_total);
      if (!one.empty()) return Ids(bundles.size(), one[0]);
    }
    if (s == PgStrategy::kStrictPack) return std::nullopt;
  }
  if (s == PgStrategy::kStrictSpread) {
    // Exhaustive on these small clusters: any assignment of distinct nodes.
    std::function<bool(size_t)> assign = [&](size_t k) {
      if (k == bundles.size()) return true;
      for (const auto& n : c.ScanCandidates(bundles[k].resources, bundles[k].selector, false)) {
        if (used[n]) continue;
        used[n] = 1, out[k] = n;
        if (assign(k + 1)) return true;
        used[n] = 0;
      }
      return false;
    };
    if (!assign(0)) return std::nullopt;
    return out;
  }
  for (size_t b = 0; b < bundles.size(); ++b) {
    if (bundles[b].fixed_node >= 0) continue;
    std::string best;
    for (const auto& n : c.ScanCandidates(bundles[b].resources, bundles[b].selector, use_total)) {
      if (!fits(bundles[b], n)) continue;  // what this group took already
      bool better = best.empty() || (s == PgStrategy::kPack ? used[n] > used[best] : used[n] < used[best]);
      if (better) best = n;
    }
    if (best.empty()) return std::nullopt;
    out[b] = best;
    used[best]++;
    Subtract(free[best], bundles[b].resources);
  }
  return out;
}

bool ValidStrictSpread(const Cluster& c, const std::vector<BundleDemand>& bundles, const Ids& ids) {
  std::set<std::string> distinct(ids.begin(), ids.end());
  if (distinct.size() != ids.size()) return false;
  for (size_t b = 0; b < bundles.size(); ++b) {
    if (!Fits(bundles[b].resources, c.Available(ids[b])) || !MatchesLabels(bundles[b].selector, c.Labels(ids[b]))) {
      return false;
    }
  }
  return true;
}

TEST(PlacementIndexTest, EveryStrategyDecidesAsThePlainScanOnRandomClusters) {
  Rng r{std::mt19937(23)};
  std::map<PgStrategy, int> placed;
  for (int round = 0; round < 4000; ++round) {
    Cluster c;
    RandomCluster(r, c);
    std::vector<BundleDemand> bundles;
    int k = 1 + r.Int(6);
    // Runs of equal bundles too: SPREAD reads their candidates once per run.
    for (int i = 0; i < k; ++i) bundles.push_back(i > 0 && r.Chance(2) ? bundles.back() : RandomDemand(r));
    for (PgStrategy s : {PgStrategy::kPack, PgStrategy::kSpread, PgStrategy::kStrictPack, PgStrategy::kStrictSpread}) {
      auto want = PlainPlace(c, bundles, s);
      auto got = c.Place(bundles, s);
      ASSERT_EQ(got.has_value(), want.has_value()) << "round " << round << " strategy " << static_cast<int>(s);
      if (!got) continue;
      ++placed[s];
      if (s == PgStrategy::kStrictSpread) {
        EXPECT_TRUE(ValidStrictSpread(c, bundles, *got)) << "round " << round;
      } else {
        EXPECT_EQ(*got, *want) << "round " << round << " strategy " << static_cast<int>(s);
      }
    }
  }
  for (const auto& [s, n] : placed) EXPECT_GT(n, 300) << "strategy " << static_cast<int>(s);
}

TEST(PlacementIndexTest, PackAndSpreadWithPlacedBundlesOrTotalsDecideAsThePlainScan) {
  // Rescheduling keeps a group's surviving bundles on their nodes (fixed_node), possibly in the
  // middle of a run of equal bundles; "could this ever be placed?" plans against the totals.
  Rng r{std::mt19937(29)};
  std::map<PgStrategy, int> placed;
  int with_fixed = 0;
  for (int round = 0; round < 4000; ++round) {
    Cluster c;
    RandomCluster(r, c);
    auto alive = c.Alive();
    std::vector<BundleDemand> bundles;
    int k = 1 + r.Int(6);
    for (int i = 0; i < k; ++i) bundles.push_back(i > 0 && r.Chance(2) ? bundles.back() : RandomDemand(r));
    bool any_fixed = false;
    for (auto& b : bundles) {
      b.fixed_node = -1;
      if (alive.empty() || !r.Chance(4)) continue;
      b.fixed_node = static_cast<int>(c.index().SlotOf(alive[static_cast<size_t>(r.Int(static_cast<int>(alive.size())))]));
      any_fixed = true;
    }
    bool use_total = r.Chance(2);
    for (PgStrategy s : {PgStrategy::kPack, PgStrategy::kSpread}) {
      auto want = PlainPlace(c, bundles, s, use_total);
      auto got = c.Place(bundles, s, use_total);
      ASSERT_EQ(got.has_value(), want.has_value()) << "round " << round << " strategy " << static_cast<int>(s);
      if (!got) continue;
      ++placed[s];
      with_fixed += any_fixed;
      EXPECT_EQ(*got, *want) << "round " << round << " strategy " << static_cast<int>(s);
    }
  }
  for (const auto& [s, n] : placed) EXPECT_GT(n, 300) << "strategy " << static_cast<int>(s);
  EXPECT_GT(with_fixed, 300);
}

}  // namespace
}  // namespace torus
