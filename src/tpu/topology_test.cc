#include "tpu/topology.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace torus::tpu {
namespace {

struct VersionCase {
  const char* input;
  Generation want;
};

// §2 "version input -> canonical" column.
TEST(NormalizeVersionTest, SpecTableInputsResolve) {
  const VersionCase cases[] = {
      {"TPU-V4", Generation::kV4},          {"TPU-v4", Generation::kV4},
      {"v4", Generation::kV4},              {"v4-4", Generation::kV4},
      {"TPU-V5P", Generation::kV5p},        {"TPU-v5p", Generation::kV5p},
      {"v5p-128", Generation::kV5p},        {"v5litepod", Generation::kV5litepod},
      {"v5litepod-16", Generation::kV5litepod}, {"v5e", Generation::kV5litepod},
      {"TPU-V6E", Generation::kV6e},        {"v6e", Generation::kV6e},
      {"v6e-64", Generation::kV6e},         {"TPU-V7X", Generation::kV7x},
      {"tpu7x", Generation::kV7x},          {"tpu7x-16", Generation::kV7x},
      {"v7x", Generation::kV7x},            {"v2-16", Generation::kV2},
      {"v2-256", Generation::kV2},          {"v3", Generation::kV3},
      {"v3-1024", Generation::kV3},
  };
  for (const VersionCase& c : cases) {
    StatusOr<Generation> gen = NormalizeVersion(c.input);
    ASSERT_TRUE(gen.ok()) << c.input << ": " << gen.status().ToString();
    EXPECT_EQ(*gen, c.want) << c.input;
  }
}

// §2 rule 1 examples.
TEST(NormalizeVersionTest, PrefixRuleExamples) {
  EXPECT_EQ(*NormalizeVersion("TPU-V4"), Generation::kV4);
  EXPECT_EQ(*NormalizeVersion("tpu7x"), Generation::kV7x);
  EXPECT_EQ(*NormalizeVersion("tpu-v6e"), Generation::kV6e);
  EXPECT_EQ(*NormalizeVersion("  TPU-V6E  "), Generation::kV6e);
  EXPECT_EQ(*NormalizeVersion("tpuv5p"), Generation::kV5p);
  EXPECT_EQ(*NormalizeVersion("tpu-v5e-8"), Generation::kV5litepod);
}

TEST(NormalizeVersionTest, InvalidVersionsListValidChoices) {
  for (const char* input : {"A100", "random-invalid-type", "TPU-invalid", "", "v2-", "v8"}) {
    StatusOr<Generation> gen = NormalizeVersion(input);
    ASSERT_FALSE(gen.ok()) << input;
    EXPECT_EQ(gen.status().code(), StatusCode::kInvalidArgument);
    const std::string& msg = gen.status().message();
    EXPECT_NE(msg.find("Invalid accelerator_type '" + std::string(input) + "'"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("v2, v3, v4, v5p, v5litepod (v5e), v6e, v7x"), std::string::npos) << msg;
  }
}

TEST(GenerationTest, NamesAndAcceleratorTypeValues) {
  EXPECT_EQ(CanonicalName(Generation::kV6e), "v6e");
  EXPECT_EQ(CanonicalName(Generation::kV5litepod), "v5litepod");
  EXPECT_EQ(AcceleratorTypeValue(Generation::kV4), "TPU-V4");
  EXPECT_EQ(AcceleratorTypeValue(Generation::kV5litepod), "TPU-V5LITEPOD");
  EXPECT_EQ(AcceleratorTypeValue(Generation::kV6e), "TPU-V6E");
  EXPECT_EQ(AcceleratorTypeValue(Generation::kV7x), "TPU-V7X");
  EXPECT_EQ(AcceleratorTypeValue(Generation::kV5p), "TPU-V5P");
  EXPECT_EQ(AllGenerations().size(), 7u);
}

// §2 generation table: GKE label, cores per chip, default chips per host, dims, set sizes.
TEST(GenerationTest, GenerationTableColumns) {
  struct Row {
    Generation gen;
    std::vector<std::string> gke;
    int cores;
    bool is3d;
    size_t num_topologies;
  };
  const Row rows[] = {
      {Generation::kV2, {}, 2, false, 5},
      {Generation::kV3, {}, 2, false, 7},
      {Generation::kV4, {"tpu-v4-podslice"}, 2, true, 40},
      {Generation::kV5p, {"tpu-v5p-slice"}, 2, true, 100},
      {Generation::kV5litepod, {"tpu-v5-lite-podslice", "tpu-v5-lite-device"}, 1, false, 9},
      {Generation::kV6e, {"tpu-v6e-slice"}, 1, false, 9},
      {Generation::kV7x, {"tpu7x"}, 2, true, 10},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(CanonicalName(r.gen));
    EXPECT_EQ(GkeAcceleratorValues(r.gen), r.gke);
    EXPECT_EQ(CoresPerChip(r.gen), r.cores);
    EXPECT_EQ(Is3D(r.gen), r.is3d);
    EXPECT_EQ(ValidTopologies(r.gen).size(), r.num_topologies);
    for (const std::string& g : r.gke) EXPECT_EQ(GenerationFromGkeAccelerator(g), r.gen);
  }
  EXPECT_EQ(GenerationFromGkeAccelerator("tpu-v3-slice"), std::nullopt);
  // Default chips per host: v5litepod/v6e 1x1->1, 2x2->4, 2x4->8, else 4; others 4.
  EXPECT_EQ(DefaultChipsPerHost(Generation::kV5litepod, "1x1"), 1);
  EXPECT_EQ(DefaultChipsPerHost(Generation::kV6e, "2x2"), 4);
  EXPECT_EQ(DefaultChipsPerHost(Generation::kV6e, "2x4"), 8);
  EXPECT_EQ(DefaultChipsPerHost(Generation::kV6e, "4x4"), 4);
  EXPECT_EQ(DefaultChipsPerHost(Generation::kV4, "2x2x1"), 4);
  EXPECT_EQ(DefaultChipsPerHost(Generation::kV7x, "2x2x2"), 4);
}

TEST(GenerationTest, ValidTopologySetsMatchTheSpecRules) {
  // v3 = v2 + 16x32, 32x32.
  std::vector<std::string> v3 = ValidTopologies(Generation::kV3);
  EXPECT_EQ(v3, (std::vector<std::string>{"4x4", "4x8", "8x8", "8x16", "16x16", "16x32",
                                          "32x32"}));
  // v4: A,B in {4,8,12}, C in {4,8,12,16}; v5p: A,B in {4..16}, C in {4..24} step 4.
  for (const char* t : {"12x4x16", "4x12x4", "12x12x12"}) {
    EXPECT_TRUE(ValidateTopology(Generation::kV4, t).ok()) << t;
  }
  for (const char* t : {"16x4x4", "4x4x20", "2x2x8"}) {
    EXPECT_FALSE(ValidateTopology(Generation::kV4, t).ok()) << t;
  }
  for (const char* t : {"16x4x20", "12x16x24", "2x2x1"}) {
    EXPECT_TRUE(ValidateTopology(Generation::kV5p, t).ok()) << t;
  }
  EXPECT_FALSE(ValidateTopology(Generation::kV5p, "4x4x28").ok());
}

struct TopologyCase {
  const char* version;
  std::vector<std::string> valid;
  std::vector<std::string> invalid;
};

// §2 "valid topologies (examples) / invalid" columns.
TEST(ValidateTopologyTest, SpecTableExamples) {
  const TopologyCase cases[] = {
      {"TPU-V4", {"2x2x1", "2x4x4", "8x8x16"}, {"16x16x16"}},
      {"v4-4", {"2x2x1", "2x4x4", "8x8x16"}, {"16x16x16"}},
      {"TPU-V5P", {"4x4x4", "16x16x16", "16x16x24"}, {"24x24x24"}},
      {"v5p-128", {"4x4x4", "16x16x16", "16x16x24"}, {"24x24x24"}},
      {"v5litepod", {"2x8", "2x4", "8x8"}, {"4x16"}},
      {"v5e", {"2x8", "2x4", "8x8"}, {"4x16"}},
      {"TPU-V6E", {"2x8", "2x4", "8x8"}, {"4x16"}},
      {"v6e-64", {"2x8", "2x4", "8x8"}, {"4x16"}},
      {"TPU-V7X", {"2x2x2", "2x4x4"}, {"4x4"}},
      {"tpu7x-16", {"2x2x2", "2x4x4"}, {"4x4"}},
      {"v2-16", {"4x4", "16x16"}, {"2x2"}},
      {"v2-256", {"4x4", "16x16"}, {"2x2"}},
      {"v3", {"32x32"}, {"4x16"}},
      {"v3-1024", {"32x32"}, {"4x16"}},
  };
  for (const TopologyCase& c : cases) {
    Generation gen = *NormalizeVersion(c.version);
    for (const std::string& t : c.valid) {
      EXPECT_TRUE(ValidateTopology(gen, t).ok()) << c.version << " " << t;
    }
    for (const std::string& t : c.invalid) {
      Status s = ValidateTopology(gen, t);
      ASSERT_FALSE(s.ok()) << c.version << " " << t;
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("Invalid accelerator topology: '" + t +
                                 "' for accelerator version: '" + CanonicalName(gen) + "'"),
                std::string::npos)
          << s.message();
    }
  }
}

TEST(ValidateTopologyTest, DimensionOrderMattersAndCaseDoesNot) {
  EXPECT_TRUE(ValidateTopology(Generation::kV4, "2x2x4").ok());
  EXPECT_FALSE(ValidateTopology(Generation::kV4, "4x2x2").ok());
  EXPECT_TRUE(ValidateTopology(Generation::kV6e, "4X4").ok());
  // A topology that does not parse reports "Invalid topology", not the membership message.
  Status s = ValidateTopology(Generation::kV6e, "4x");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("Invalid topology '4x'"), std::string::npos) << s.message();
}

