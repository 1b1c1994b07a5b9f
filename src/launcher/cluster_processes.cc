#include "launcher/cluster_processes.h"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "common/session.h"

namespace torus::launcher {

using Clock = std::chrono::steady_clock;

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
