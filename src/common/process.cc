#include "common/process.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "common/grpc_env.h"
#include "common/session.h"

extern char** environ;

namespace torus {

StatusOr<pid_t> Spawn(const SpawnOptions& opts) {
  if (opts.argv.empty()) return InvalidArgument("spawn: empty argv");
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    const char* eq = strchr(*e, '=');
    if (!eq) continue;
    env[std::string(*e, eq - *e)] = eq + 1;
  }
  for (const auto& k : GrpcEnvSetHere()) env.erase(k);  // ours, not the child's
  for (const auto& k : opts.env_unset) env.erase(k);
  for (const auto& [k, v] : opts.env_set) env[k] = v;
  std::vector<std::string> env_strs;
  env_strs.reserve(env.size());
  for (const auto& [k, v] : env) env_strs.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strs) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = opts.argv;
  std::vector<char*> argv;
  for (auto& s : argv_copy) argv.push_back(s.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  if (!opts.stdout_path.empty()) {
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, opts.stdout_path.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
  }
  if (!opts.stderr_path.empty()) {
    if (opts.stderr_path == opts.stdout_path) {
      posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
    } else {
      posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, opts.stderr_path.c_str(),
                                       O_WRONLY | O_CREAT | O_APPEND, 0644);
    }
  }
  if (!opts.cwd.empty()) posix_spawn_file_actions_addchdir_np(&fa, opts.cwd.c_str());
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  sigset_t empty, all;
  sigemptyset(&empty);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &all);
  if (opts.new_session) flags |= POSIX_SPAWN_SETSID;
  posix_spawnattr_setflags(&attr, flags);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, argv[0], &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return Internal("cannot start " + opts.argv[0] + ": " + strerror(rc));
  }
  return pid;
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return "killed by signal " + std::to_string(sig) + " (SIG" + (name ? name : "?") + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

uint64_t ProcessStartTime(pid_t pid) {
  if (pid <= 0) return 0;
  auto read = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat = read.ok() ? *read : "";
  auto close = stat.rfind(')');  // the name (field 2) may hold spaces and parentheses
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 3 && (field == "Z" || field == "X")) return 0;  // a zombie is gone
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  }
  return 0;
}

std::string PidFileContent(pid_t pid) {
  return std::to_string(pid) + " " + std::to_string(ProcessStartTime(pid)) + "\n";
}

StatusOr<PidRecord> ParsePidFile(const std::string& content) {
  std::istringstream in(content);
  std::string pid_s, start_s, extra;
  in >> pid_s >> start_s >> extra;
  auto digits = [](const std::string& v) {
    return !v.empty() && v.size() <= 19 && v.find_first_not_of("0123456789") == std::string::npos;
  };
  if (!digits(pid_s) || (!start_s.empty() && !digits(start_s)) || !extra.empty()) {
    return InvalidArgument("not a pid file (expected \"PID [STARTTIME]\", found \"" + content.substr(0, 40) + "\")");
  }
  long long pid = std::stoll(pid_s);
  if (pid <= 1 || pid > INT_MAX) return InvalidArgument("pid " + pid_s + " is not a daemon's");
  PidRecord r;
  r.pid = static_cast<pid_t>(pid);
  r.start_time = start_s.empty() ? 0 : std::strtoull(start_s.c_str(), nullptr, 10);
  return r;
}

namespace {
// The command line of `pid` (its NUL-separated /proc cmdline); empty when it cannot be read.
std::vector<std::string> ProcessArgv(pid_t pid) {
  auto read = ReadFile("/proc/" + std::to_string(pid) + "/cmdline");
  const std::string cmd = read.ok() ? *read : "";
  std::vector<std::string> argv;
  for (size_t start = 0; start < cmd.size();) {
    size_t end = cmd.find('\0', start);
    if (end == std::string::npos) end = cmd.size();
    argv.push_back(cmd.substr(start, end - start));
    start = end + 1;
  }
  return argv;
}

// The argv contains `--session-dir` followed by `session_dir` (or the same directory under
// another spelling).
bool ArgvNamesSession(const std::vector<std::string>& argv, const std::string& session_dir) {
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] != "--session-dir") continue;
    std::error_code ec;
    if (argv[i + 1] == session_dir || std::filesystem::equivalent(argv[i + 1], session_dir, ec)) return true;
  }
  return false;
}

// `torus start ... --block`.
bool IsForegroundStart(const std::vector<std::string>& argv) {
  auto has = [&](const char* a) { return std::find(argv.begin(), argv.end(), a) != argv.end(); };
  return has("start") && has("--block");
}
}  // namespace

PidState CheckSessionProcess(const PidRecord& rec, const std::string& session_dir, std::string* why) {
  uint64_t started = ProcessStartTime(rec.pid);
  if (started == 0) {
    *why = "no process " + std::to_string(rec.pid);
    return PidState::kGone;
  }
  if (rec.start_time != 0 && started != rec.start_time) {
    *why = "pid " + std::to_string(rec.pid) + " was reused: it started at tick " + std::to_string(started) +
           ", the daemon at " + std::to_string(rec.start_time);
    return PidState::kGone;
  }
  // A head or node in the foreground (`torus start --block`) names no session on its command
  // line; its pid file does, with its start time, checked above.
  const std::vector<std::string> argv = ProcessArgv(rec.pid);
  if (!ArgvNamesSession(argv, session_dir) && !(rec.start_time != 0 && IsForegroundStart(argv))) {
    *why = "pid " + std::to_string(rec.pid) + " is not a Torus daemon of " + session_dir +
           " (its command line has no --session-dir " + session_dir + ")";
    return PidState::kOther;
  }
  return PidState::kSessionDaemon;
}

std::string SelfExecutable() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  buf[n] = 0;
  return buf;
}

}  // namespace torus

namespace torus {

ChildExitWaiter::ChildExitWaiter() : wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

ChildExitWaiter::~ChildExitWaiter() {
  for (auto& [pid, fd] : pidfds_) {
    if (fd >= 0) close(fd);
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

void ChildExitWaiter::Wake() {
  uint64_t one = 1;
  if (wake_fd_ >= 0 && write(wake_fd_, &one, sizeof one) < 0) {
    // The counter is saturated: a wake-up is pending anyway.
  }
}

void ChildExitWaiter::Wait(const std::vector<pid_t>& children, int timeout_ms) {
  // Keep one pidfd per child in the set (a zombie still has one, so none is missed).
  std::unordered_map<pid_t, int> keep;
  bool blind = wake_fd_ < 0;
  for (pid_t pid : children) {
    auto it = pidfds_.find(pid);
    int fd = it != pidfds_.end() ? it->second : static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    if (it != pidfds_.end()) pidfds_.erase(it);
    if (fd < 0) blind = true;
    keep[pid] = fd;
  }
  for (auto& [pid, fd] : pidfds_) {
    if (fd >= 0) close(fd);
  }
  pidfds_.swap(keep);
  std::vector<pollfd> fds;
  if (wake_fd_ >= 0) fds.push_back({wake_fd_, POLLIN, 0});
  for (auto& [pid, fd] : pidfds_) {
    if (fd >= 0) fds.push_back({fd, POLLIN, 0});
  }
  poll(fds.data(), fds.size(), blind ? std::min(timeout_ms, 5) : timeout_ms);
  uint64_t n;
  if (wake_fd_ >= 0 && read(wake_fd_, &n, sizeof n) < 0) {
    // Nothing was pending.
  }
}

}  // namespace torus