// §3.1 and the §8 "topology 4x, axb, 2x2x2x2, """ row.
TEST(ParseTopologyTest, ParsesAndRejects) {
  EXPECT_EQ(*ParseTopology("4x4"), (std::vector<int>{4, 4}));
  EXPECT_EQ(*ParseTopology(" 2X2X4 "), (std::vector<int>{2, 2, 4}));
  EXPECT_EQ(*TopologyChips("16x16x24"), 6144);
  for (const char* bad : {"4x", "axb", "2x2x2x2", "", "4", "0x4", "-1x4", "4x+4", "x4",
                          "99999x99999x99999"}) {
    StatusOr<std::vector<int>> dims = ParseTopology(bad);
    ASSERT_FALSE(dims.ok()) << bad;
    EXPECT_EQ(dims.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(dims.status().message().find("Invalid topology '" + std::string(bad) + "'"),
              std::string::npos)
        << dims.status().message();
  }
}

// §3.2: pure, no validity check; empty topology yields nothing.
TEST(InferPodTypeTest, PureFunctionOfVersionAndTopology) {
  EXPECT_EQ(InferPodType("TPU-V5P", "4x4"), "v5p-32");
  EXPECT_EQ(InferPodType("TPU-V6E", "4x4"), "v6e-16");
  EXPECT_EQ(InferPodType("tpu7x", "2x2x2"), "v7x-16");
  EXPECT_EQ(InferPodType("v5e", "2x4"), "v5litepod-8");
  EXPECT_EQ(InferPodType("TPU-V6E", ""), std::nullopt);
  EXPECT_EQ(InferPodType("TPU-V6E", "4x"), std::nullopt);
  EXPECT_EQ(InferPodType("A100", "4x4"), std::nullopt);
  EXPECT_EQ(PodTypeName(Generation::kV4, 8), "v4-16");
}

struct ShapeCase {
  const char* version;
  const char* topology;
  std::optional<int> chips_per_vm;
  int chips;
  const char* pod_type;
  int chips_per_host;
  int hosts;
  bool single_host;
};

// Every row of the §3 table.
TEST(ComputeSliceShapeTest, SpecTableRows) {
  const ShapeCase cases[] = {
      {"TPU-V6E", "4x4", std::nullopt, 16, "v6e-16", 4, 4, false},
      {"TPU-V6E", "2x4", std::nullopt, 8, "v6e-8", 8, 1, true},
      {"TPU-V6E", "2x4", 4, 8, "v6e-8", 4, 2, false},
      {"TPU-V6E", "2x2", std::nullopt, 4, "v6e-4", 4, 1, true},
      {"TPU-V6E", "1x1", std::nullopt, 1, "v6e-1", 1, 1, true},
      {"TPU-V6E", "8x16", std::nullopt, 128, "v6e-128", 4, 32, false},
      {"v5litepod", "2x8", std::nullopt, 16, "v5litepod-16", 4, 4, false},
      {"TPU-V4", "2x2x1", std::nullopt, 4, "v4-8", 4, 1, true},
      {"TPU-V4", "2x2x2", std::nullopt, 8, "v4-16", 4, 2, false},
      {"TPU-V4", "2x2x4", std::nullopt, 16, "v4-32", 4, 4, false},
      {"TPU-V5P", "2x2x1", std::nullopt, 4, "v5p-8", 4, 1, true},
      {"TPU-V5P", "4x4x4", std::nullopt, 64, "v5p-128", 4, 16, false},
      {"TPU-V5P", "16x16x24", std::nullopt, 6144, "v5p-12288", 4, 1536, false},
      {"TPU-V3", "4x8", std::nullopt, 32, "v3-64", 4, 8, false},
      {"TPU-V7X", "2x2x2", std::nullopt, 8, "v7x-16", 4, 2, false},
  };
  for (const ShapeCase& c : cases) {
    SCOPED_TRACE(std::string(c.version) + " " + c.topology);
    StatusOr<SliceShape> shape = ComputeSliceShape(c.version, c.topology, c.chips_per_vm);
    ASSERT_TRUE(shape.ok()) << shape.status().ToString();
    EXPECT_EQ(shape->chips, c.chips);
    EXPECT_EQ(shape->pod_type, c.pod_type);
    EXPECT_EQ(shape->chips_per_host, c.chips_per_host);
    EXPECT_EQ(shape->hosts, c.hosts);
    EXPECT_EQ(shape->single_host, c.single_host);
    EXPECT_EQ(shape->topology, c.topology);
  }
}

TEST(ComputeSliceShapeTest, SizeSuffixOnVersionIsIgnored) {
  StatusOr<SliceShape> shape = ComputeSliceShape("v2-16", "4x4", std::nullopt);
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  EXPECT_EQ(shape->gen, Generation::kV2);
  EXPECT_EQ(shape->pod_type, "v2-32");
}

TEST(ComputeSliceShapeTest, RejectsBadInputs) {
  auto message = [](const char* v, const char* t, std::optional<int> cpv) {
    StatusOr<SliceShape> shape = ComputeSliceShape(v, t, cpv);
    EXPECT_FALSE(shape.ok()) << v << " " << t;
    if (shape.ok()) return std::string();
    EXPECT_EQ(shape.status().code(), StatusCode::kInvalidArgument);
    return shape.status().message();
  };
  EXPECT_NE(message("A100", "4x4", std::nullopt).find("Invalid accelerator_type 'A100'"),
            std::string::npos);
  EXPECT_NE(message("TPU-V6E", "", std::nullopt).find("Invalid topology ''"), std::string::npos);
  EXPECT_NE(message("TPU-V6E", "4x16", std::nullopt).find("Invalid accelerator topology"),
            std::string::npos);
  EXPECT_NE(message("TPU-V5P", "4x4", std::nullopt).find("Invalid accelerator topology"),
            std::string::npos);
  EXPECT_NE(message("TPU-V6E", "4x4", 0).find("chips_per_vm must be positive."),
            std::string::npos);
  EXPECT_NE(message("TPU-V6E", "4x4", -4).find("chips_per_vm must be positive."),
            std::string::npos);
}

// §3.5 accepted strings, and the "pod type -> chips, default c" column.
TEST(ParsePodTypeTest, AcceptedStrings) {
  struct Row {
    const char* input;
    const char* normalized;
    int chips;
    int default_c;
  };
  const Row rows[] = {
      {"v2-8", "v2-8", 4, 4},
      {"v3-32", "v3-32", 16, 4},
      {"v4-8", "v4-8", 4, 4},
      {"v5p-8", "v5p-8", 4, 4},
      {"v5litepod-8", "v5litepod-8", 8, 8},
      {"v6e-8", "v6e-8", 8, 8},
      {"v7x-16", "v7x-16", 8, 4},
      {"tpu7x-16", "v7x-16", 8, 4},
      {"v6e-16", "v6e-16", 16, 4},
      {"v6e-32", "v6e-32", 32, 4},
      {"v6e-4", "v6e-4", 4, 4},
      {"v6e-1", "v6e-1", 1, 1},
      {"v5litepod-16", "v5litepod-16", 16, 4},
      {"v5litepod-4", "v5litepod-4", 4, 4},
      {"v5litepod-1", "v5litepod-1", 1, 1},
      {"v5e-8", "v5litepod-8", 8, 8},
      {"TPU-V6E-16", "v6e-16", 16, 4},
  };
  for (const Row& r : rows) {
    StatusOr<PodType> pt = ParsePodType(r.input);
    ASSERT_TRUE(pt.ok()) << r.input << ": " << pt.status().ToString();
    EXPECT_EQ(pt->normalized, r.normalized) << r.input;
    EXPECT_EQ(pt->chips, r.chips) << r.input;
    EXPECT_EQ(pt->default_chips_per_host, r.default_c) << r.input;
  }
  EXPECT_EQ(ParsePodType("v7x-16")->size, 16);
  EXPECT_EQ(ParsePodType("v7x-16")->gen, Generation::kV7x);
}

TEST(ParsePodTypeTest, RejectedStrings) {
  for (const char* bad : {"v-8", "8", "tpu-8", "v2", "v2-", "random-string", "v6e", "invalid-8",
                          "", "v4-0", "v4-3", "v6e-x"}) {
    StatusOr<PodType> pt = ParsePodType(bad);
    ASSERT_FALSE(pt.ok()) << bad;
    EXPECT_EQ(pt.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  // §8 messages.
  EXPECT_NE(ParsePodType("v6e").status().message().find("must include size"), std::string::npos);
  EXPECT_NE(ParsePodType("v2-").status().message().find("must include size"), std::string::npos);
  EXPECT_NE(ParsePodType("invalid-8").status().message().find("Invalid accelerator type"),
            std::string::npos);
  EXPECT_NE(ParsePodType("random-string").status().message().find("Invalid accelerator type"),
            std::string::npos);
}

// §3.6 "(node chips, pod type) -> H" column.
TEST(HostsOfSliceFromNodeTest, SpecTable) {
  struct Row {
    int node_chips;
    const char* pod_type;
    int hosts;
  };
  const Row rows[] = {
      {4, "v2-4", 1},         {4, "v3-32", 4},        {4, "v4-8", 1},
      {4, "v4-16", 2},        {4, "v5p-4", 1},        {4, "v5p-8", 1},
      {4, "v5p-16", 2},       {8, "v5litepod-4", 1},  {8, "v5litepod-8", 1},
      {8, "v5litepod-16", 2}, {8, "v5litepod-32", 4}, {4, "v6e-4", 1},
      {8, "v6e-8", 1},        {4, "v6e-8", 2},        {8, "v6e-16", 2},
      {4, "v7x-8", 1},        {4, "v7x-16", 2},
  };
  for (const Row& r : rows) {
    StatusOr<PodType> pt = ParsePodType(r.pod_type);
    ASSERT_TRUE(pt.ok()) << r.pod_type;
    EXPECT_EQ(HostsOfSliceFromNode(r.node_chips, *pt), r.hosts)
        << r.node_chips << " " << r.pod_type;
  }
  EXPECT_EQ(HostsOfSliceFromNode(0, *ParsePodType("v4-16")), 0);
}

// ---- §6 bundle shape and count ----

SliceShape Shape(const char* version, const char* topology,
                 std::optional<int> chips_per_vm = std::nullopt) {
  StatusOr<SliceShape> shape = ComputeSliceShape(version, topology, chips_per_vm);
  EXPECT_TRUE(shape.ok()) << shape.status().ToString();
  return shape.ok() ? *shape : SliceShape{};
}

std::string LayoutError(const SliceShape& shape, double t, int num_slices,
                        const char* strategy) {
  StatusOr<BundleLayout> layout = ComputeBundleLayout(shape, t, num_slices, strategy);
  EXPECT_FALSE(layout.ok());
  if (layout.ok()) return "";
  EXPECT_EQ(layout.status().code(), StatusCode::kInvalidArgument);
  return layout.status().message();
}

// F1: two v4-16 slices (2x2x2, 2 hosts x 4 chips).
TEST(BundleLayoutTest, F1DefaultBundlesOnePerHost) {
  SliceShape f1 = Shape("TPU-V4", "2x2x2");
  EXPECT_EQ(f1.chips_per_host, 4);
  EXPECT_EQ(f1.hosts, 2);
  StatusOr<BundleLayout> layout = ComputeBundleLayout(f1, 1, "SPREAD");
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->tpu_per_bundle, 4);
  EXPECT_EQ(layout->bundles_per_slice, 2);
  EXPECT_EQ(layout->bundles_per_host, 1);
  EXPECT_EQ(layout->total_bundles, 2);
  EXPECT_EQ(LocateBundle(f1, *layout, 0).host_index, 0);
  EXPECT_EQ(LocateBundle(f1, *layout, 1).host_index, 1);
  EXPECT_EQ(LocateBundle(f1, *layout, 1).slice_index, 0);
}

TEST(BundleLayoutTest, F1MultisliceIsSliceMajor) {
  SliceShape f1 = Shape("TPU-V4", "2x2x2");
  StatusOr<BundleLayout> layout = ComputeBundleLayout(f1, 4.0, 2, "SPREAD");
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->total_bundles, 4);
  const int want_slice[] = {0, 0, 1, 1};
  const int want_host[] = {0, 1, 0, 1};
  for (int i = 0; i < 4; ++i) {
    BundleLocation loc = LocateBundle(f1, *layout, i);
    EXPECT_EQ(loc.slice_index, want_slice[i]) << i;
    EXPECT_EQ(loc.host_index, want_host[i]) << i;
  }
  // §7: bundle 2 is slice 1, host 0.
  EXPECT_EQ(LocateBundle(f1, *layout, 2).slice_index, 1);
  EXPECT_EQ(ComputeBundleLayout(f1, 3, "SPREAD")->total_bundles, 6);
}

// F2: (2x4, v6e) / with chips_per_vm=4.
TEST(BundleLayoutTest, F2V6e2x4AsOneOrTwoHosts) {
  SliceShape one_vm = Shape("v6e", "2x4");
  StatusOr<BundleLayout> layout = ComputeBundleLayout(one_vm, 1, "SPREAD");
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->total_bundles, 1);
  EXPECT_EQ(layout->tpu_per_bundle, 8);

  SliceShape two_vms = Shape("v6e", "2x4", 4);
  layout = ComputeBundleLayout(two_vms, 1, "SPREAD");
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->total_bundles, 2);
  EXPECT_EQ(layout->tpu_per_bundle, 4);
  EXPECT_EQ(two_vms.hosts, 2);
}

