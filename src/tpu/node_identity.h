// TPU node identity (docs/tpu.md §4): how a node process learns its chip count, pod type, slice
// name, worker id and topology, and which labels and resources it advertises.
//
// ComputeNodeTpuIdentity is computed once per node process, on its start-up thread. Its only I/O
// is reading the device tree (under NodeTpuInput::device_root) and calling the injected
// MetadataFetcher; everything else is a pure function of the input, so tests pass a fake tree in
// a temp dir and a fake fetcher. Malformed inputs never abort: they become `warnings` (for the
// caller to log) and the field is treated as absent. The only errors are the §8 node-start ones.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "tpu/topology.h"

namespace torus::tpu {

using EnvMap = std::map<std::string, std::string>;

// Looks up one GCE metadata attribute by key ("accelerator-type", "instance-id",
// "agent-worker-number", "tpu-env"). nullopt means absent: no server, a timeout, a non-200 reply
// or an empty body. An empty std::function means "no metadata server" and is never called.
using MetadataFetcher = std::function<std::optional<std::string>(const std::string& key)>;

inline constexpr std::string_view kDefaultMetadataBaseUrl =
    "http://metadata.google.internal/computeMetadata/v1/instance/attributes/";
inline constexpr std::chrono::milliseconds kMetadataTimeout{1000};

// The real fetcher: a blocking HTTP/1.1 GET of `base_url` + key (a '/' is inserted if the base
// lacks one) with header `Metadata-Flavor: Google` over a plain TCP socket. `timeout` bounds the
// whole request (name resolution, connect, send, receive). Only http:// URLs are supported; any
// error gives nullopt. Thread-safe: the returned function holds only copies of its arguments.
// Name resolution of a non-numeric host uses glibc's asynchronous getaddrinfo_a, so that a slow
// DNS server cannot exceed the timeout; a lookup still running at the deadline is left to the C
// library's own helper thread and freed by a later call once it has finished.
MetadataFetcher HttpMetadataFetcher(std::string base_url,
                                    std::chrono::milliseconds timeout = kMetadataTimeout);

// TORUS_TPU_METADATA_URL in `env`: absent -> HttpMetadataFetcher(kDefaultMetadataBaseUrl);
// "off" -> an empty fetcher (metadata disabled); else HttpMetadataFetcher(value).
MetadataFetcher MetadataFetcherFromEnv(const EnvMap& env);

// The topology quoted in the `TOPOLOGY: '<t>'` line of the `tpu-env` attribute, lowercased;
// nullopt when there is no such line or its value is empty.
std::optional<std::string> ParseTpuEnvTopology(std::string_view tpu_env);

// §4 chip count steps 1-3 under `device_root` ("" for the real /dev and /sys):
// non-directory entries of <root>/dev named accel*; if none, numeric entries n of <root>/dev/vfio
// for which some <root>/sys/kernel/iommu_groups/<n>/devices/*/vendor reads 0x1ae0; else 0.
// Missing or unreadable paths count as nothing.
int CountTpuChipsInDeviceTree(const std::string& device_root);

struct NodeTpuInput {
  EnvMap env;                         // the node process's environment
  std::optional<double> explicit_tpu; // `TPU` in the node's start resources, if given
  std::string device_root;            // TORUS_TPU_DEVICE_ROOT; "" = the real tree
  MetadataFetcher metadata;           // empty = no metadata server
};

// Fills device_root from TORUS_TPU_DEVICE_ROOT and metadata from MetadataFetcherFromEnv.
NodeTpuInput NodeTpuInputFromEnv(EnvMap env, std::optional<double> explicit_tpu);

struct NodeTpuIdentity {
  int chips = 0;              // the TPU resource; 0 = not a TPU node (no labels or resources)
  std::vector<int> chip_ids;  // physical chip ids, size == chips (TPU_VISIBLE_CHIPS or 0..N-1)
  // Each present only when its first valid source resolved (and chips > 0 for metadata).
  std::optional<PodType> pod_type;
  std::optional<std::string> slice_name;
  std::optional<int> worker_id;
  std::optional<std::string> topology;   // lowercased
  std::vector<std::string> worker_hostnames;  // TPU_WORKER_HOSTNAMES, informational only
  int slice_hosts = 0;        // §3.6 H when chips > 0 and the pod type resolved, else 0
  bool single_host = false;   // pod type resolved and H == 1
  // A single-host TPU node without a slice name: an anonymous slice identified by its node id,
  // which the caller (who knows the node id) uses as the slice key. Carries the head resource.
  bool anonymous_slice = false;
  std::map<std::string, std::string> labels;  // torus.io/ keys only
  std::map<std::string, double> resources;     // TPU, accelerator_type:..., <slice>, TPU-...-head
  std::vector<std::string> warnings;           // malformed inputs, for the caller to log
};

// Applies §4. Fails (InvalidArgument, node start fails) only when the explicit TPU is negative,
// not an integer, or above the number of chips listed in TPU_VISIBLE_CHIPS.
// Resolution order of the chip count: explicit TPU; TORUS_TPU_CHIPS (skips detection); the
// device tree. TPU_VISIBLE_CHIPS then caps the count and supplies the physical ids.
StatusOr<NodeTpuIdentity> ComputeNodeTpuIdentity(const NodeTpuInput& input);

// User-supplied node labels (start flags, RayCluster `labels`) may not set any of the ten
// reserved TPU keys (IsReservedTpuLabelKey). InvalidArgument names the first offending key.
Status ValidateUserNodeLabels(const std::map<std::string, std::string>& labels);

}  // namespace torus::tpu
