#include "common/session_daemons.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <thread>

#include "common/session.h"

namespace torus {

StatusOr<pid_t> SpawnSessionDaemon(const std::string& session, const std::string& name,
                                   const std::vector<std::string>& argv,
                                   const std::map<std::string, std::string>& env_set,
                                   const std::vector<std::string>& env_unset) {
  SpawnOptions o;
  o.argv = argv;
  o.env_set = env_set;
  o.env_unset = env_unset;
  o.stdout_path = session + "/logs/" + name + ".out";
  o.stderr_path = session + "/logs/" + name + ".err";
  o.new_session = true;
  auto pid = Spawn(o);
  if (!pid.ok()) return pid.status();
  if (auto s = WriteSessionPidFile(session, name, *pid); !s.ok()) {
    kill(*pid, SIGKILL);
    waitpid(*pid, nullptr, 0);
    return Status(s.code(), "cannot start " + name + ": " + s.message());
  }
  return *pid;
}

StatusOr<pid_t> SpawnReportingSessionDaemon(const std::string& session, const std::string& name,
                                            const std::vector<std::string>& argv, int* report,
                                            const std::map<std::string, std::string>& env_set,
                                            const std::vector<std::string>& env_unset) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return Internal(std::string("cannot start " + name + ": pipe: ") + strerror(errno));
  // Inheritable only while it is spawned.
  fcntl(fds[1], F_SETFD, 0);
  std::vector<std::string> args = argv;
  args.push_back("--ready-fd");
  args.push_back(std::to_string(fds[1]));
  auto pid = SpawnSessionDaemon(session, name, args, env_set, env_unset);
  close(fds[1]);
  if (!pid.ok()) {
    close(fds[0]);
    return pid.status();
  }
  *report = fds[0];
  return *pid;
}

namespace {
// The last `max` bytes of the file at `path`, from a line start when it can ("" if unreadable).
std::string TailOf(const std::string& path, size_t max) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return "";
  struct stat st;
  std::string out;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    off_t from = st.st_size > static_cast<off_t>(max) ? st.st_size - static_cast<off_t>(max) : 0;
    out.resize(static_cast<size_t>(st.st_size - from));
    ssize_t n = pread(fd, out.data(), out.size(), from);
    out.resize(n > 0 ? static_cast<size_t>(n) : 0);
    if (from > 0 && out.find('\n') != std::string::npos) out = "...\n" + out.substr(out.find('\n') + 1);
  }
  close(fd);
  return out;
}
}  // namespace

StatusOr<std::string> WaitForDaemonReport(int report, pid_t pid, const std::string& log,
                                          std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string said;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return DeadlineExceeded("it said nothing within " + std::to_string(timeout.count() / 1000) + " s; see " + log);
    }
    pollfd p{report, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[4096];
    ssize_t n = read(report, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n > 0) {
      said.append(buf, static_cast<size_t>(n));
      continue;
    }
    break;  // EOF: the daemon reported and closed it, or exited
  }
  if (said.rfind("ok ", 0) == 0) return said.substr(3);
  if (said.rfind("error ", 0) == 0) return Unavailable(said.substr(6));
  // It closed the pipe without a word: it exited (or is exiting), or was not given the pipe.
  std::string how = "closed its report without a word";
  for (int i = 0; i < 200; ++i) {
    int status = 0;
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) how = DescribeWaitStatus(status);
    if (w != 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::string tail = TailOf(log, 8192);
  return Unavailable(how + (tail.empty() ? " and left nothing in " + log : ":\n" + tail));
}

namespace {
int g_report_fd = -1;  // the daemon's --ready-fd; main thread only

void Report(const std::string& line) {
  if (g_report_fd < 0) return;
  for (size_t done = 0; done < line.size();) {
    ssize_t n = write(g_report_fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(g_report_fd);
  g_report_fd = -1;
}
}  // namespace

void SetDaemonReportFd(int fd) {
  if (fd < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) return;  // not a descriptor we were given
  g_report_fd = fd;
  // A command that went away must not kill the daemon when it reports (children get the
  // default back: Spawn resets every signal).
  signal(SIGPIPE, SIG_IGN);
}

void ReportDaemonStarted(const std::string& payload) { Report("ok " + payload); }

void ReportDaemonFailed(const std::string& message) { Report("error " + message); }

Status WriteSessionPidFile(const std::string& session, const std::string& name, pid_t pid) {
  std::error_code ec;
  std::filesystem::create_directories(session + "/pids", ec);
  return WriteFile(session + "/pids/" + name + ".pid", PidFileContent(pid));
}

std::vector<SessionDaemon> LiveSessionDaemons(const std::string& session, std::vector<std::string>* refused) {
  namespace fs = std::filesystem;
  std::vector<SessionDaemon> out;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(session + "/pids", ec)) {
    if (f.path().extension() != ".pid") continue;
    const std::string file = f.path().string();
    auto content = ReadFile(file);
    if (!content.ok()) continue;
    auto rec = ParsePidFile(*content);
    std::string why;
    PidState state = rec.ok() ? CheckSessionProcess(*rec, session, &why) : PidState::kOther;
    if (state == PidState::kSessionDaemon) {
      out.push_back({file, *rec});
      continue;
    }
    if (state == PidState::kOther) {
      refused->push_back("not signalling anything for " + file + ": " +
                         (rec.ok() ? why : rec.status().message()) + "; removed it");
    }
    fs::remove(f.path(), ec);
  }
  return out;
}

int TerminateSessionDaemons(const std::vector<SessionDaemon>& daemons, std::chrono::milliseconds grace) {
  int n = 0;
  for (const auto& d : daemons) n += kill(d.rec.pid, SIGTERM) == 0;
  auto deadline = std::chrono::steady_clock::now() + grace;
  auto same = [](const SessionDaemon& d) {
    uint64_t t = ProcessStartTime(d.rec.pid);
    return t != 0 && (d.rec.start_time == 0 || t == d.rec.start_time);
  };
  for (const auto& d : daemons) {
    while (same(d) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (same(d)) kill(d.rec.pid, SIGKILL);
    std::error_code ec;
    std::filesystem::remove(d.file, ec);
  }
  return n;
}

}  // namespace torus
