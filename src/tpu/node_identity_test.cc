#include "tpu/node_identity.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

namespace torus::tpu {
namespace {

namespace fs = std::filesystem;
using Labels = std::map<std::string, std::string>;
using Resources = std::map<std::string, double>;

// A fake device tree in a fresh temp dir, removed at the end of the test.
class FakeDeviceTree {
 public:
  FakeDeviceTree() {
    std::string tmpl = (fs::temp_directory_path() / "tpu_tree_XXXXXX").string();
    char* dir = ::mkdtemp(tmpl.data());
    EXPECT_NE(dir, nullptr);
    root_ = tmpl;
  }
  ~FakeDeviceTree() {
    std::error_code ec;
    fs::permissions(root_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(root_, ec);
  }
  const std::string& root() const { return root_; }

  void AddFile(const std::string& rel, const std::string& content = "") {
    fs::path p = fs::path(root_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << content;
  }
  void AddDir(const std::string& rel) { fs::create_directories(fs::path(root_) / rel); }
  void AddAccel(int n) {
    for (int i = 0; i < n; ++i) AddFile("dev/accel" + std::to_string(i));
  }
  // /dev/vfio/<group> and one device of that IOMMU group with the given vendor file content.
  void AddVfioGroup(int group, const std::string& vendor) {
    AddFile("dev/vfio/" + std::to_string(group));
    AddFile("sys/kernel/iommu_groups/" + std::to_string(group) + "/devices/0000:00:04.0/vendor",
            vendor);
  }

 private:
  std::string root_;
};

// A metadata fetcher backed by a map, recording the keys it was asked for.
struct FakeMetadata {
  std::map<std::string, std::string> values;
  std::vector<std::string> asked;

  MetadataFetcher Fetcher() {
    return [this](const std::string& key) -> std::optional<std::string> {
      asked.push_back(key);
      auto it = values.find(key);
      if (it == values.end()) return std::nullopt;
      return it->second;
    };
  }
};

NodeTpuIdentity Compute(const NodeTpuInput& input) {
  StatusOr<NodeTpuIdentity> id = ComputeNodeTpuIdentity(input);
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  return id.ok() ? *id : NodeTpuIdentity{};
}

// ---- §4 chip count ----

TEST(ChipCountTest, AccelDevicesAreCounted) {
  FakeDeviceTree tree;
  tree.AddAccel(4);
  tree.AddFile("dev/null");
  EXPECT_EQ(CountTpuChipsInDeviceTree(tree.root()), 4);
  NodeTpuIdentity id = Compute({.env = {}, .explicit_tpu = {}, .device_root = tree.root(),
                                .metadata = {}});
  EXPECT_EQ(id.chips, 4);
  EXPECT_EQ(id.chip_ids, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(id.resources, (Resources{{"TPU", 4}}));
}

TEST(ChipCountTest, NvidiaAccelDirectoryIsNotCounted) {
  FakeDeviceTree tree;
  tree.AddDir("dev/accel");
  tree.AddFile("dev/accel/accel0");
  EXPECT_EQ(CountTpuChipsInDeviceTree(tree.root()), 0);
  NodeTpuIdentity id = Compute({.env = {}, .explicit_tpu = {}, .device_root = tree.root(),
                                .metadata = {}});
  EXPECT_EQ(id.chips, 0);
  EXPECT_TRUE(id.resources.empty());
  EXPECT_TRUE(id.labels.empty());
}

TEST(ChipCountTest, TorusTpuChipsOverridesDetection) {
  FakeDeviceTree tree;
  tree.AddAccel(4);
  NodeTpuIdentity id = Compute({.env = {{"TORUS_TPU_CHIPS", "8"}}, .explicit_tpu = {},
                                .device_root = tree.root(), .metadata = {}});
  EXPECT_EQ(id.chips, 8);
  EXPECT_EQ(id.resources.at("TPU"), 8);
}

TEST(ChipCountTest, MalformedTorusTpuChipsFallsBackToDetection) {
  FakeDeviceTree tree;
  tree.AddAccel(4);
  NodeTpuIdentity id = Compute({.env = {{"TORUS_TPU_CHIPS", "many"}}, .explicit_tpu = {},
                                .device_root = tree.root(), .metadata = {}});
  EXPECT_EQ(id.chips, 4);
  EXPECT_FALSE(id.warnings.empty());
}

TEST(ChipCountTest, VfioGroupWithGoogleVendorIsAChip) {
  FakeDeviceTree tree;
  tree.AddVfioGroup(12, "0x1ae0\n");
  tree.AddFile("dev/vfio/vfio");  // the container device: skipped
  EXPECT_EQ(CountTpuChipsInDeviceTree(tree.root()), 1);
}

TEST(ChipCountTest, VfioGroupWithOtherVendorIsNotAChip) {
  FakeDeviceTree tree;
  tree.AddVfioGroup(96, "0x10de\n");
  EXPECT_EQ(CountTpuChipsInDeviceTree(tree.root()), 0);
}

TEST(ChipCountTest, VfioGroupWithUnreadableVendorIsNotAChip) {
  FakeDeviceTree tree;
  tree.AddFile("dev/vfio/12");
  // A vendor "file" that cannot be read as a file: a directory.
  tree.AddDir("sys/kernel/iommu_groups/12/devices/0000:00:04.0/vendor");
  EXPECT_EQ(CountTpuChipsInDeviceTree(tree.root()), 0);
  // And a group without any devices directory.
  tree.AddFile("dev/vfio/13");
  EXPECT_EQ(CountTpuChipsInDeviceTree(tree.root()), 0);
}

TEST(ChipCountTest, VfioIsOnlyConsultedWithoutAccelDevices) {
  FakeDeviceTree tree;
  tree.AddAccel(2);
  tree.AddVfioGroup(12, "0x1ae0");
  tree.AddVfioGroup(13, "0x1ae0");
  tree.AddVfioGroup(14, "0x1ae0");
  EXPECT_EQ(CountTpuChipsInDeviceTree(tree.root()), 2);
}

TEST(ChipCountTest, MissingTreeCountsNothing) {
  EXPECT_EQ(CountTpuChipsInDeviceTree("/nonexistent/torus/tree"), 0);
}

TEST(ChipCountTest, VisibleChipsCapsAndNamesChips) {
  NodeTpuIdentity id = Compute({.env = {{"TORUS_TPU_CHIPS", "8"}, {"TPU_VISIBLE_CHIPS", "4,5"}},
                                .explicit_tpu = {}, .device_root = "", .metadata = {}});
  EXPECT_EQ(id.chips, 2);
  EXPECT_EQ(id.chip_ids, (std::vector<int>{4, 5}));
  // A visible list longer than the detected count does not raise it.
  id = Compute({.env = {{"TORUS_TPU_CHIPS", "1"}, {"TPU_VISIBLE_CHIPS", "0,1,2"}},
                .explicit_tpu = {}, .device_root = "", .metadata = {}});
  EXPECT_EQ(id.chips, 1);
  EXPECT_EQ(id.chip_ids, (std::vector<int>{0}));
}

TEST(ChipCountTest, ExplicitTpuIsStrongest) {
  FakeDeviceTree tree;
  tree.AddAccel(4);
  NodeTpuIdentity id = Compute({.env = {{"TORUS_TPU_CHIPS", "8"}}, .explicit_tpu = 2,
                                .device_root = tree.root(), .metadata = {}});
  EXPECT_EQ(id.chips, 2);
  EXPECT_EQ(id.chip_ids, (std::vector<int>{0, 1}));
  id = Compute({.env = {{"TPU_VISIBLE_CHIPS", "4,5,6,7"}}, .explicit_tpu = 4,
                .device_root = tree.root(), .metadata = {}});
  EXPECT_EQ(id.chip_ids, (std::vector<int>{4, 5, 6, 7}));
}

// §8: explicit node TPU > TPU_VISIBLE_CHIPS count fails node start.
TEST(ChipCountTest, ExplicitTpuAboveVisibleChipsFails) {
  StatusOr<NodeTpuIdentity> id = ComputeNodeTpuIdentity(
      {.env = {{"TPU_VISIBLE_CHIPS", "0,1"}}, .explicit_tpu = 4, .device_root = "",
       .metadata = {}});
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("4"), std::string::npos);
  EXPECT_NE(id.status().message().find("2 visible"), std::string::npos);
  for (double bad : {-1.0, 2.5}) {
    EXPECT_FALSE(ComputeNodeTpuIdentity({.env = {}, .explicit_tpu = bad, .device_root = "",
                                         .metadata = {}})
                     .ok())
        << bad;
  }
}

// ---- §4 labels and resources: every row of the table ----

Labels V6eLabels(const std::string& worker_id) {
  return {{"torus.io/tpu-slice-name", "tpu-worker-group-2"},
          {"torus.io/tpu-worker-id", worker_id},
          {"torus.io/tpu-topology", "4x4"},
          {"torus.io/tpu-pod-type", "v6e-16"},
          {"torus.io/accelerator-type", "TPU-V6E"}};
}

TEST(NodeIdentityTest, GkeHostZeroOfV6e16) {
  FakeDeviceTree tree;
  tree.AddAccel(4);
  FakeMetadata md;
  NodeTpuIdentity id = Compute({.env = {{"TPU_NAME", "tpu-worker-group-2"},
                                        {"TPU_WORKER_ID", "0"},
                                        {"TPU_ACCELERATOR_TYPE", "v6e-16"},
                                        {"TPU_TOPOLOGY", "4x4"}},
                                .explicit_tpu = {}, .device_root = tree.root(),
                                .metadata = md.Fetcher()});
  EXPECT_EQ(id.labels, V6eLabels("0"));
  EXPECT_EQ(id.resources, (Resources{{"TPU", 4},
                                     {"accelerator_type:TPU-V6E", 1},
                                     {"tpu-worker-group-2", 1},
                                     {"TPU-v6e-16-head", 1}}));
  EXPECT_EQ(id.slice_hosts, 4);
  EXPECT_FALSE(id.single_host);
  EXPECT_FALSE(id.anonymous_slice);
  EXPECT_TRUE(md.asked.empty());  // everything came from the environment
  EXPECT_TRUE(id.warnings.empty());
}

TEST(NodeIdentityTest, GkeHostOneHasNoHeadResource) {
  NodeTpuIdentity id = Compute({.env = {{"TPU_NAME", "tpu-worker-group-2"},
                                        {"TPU_WORKER_ID", "1"},
                                        {"TPU_ACCELERATOR_TYPE", "v6e-16"},
                                        {"TPU_TOPOLOGY", "4x4"},
                                        {"TORUS_TPU_CHIPS", "4"}},
                                .explicit_tpu = {}, .device_root = "", .metadata = {}});
  EXPECT_EQ(id.labels, V6eLabels("1"));
  EXPECT_EQ(id.resources, (Resources{{"TPU", 4},
                                     {"accelerator_type:TPU-V6E", 1},
                                     {"tpu-worker-group-2", 1}}));
}

TEST(NodeIdentityTest, Tpu7xPodTypeIsNormalised) {
  NodeTpuIdentity id = Compute({.env = {{"TPU_NAME", "s"},
                                        {"TPU_WORKER_ID", "0"},
                                        {"TPU_ACCELERATOR_TYPE", "tpu7x-16"},
                                        {"TORUS_TPU_CHIPS", "4"}},
                                .explicit_tpu = {}, .device_root = "", .metadata = {}});
  EXPECT_EQ(id.labels.at("torus.io/tpu-pod-type"), "v7x-16");
  EXPECT_EQ(id.labels.at("torus.io/accelerator-type"), "TPU-V7X");
  EXPECT_EQ(id.resources, (Resources{{"TPU", 4},
                                     {"accelerator_type:TPU-V7X", 1},
                                     {"s", 1},
                                     {"TPU-v7x-16-head", 1}}));
}

TEST(NodeIdentityTest, NoSliceNameAndNoMetadataServerStillStarts) {
  FakeMetadata md;  // a server that knows nothing
  NodeTpuIdentity id = Compute({.env = {{"TPU_WORKER_ID", "0"},
                                        {"TPU_ACCELERATOR_TYPE", "v6e-16"},
                                        {"TPU_TOPOLOGY", "4x4"},
                                        {"TORUS_TPU_CHIPS", "4"}},
                                .explicit_tpu = {}, .device_root = "",
                                .metadata = md.Fetcher()});
  EXPECT_EQ(id.labels.count("torus.io/tpu-slice-name"), 0u);
  EXPECT_EQ(id.resources, (Resources{{"TPU", 4}, {"accelerator_type:TPU-V6E", 1}}));
  EXPECT_FALSE(id.anonymous_slice);  // multi-host pod type: belongs to no slice
  EXPECT_EQ(md.asked, (std::vector<std::string>{"instance-id"}));

  // Metadata disabled entirely ("off"): same result, nothing asked.
  NodeTpuInput input = NodeTpuInputFromEnv(
      {{"TPU_ACCELERATOR_TYPE", "v6e-16"}, {"TORUS_TPU_CHIPS", "4"},
       {"TORUS_TPU_METADATA_URL", "off"}},
      std::nullopt);
  EXPECT_FALSE(static_cast<bool>(input.metadata));
  id = Compute(input);
  EXPECT_EQ(id.resources, (Resources{{"TPU", 4}, {"accelerator_type:TPU-V6E", 1}}));
  EXPECT_EQ(id.labels, (Labels{{"torus.io/tpu-pod-type", "v6e-16"},
                               {"torus.io/accelerator-type", "TPU-V6E"}}));
}

TEST(NodeIdentityTest, TopologyFromMetadataTpuEnv) {
  FakeDeviceTree tree;
  tree.AddAccel(4);
  FakeMetadata md;
  md.values["tpu-env"] = "TPU_ACCELERATOR:v6e.\nTOPOLOGY: '2x2x4'\nTPU_HOST_BOUNDS:0,1,1,2\n";
  NodeTpuIdentity id = Compute({.env = {}, .explicit_tpu = {}, .device_root = tree.root(),
                                .metadata = md.Fetcher()});
  EXPECT_EQ(id.labels, (Labels{{"torus.io/tpu-topology", "2x2x4"}}));
  EXPECT_EQ(id.resources, (Resources{{"TPU", 4}}));
  EXPECT_EQ(md.asked, (std::vector<std::string>{"accelerator-type", "instance-id",
                                                "agent-worker-number", "tpu-env"}));
}

TEST(NodeIdentityTest, MalformedPodTypeIsAWarningNotAFailure) {
  NodeTpuIdentity id = Compute({.env = {{"TPU_ACCELERATOR_TYPE", "v2-"}, {"TORUS_TPU_CHIPS", "4"}},
                                .explicit_tpu = {}, .device_root = "", .metadata = {}});
  EXPECT_EQ(id.labels.count("torus.io/tpu-pod-type"), 0u);
  EXPECT_EQ(id.labels.count("torus.io/accelerator-type"), 0u);
  EXPECT_EQ(id.resources, (Resources{{"TPU", 4}}));
  ASSERT_FALSE(id.warnings.empty());
  EXPECT_NE(id.warnings[0].find("TPU_ACCELERATOR_TYPE"), std::string::npos);
}

TEST(NodeIdentityTest, MetadataFillsMissingFieldsOnGce) {
  FakeMetadata md;
  md.values = {{"accelerator-type", "v4-16"},
               {"instance-id", "my-tpu"},
               {"agent-worker-number", "1"},
               {"tpu-env", "TOPOLOGY: '2x2x2'"}};
  NodeTpuIdentity id = Compute({.env = {{"TORUS_TPU_CHIPS", "4"}}, .explicit_tpu = {},
                                .device_root = "", .metadata = md.Fetcher()});
  EXPECT_EQ(id.labels, (Labels{{"torus.io/tpu-slice-name", "my-tpu"},
                               {"torus.io/tpu-worker-id", "1"},
                               {"torus.io/tpu-topology", "2x2x2"},
                               {"torus.io/tpu-pod-type", "v4-16"},
                               {"torus.io/accelerator-type", "TPU-V4"}}));
  EXPECT_EQ(id.resources, (Resources{{"TPU", 4}, {"accelerator_type:TPU-V4", 1}, {"my-tpu", 1}}));
}

TEST(NodeIdentityTest, MalformedEnvValueFallsBackToMetadata) {
  FakeMetadata md;
  md.values = {{"agent-worker-number", "0"}, {"tpu-env", "TOPOLOGY: '2x2x2'"}};
  NodeTpuIdentity id = Compute({.env = {{"TPU_NAME", "s"},
                                        {"TPU_WORKER_ID", "-1"},
                                        {"TPU_TOPOLOGY", "2x"},
                                        {"TPU_ACCELERATOR_TYPE", "v4-16"},
                                        {"TORUS_TPU_CHIPS", "4"}},
                                .explicit_tpu = {}, .device_root = "",
                                .metadata = md.Fetcher()});
  EXPECT_EQ(id.worker_id, 0);
  EXPECT_EQ(id.topology, "2x2x2");
  EXPECT_EQ(id.warnings.size(), 2u);
  EXPECT_EQ(id.resources.count("TPU-v4-16-head"), 1u);
}

TEST(NodeIdentityTest, NoMetadataLookupsWithoutChips) {
  FakeMetadata md;
  md.values = {{"accelerator-type", "v4-16"}};
  NodeTpuIdentity id = Compute({.env = {{"TPU_ACCELERATOR_TYPE", "v4-16"}}, .explicit_tpu = {},
                                .device_root = "/nonexistent", .metadata = md.Fetcher()});
  EXPECT_EQ(id.chips, 0);
  EXPECT_TRUE(md.asked.empty());
  EXPECT_TRUE(id.labels.empty());
  EXPECT_TRUE(id.resources.empty());
}

TEST(NodeIdentityTest, SingleHostSliceIsItsOwnHostZero) {
  // A named single-host slice carries the head resource even without a worker id.
  NodeTpuIdentity id = Compute({.env = {{"TPU_NAME", "solo"},
                                        {"TPU_ACCELERATOR_TYPE", "v6e-8"},
                                        {"TORUS_TPU_CHIPS", "8"}},
                                .explicit_tpu = {}, .device_root = "", .metadata = {}});
  EXPECT_TRUE(id.single_host);
  EXPECT_FALSE(id.anonymous_slice);
  EXPECT_EQ(id.resources, (Resources{{"TPU", 8},
                                     {"accelerator_type:TPU-V6E", 1},
                                     {"solo", 1},
                                     {"TPU-v6e-8-head", 1}}));
}

TEST(NodeIdentityTest, AnonymousSingleHostSlice) {
  NodeTpuIdentity id = Compute({.env = {{"TPU_ACCELERATOR_TYPE", "v6e-8"},
                                        {"TORUS_TPU_CHIPS", "8"}},
                                .explicit_tpu = {}, .device_root = "", .metadata = {}});
  EXPECT_TRUE(id.single_host);
  EXPECT_TRUE(id.anonymous_slice);
  EXPECT_EQ(id.labels.count("torus.io/tpu-slice-name"), 0u);
  EXPECT_EQ(id.resources, (Resources{{"TPU", 8},
                                     {"accelerator_type:TPU-V6E", 1},
                                     {"TPU-v6e-8-head", 1}}));
}

TEST(NodeIdentityTest, WorkerHostnamesMismatchOnlyWarns) {
  NodeTpuIdentity id = Compute({.env = {{"TPU_NAME", "g-0"},
                                        {"TPU_WORKER_ID", "0"},
                                        {"TPU_ACCELERATOR_TYPE", "v4-16"},
                                        {"TPU_WORKER_HOSTNAMES", "a, b, c"},
                                        {"TORUS_TPU_CHIPS", "4"}},
                                .explicit_tpu = {}, .device_root = "", .metadata = {}});
  EXPECT_EQ(id.worker_hostnames, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(id.slice_hosts, 2);
  ASSERT_EQ(id.warnings.size(), 1u);
  EXPECT_NE(id.warnings[0].find("TPU_WORKER_HOSTNAMES"), std::string::npos);
  EXPECT_EQ(id.resources.count("TPU-v4-16-head"), 1u);
}

TEST(ParseTpuEnvTopologyTest, FindsTheTopologyLine) {
  EXPECT_EQ(ParseTpuEnvTopology("TPU_ACCELERATOR:v6e.\nTOPOLOGY: '2x2x4'\nTPU_HOST_BOUNDS:0,1,1,2"),
            "2x2x4");
  EXPECT_EQ(ParseTpuEnvTopology("TOPOLOGY: \"4X4\"\r\n"), "4x4");
  EXPECT_EQ(ParseTpuEnvTopology("  TOPOLOGY:2x2"), "2x2");
  EXPECT_EQ(ParseTpuEnvTopology("TPU_TOPOLOGY: '2x2'\nZONE: 'x'"), std::nullopt);
  EXPECT_EQ(ParseTpuEnvTopology("TOPOLOGY: ''"), std::nullopt);
  EXPECT_EQ(ParseTpuEnvTopology(""), std::nullopt);
}

TEST(ValidateUserNodeLabelsTest, ReservedKeysAreRejected) {
  EXPECT_TRUE(ValidateUserNodeLabels({{"team", "a"}, {"torus.io/node-group", "g"}}).ok());
  for (const char* key : {"ray.io/tpu-slice-name", "torus.io/tpu-pod-type",
                          "ray.io/accelerator-type", "torus.io/tpu-worker-id",
                          "ray.io/tpu-topology"}) {
    Status s = ValidateUserNodeLabels({{"team", "a"}, {key, "x"}});
    ASSERT_FALSE(s.ok()) << key;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(key), std::string::npos);
    EXPECT_NE(s.message().find("reserved"), std::string::npos);
  }
}

// ---- HttpMetadataFetcher against real sockets on loopback ----

// A tiny HTTP/1.1 server on 127.0.0.1: one thread, one connection at a time. Each reply comes
// from `routes` (path -> raw response) or is a 404. With `hang`, it accepts and never answers.
class FakeHttpServer {
 public:
  explicit FakeHttpServer(std::map<std::string, std::string> routes, bool hang = false)
      : routes_(std::move(routes)), hang_(hang) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_fd_, 8), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeHttpServer() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
  }
  int port() const { return port_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/attrs"; }
  std::vector<std::string> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  void Serve() {
    while (!stop_) {
      pollfd pfd{listen_fd_, POLLIN, 0};
      if (::poll(&pfd, 1, 20) <= 0) continue;
      int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      std::string request;
      char buf[1024];
      while (request.find("\r\n\r\n") == std::string::npos) {
        pollfd cpfd{fd, POLLIN, 0};
        if (::poll(&cpfd, 1, 2000) <= 0) break;
        ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        request.append(buf, static_cast<size_t>(n));
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        requests_.push_back(request);
      }
      if (hang_) {
        while (!stop_) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        ::close(fd);
        continue;
      }
      std::string path = request.substr(4, request.find(' ', 4) - 4);
      auto it = routes_.find(path);
      std::string reply = it != routes_.end()
                              ? it->second
                              : "HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found";
      ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
      ::close(fd);
    }
  }

  const std::map<std::string, std::string> routes_;
  const bool hang_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::string> requests_;  // guarded by mu_
  std::thread thread_;
};

std::string Ok(const std::string& body) {
  return "HTTP/1.1 200 OK\r\nContent-Type: application/text\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

TEST(HttpMetadataFetcherTest, FetchesAttributesFromALoopbackServer) {
  FakeHttpServer server({
      {"/attrs/accelerator-type", Ok("v6e-8")},
      {"/attrs/instance-id", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                             "3\r\nmy-\r\n5\r\nslice\r\n0\r\n\r\n"},
      {"/attrs/tpu-env", "HTTP/1.0 200 OK\r\n\r\nTOPOLOGY: '2x4'\n"},  // body runs to close
      {"/attrs/empty", Ok("")},
      {"/attrs/forbidden", "HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno"},
  });
  MetadataFetcher fetch = HttpMetadataFetcher(server.base_url(), std::chrono::seconds(1));
  EXPECT_EQ(fetch("accelerator-type"), "v6e-8");
  EXPECT_EQ(fetch("instance-id"), "my-slice");
  EXPECT_EQ(fetch("tpu-env"), "TOPOLOGY: '2x4'\n");
  EXPECT_EQ(fetch("empty"), std::nullopt);
  EXPECT_EQ(fetch("forbidden"), std::nullopt);
  EXPECT_EQ(fetch("missing"), std::nullopt);

  std::vector<std::string> requests = server.requests();
  ASSERT_EQ(requests.size(), 6u);
  EXPECT_EQ(requests[0].rfind("GET /attrs/accelerator-type HTTP/1.1\r\n", 0), 0u) << requests[0];
  EXPECT_NE(requests[0].find("\r\nMetadata-Flavor: Google\r\n"), std::string::npos);
  EXPECT_NE(requests[0].find("\r\nHost: 127.0.0.1:" + std::to_string(server.port())),
            std::string::npos);
}

// ThreadSanitizer cannot run getaddrinfo_a: glibc starts the lookup's helper thread with its
// internal pthread_create, which TSan's interceptor never sees, so that thread has no TSan state
// and the first allocation in it (nss_database_state_get -> malloc) dereferences a null cache:
// SIGSEGV inside libtsan. The resolver is glibc's own code and the rest of the fetcher is tested
// with numeric addresses, so only this test is skipped there.
TEST(HttpMetadataFetcherTest, ResolvesHostNames) {
#ifdef TORUS_TSAN_BUILD  // CMakeLists.txt, TORUS_TSAN
  GTEST_SKIP() << "getaddrinfo_a's glibc-internal helper thread crashes ThreadSanitizer";
#endif
  // "localhost" is not numeric, so it goes through the resolver thread; if it resolves to ::1
  // first, the refused IPv6 attempt falls through to 127.0.0.1.
  FakeHttpServer server({{"/attrs/instance-id", Ok("named")}});
  MetadataFetcher fetch = HttpMetadataFetcher(
      "http://localhost:" + std::to_string(server.port()) + "/attrs/", std::chrono::seconds(1));
  EXPECT_EQ(fetch("instance-id"), "named");
}

TEST(HttpMetadataFetcherTest, ClosedPortGivesNulloptQuickly) {
  // Reserve a port, then close it so that nothing listens there.
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  MetadataFetcher fetch = HttpMetadataFetcher(
      "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)), std::chrono::seconds(10));
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(fetch("accelerator-type"), std::nullopt);
  // Refused at once, long before the 10 s limit.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(HttpMetadataFetcherTest, SilentServerIsCutOffByTheTimeout) {
  FakeHttpServer server({}, /*hang=*/true);
  MetadataFetcher fetch = HttpMetadataFetcher(server.base_url(), std::chrono::milliseconds(200));
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(fetch("accelerator-type"), std::nullopt);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(HttpMetadataFetcherTest, UnsupportedUrlsGiveNullopt) {
  EXPECT_EQ(HttpMetadataFetcher("https://127.0.0.1:1/x")("k"), std::nullopt);
  EXPECT_EQ(HttpMetadataFetcher("not a url")("k"), std::nullopt);
  EXPECT_EQ(HttpMetadataFetcher("http://127.0.0.1:99999/x")("k"), std::nullopt);
}

TEST(HttpMetadataFetcherTest, NodeIdentityEndToEndFromEnvironment) {
  FakeDeviceTree tree;
  tree.AddAccel(4);
  FakeHttpServer server({
      {"/attrs/accelerator-type", Ok("v4-16")},
      {"/attrs/instance-id", Ok("gce-slice\n")},
      {"/attrs/agent-worker-number", Ok("0")},
      {"/attrs/tpu-env", Ok("TPU_ACCELERATOR:v4.\nTOPOLOGY: '2x2x2'\n")},
  });
  NodeTpuInput input = NodeTpuInputFromEnv(
      {{"TORUS_TPU_DEVICE_ROOT", tree.root()}, {"TORUS_TPU_METADATA_URL", server.base_url()}},
      std::nullopt);
  EXPECT_EQ(input.device_root, tree.root());
  NodeTpuIdentity id = Compute(input);
  EXPECT_EQ(id.chips, 4);
  EXPECT_EQ(id.labels, (Labels{{"torus.io/tpu-slice-name", "gce-slice"},
                               {"torus.io/tpu-worker-id", "0"},
                               {"torus.io/tpu-topology", "2x2x2"},
                               {"torus.io/tpu-pod-type", "v4-16"},
                               {"torus.io/accelerator-type", "TPU-V4"}}));
  EXPECT_EQ(id.resources, (Resources{{"TPU", 4},
                                     {"accelerator_type:TPU-V4", 1},
                                     {"gce-slice", 1},
                                     {"TPU-v4-16-head", 1}}));
}

}  // namespace
}  // namespace torus::tpu
