#include "etcd_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cluster.h"
#include "head/etcd_client.h"

namespace torus_test {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// The path of `name` in a directory of $PATH, or "" when there is none.
std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0 && fs::is_regular_file(candidate)) return candidate;
    start = end + 1;
  }
  return "";
}

// fork + exec with the child's output to `log` and SIGKILL when this thread ends. Everything the
// child touches is prepared before fork (only async-signal-safe calls after it).
pid_t SpawnTied(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + log);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent is gone already
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, STDIN_FILENO);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fd);
  if (pid < 0) throw std::runtime_error("fork failed");
  return pid;
}

}  // namespace

EtcdProcess::~EtcdProcess() { Kill(); }

std::string EtcdProcess::Log() const {
  return dir_.empty() ? "" : ReadFileOr(dir_ + "/etcd.log");
}

void EtcdProcess::Start() {
  if (pid_ != 0) throw std::runtime_error("EtcdProcess::Start: already started");
  std::string etcd = FindOnPath("etcd");
  if (etcd.empty()) {
    const char* path = std::getenv("PATH");
    throw std::runtime_error(std::string("etcd is not on PATH (") + (path ? path : "") +
                             "): these tests need a real etcd 3.4+ (Debian: apt-get install "
                             "etcd-server; scripts/deps.sh installs it)");
  }
  std::string tmpl = "/tmp/torus-etcd-XXXXXX";
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed: " + tmpl);
  dir_ = tmpl;
  // A port free a moment ago may be taken by the time etcd binds it: try again on others.
  std::string last_log;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (TryStart(etcd)) return;
    last_log = Log();
  }
  Kill();
  throw std::runtime_error("etcd exited at start three times; its last log:\n" + last_log);
}

bool EtcdProcess::TryStart(const std::string& etcd) {
  int client_port = FreePort(), peer_port = FreePort();
  while (peer_port == client_port) peer_port = FreePort();
  std::string client_url = "http://127.0.0.1:" + std::to_string(client_port);
  std::string peer_url = "http://127.0.0.1:" + std::to_string(peer_port);
  std::error_code ec;
  fs::remove_all(dir_ + "/data", ec);
  pid_ = SpawnTied({etcd, "--name", "t", "--data-dir", dir_ + "/data",
                    "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                    "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                    "--initial-cluster", "t=" + peer_url},
                   dir_ + "/etcd.log");
  endpoint_ = "127.0.0.1:" + std::to_string(client_port);
  auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = 0;
      return false;
    }
    if (torus::EtcdClient::Connect(endpoint_, 1000).ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string log = Log();
  Kill();
  throw std::runtime_error("etcd did not serve on " + endpoint_ + " within 30 s; its log:\n" + log);
}

void EtcdProcess::Kill() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = 0;
  }
  if (!dir_.empty()) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    dir_.clear();
  }
}

EtcdCluster::~EtcdCluster() {
  for (size_t i = 0; i < members_.size(); ++i) Kill(static_cast<int>(i));
  std::error_code ec;
  if (!dir_.empty()) fs::remove_all(dir_, ec);
}

void EtcdCluster::Start(int n) {
  std::string etcd = FindOnPath("etcd");
  if (etcd.empty()) throw std::runtime_error("etcd is not on PATH (scripts/deps.sh installs etcd-server)");
  std::string tmpl = "/tmp/torus-etcdc-XXXXXX";
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed: " + tmpl);
  dir_ = tmpl;
  std::vector<std::string> client, peer;
  std::string initial;
  for (int i = 0; i < n; ++i) {
    client.push_back("http://127.0.0.1:" + std::to_string(FreePort()));
    peer.push_back("http://127.0.0.1:" + std::to_string(FreePort()));
    initial += (i ? "," : "") + ("m" + std::to_string(i)) + "=" + peer.back();
  }
  for (int i = 0; i < n; ++i) {
    std::string name = "m" + std::to_string(i);
    Member m;
    m.endpoint = client[i].substr(std::string("http://").size());
    m.pid = SpawnTied({etcd, "--name", name, "--data-dir", dir_ + "/" + name,
                       "--listen-client-urls", client[i], "--advertise-client-urls", client[i],
                       "--listen-peer-urls", peer[i], "--initial-advertise-peer-urls", peer[i],
                       "--initial-cluster", initial, "--initial-cluster-state", "new"},
                      dir_ + "/" + name + ".log");
    endpoints_ += (i ? "," : "") + m.endpoint;
    members_.push_back(m);
  }
  auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline) {
    auto c = torus::EtcdClient::Connect(endpoints_, 1000);
    if (c.ok() && (*c)->Put("/up", "1").ok()) return;  // a write: the members have a leader
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  throw std::runtime_error("the etcd cluster " + endpoints_ + " did not serve within 30 s; member 0's log:\n" +
                           ReadFileOr(dir_ + "/m0.log"));
}

void EtcdCluster::Kill(int i) {
  Member& m = members_.at(static_cast<size_t>(i));
  if (m.pid == 0) return;
  kill(m.pid, SIGKILL);
  int status = 0;
  waitpid(m.pid, &status, 0);
  m.pid = 0;
}

}  // namespace torus_test
