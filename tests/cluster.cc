#include "cluster.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <ray/api.h>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "launcher/cluster_processes.h"
#include "proto/torus.grpc.pb.h"

extern char** environ;

namespace torus_test {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// With TORUS_TEST_TIMING set, prints how long each phase of a cluster's life took (stderr).
class Phase {
 public:
  explicit Phase(std::string what) : what_(std::move(what)), start_(Clock::now()) {}
  ~Phase() {
    if (!std::getenv("TORUS_TEST_TIMING")) return;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start_).count();
    std::cerr << "[timing] " << what_ << ": " << ms << " ms\n";
  }

 private:
  std::string what_;
  Clock::time_point start_;
};

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

std::vector<std::string> BuildEnv(const std::map<std::string, std::string>& env_set,
                                  const std::vector<std::string>& env_unset) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    const char* eq = strchr(*e, '=');
    if (!eq) continue;
    env[std::string(*e, eq - *e)] = eq + 1;
  }
  for (const auto& k : env_unset) env.erase(k);
  for (const auto& [k, v] : env_set) env[k] = v;
  std::vector<std::string> out;
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

pid_t Spawn(const std::vector<std::string>& argv_in, const std::vector<std::string>& env_in,
            const std::string& out_path, const std::string& err_path) {
  std::vector<std::string> argv_copy = argv_in, env_copy = env_in;
  std::vector<char*> argv, envp;
  for (auto& s : argv_copy) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env_copy) envp.push_back(s.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty, all;
  sigemptyset(&empty);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, argv[0], &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    throw std::runtime_error("cannot start " + argv_in[0] + ": " + strerror(rc));
  }
  return pid;
}

// Waits for `pid` up to `timeout`; returns true and the wait status when it ended.
bool WaitPid(pid_t pid, std::chrono::milliseconds timeout, int* status) {
  auto deadline = Clock::now() + timeout;
  while (true) {
    pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid) return true;
    if (r < 0 && errno == ECHILD) {
      *status = 0;
      return true;
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string SelfExe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  buf[n] = 0;
  return buf;
}

std::string ResourcesArg(const nlohmann::json& resources) {
  return resources.is_null() ? "{}" : resources.dump();
}

std::string LabelsArg(const std::map<std::string, std::string>& labels) {
  std::string s;
  for (const auto& [k, v] : labels) s += (s.empty() ? "" : ",") + k + "=" + v;
  return s;
}

std::string NumberArg(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

// The head's node table, over gRPC with the cluster token.
bool HeadList(const std::string& address, const std::string& token, torus::rpc::ListReply* out,
              std::string* error) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = torus::rpc::Head::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.AddMetadata("torus-token", token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto st = stub->List(&ctx, torus::rpc::Empty(), out);
  if (!st.ok() && error) *error = st.error_message();
  return st.ok();
}

}  // namespace

// ------------------------------------------------------------------------------- processes

std::string RunResult::Describe() const {
  std::ostringstream os;
  os << "exit code " << exit_code << (timed_out ? " (timed out)" : "") << "\n--- stdout ---\n"
     << out << "\n--- stderr ---\n"
     << err;
  return os.str();
}

pid_t SpawnProcess(const std::vector<std::string>& argv,
                   const std::map<std::string, std::string>& env_set,
                   const std::vector<std::string>& env_unset, const std::string& stdout_path,
                   const std::string& stderr_path) {
  return Spawn(argv, BuildEnv(env_set, env_unset), stdout_path, stderr_path);
}

RunResult RunProcess(const std::vector<std::string>& argv,
                     const std::map<std::string, std::string>& env_set,
                     const std::vector<std::string>& env_unset, double timeout_s) {
  // Inside the cluster's directory when there is one, so that the watchdog cleans it up too.
  const char* root = std::getenv("TORUS_TMPDIR");
  std::string tmpl = root && fs::is_directory(root) ? std::string(root) + "/run-XXXXXX"
                                                    : std::string("/tmp/torus-test-run-XXXXXX");
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed: " + tmpl);
  std::string dir = buf.data();
  pid_t pid = Spawn(argv, BuildEnv(env_set, env_unset), dir + "/out", dir + "/err");
  RunResult r;
  int status = 0;
  if (!WaitPid(pid, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)), &status)) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    r.timed_out = true;
  }
  if (!r.timed_out && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  r.out = ReadFileOr(dir + "/out");
  r.err = ReadFileOr(dir + "/err");
  std::error_code ec;
  fs::remove_all(dir, ec);
  return r;
}