// F3: one v6e-16 slice (4x4, 4 hosts x 4 chips).
TEST(BundleLayoutTest, F3OneChipBundles) {
  SliceShape f3 = Shape("TPU-V6E", "4x4");
  StatusOr<BundleLayout> layout = ComputeBundleLayout(f3, 1.0, 1, "SPREAD");
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->total_bundles, 16);
  EXPECT_EQ(layout->bundles_per_host, 4);
  for (int k = 0; k < 16; ++k) {
    EXPECT_EQ(LocateBundle(f3, *layout, k).host_index, k / 4) << k;
    EXPECT_EQ(LocateBundle(f3, *layout, k).slice_index, 0) << k;
  }
}

TEST(BundleLayoutTest, F3ThreeChipBundlesAreUneven) {
  SliceShape f3 = Shape("TPU-V6E", "4x4");
  EXPECT_NE(LayoutError(f3, 3, 1, "SPREAD")
                .find("uneven distribution of TPU across bundles is not supported"),
            std::string::npos);
}

TEST(BundleLayoutTest, F3EightChipBundlesWouldNotFitAHost) {
  SliceShape f3 = Shape("TPU-V6E", "4x4");
  EXPECT_NE(LayoutError(f3, 8, 1, "SPREAD").find("bundle would not fit a host"),
            std::string::npos);
}

