#include "launcher/host_budget.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/session.h"

namespace torus::launcher {

namespace {

constexpr uint64_t kUnknown = UINT64_MAX;

// The first number in the file at `path` (a "max" or a missing file: kUnknown).
uint64_t ReadNumber(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return kUnknown;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(text->c_str(), &end, 10);
  if (errno != 0 || end == text->c_str()) return kUnknown;
  return v;
}

// The room left under a cgroup limit: <dir>/<limit_file> minus <dir>/<usage_file>, looked up
// at the process' own cgroup path and, inside a container whose cgroup is mounted at its
// root, at the root.
uint64_t CgroupRoom(const std::string& mount, const std::string& path, const char* limit_file,
                    const char* usage_file) {
  for (const std::string& dir : {mount + path, mount}) {
    uint64_t limit = ReadNumber(dir + "/" + limit_file);
    if (limit == kUnknown) continue;
    uint64_t used = ReadNumber(dir + "/" + usage_file);
    if (used == kUnknown) used = 0;
    return limit > used ? limit - used : 0;
  }
  return kUnknown;
}

// The cgroup path of this process for `controller` ("" for the unified hierarchy), or "".
std::optional<std::string> CgroupPath(const std::string& controller) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string names = line.substr(a + 1, b - a - 1);
    if (controller.empty() ? line.substr(0, a) == "0" && names.empty()
                           : ("," + names + ",").find("," + controller + ",") != std::string::npos) {
      return line.substr(b + 1);
    }
  }
  return std::nullopt;
}

// The room a controller's cgroup leaves, in the v1 hierarchy or the unified one.
uint64_t ControllerRoom(const std::string& controller, const char* v1_limit, const char* v1_usage,
                        const char* v2_limit, const char* v2_usage) {
  uint64_t room = kUnknown;
  if (auto p = CgroupPath(controller)) {
    room = std::min(room, CgroupRoom("/sys/fs/cgroup/" + controller, *p, v1_limit, v1_usage));
  }
  if (auto p = CgroupPath("")) room = std::min(room, CgroupRoom("/sys/fs/cgroup", *p, v2_limit, v2_usage));
  return room;
}

uint64_t MemAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return static_cast<uint64_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
}

// Threads (tasks) running now: the total of /proc/loadavg's "running/total".
uint64_t TasksNow() {
  auto text = ReadFile("/proc/loadavg");
  if (!text.ok()) return 0;
  auto slash = text->find('/');
  return slash == std::string::npos ? 0 : std::strtoull(text->c_str() + slash + 1, nullptr, 10);
}

std::string Gib(uint64_t bytes) {
  std::ostringstream s;
  s.precision(1);
  s << std::fixed << static_cast<double>(bytes) / static_cast<double>(1ull << 30) << " GiB";
  return s.str();
}

StatusOr<int64_t> PositiveCount(const std::string& value, const std::string& source) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0 || v <= 0) {
    return InvalidArgument(source + " must be a positive number of hosts, got '" + value + "'");
  }
  return static_cast<int64_t>(v);
}

}  // namespace

MachineRoom ReadMachineRoom() {
  MachineRoom room;
  room.memory_bytes = std::min(MemAvailable(), ControllerRoom("memory", "memory.limit_in_bytes",
                                                              "memory.usage_in_bytes", "memory.max", "memory.current"));
  const uint64_t now = TasksNow();
  uint64_t tasks = kUnknown;
  for (const char* f : {"/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"}) {
    uint64_t limit = ReadNumber(f);
    if (limit != kUnknown) tasks = std::min(tasks, limit > now ? limit - now : 0);
  }
  tasks = std::min(tasks, ControllerRoom("pids", "pids.max", "pids.current", "pids.max", "pids.current"));
  rlimit nproc;
  if (geteuid() != 0 && getrlimit(RLIMIT_NPROC, &nproc) == 0 && nproc.rlim_cur != RLIM_INFINITY) {
    tasks = std::min<uint64_t>(tasks, nproc.rlim_cur);  // counts this user's tasks: an upper bound
  }
  room.tasks = tasks == kUnknown ? 0 : tasks;
  return room;
}

StatusOr<HostLimit> ResolveHostLimit(const std::optional<std::string>& flag, const std::optional<std::string>& env,
                                     const MachineRoom& room) {
  if (flag) {
    auto n = PositiveCount(*flag, "--max-hosts");
    if (!n.ok()) return n.status();
    return HostLimit{*n, "--max-hosts " + *flag};
  }
  if (env) {
    auto n = PositiveCount(*env, "TORUS_MAX_HOSTS");
    if (!n.ok()) return n.status();
    return HostLimit{*n, "TORUS_MAX_HOSTS=" + *env};
  }
  const uint64_t by_memory = room.memory_bytes / kHostMemoryBytes;
  const uint64_t by_tasks = room.tasks / kHostTasks;
  HostLimit limit;
  limit.max_hosts = static_cast<int64_t>(std::max<uint64_t>(1, std::min(by_memory, by_tasks)));
  limit.source = "what this machine has room for: " + Gib(room.memory_bytes) + " of memory available at " +
                 std::to_string(kHostMemoryBytes >> 20) + " MiB per host, " + std::to_string(room.tasks) +
                 " more processes and threads at " + std::to_string(kHostTasks) + " per host";
  return limit;
}

Status CheckHostCount(size_t hosts, const HostLimit& limit) {
  if (static_cast<uint64_t>(hosts) <= static_cast<uint64_t>(limit.max_hosts)) return Status::Ok();
  return FailedPrecondition("the manifest asks for " + std::to_string(hosts) +
                            " hosts (node processes on this machine, the head's included), more than the " +
                            std::to_string(limit.max_hosts) + " allowed by " + limit.source +
                            "; nothing was started. Give --max-hosts N (or TORUS_MAX_HOSTS=N) to allow more");
}

}  // namespace torus::launcher