RunResult RunChild(const std::string& name, const std::map<std::string, std::string>& env_set,
                   const std::vector<std::string>& env_unset, double timeout_s) {
  std::map<std::string, std::string> env = env_set;
  env["TORUS_TEST_CHILD"] = name;
  return RunProcess({SelfExe()}, env, env_unset, timeout_s);
}

bool ProcessRunning(pid_t pid) {
  if (pid <= 0) return false;
  std::string stat = ReadFileOr("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return false;
  auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  char state = stat[close + 2];
  return state != 'Z' && state != 'X';
}

std::vector<pid_t> ProcessesWithEnv(const std::string& entry) { return torus::launcher::ProcessesWithEnv(entry); }

std::string DescribeProcess(pid_t pid) {
  std::string cmd = ReadFileOr("/proc/" + std::to_string(pid) + "/cmdline");
  for (char& c : cmd) {
    if (c == '\0') c = ' ';
  }
  return "pid " + std::to_string(pid) + " (" + Trim(cmd) + ")";
}

std::vector<std::string> ShmSegments(const std::string& prefix) {
  std::vector<std::string> out;
  DIR* d = opendir("/dev/shm");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) out.push_back(e->d_name);
  }
  closedir(d);
  return out;
}

std::string ReadFileOr(const std::string& path, const std::string& fallback) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fallback;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool WaitUntil(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (true) {
    if (pred()) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    throw std::runtime_error("bind() failed");
  }
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

// ------------------------------------------------------------------------------- the cluster

TestCluster::TestCluster(const std::string& name) : name_(name) {
  std::string tmpl = "/tmp/torus-test-" + name + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed: " + tmpl);
  tmpdir_ = buf.data();
  setenv("TORUS_TMPDIR", tmpdir_.c_str(), 1);
  unsetenv("TORUS_ADDRESS");
  unsetenv("RAY_ADDRESS");
  unsetenv("TORUS_TOKEN");
  StartWatchdog();
}

// The watchdog: a shell that waits for EOF on a pipe whose only write end is this process' (the
// end is close-on-exec, so no child inherits it). EOF comes when Stop() closes it or when this
// process dies, e.g. when the runtime crashes it: then the watchdog stops the cluster, kills
// what is left of it, removes its nodes' shared memory and the temporary directory, so that a
// crashed test leaves nothing running.
void TestCluster::StartWatchdog() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  const std::string script = R"SH(
    read -r _ignored
    dir="$1"; torus="$2"; keep="$3"
    [ -d "$dir" ] || exit 0
    TORUS_TMPDIR="$dir" "$torus" stop >/dev/null 2>&1
    for p in /proc/[0-9]*; do
      if cat "$p/environ" 2>/dev/null | tr '\0' '\n' | grep -qxF "TORUS_TMPDIR=$dir"; then
        kill -9 "${p#/proc/}" 2>/dev/null
      fi
    done
    if [ -f "$dir/node_ids" ]; then
      while read -r id; do
        [ -n "$id" ] && rm -f /dev/shm/torus."$(printf %.12s "$id")".* 2>/dev/null
      done < "$dir/node_ids"
    fi
    [ -z "$keep" ] && rm -rf "$dir"
    exit 0
  )SH";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[0], STDIN_FILENO);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own session: a signal meant for the test's process group does not reach it.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
  const char* keep = std::getenv("TORUS_TEST_KEEP_TMP");
  std::vector<std::string> args = {"/bin/sh", "-c", script, "torus-test-watchdog", tmpdir_,
                                   TORUS_BIN, keep ? "1" : ""};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Without TORUS_TMPDIR=<dir> in its environment, or it would kill itself.
  std::vector<std::string> env = BuildEnv({}, {"TORUS_TMPDIR"});
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, "/bin/sh", &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(fds[0]);
  if (rc != 0) {
    close(fds[1]);
    throw std::runtime_error(std::string("cannot start the watchdog: ") + strerror(rc));
  }
  watchdog_pid_ = pid;
  watchdog_fd_ = fds[1];
}

void TestCluster::RecordNode(const std::string& node_id) {
  std::ofstream out(tmpdir_ + "/node_ids", std::ios::app);
  out << node_id << "\n";
}

TestCluster::~TestCluster() {
  std::vector<std::string> leftovers = Stop();
  for (const auto& l : leftovers) std::cerr << "TestCluster(" << name_ << "): leftover " << l << "\n";
  if (std::getenv("TORUS_TEST_KEEP_TMP")) {
    std::cerr << "TestCluster(" << name_ << "): kept " << tmpdir_ << "\n";
  }
  // The watchdog removes the directory (unless kept) once it sees the pipe close.
  if (watchdog_fd_ >= 0) close(watchdog_fd_);
  if (watchdog_pid_ > 0) {
    int status;
    WaitPid(watchdog_pid_, std::chrono::seconds(20), &status);
  }
}

