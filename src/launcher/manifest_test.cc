// docs/tpu.md §5: RayCluster parsing, validation, host plan and environment.
#include "launcher/manifest.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tpu/node_identity.h"

namespace torus::launcher {
namespace {

struct TpuGroup {
  std::string accelerator = "tpu-v4-podslice";  // "" = no selector
  std::string topology = "2x2x2";               // "" = no selector
  std::string tpu = "4";                        // google.com/tpu limit
  int num_of_hosts = 2;
  int replicas = 1;
  std::string env;  // extra env entries, YAML lines at the env list's indentation
  std::string name = "g";
};

std::string Manifest(const TpuGroup& g, const std::string& cluster = "c") {
  std::string y =
      "apiVersion: ray.io/v1\n"
      "kind: RayCluster\n"
      "metadata:\n"
      "  name: " + cluster + "\n"
      "spec:\n"
      "  rayVersion: '2.40.0'\n"
      "  headGroupSpec:\n"
      "    rayStartParams:\n"
      "      num-cpus: '1'\n"
      "    template:\n"
      "      spec:\n"
      "        containers:\n"
      "        - name: ray-head\n"
      "          image: rayproject/ray:2.40.0\n"
      "  workerGroupSpecs:\n"
      "  - groupName: " + g.name + "\n"
      "    replicas: " + std::to_string(g.replicas) + "\n"
      "    minReplicas: 0\n"
      "    maxReplicas: 4\n"
      "    numOfHosts: " + std::to_string(g.num_of_hosts) + "\n"
      "    rayStartParams:\n"
      "      num-cpus: '1'\n"
      "    template:\n"
      "      spec:\n"
      "        nodeSelector:\n";
  if (!g.accelerator.empty()) y += "          cloud.google.com/gke-tpu-accelerator: " + g.accelerator + "\n";
  if (!g.topology.empty()) y += "          cloud.google.com/gke-tpu-topology: " + g.topology + "\n";
  if (g.accelerator.empty() && g.topology.empty()) y += "          {}\n";
  y +=
      "        containers:\n"
      "        - name: ray-worker\n"
      "          image: rayproject/ray:2.40.0\n"
      "          resources:\n"
      "            limits:\n"
      "              google.com/tpu: \"" + g.tpu + "\"\n"
      "            requests:\n"
      "              google.com/tpu: \"" + g.tpu + "\"\n";
  if (!g.env.empty()) y += "          env:\n" + g.env;
  return y;
}

ClusterSpec MustParse(const std::string& y) {
  auto s = ParseRayCluster(y);
  EXPECT_TRUE(s.ok()) << s.status().ToString() << "\n" << y;
  return s.ok() ? *s : ClusterSpec{};
}

std::vector<HostPlan> TpuHosts(const ClusterSpec& c) {
  std::vector<HostPlan> out;
  for (auto& h : PlanHosts(c)) {
    if (h.tpu) out.push_back(h);
  }
  return out;
}

std::string Env(const HostPlan& h, const std::string& k) {
  auto it = h.env.find(k);
  return it == h.env.end() ? "<unset>" : it->second;
}

// The node side (§4) on the planned environment: what the node would advertise.
tpu::NodeTpuIdentity NodeView(const HostPlan& h) {
  tpu::NodeTpuInput in;
  in.env = h.env;
  auto id = tpu::ComputeNodeTpuIdentity(in);
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  return id.ok() ? *id : tpu::NodeTpuIdentity{};
}

// ---- §5 worked examples

TEST(Manifest, V4TwoHostSlice) {
  auto c = MustParse(Manifest({}));
  auto hosts = TpuHosts(c);
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(hosts[0].name, "g-0-0");
  EXPECT_EQ(hosts[1].name, "g-0-1");
  for (int j = 0; j < 2; ++j) {
    EXPECT_EQ(Env(hosts[j], "TPU_NAME"), "g-0");
    EXPECT_EQ(Env(hosts[j], "TPU_WORKER_ID"), std::to_string(j));
    EXPECT_EQ(Env(hosts[j], "TPU_WORKER_HOSTNAMES"), "g-0-0.c-headless,g-0-1.c-headless");
    EXPECT_EQ(Env(hosts[j], "TPU_ACCELERATOR_TYPE"), "v4-16");
    EXPECT_EQ(Env(hosts[j], "TPU_TOPOLOGY"), "2x2x2");
    EXPECT_EQ(Env(hosts[j], "TORUS_TPU_CHIPS"), "4");
    EXPECT_EQ(Env(hosts[j], "TORUS_TPU_METADATA_URL"), "off");
    EXPECT_EQ(Env(hosts[j], "MEGASCALE_SLICE_ID"), "<unset>");
    EXPECT_EQ(Env(hosts[j], "TPU_PROCESS_ADDRESSES"), "<unset>");
    EXPECT_EQ(hosts[j].labels.at("torus.io/node-group"), "g");
    EXPECT_EQ(hosts[j].resources.at("CPU"), 1);
    EXPECT_EQ(hosts[j].resources.count("TPU"), 0u) << "P reaches the node as TORUS_TPU_CHIPS";
  }
  EXPECT_EQ(hosts[0].fqdn, "g-0-0.c-headless");
  auto n0 = NodeView(hosts[0]), n1 = NodeView(hosts[1]);
  EXPECT_EQ(n0.resources.count("TPU-v4-16-head"), 1u);
  EXPECT_EQ(n1.resources.count("TPU-v4-16-head"), 0u);
  EXPECT_EQ(n0.resources.at("TPU"), 4);
  EXPECT_EQ(n0.resources.at("g-0"), 1);
  EXPECT_EQ(n1.labels.at("torus.io/tpu-worker-id"), "1");
}

TEST(Manifest, V4WithOneHostIsRejected) {
  TpuGroup g;
  g.num_of_hosts = 1;
  auto s = ParseRayCluster(Manifest(g));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("Number of workers in worker group not equal to specified topology"),
            std::string::npos)
      << s.status().message();
}

TEST(Manifest, V6eMultislice) {
  TpuGroup g{"tpu-v6e-slice", "4x4", "4", 4, 2, "          - name: MEGASCALE_NUM_SLICES\n            value: \"2\"\n"};
  auto hosts = TpuHosts(MustParse(Manifest(g)));
  ASSERT_EQ(hosts.size(), 8u);
  for (const auto& h : hosts) {
    EXPECT_EQ(Env(h, "TPU_NAME"), "g-" + std::to_string(h.replica));
    EXPECT_EQ(Env(h, "MEGASCALE_SLICE_ID"), std::to_string(h.replica));
    EXPECT_EQ(Env(h, "MEGASCALE_NUM_SLICES"), "2") << "left as the template sets it";
    EXPECT_EQ(Env(h, "MEGASCALE_COORDINATOR_ADDRESS"), "g-0-0.c-headless");
    EXPECT_EQ(Env(h, "MEGASCALE_PORT"), "8081");
    EXPECT_EQ(Env(h, "TPU_ACCELERATOR_TYPE"), "v6e-16");
    EXPECT_EQ(Env(h, "TPU_WORKER_ID"), std::to_string(h.host));
  }
  EXPECT_EQ(hosts[5].name, "g-1-1");
  EXPECT_EQ(Env(hosts[5], "TPU_WORKER_HOSTNAMES"),
            "g-1-0.c-headless,g-1-1.c-headless,g-1-2.c-headless,g-1-3.c-headless");
}

TEST(Manifest, V6e2x4OneOrTwoHosts) {
  auto one = TpuHosts(MustParse(Manifest({"tpu-v6e-slice", "2x4", "8", 1, 1})));
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(Env(one[0], "TPU_NAME"), "g-0");
  EXPECT_EQ(Env(one[0], "TPU_WORKER_ID"), "0");
  EXPECT_EQ(Env(one[0], "TPU_WORKER_HOSTNAMES"), "<unset>");
  EXPECT_EQ(Env(one[0], "TPU_ACCELERATOR_TYPE"), "v6e-8");
  EXPECT_EQ(NodeView(one[0]).resources.count("TPU-v6e-8-head"), 1u);
  auto two = TpuHosts(MustParse(Manifest({"tpu-v6e-slice", "2x4", "4", 2, 1})));
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(Env(two[1], "TORUS_TPU_CHIPS"), "4");
  EXPECT_EQ(NodeView(two[1]).resources.at("TPU"), 4);
}

TEST(Manifest, V7xProcessVariablesAndTemplateEnvWins) {
  auto hosts = TpuHosts(MustParse(Manifest({"tpu7x", "2x2x2", "4", 2, 1})));
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(Env(hosts[0], "TPU_ACCELERATOR_TYPE"), "v7x-16");
  EXPECT_EQ(Env(hosts[0], "TPU_PROCESS_ADDRESSES"), "g-0-0.c-headless:8471,g-0-1.c-headless:8471");
  EXPECT_EQ(Env(hosts[1], "TPU_PROCESS_PORT"), "8471");
  TpuGroup g{"tpu7x", "2x2x2", "4", 2, 1, "          - name: TPU_WORKER_ID\n            value: \"5\"\n"};
  for (const auto& h : TpuHosts(MustParse(Manifest(g)))) EXPECT_EQ(Env(h, "TPU_WORKER_ID"), "5");
}

TEST(Manifest, V7xMultisliceCoordinatorHasPort) {
  TpuGroup g{"tpu7x", "2x2x2", "4", 2, 2, "          - name: MEGASCALE_NUM_SLICES\n            value: \"2\"\n"};
  auto hosts = TpuHosts(MustParse(Manifest(g)));
  ASSERT_EQ(hosts.size(), 4u);
  EXPECT_EQ(Env(hosts[3], "MEGASCALE_COORDINATOR_ADDRESS"), "g-0-0.c-headless:8081");
  EXPECT_EQ(Env(hosts[3], "MEGASCALE_SLICE_ID"), "1");
}

TEST(Manifest, LocalhostWorkerHostnamesIsReplaced) {
  TpuGroup g;
  g.env = "          - name: TPU_WORKER_HOSTNAMES\n            value: localhost\n"
          "          - name: MY_VAR\n            value: kept\n";
  auto hosts = TpuHosts(MustParse(Manifest(g)));
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(Env(hosts[0], "TPU_WORKER_HOSTNAMES"), "g-0-0.c-headless,g-0-1.c-headless");
  EXPECT_EQ(Env(hosts[0], "MY_VAR"), "kept");
}

TEST(Manifest, LabelsResourcesAndIgnoredFields) {
  std::string y = R"(apiVersion: ray.io/v1
kind: RayCluster
metadata:
  name: demo
  namespace: default
spec:
  enableInTreeAutoscaling: false
  headGroupSpec:
    serviceType: ClusterIP
    rayStartParams:
      num-cpus: "2"
      dashboard-host: 0.0.0.0
    template:
      spec:
        containers:
        - name: head
          image: x
          ports: [{containerPort: 6379}]
  workerGroupSpecs:
  - groupName: cpu
    replicas: 2
    numOfHosts: 0
    labels: {zone: a, tier: batch}
    resources: {custom: "3"}
    rayStartParams:
      resources: '"{\"extra\": 2, \"TPU\": 0}"'
      object-store-memory: "100000000"
    template:
      spec:
        containers:
        - name: w
          image: x
          resources:
            limits: {cpu: 1500m, memory: 2Gi}
            requests: {cpu: "1", memory: 1Gi}
  - groupName: tpu
    replicas: 1
    numOfHosts: 1
    rayStartParams:
      num-cpus: "1"
      resources: '{"TPU": 2}'
    template:
      metadata:
        annotations: {note: x}
      spec:
        nodeSelector:
          cloud.google.com/gke-tpu-accelerator: tpu-v6e-slice
          cloud.google.com/gke-tpu-topology: 2x2
        containers:
        - name: w
          image: x
          resources:
            limits: {google.com/tpu: 4}
)";
  auto c = MustParse(y);
  ASSERT_EQ(c.workers.size(), 2u);
  EXPECT_EQ(c.head.resources.at("CPU"), 2);
  const auto& cpu = c.workers[0];
  EXPECT_EQ(cpu.num_of_hosts, 1) << "numOfHosts <= 0 reads as 1 for non-TPU groups";
  EXPECT_EQ(cpu.resources.at("CPU"), 2) << "cpu limit 1500m rounded up";
  EXPECT_EQ(cpu.resources.at("memory"), 2.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(cpu.resources.at("custom"), 3);
  EXPECT_EQ(cpu.resources.at("extra"), 2);
  auto plan = PlanHosts(c);
  ASSERT_EQ(plan.size(), 4u);  // head, cpu-0-0, cpu-1-0, tpu-0-0
  EXPECT_TRUE(plan[0].is_head);
  EXPECT_EQ(plan[0].name, "demo-head");
  EXPECT_EQ(plan[0].labels.at("torus.io/node-group"), "headgroup");
  EXPECT_EQ(plan[2].name, "cpu-1-0");
  EXPECT_EQ(plan[2].labels.at("zone"), "a");
  EXPECT_EQ(plan[2].labels.at("torus.io/node-group"), "cpu");
  EXPECT_EQ(plan[2].env.count("TPU_NAME"), 0u);
  EXPECT_EQ(plan[2].object_store_bytes, 100000000u) << "rayStartParams object-store-memory";
  EXPECT_EQ(plan[0].object_store_bytes, 0u) << "not given: the node's default";
  EXPECT_EQ(plan[3].resources.at("TPU"), 2) << "an explicit TPU wins over P";
  std::vector<std::string> want = {"metadata.namespace",
                                   "spec.enableInTreeAutoscaling",
                                   "spec.headGroupSpec.rayStartParams.dashboard-host",
                                   "spec.headGroupSpec.serviceType",
                                   "spec.headGroupSpec.template.spec.containers[].image",
                                   "spec.headGroupSpec.template.spec.containers[].name",
                                   "spec.headGroupSpec.template.spec.containers[].ports",
                                   "spec.workerGroupSpecs[].template.spec.containers[].image",
                                   "spec.workerGroupSpecs[].template.spec.containers[].name"};
  EXPECT_EQ(c.ignored_fields, want);
}

TEST(Manifest, HeadlessSubdomainIsShortenedTo63) {
  EXPECT_EQ(HeadlessSubdomain("c"), "c-headless");
  std::string longname(60, 'a');
  longname[4] = 'b';
  std::string sub = HeadlessSubdomain(longname);
  EXPECT_EQ(sub.size(), 63u);
  EXPECT_EQ(sub, std::string(54, 'a') + "-headless");
  EXPECT_EQ(HeadlessSubdomain(std::string(10, 'x') + "-9" + std::string(53, 'y'))[0], 'r');
}

TEST(Manifest, Quantities) {
  EXPECT_EQ(*ParseQuantity("4"), 4);
  EXPECT_EQ(*ParseQuantity("500m"), 0.5);
  EXPECT_EQ(*ParseQuantity("2Gi"), 2.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(*ParseQuantity("1e3"), 1000);
  EXPECT_EQ(*ParseQuantity("1.5k"), 1500);
  EXPECT_FALSE(ParseQuantity("").has_value());
  EXPECT_FALSE(ParseQuantity("four").has_value());
  EXPECT_FALSE(ParseQuantity("4Xi").has_value());
}

// ---- bad manifests: each refused, naming the field

struct Bad {
  std::string what;
  std::string yaml;
  std::vector<std::string> expect;  // substrings of the message
};

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  auto p = s.find(from);
  EXPECT_NE(p, std::string::npos) << from;
  if (p != std::string::npos) s.replace(p, from.size(), to);
  return s;
}

TEST(Manifest, BadManifestsAreRefusedNamingTheField) {
  TpuGroup two_containers;
  std::string head_tpu = Replace(Manifest({}), "          image: rayproject/ray:2.40.0\n  workerGroupSpecs",
                                 "          image: rayproject/ray:2.40.0\n          resources:\n"
                                 "            limits: {google.com/tpu: 4}\n  workerGroupSpecs");
  std::string two = Manifest({}) +
                    "        - name: second\n          resources:\n            limits: {google.com/tpu: 4}\n";
  std::string deep;  // {"a": {"a": ... {} ...}} 100000 levels deep (issue 41: no recursion on it)
  for (int i = 1; i < 100000; ++i) deep += "{\"a\": ";
  deep += "{}" + std::string(99999, '}');
  std::vector<Bad> cases = {
      {"numOfHosts does not match the topology", Manifest({"tpu-v4-podslice", "2x2x2", "4", 1, 1}),
       {"numOfHosts", "Number of workers in worker group not equal to specified topology", "expected 2"}},
      {"numOfHosts 0", Manifest({"tpu-v4-podslice", "2x2x2", "4", 0, 1}), {"numOfHosts", "0; expected >= 1"}},
      {"no topology selector", Manifest({"tpu-v4-podslice", "", "4", 2, 1}),
       {"nodeSelector", "missing cloud.google.com/gke-tpu-topology"}},
      {"no accelerator selector", Manifest({"", "2x2x2", "4", 2, 1}),
       {"nodeSelector", "missing cloud.google.com/gke-tpu-accelerator"}},
      {"unknown generation", Manifest({"tpu-v3-slice", "4x4", "4", 4, 1}),
       {"cloud.google.com/gke-tpu-accelerator", "'tpu-v3-slice' is not a known TPU accelerator", "tpu-v6e-slice"}},
      {"topology not valid for the generation", Manifest({"tpu-v6e-slice", "2x2x2", "4", 2, 1}),
       {"cloud.google.com/gke-tpu-topology", "Invalid accelerator topology: '2x2x2'"}},
      {"topology does not parse", Manifest({"tpu-v6e-slice", "4x", "4", 2, 1}), {"Invalid topology '4x'"}},
      {"P does not divide C", Manifest({"tpu-v4-podslice", "2x2x2", "3", 2, 1}),
       {"google.com/tpu", "3 does not divide the 8 chips"}},
      {"P zero", Manifest({"tpu-v4-podslice", "2x2x2", "0", 2, 1}),
       {"google.com/tpu", "expected a positive integer"}},
      {"P fractional", Manifest({"tpu-v4-podslice", "2x2x2", "500m", 2, 1}), {"google.com/tpu", "is 0.5"}},
      {"two TPU containers", two, {"2 containers ask for google.com/tpu", "exactly one TPU container"}},
      {"head with TPU", head_tpu, {"spec.headGroupSpec", "the head group asks for google.com/tpu (4)"}},
      {"wrong kind", Replace(Manifest({}), "kind: RayCluster", "kind: RayJob"), {"kind", "'RayJob'", "RayCluster"}},
      {"wrong apiVersion", Replace(Manifest({}), "ray.io/v1", "ray.io/v1alpha1"), {"apiVersion", "ray.io/v1alpha1"}},
      {"malformed YAML", "apiVersion: ray.io/v1\nkind: RayCluster\nmetadata:\n  name: [c\n",
       {"malformed YAML at line", "column"}},
      {"tab-indented YAML", "apiVersion: ray.io/v1\nkind: RayCluster\nspec:\n\theadGroupSpec: {}\n",
       {"malformed YAML at line 4"}},
      {"replicas not an integer", Replace(Manifest({}), "replicas: 1\n", "replicas: two\n"),
       {"spec.workerGroupSpecs[0].replicas", "'two' (line 17) is not an integer"}},
      {"reserved label", Replace(Manifest({}), "    minReplicas: 0\n", "    minReplicas: 0\n    labels: {ray.io/tpu-worker-id: \"3\"}\n"),
       {"labels", "ray.io/tpu-worker-id"}},
      {"subslice annotation", Replace(Manifest({}), "    template:\n      spec:\n        nodeSelector",
                                      "    template:\n      metadata:\n        annotations:\n"
                                      "          cloud.google.com/gke-tpu-slice-topology: 2x2x1\n"
                                      "      spec:\n        nodeSelector"),
       {"cloud.google.com/gke-tpu-slice-topology", "not supported"}},
      {"bad resources JSON", Replace(Manifest({}), "      num-cpus: '1'\n    template:\n      spec:\n        nodeSelector",
                                     "      num-cpus: '1'\n      resources: '{bad'\n    template:\n      spec:\n        nodeSelector"),
       {"rayStartParams.resources", "not a JSON object"}},
      {"deep resources JSON", Replace(Manifest({}), "      num-cpus: '1'\n    template:\n      spec:\n        nodeSelector",
                                      "      num-cpus: '1'\n      resources: '" + deep +
                                          "'\n    template:\n      spec:\n        nodeSelector"),
       {"rayStartParams.resources", "JSON nested deeper than 64 levels"}},
      {"absurd num-cpus", Replace(Manifest({}), "    numOfHosts: 2\n    rayStartParams:\n      num-cpus: '1'\n",
                                  "    numOfHosts: 2\n    rayStartParams:\n      num-cpus: '5e15'\n"),
       {"spec.workerGroupSpecs[0]", "CPU = 5e+15 is too large"}},
      {"absurd resource JSON", Replace(Manifest({}), "      num-cpus: '1'\n    template:\n      spec:\n        nodeSelector",
                                       "      num-cpus: '1'\n      resources: '{\"custom\": 1e300}'\n    template:\n      spec:\n        nodeSelector"),
       {"custom = 1e+300 is too large"}},
      {"no name", Replace(Manifest({}), "  name: c\n", "  labels: {}\n"), {"metadata.name", "missing"}},
      {"two documents", Manifest({}) + "---\n" + Manifest({}), {"exactly one YAML document"}},
  };
  for (const auto& c : cases) {
    auto s = ParseRayCluster(c.yaml);
    ASSERT_FALSE(s.ok()) << c.what;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << c.what;
    const std::string& m = s.status().message();
    EXPECT_EQ(m.rfind("Failed to validate RayCluster: ", 0), 0u) << c.what << ": " << m;
    for (const auto& e : c.expect) EXPECT_NE(m.find(e), std::string::npos) << c.what << ": want '" << e << "' in\n" << m;
  }
}

TEST(Manifest, AllProblemsAreReportedTogether) {
  std::string y = Manifest({"tpu-v3-slice", "", "4", 2, 1});
  y += "  - groupName: h\n    replicas: 1\n    numOfHosts: 1\n    template:\n      spec:\n"
       "        nodeSelector:\n          cloud.google.com/gke-tpu-accelerator: tpu-v4-podslice\n"
       "          cloud.google.com/gke-tpu-topology: 2x2x2\n        containers:\n        - name: w\n"
       "          resources:\n            limits: {google.com/tpu: 4}\n";
  auto s = ParseRayCluster(y);
  ASSERT_FALSE(s.ok());
  const std::string& m = s.status().message();
  EXPECT_NE(m.find("'tpu-v3-slice'"), std::string::npos) << m;
  EXPECT_NE(m.find("missing cloud.google.com/gke-tpu-topology"), std::string::npos) << m;
  EXPECT_NE(m.find("group 'h'"), std::string::npos) << m;
  EXPECT_NE(m.find("Number of workers"), std::string::npos) << m;
}

}  // namespace
}  // namespace torus::launcher

