#include "launcher/cluster_processes.h"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/session.h"

namespace torus::launcher {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {
// Whether /dev/shm holds a segment whose name starts with `prefix`.
bool AnySegmentWithPrefix(const std::string& prefix) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) return true;
  }
  return false;
}

}  // namespace

std::set<std::string> ShmPrefixes(const std::string& session, const std::vector<pid_t>& pids) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(session + "/logs", ec)) {
    std::string n = f.path().filename().string();
    if (n.rfind("node-", 0) != 0 || f.path().extension() != ".err") continue;
    std::ifstream in(f.path());
    std::string line;
    while (std::getline(in, line)) {
      auto p = line.find("] node ");
      if (p == std::string::npos) continue;
      std::string id = line.substr(p + 7, line.find(' ', p + 7) - (p + 7));
      if (id.size() >= 12 && line.find(" listening on ", p) != std::string::npos) {
        out.insert("torus." + id.substr(0, 12) + ".");
      }
    }
  }
  for (pid_t pid : pids) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
    std::string line;
    while (std::getline(in, line)) {
      auto p = line.find("/dev/shm/torus.");
      if (p == std::string::npos) continue;
      std::string name = line.substr(p + 9);
      auto dot = name.find('.', 6);
      if (dot != std::string::npos) out.insert(name.substr(0, dot + 1));
    }
  }
  return out;
}

bool HasLeftovers(const std::string& session) {
  if (!SessionProcesses(session).empty()) return true;
  std::error_code ec;
  for (const char* dir : {"/pids", "/shm"}) {
    if (fs::directory_iterator(session + dir, ec) != fs::directory_iterator()) return true;
  }
  for (const auto& p : ShmPrefixes(session, {})) {
    if (AnySegmentWithPrefix(p)) return true;
  }
  return false;
}

std::string Marker(const std::string& session) { return std::string(kMarkerVar) + "=" + session; }

bool Alive(pid_t pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  auto st = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  if (!st.ok()) return false;
  auto close = st->rfind(')');
  return close == std::string::npos || close + 2 >= st->size() || (*st)[close + 2] != 'Z';
}

bool HasEnvEntry(pid_t pid, const std::string& entry) {
  auto env = ReadFile("/proc/" + std::to_string(pid) + "/environ");
  if (!env.ok()) return false;
  size_t start = 0;
  while (start < env->size()) {
    size_t end = env->find('\0', start);
    if (end == std::string::npos) end = env->size();
    if (env->compare(start, end - start, entry) == 0) return true;
    start = end + 1;
  }
  return false;
}

std::vector<pid_t> SessionProcesses(const std::string& session) { return ProcessesWithEnv(Marker(session)); }

std::vector<pid_t> ProcessesWithEnv(const std::string& entry) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long pid = strtol(e->d_name, &end, 10);
    if (*end != 0 || pid <= 0 || pid == getpid()) continue;
    if (HasEnvEntry(static_cast<pid_t>(pid), entry) && Alive(static_cast<pid_t>(pid))) {
      out.push_back(static_cast<pid_t>(pid));
    }
  }
  closedir(d);
  return out;
}

pid_t ReadPid(const std::string& path) {
  auto r = ReadFile(path);
  if (!r.ok()) return 0;
  try {
    return static_cast<pid_t>(std::stol(*r));
  } catch (...) {
    return 0;
  }
}

int TerminateAll(const std::vector<pid_t>& pids, std::chrono::milliseconds grace) {
  int n = 0;
  for (pid_t p : pids) n += kill(p, SIGTERM) == 0;
  auto deadline = Clock::now() + grace;
  for (pid_t p : pids) {
    while (Alive(p) && Clock::now() < deadline) {
      waitpid(p, nullptr, WNOHANG);  // reaps our own children
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (Alive(p)) kill(p, SIGKILL);
  }
  for (pid_t p : pids) {
    for (int i = 0; i < 100 && Alive(p); ++i) {
      waitpid(p, nullptr, WNOHANG);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return n;
}

}  // namespace torus::launcher