// §8: "v6e 2x2 with chips_per_vm=8" is the uneven-distribution error.
TEST(BundleLayoutTest, V6e2x2WithChipsPerVm8IsUneven) {
  SliceShape shape = Shape("TPU-V6E", "2x2", 8);
  StatusOr<BundleLayout> layout = ComputeBundleLayout(shape, 1, "SPREAD");
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find(
                "uneven distribution of TPU across bundles is not supported"),
            std::string::npos)
      << layout.status().message();
}

TEST(BundleLayoutTest, ChipsPerSliceNotDivisibleByChipsPerHost) {
  SliceShape shape = Shape("TPU-V6E", "4x4", 3);
  EXPECT_NE(LayoutError(shape, 1, 1, "SPREAD").find("bundle would not fit a host"),
            std::string::npos);
}

TEST(BundleLayoutTest, TpuPerBundleMustBePositiveInteger) {
  SliceShape f3 = Shape("TPU-V6E", "4x4");
  EXPECT_NE(LayoutError(f3, 0, 1, "SPREAD").find("TPU per bundle must be positive"),
            std::string::npos);
  EXPECT_NE(LayoutError(f3, -2, 1, "SPREAD").find("TPU per bundle must be positive"),
            std::string::npos);
  EXPECT_NE(LayoutError(f3, 0.5, 1, "SPREAD").find("TPU per bundle"), std::string::npos);
}

