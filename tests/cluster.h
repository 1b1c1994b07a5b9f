// TestCluster: a real Torus cluster for multi-process tests, started with the real `torus` binary
// (TORUS_BIN, the build's torus_cli) in a private TORUS_TMPDIR.
//
//   TestCluster cluster("tasks");
//   cluster.StartHead(/*num_cpus=*/1, {{"head_only", 1}});
//   NodeInfo a = cluster.AddNode({.num_cpus = 1, .resources = {{"custom", 1}}});
//   cluster.ConnectDriver();                 // ray::Init with cluster.address()
//   ...
//   cluster.Stop();                          // ray::Shutdown, `torus stop`, kills what is left
//
// The constructor makes a fresh directory under /tmp, points TORUS_TMPDIR of *this process* at it
// (so `torus` children and ray::Init find the session and its token there) and unsets
// TORUS_ADDRESS, RAY_ADDRESS and TORUS_TOKEN. One TestCluster at a time per process.
//
// Every process of the cluster (daemons, nodes, workers) inherits TORUS_TMPDIR=<tmpdir> from this
// process, which is how ClusterProcesses() finds them: Stop() uses it to check that nothing is
// left behind and to kill what is. A watchdog process does the same cleanup if this process dies
// without Stop() (a runtime crash in the test process must not leave a cluster running).
//
// Thread safety: none; call from the test's main thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace torus_test {

// ------------------------------------------------------------------------------- processes

struct RunResult {
  int exit_code = -1;       // -1: killed by a signal or timed out
  bool timed_out = false;
  std::string out;          // stdout
  std::string err;          // stderr
  std::string Describe() const;  // for failure messages
};

// Runs argv[0] (a path) with this process' environment plus env_set minus env_unset, capturing
// stdout and stderr; kills it (SIGKILL) after timeout_s.
RunResult RunProcess(const std::vector<std::string>& argv,
                     const std::map<std::string, std::string>& env_set = {},
                     const std::vector<std::string>& env_unset = {}, double timeout_s = 60);

// Starts argv[0] in the background (stdout/stderr to the given files); returns its pid.
pid_t SpawnProcess(const std::vector<std::string>& argv,
                   const std::map<std::string, std::string>& env_set,
                   const std::vector<std::string>& env_unset, const std::string& stdout_path,
                   const std::string& stderr_path);

// Runs this test binary again as a driver that executes the child scenario `name` (registered
// with TORUS_TEST_CHILD_SCENARIO) instead of the tests.
RunResult RunChild(const std::string& name, const std::map<std::string, std::string>& env_set = {},
                   const std::vector<std::string>& env_unset = {}, double timeout_s = 90);

// True when `pid` exists and is not a zombie.
bool ProcessRunning(pid_t pid);
// Live processes (not zombies, not this one) whose initial environment contains `entry`
// ("KEY=value"): what `torus down` finds a launched cluster's processes by.
// (launcher::ProcessesWithEnv.)
std::vector<pid_t> ProcessesWithEnv(const std::string& entry);
// "pid 123 (cmdline...)".
std::string DescribeProcess(pid_t pid);

// Names in /dev/shm starting with `prefix`.
std::vector<std::string> ShmSegments(const std::string& prefix = "torus.");

std::string ReadFileOr(const std::string& path, const std::string& fallback = "");
// Polls `pred` every 50 ms until it is true or `timeout` passes; returns its last value.
bool WaitUntil(const std::function<bool()>& pred,
               std::chrono::milliseconds timeout = std::chrono::seconds(20));
// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort();
// The port of "host:port".
inline int PortOf(const std::string& address) {
  return std::atoi(address.substr(address.rfind(':') + 1).c_str());
}
inline bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}
// The node this process runs on (TORUS_NODE_ID, which a node gives its workers; "" elsewhere).
inline std::string ThisNode() {
  const char* v = std::getenv("TORUS_NODE_ID");
  return v ? v : "";
}

// ------------------------------------------------------------------------------- the cluster

struct NodeSpec {
  double num_cpus = 1;
  nlohmann::json resources = nlohmann::json::object();  // extra resources, e.g. {"custom": 1}
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> env;  // added to the node's (and so its workers') env
  std::vector<std::string> flags;          // added to `torus start --address ...`
  // true: `torus start --address ... --block`, a child of this process (stopped with SIGTERM);
  // false: `torus start --address ...`, a daemon that `torus stop` stops.
  bool block = false;
};

