// The cluster launcher's model of a KubeRay `RayCluster` manifest (docs/tpu.md §5): parsing,
// validation, and the plan of node processes with the environment GKE and the KubeRay TPU
// webhook would give each host.
//
// Pure functions of their arguments: no I/O, no global state, safe from any thread. The
// manifest comes from a user's file, so every problem is answered with an InvalidArgument
// Status ("Failed to validate RayCluster: ..."), never a crash. The TPU rules (generations,
// topologies, pod types, reserved label keys) come from tpu/topology.h and tpu/node_identity.h.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "tpu/gang_env.h"
#include "tpu/topology.h"

namespace torus::launcher {

inline constexpr std::string_view kGkeAcceleratorSelector = "cloud.google.com/gke-tpu-accelerator";
inline constexpr std::string_view kGkeTopologySelector = "cloud.google.com/gke-tpu-topology";
inline constexpr std::string_view kGkeSubsliceAnnotation = "cloud.google.com/gke-tpu-slice-topology";
inline constexpr std::string_view kTpuResourceName = "google.com/tpu";
inline constexpr std::string_view kNodeGroupLabel = "torus.io/node-group";
inline constexpr int kMegascalePort = tpu::kMegascalePort;  // the one value: tpu/gang_env.h
inline constexpr int kTpuProcessPortBase = 8471;  // spec §5: "(to confirm)"; webhook README: 8476

// One group of the manifest: the head group or a workerGroupSpecs entry.
struct GroupSpec {
  std::string name;       // groupName; "head" for the head group
  bool is_head = false;
  int replicas = 0;       // the head group: 1
  std::optional<int> min_replicas, max_replicas;  // recorded; v1 launches `replicas`
  int num_of_hosts = 1;   // non-TPU groups: a value <= 0 reads as 1
  // Logical resources of each node: container cpu/memory, then rayStartParams.resources, then
  // the group's `resources`, then rayStartParams num-cpus (CPU). No CPU key = the node default.
  // TPU appears here only when given explicitly (it then wins over P).
  std::map<std::string, double> resources;
  std::map<std::string, std::string> labels;         // the group's `labels`
  uint64_t object_store_bytes = 0;  // rayStartParams object-store-memory; 0 = the node's default
  std::map<std::string, std::string> node_selector;  // template.spec.nodeSelector
  std::map<std::string, std::string> annotations;    // template.metadata.annotations
  // The pod's env (`name`/`value` entries of the TPU container, else of the first container),
  // in manifest order.
  std::vector<std::pair<std::string, std::string>> env;

  // TPU groups only (tpu_chips > 0).
  int tpu_chips = 0;  // P: google.com/tpu of the pod (limits, else requests)
  tpu::Generation generation = tpu::Generation::kV4;
  std::string topology;   // the topology selector, lowercased
  int slice_chips = 0;    // C
  std::string pod_type;   // "v6e-16"

  bool is_tpu() const { return tpu_chips > 0; }
  // Node processes of the group: replicas × numOfHosts.
  int NumHosts() const { return replicas * num_of_hosts; }
};

struct ClusterSpec {
  std::string name;  // metadata.name
  GroupSpec head;
  std::vector<GroupSpec> workers;
  // Fields present in the manifest that Torus does not use, as paths with list indices
  // collapsed ("spec.workerGroupSpecs[].template.spec.containers[].image"), sorted, unique.
  std::vector<std::string> ignored_fields;
};

// Parses and validates one YAML document. Errors (InvalidArgument), all collected into one
// "Failed to validate RayCluster: <problem>; <problem>; ..." naming field, value and what was
// expected: malformed YAML (with line and column), apiVersion other than ray.io/v1, kind other
// than RayCluster, wrong types, and the §5 TPU rules.
StatusOr<ClusterSpec> ParseRayCluster(std::string_view yaml_text);

// "<cluster>-headless", shortened to 63 characters as KubeRay shortens names: leading characters
// are dropped, and a first character that is not a letter becomes 'r'.
std::string HeadlessSubdomain(std::string_view cluster_name);

// One node process to start.
struct HostPlan {
  std::string group;
  bool is_head = false;
  bool tpu = false;
  int replica = 0;        // r
  int host = 0;           // j
  int replica_hosts = 1;  // numOfHosts of the group
  std::string name;       // "G-r-j"; the head: "<cluster>-head"
  std::string fqdn;       // "G-r-j.<subdomain>"
  // The pod's environment: the template env, plus the §5 variables it does not set.
  std::map<std::string, std::string> env;
  std::map<std::string, double> resources;     // passed as the node's --resources
  std::map<std::string, std::string> labels;   // passed as --labels (group labels + node-group)
  uint64_t object_store_bytes = 0;             // --object-store-memory when not 0
};

// The head first, then each group in manifest order, replica-major then host.
std::vector<HostPlan> PlanHosts(const ClusterSpec& spec);

// Parses a Kubernetes quantity ("1", "500m", "2Gi", "1.5", "1e3") to a number.
std::optional<double> ParseQuantity(std::string_view q);

}  // namespace torus::launcher