TEST(BundleLayoutTest, NumSlicesAndStrategyAreValidated) {
  SliceShape f1 = Shape("TPU-V4", "2x2x2");
  EXPECT_NE(LayoutError(f1, 4, 0, "SPREAD").find("num_slices"), std::string::npos);
  EXPECT_NE(LayoutError(f1, 4, -1, "SPREAD").find("num_slices"), std::string::npos);
  EXPECT_NE(LayoutError(f1, 4, 1, "RANDOM").find("strategy"), std::string::npos);
  for (const std::string& s : ValidStrategies()) {
    if (s == "STRICT_PACK") continue;  // F1 is multi-host
    EXPECT_TRUE(ComputeBundleLayout(f1, 4.0, 2, s).ok()) << s;
  }
}

TEST(BundleLayoutTest, StrictSpreadNeedsOneBundlePerHost) {
  SliceShape f3 = Shape("TPU-V6E", "4x4");
  EXPECT_TRUE(ComputeBundleLayout(f3, 4.0, 1, "STRICT_SPREAD").ok());
  EXPECT_NE(LayoutError(f3, 1, 1, "STRICT_SPREAD").find("STRICT_SPREAD"), std::string::npos);
  EXPECT_NE(LayoutError(f3, 2, 2, "STRICT_SPREAD").find("STRICT_SPREAD"), std::string::npos);
}