struct NodeInfo {
  std::string node_id;
  std::string address;  // host:port of the node daemon
  pid_t pid = 0;        // the node daemon (from the head's node table)
  bool owned = false;   // a --block child of this process
};

class TestCluster {
 public:
  // `name` goes into the temporary directory's name, for humans.
  explicit TestCluster(const std::string& name);
  ~TestCluster();
  TestCluster(const TestCluster&) = delete;
  TestCluster& operator=(const TestCluster&) = delete;

  // `torus start --head --port <free port>` with the head's own node; throws std::runtime_error
  // when it does not come up.
  // `head_flags` are added to `torus start --head` (e.g. {"--max-heartbeats-per-s", "2"}).
  void StartHead(double num_cpus = 1, const nlohmann::json& resources = nlohmann::json::object(),
                 const std::map<std::string, std::string>& labels = {},
                 const std::vector<std::string>& head_flags = {});
  // Adds a node and waits until the head lists it alive (`torus start` with the node's env added
  // to this process' environment). Throws std::runtime_error on failure.
  NodeInfo AddNode(const NodeSpec& spec);
  // SIGKILLs a node daemon (reaped when it is a --block child of this process). Stop() does not
  // count the shared memory it leaves as a leftover.
  void KillNode(const NodeInfo& node);

  // ray::Init(cfg) with cfg.address = address(); `ray_namespace` may be empty.
  void ConnectDriver(const std::string& ray_namespace = "");

  const std::string& address() const { return address_; }
  const std::string& tmpdir() const { return tmpdir_; }
  const std::string& session_dir() const { return session_; }
  std::string token() const;
  const NodeInfo& head_node() const { return head_node_; }
  pid_t head_pid() const { return head_pid_; }
  // Every node added so far, the head's first.
  const std::vector<NodeInfo>& nodes() const { return nodes_; }
  // "TORUS_TMPDIR=<tmpdir>": the environment entry every process of this cluster carries.
  std::string EnvMarker() const { return "TORUS_TMPDIR=" + tmpdir_; }

  // Runs the torus binary with `args` (this cluster's TORUS_TMPDIR in the environment).
  RunResult Torus(const std::vector<std::string>& args,
                  const std::map<std::string, std::string>& env_set = {},
                  const std::vector<std::string>& env_unset = {}, double timeout_s = 60) const;
  // `torus status` output; throws when it fails.
  std::string Status() const;
  // `torus list <kind> --format json`, parsed; throws when it fails or is not JSON.
  nlohmann::json ListJson(const std::string& kind) const;

  // Live processes of this cluster (daemons, nodes, workers), this process excluded.
  std::vector<pid_t> ClusterProcesses() const;
  // ray::Shutdown() if initialized, `torus stop`, then SIGTERM/SIGKILL of nodes this object
  // owns. Returns a description of every cluster process that was still alive after that and
  // had to be SIGKILLed, and of every leftover /dev/shm segment of the cluster's nodes (removed).
  // Idempotent.
  std::vector<std::string> Stop();

 private:
  std::vector<std::string> NodeIdsAlive() const;
  void StartWatchdog();
  void RecordNode(const std::string& node_id);  // for the watchdog's shared-memory cleanup

  std::string name_;
  std::string tmpdir_;
  std::string session_;
  std::string address_;
  pid_t head_pid_ = 0;
  NodeInfo head_node_;
  std::vector<NodeInfo> nodes_;
  std::vector<pid_t> owned_;
  std::vector<std::string> killed_;  // node ids: their shared memory is not theirs to clean
  bool stopped_ = false;
  int node_counter_ = 0;
  pid_t watchdog_pid_ = 0;
  int watchdog_fd_ = -1;  // write end of the watchdog's pipe (close-on-exec)
};

// ------------------------------------------------------------------------------- child drivers

using ChildScenario = std::function<int()>;
std::map<std::string, ChildScenario>& ChildScenarios();
bool RegisterChildScenario(const std::string& name, ChildScenario fn);

// The crash tests abort and segfault workers on purpose: no core files (inherited by workers).
void DisableCoreDumps();
// When TORUS_TEST_CHILD names a child scenario, runs it and exits with its code; else returns.
void RunChildScenarioIfAsked();

}  // namespace torus_test

// Defines a child scenario: a function body returning the child's exit code.
#define TORUS_TEST_CHILD_SCENARIO(name)                                                  \
  static int TorusTestChild_##name();                                                    \
  [[maybe_unused]] static const bool torus_test_child_registered_##name =                \
      ::torus_test::RegisterChildScenario(#name, &TorusTestChild_##name);                \
  static int TorusTestChild_##name()