namespace torus::launcher {
namespace {

std::string ReadExample(const std::string& name) {
  std::ifstream f(std::string(TORUS_SOURCE_DIR) + "/examples/kuberay/" + name);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The GKE manifests that run Torus's image (examples/kuberay, scripts/image.sh) are valid
// RayClusters with the slices they say.
TEST(KubeRayExamples, TheSliceAndMultisliceManifestsAskForWholeV6eSlices) {
  for (auto [file, replicas] : {std::pair{"v6e-4x4-slice.yaml", 1}, std::pair{"v6e-4x4-multislice.yaml", 2}}) {
    std::string text = ReadExample(file);
    ASSERT_FALSE(text.empty()) << file;
    auto spec = ParseRayCluster(text);
    ASSERT_TRUE(spec.ok()) << file << ": " << spec.status().message();
    ASSERT_EQ(spec->workers.size(), 1u) << file;
    const GroupSpec& g = spec->workers[0];
    EXPECT_EQ(g.replicas, replicas) << file;
    EXPECT_EQ(g.num_of_hosts, 4) << file;
    EXPECT_EQ(g.tpu_chips, 4) << file;
    EXPECT_EQ(g.topology, "4x4") << file;
    EXPECT_EQ(g.pod_type, "v6e-16") << file;
    EXPECT_EQ(g.NumHosts(), 4 * replicas) << file;
  }
}

}  // namespace
}  // namespace torus::launcher