TEST(BundleLayoutTest, StrictPackNeedsOneSingleHostSlice) {
  SliceShape single = Shape("v6e", "2x4");
  EXPECT_TRUE(ComputeBundleLayout(single, 1, "STRICT_PACK").ok());
  EXPECT_TRUE(ComputeBundleLayout(single, 2.0, 1, "STRICT_PACK").ok());
  EXPECT_NE(LayoutError(single, 8, 2, "STRICT_PACK").find("STRICT_PACK"), std::string::npos);
  SliceShape f1 = Shape("TPU-V4", "2x2x2");
  EXPECT_NE(LayoutError(f1, 4, 1, "STRICT_PACK").find("STRICT_PACK"), std::string::npos);
}

// ---- §4 label keys ----

TEST(LabelKeyTest, RayAliasesMapToTorusKeys) {
  for (const char* k :
       {"accelerator-type", "tpu-slice-name", "tpu-worker-id", "tpu-topology", "tpu-pod-type"}) {
    EXPECT_EQ(NormalizeLabelKey(std::string("ray.io/") + k), std::string("torus.io/") + k);
    EXPECT_EQ(NormalizeLabelKey(std::string("torus.io/") + k), std::string("torus.io/") + k);
    EXPECT_TRUE(IsReservedTpuLabelKey(std::string("ray.io/") + k)) << k;
    EXPECT_TRUE(IsReservedTpuLabelKey(std::string("torus.io/") + k)) << k;
  }
  EXPECT_EQ(NormalizeLabelKey("ray.io/node-id"), "ray.io/node-id");
  EXPECT_EQ(NormalizeLabelKey("team"), "team");
  EXPECT_EQ(NormalizeLabelKey("ray.io/tpu-slice-name-x"), "ray.io/tpu-slice-name-x");
  EXPECT_FALSE(IsReservedTpuLabelKey("torus.io/node-group"));
  EXPECT_FALSE(IsReservedTpuLabelKey("ray.io/node-id"));
  EXPECT_EQ(kLabelPodType, "torus.io/tpu-pod-type");
}

TEST(LabelKeyTest, SelectorAliasesMergeOrConflict) {
  StatusOr<std::map<std::string, std::string>> merged = NormalizeSelectorKeys(
      {{"ray.io/tpu-slice-name", "s0"}, {"torus.io/tpu-slice-name", "s0"}, {"team", "a"}});
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(*merged, (std::map<std::string, std::string>{{"torus.io/tpu-slice-name", "s0"},
                                                         {"team", "a"}}));
  StatusOr<std::map<std::string, std::string>> conflict = NormalizeSelectorKeys(
      {{"ray.io/tpu-pod-type", "v4-16"}, {"torus.io/tpu-pod-type", "in(v4-16,v4-32)"}});
  ASSERT_FALSE(conflict.ok());
  EXPECT_EQ(conflict.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(conflict.status().message().find("torus.io/tpu-pod-type"), std::string::npos);
}

}  // namespace
}  // namespace torus::tpu