std::string TestCluster::token() const { return Trim(ReadFileOr(session_ + "/token")); }

RunResult TestCluster::Torus(const std::vector<std::string>& args,
                             const std::map<std::string, std::string>& env_set,
                             const std::vector<std::string>& env_unset, double timeout_s) const {
  std::vector<std::string> argv = {TORUS_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  std::map<std::string, std::string> env = env_set;
  if (!env.count("TORUS_TMPDIR")) env["TORUS_TMPDIR"] = tmpdir_;
  return RunProcess(argv, env, env_unset, timeout_s);
}

void TestCluster::StartHead(double num_cpus, const nlohmann::json& resources,
                            const std::map<std::string, std::string>& labels,
                            const std::vector<std::string>& head_flags) {
  Phase phase("StartHead");
  RunResult r;
  // The port may be taken between FreePort() and the head's bind: try a few.
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::vector<std::string> args = {"start",       "--head",
                                     "--port",      std::to_string(FreePort()),
                                     "--num-cpus",  NumberArg(num_cpus),
                                     "--resources", ResourcesArg(resources)};
    if (!labels.empty()) {
      args.push_back("--labels");
      args.push_back(LabelsArg(labels));
    }
    args.insert(args.end(), head_flags.begin(), head_flags.end());
    r = Torus(args);
    if (r.exit_code == 0) break;
  }
  if (r.exit_code != 0) throw std::runtime_error("torus start --head failed: " + r.Describe());
  std::error_code ec;
  session_ = fs::canonical(tmpdir_ + "/session_latest", ec).string();
  if (ec) throw std::runtime_error("no session_latest under " + tmpdir_);
  address_ = Trim(ReadFileOr(session_ + "/head_address"));
  head_pid_ = std::atoi(ReadFileOr(session_ + "/pids/head.pid", "0").c_str());
  if (address_.empty()) throw std::runtime_error("no head_address in " + session_);
  torus::rpc::ListReply list;
  std::string err;
  if (!HeadList(address_, token(), &list, &err)) {
    throw std::runtime_error("cannot list the head's nodes: " + err);
  }
  for (const auto& n : list.nodes()) {
    if (!n.alive()) continue;
    head_node_.node_id = n.node_id();
    head_node_.address = n.address();
    head_node_.pid = static_cast<pid_t>(n.pid());
  }
  if (head_node_.node_id.empty()) throw std::runtime_error("the head's node is not listed");
  nodes_.push_back(head_node_);
  RecordNode(head_node_.node_id);
}

std::vector<std::string> TestCluster::NodeIdsAlive() const {
  torus::rpc::ListReply list;
  std::vector<std::string> out;
  if (!HeadList(address_, token(), &list, nullptr)) return out;
  for (const auto& n : list.nodes()) {
    if (n.alive()) out.push_back(n.node_id());
  }
  return out;
}

NodeInfo TestCluster::AddNode(const NodeSpec& spec) {
  Phase phase("AddNode");
  if (address_.empty()) throw std::runtime_error("AddNode before StartHead");
  std::vector<std::string> before = NodeIdsAlive();
  std::vector<std::string> argv = {TORUS_BIN,     "start",
                                   "--address",   address_,
                                   "--num-cpus",  NumberArg(spec.num_cpus),
                                   "--resources", ResourcesArg(spec.resources)};
  if (!spec.labels.empty()) {
    argv.push_back("--labels");
    argv.push_back(LabelsArg(spec.labels));
  }
  argv.insert(argv.end(), spec.flags.begin(), spec.flags.end());
  std::map<std::string, std::string> env = spec.env;
  env["TORUS_TMPDIR"] = tmpdir_;
  pid_t child = 0;
  std::string out_path, err_path;
  if (spec.block) {
    argv.push_back("--block");
    int n = node_counter_++;
    out_path = tmpdir_ + "/node-" + std::to_string(n) + ".out";
    err_path = tmpdir_ + "/node-" + std::to_string(n) + ".err";
    child = SpawnProcess(argv, env, {}, out_path, err_path);
    owned_.push_back(child);
  } else {
    RunResult r = RunProcess(argv, env, {}, 30);
    if (r.exit_code != 0) throw std::runtime_error("torus start --address failed: " + r.Describe());
  }
  std::set<std::string> old(before.begin(), before.end());
  NodeInfo info;
  info.owned = spec.block;
  bool found = WaitUntil(
      [&] {
        torus::rpc::ListReply list;
        if (!HeadList(address_, token(), &list, nullptr)) return false;
        for (const auto& n : list.nodes()) {
          if (n.alive() && !old.count(n.node_id())) {
            info.node_id = n.node_id();
            info.address = n.address();
            info.pid = static_cast<pid_t>(n.pid());
            return true;
          }
        }
        if (child > 0) {
          int status;
          if (waitpid(child, &status, WNOHANG) == child) {
            throw std::runtime_error("the node exited before registering:\n" +
                                     ReadFileOr(err_path) + ReadFileOr(out_path));
          }
        }
        return false;
      },
      std::chrono::seconds(20));
  if (!found) throw std::runtime_error("the new node did not register within 20 s");
  nodes_.push_back(info);
  RecordNode(info.node_id);
  return info;
}

void TestCluster::KillNode(const NodeInfo& node) {
  killed_.push_back(node.node_id);
  if (node.pid > 0) kill(node.pid, SIGKILL);
  for (pid_t p : owned_) {
    if (p == node.pid) {
      int status;
      waitpid(p, &status, 0);
    }
  }
}

void TestCluster::ConnectDriver(const std::string& ray_namespace) {
  Phase phase("ray::Init");
  ray::RayConfig cfg;
  cfg.address = address_;
  cfg.ray_namespace = ray_namespace;
  ray::Init(cfg);
}

std::string TestCluster::Status() const {
  RunResult r = Torus({"status"});
  if (r.exit_code != 0) throw std::runtime_error("torus status failed: " + r.Describe());
  return r.out;
}

nlohmann::json TestCluster::ListJson(const std::string& kind) const {
  RunResult r = Torus({"list", kind, "--format", "json"});
  if (r.exit_code != 0) throw std::runtime_error("torus list " + kind + " failed: " + r.Describe());
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception& e) {
    throw std::runtime_error("torus list " + kind + " printed no JSON (" + e.what() + "):\n" + r.out);
  }
}

std::vector<pid_t> TestCluster::ClusterProcesses() const { return ProcessesWithEnv(EnvMarker()); }

std::vector<std::string> TestCluster::Stop() {
  if (stopped_) return {};
  stopped_ = true;
  if (ray::IsInitialized()) {
    Phase phase("ray::Shutdown");
    ray::Shutdown();
  }
  std::vector<std::string> leftovers;
  if (!address_.empty()) {
    Phase phase("torus stop");
    RunResult r = Torus({"stop"});
    if (r.exit_code != 0) leftovers.push_back("`torus stop` failed: " + r.Describe());
  }
  Phase phase("after torus stop");
  for (pid_t p : owned_) kill(p, SIGTERM);
  for (pid_t p : owned_) {
    int status;
    if (!WaitPid(p, std::chrono::seconds(5), &status)) {
      leftovers.push_back("node " + DescribeProcess(p) + " ignored SIGTERM for 5 s");
      kill(p, SIGKILL);
      waitpid(p, &status, 0);
    }
  }
  owned_.clear();
  // Workers notice their node is gone within a moment; give them that moment.
  WaitUntil([&] { return ClusterProcesses().empty(); }, std::chrono::seconds(5));
  for (pid_t p : ClusterProcesses()) {
    leftovers.push_back("process still running after stop: " + DescribeProcess(p));
    kill(p, SIGKILL);
  }
  for (const auto& n : nodes_) {
    bool killed = std::find(killed_.begin(), killed_.end(), n.node_id) != killed_.end();
    for (const auto& seg : ShmSegments("torus." + n.node_id.substr(0, 12) + ".")) {
      if (!killed) leftovers.push_back("shared-memory segment left: /dev/shm/" + seg);
      shm_unlink(("/" + seg).c_str());
    }
  }
  return leftovers;
}

// ------------------------------------------------------------------------------- child drivers

std::map<std::string, ChildScenario>& ChildScenarios() {
  static auto* m = new std::map<std::string, ChildScenario>();
  return *m;
}

bool RegisterChildScenario(const std::string& name, ChildScenario fn) {
  ChildScenarios()[name] = std::move(fn);
  return true;
}

void DisableCoreDumps() {
  rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
}

void RunChildScenarioIfAsked() {
  if (const char* name = std::getenv("TORUS_TEST_CHILD")) {
    auto it = ChildScenarios().find(name);
    if (it == ChildScenarios().end()) {
      std::fprintf(stderr, "unknown child scenario '%s'\n", name);
      std::exit(2);
    }
    int rc = 0;
    try {
      rc = it->second();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child scenario %s threw: %s\n", name, e.what());
      rc = 3;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    std::exit(rc);
  }
}

}  // namespace torus_test
